//! The workspace figures: how long an agent's checkout and a run's checkout take to make on
//! a repository of a few thousand files, through `canopy_git::Git` exactly as the
//! daemon calls it, beside git's own cheapest ways to get a work tree, in the same run.
//!
//! An agent's checkout (`clone --shared` of the mirror, then its branch) is set beside a plain
//! local `git clone`; a run's (the Manager's HEAD published into the mirror by a confined
//! fetch, then a checkout) beside `git worktree add`. Owns only the timing loop.

use std::path::Path;
use std::time::{Duration, Instant};

use canopy_git::Git;
use canopy_harness::SandboxSettings;

use crate::figure::{Figure, percentile};

/// Files in the benchmark repository.
const FILES: usize = 3_000;

fn git(dir: &Path, args: &[&str]) -> Result<(), String> {
    canopy_cli::sandbox::operator_git(dir, args).map(|_| ())
}

/// An agent's and a run's checkout, each beside its git baseline.
pub async fn figures(quick: bool) -> Result<Vec<Figure>, String> {
    let samples = if quick { 5 } else { 20 };
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let source = dir.path().join("app");
    for n in 0..FILES {
        let sub = source.join(format!("src/m{}", n % 30));
        std::fs::create_dir_all(&sub).map_err(|e| e.to_string())?;
        std::fs::write(sub.join(format!("f{n}.rs")), format!("pub fn f{n}() -> usize {{ {n} }}\n"))
            .map_err(|e| e.to_string())?;
    }
    git(&source, &["init", "-q", "-b", "main"])?;
    git(&source, &["add", "-A"])?;
    git(&source, &["commit", "-qm", "start"])?;
    let data = dir.path().join("data");
    let git_ops = Git::new("git", SandboxSettings::required(&data), Duration::from_secs(60));
    let mirror = git_ops.mirror_path("app");
    let base =
        git_ops.create_mirror(&source.display().to_string(), &mirror, "main").await.map_err(|e| e.to_string())?;
    let manager = data.join("sessions/lead/work");
    git_ops.create_checkout(&mirror, &manager, "canopy/lead", &base, "lead").await.map_err(|e| e.to_string())?;

    let (mut agent, mut clone, mut run, mut worktree) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for n in 0..samples {
        let started = Instant::now();
        let dest = data.join(format!("sessions/a{n}/work"));
        git_ops
            .create_checkout(&mirror, &dest, &format!("canopy/a{n}"), &base, "a")
            .await
            .map_err(|e| e.to_string())?;
        agent.push(started.elapsed());

        let started = Instant::now();
        git(dir.path(), &["clone", "-q", source.to_str().unwrap_or_default(), &format!("clone-{n}")])?;
        clone.push(started.elapsed());

        let started = Instant::now();
        let head = git_ops
            .publish(&mirror, &manager, "HEAD", "refs/canopy/agents/lead")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the Manager's checkout has no HEAD")?;
        let dest = data.join(format!("sessions/run-{n}/work"));
        git_ops
            .create_checkout(&mirror, &dest, &format!("canopy/lead/run-{n}"), &head, "run")
            .await
            .map_err(|e| e.to_string())?;
        run.push(started.elapsed());

        let started = Instant::now();
        git(&source, &["worktree", "add", "-q", "-b", &format!("w{n}"), &format!("../worktree-{n}"), "main"])?;
        worktree.push(started.elapsed());
    }
    for times in [&mut agent, &mut clone, &mut run, &mut worktree] {
        times.sort();
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let figure = |name: &str, value: &[Duration], baseline: &[Duration], baseline_name: &str| {
        let (v, b) = (ms(percentile(value, 0.5)), ms(percentile(baseline, 0.5)));
        Figure {
            figure: format!("{name} ({FILES} files) p50"),
            value: v,
            unit: "ms".into(),
            baseline: b,
            baseline_name: baseline_name.into(),
            ratio: v / b,
            target: "(reported)".into(),
            met: true,
            note: format!(
                "{samples} each, interleaved; max {:.1} ms vs {:.1} ms",
                ms(value[value.len() - 1]),
                ms(baseline[baseline.len() - 1])
            ),
        }
    };
    Ok(vec![
        figure(
            "an agent's checkout (clone --shared of the mirror, its branch)",
            &agent,
            &clone,
            "a plain local `git clone` p50 (ms)",
        ),
        figure(
            "a run's checkout (the Manager's HEAD published confined, then a checkout)",
            &run,
            &worktree,
            "`git worktree add` p50 (ms)",
        ),
    ])
}
