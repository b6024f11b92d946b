//! The prompt-render figure: a Manager's prompt rendered from a bundle of 100 skills and 50
//! rules, warm (sections cached) and cold (a fresh renderer, and a fresh load from disk),
//! beside the baseline of reading the same files.
//!
//! The bundle is the shipped one (roles, block-0s, definitions) plus generated skills and
//! rules in a temporary directory. No daemon or NATS is involved: rendering is a pure
//! function of the bundle and the facts.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use canopy_prompt::{Bundle, Facts, Renderer};

use crate::figure::{Figure, percentile};

const SKILLS: usize = 100;
const RULES: usize = 50;
/// Rules that always apply (rendered in full); the rest are listed by name.
const ALWAYS: usize = 10;

/// Writes the benchmark bundle under `root`.
fn write_bundle(root: &Path) -> Result<(), String> {
    let write = |rel: &str, text: &str| {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
        }
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))
    };
    let shipped = Bundle::embedded().map_err(|e| e.to_string())?;
    for (name, block) in &shipped.blocks {
        write(&format!("config/prompts/{name}/SYSTEM.md"), &block.text)?;
    }
    for d in shipped.definitions.values() {
        write(&d.file, &format!("---\nname: {}\ndescription: {}\n---\n{}", d.name, d.description, d.body.text))?;
    }
    for role in shipped.roles.values() {
        let list = |v: &[String]| v.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ");
        let skills = if role.definition.is_some() { String::new() } else { "\"*\"".to_owned() };
        let definition = role.definition.as_ref().map(|d| format!("definition = {d:?}\n")).unwrap_or_default();
        write(
            &role.file,
            &format!(
                "id = {:?}\nblock0 = {:?}\nmode = {:?}\ntools = [{}]\nskills = [{skills}]\n{definition}",
                role.id,
                role.block0,
                role.mode.as_str(),
                list(&role.tools)
            ),
        )?;
    }
    let paragraph = "Read the situation before acting, say what you will do, do it in small verified steps, \
                     and report what changed and how you checked it. ";
    for i in 0..SKILLS {
        write(
            &format!("skills/skill-{i:03}/SKILL.md"),
            &format!(
                "---\nname: skill-{i:03}\ndescription: Playbook {i} for one recurring kind of work.\n---\n# Skill {i}\n\n{}\n",
                paragraph.repeat(12)
            ),
        )?;
    }
    for i in 0..RULES {
        let always = i < ALWAYS;
        write(
            &format!("rules/rule-{i:03}.md"),
            &format!(
                "---\ndescription: Rule {i} about one practice.\nalwaysApply: {always}\nglobs: [\"src/**/*.rs\"]\n---\n{}\n",
                paragraph.repeat(3)
            ),
        )?;
    }
    Ok(())
}

/// Reads every file under `dir`; returns (files, bytes).
fn read_all(dir: &Path) -> Result<(usize, usize), String> {
    let mut totals = (0, 0);
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
        let path = entry.path();
        let (files, bytes) = match path.is_dir() {
            true => read_all(&path)?,
            false => (1, std::fs::read_to_string(&path).map_err(|e| e.to_string())?.len()),
        };
        totals = (totals.0 + files, totals.1 + bytes);
    }
    Ok(totals)
}

fn facts() -> Facts {
    Facts {
        handle: "ci-manager".into(),
        name: "CI Manager".into(),
        role: "manager".into(),
        parent: Some("supervisor".into()),
        home_channel: "home-ci-manager".into(),
        workspace: "bench".into(),
        cwd: "/work/bench".into(),
        date: "2026-11-30".into(),
        mission: "Keep the build green.".into(),
        project: "The CI migration.".into(),
        goal: "Move the test jobs to the new runners.".into(),
        persona: None,
        native_subagents: false,
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    percentile(&samples, 0.5)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Warm and cold render times beside the time to read the same files.
pub fn figures(catalog: &[&str], quick: bool) -> Result<Vec<Figure>, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    write_bundle(dir.path())?;
    let rounds = if quick { 50 } else { 300 };

    // Baseline: reading every file of the bundle (page cache warm after the first round).
    let (files, bytes) = read_all(dir.path())?;
    let baseline = median(
        (0..rounds)
            .map(|_| {
                let start = Instant::now();
                // Timed only: the same read succeeded above.
                let _ = read_all(dir.path());
                start.elapsed()
            })
            .collect(),
    );

    let bundle = Arc::new(Bundle::load(dir.path()).map_err(|e| e.to_string())?);
    let facts = facts();
    let renderer = Renderer::new(bundle.clone(), catalog);
    let first = renderer.render(&facts, false).map_err(|e| e.to_string())?;
    let warm = median(
        (0..rounds * 10)
            .map(|_| {
                let start = Instant::now();
                let rendered = renderer.render(&facts, false);
                let took = start.elapsed();
                debug_assert!(rendered.is_ok_and(|r| r.hash == first.hash));
                took
            })
            .collect(),
    );
    let cold = median(
        (0..rounds)
            .map(|_| {
                let start = Instant::now();
                // Timed only: the same render succeeded above.
                let _ = Renderer::new(bundle.clone(), catalog).render(&facts, false);
                start.elapsed()
            })
            .collect(),
    );
    let from_disk = median(
        (0..rounds)
            .map(|_| {
                let start = Instant::now();
                if let Ok(bundle) = Bundle::load(dir.path()) {
                    // Timed only: the same load and render succeeded above.
                    let _ = Renderer::new(Arc::new(bundle), catalog).render(&facts, false);
                }
                start.elapsed()
            })
            .collect(),
    );
    let base = us(baseline);
    let baseline_name = format!("reading the bundle's {files} files ({bytes} bytes), median (us)");
    let note = format!(
        "{SKILLS} skills, {RULES} rules ({ALWAYS} always-apply); the Manager prompt is {} bytes, sections {}",
        first.text.len(),
        first.sections.join(", ")
    );
    let figure = |name: &str, value: Duration, target: &str, met: bool| Figure {
        figure: name.to_owned(),
        value: us(value),
        unit: "us".into(),
        baseline: base,
        baseline_name: baseline_name.clone(),
        ratio: us(value) / base.max(0.001),
        target: target.to_owned(),
        met,
        note: note.clone(),
    };
    Ok(vec![
        figure("prompt render, warm (sections cached), median", warm, "< 1 ms", warm < Duration::from_millis(1)),
        figure("prompt render, cold (fresh renderer, bundle parsed), median", cold, "(reported)", true),
        figure("prompt render, cold from disk (read + parse + render), median", from_disk, "(reported)", true),
    ])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on purpose")]

    use super::*;

    #[test]
    fn the_bench_bundle_is_valid_and_renders_every_section() {
        let dir = tempfile::tempdir().unwrap();
        write_bundle(dir.path()).unwrap();
        assert_eq!(read_all(dir.path()).unwrap().0, 159, "3 block-0s, 4 roles, 2 definitions, 100 skills, 50 rules");
        let catalog = canopy_daemon::bundle::catalog();
        let renderer = Renderer::new(Arc::new(Bundle::load(dir.path()).unwrap()), &catalog);
        assert_eq!(canopy_prompt::lint(&renderer), []);
        let rendered = renderer.render(&facts(), false).unwrap();
        assert_eq!(rendered.sections, ["role", "why_here", "skills", "rules", "other_rules", "footer"]);
        assert!(rendered.text.contains("- `skill-099`: Playbook 99"));
    }
}
