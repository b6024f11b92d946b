//! Snapshot and property tests of the renderer and the lint on the fixture bundle in
//! `tests/fixtures/small`. Snapshots live in `tests/snapshots/`; after an intended change,
//! regenerate them with `CANOPY_BLESS=1 cargo test -p canopy-prompt` and review the diff.

#![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

#[path = "../../../tests/e2e/copy_dir.rs"]
mod copy_dir;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use canopy_prompt::{Bundle, Facts, Renderer, lint};
use copy_dir::copy_dir;

const CATALOG: &[&str] = &[
    "comms_post_message",
    "comms_list_messages",
    "comms_list_channels",
    "tree_show",
    "agents_spawn_peer",
    "agents_run_subagent",
    "skill_read",
    "rule_read",
    "history_search",
];

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/small")
}

fn renderer() -> Renderer {
    Renderer::new(Arc::new(Bundle::load(&fixture()).expect("the fixture bundle loads")), CATALOG)
}

fn facts(role: &str) -> Facts {
    Facts {
        handle: "ci-manager".into(),
        name: "CI Manager".into(),
        role: role.into(),
        parent: Some("supervisor".into()),
        home_channel: "home-ci-manager".into(),
        workspace: "acme".into(),
        cwd: "/work/acme".into(),
        date: "2026-11-30".into(),
        mission: "Ship a reliable build for every team.".into(),
        project: "The CI migration.".into(),
        goal: "Move the test jobs to the new runners.".into(),
        persona: None,
        native_subagents: false,
    }
}

fn snapshot(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots").join(format!("{name}.md"));
    if std::env::var_os("CANOPY_BLESS").is_some() {
        std::fs::write(&path, actual).expect("writing the snapshot");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with CANOPY_BLESS=1 to create it)", path.display()));
    assert_eq!(actual, expected, "{name} differs from its snapshot (CANOPY_BLESS=1 to update after review)");
}

#[test]
fn manager_snapshot_has_every_section_in_order() {
    let mut f = facts("manager");
    f.persona = Some("Dry humour, short sentences.".into());
    let r = renderer().render(&f, false).unwrap();
    assert_eq!(r.sections, ["role", "why_here", "skills", "rules", "other_rules", "footer", "persona"]);
    assert_eq!(r.delivery, canopy_core::harness::PromptMode::Replace);
    // The manager role lacks history_search: its line is dropped, the others stay.
    assert!(!r.text.contains("history_search") && r.text.contains("agents_run_subagent"));
    assert!(!r.text.contains("<!--"), "markers are stripped");
    // Skills filtered by the role; bodies are not inlined.
    assert!(r.text.contains("- `alpha`: How to do alpha things.") && !r.text.contains("root-only"));
    assert!(!r.text.contains("Alpha body"));
    snapshot("manager", &r.text);
}

#[test]
fn supervisor_snapshot() {
    let mut f = facts("supervisor");
    f.handle = "supervisor".into();
    f.name = "Supervisor".into();
    f.parent = None;
    f.home_channel = "home-supervisor".into();
    f.goal = String::new();
    let r = renderer().render(&f, false).unwrap();
    assert!(r.text.contains("- `root-only`: Only the Supervisor lists this."));
    assert!(r.text.contains("- Parent: none (you are the root)"));
    snapshot("supervisor", &r.text);
}

#[test]
fn implementer_delta_is_second_to_last_before_the_footer() {
    let r = renderer().render(&facts("implementer"), false).unwrap();
    assert_eq!(r.sections, ["default", "delta", "rules", "footer"]);
    assert_eq!(r.delivery, canopy_core::harness::PromptMode::Replace);
    let default = r.text.find("# Default block-0").unwrap();
    let delta = r.text.find("# Role delta").unwrap();
    let rules = r.text.find("# Rules").unwrap();
    let footer = r.text.find("# This Session").unwrap();
    assert!(default < delta && delta < rules && rules < footer, "the always-apply rules bind a run too");
    assert_eq!(r.tools, ["comms_post_message", "comms_list_messages"]);
    snapshot("implementer", &r.text);
}

#[test]
fn with_a_harness_that_owns_its_default_only_the_delta_is_appended() {
    let r = renderer().render(&facts("implementer"), true).unwrap();
    assert_eq!(r.delivery, canopy_core::harness::PromptMode::Append);
    assert_eq!(r.sections, ["delta", "rules", "footer"]);
    assert!(!r.text.contains("careful coding agent"), "the delta never copies the default");
    snapshot("implementer-append", &r.text);
}

#[test]
fn a_run_uses_its_definition_and_its_tool_list() {
    let r = renderer().render_run("reviewer", &facts("implementer"), false).unwrap();
    assert_eq!(r.definition.as_deref(), Some("reviewer"));
    assert_eq!(r.tools, ["comms_post_message"]);
    assert!(r.text.contains("Review the change"));
    assert!(renderer().render_run("nope", &facts("implementer"), false).is_err());
}

#[test]
fn absent_ancestry_leaves_no_trace() {
    let renderer = renderer();
    let with = renderer.render(&facts("manager"), false).unwrap();
    let mut bare = facts("manager");
    bare.mission = String::new();
    bare.project = "   ".into();
    bare.goal = String::new();
    let without = renderer.render(&bare, false).unwrap();
    assert!(!without.sections.contains(&"why_here"));
    let start = with.text.find("# Why You're Here").unwrap();
    let end = start + with.text[start..].find("\n\n# Skills").unwrap() + 2;
    let removed = format!("{}{}", &with.text[..start], &with.text[end..]);
    assert_eq!(removed, without.text, "byte-identical to a prompt rendered without the section");
}

#[test]
fn ancestry_lines_are_capped_at_200_characters() {
    let mut f = facts("manager");
    f.goal = "g".repeat(500);
    let r = renderer().render(&f, false).unwrap();
    let line = r.text.lines().find(|l| l.starts_with("- Goal: ")).unwrap();
    let value = line.trim_start_matches("- Goal: ");
    assert_eq!(value.chars().count(), 200);
    assert!(value.ends_with('…'));
}

#[test]
fn rendering_is_deterministic_and_the_cache_changes_nothing() {
    let warm = renderer();
    let first = warm.render(&facts("manager"), false).unwrap();
    let second = warm.render(&facts("manager"), false).unwrap();
    let cold = renderer().render(&facts("manager"), false).unwrap();
    assert_eq!(first, second);
    assert_eq!(first, cold);
    assert_eq!(first.hash, canopy_prompt::render::hash(&first.text));
    let mut other = facts("manager");
    other.handle = "docs-manager".into();
    assert_ne!(warm.render(&other, false).unwrap().hash, first.hash);
}

#[test]
fn the_fixture_passes_the_lint() {
    assert_eq!(lint(&renderer()), []);
}

/// Copies the fixture into a temp dir, applies `edit`, and loads it.
fn planted(edit: impl FnOnce(&Path)) -> (tempfile::TempDir, Result<Bundle, canopy_prompt::BundleError>) {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture(), dir.path());
    edit(dir.path());
    let loaded = Bundle::load(dir.path());
    (dir, loaded)
}

#[test]
fn the_lint_catches_a_planted_tool_name() {
    let (_dir, bundle) = planted(|root| {
        let skill = root.join("skills/alpha/SKILL.md");
        let text = std::fs::read_to_string(&skill).unwrap();
        std::fs::write(&skill, format!("{text}Then call `comms_frobnicate` twice.\n")).unwrap();
        let delta = root.join("agents/implementer.md");
        let text = std::fs::read_to_string(&delta).unwrap();
        std::fs::write(&delta, format!("{text}Spawn helpers with `agents_spawn_peer`.\n")).unwrap();
    });
    let findings = lint(&Renderer::new(Arc::new(bundle.unwrap()), CATALOG));
    let rendered: Vec<String> = findings.iter().map(|f| f.to_string()).collect();
    assert!(
        rendered.iter().any(|f| f.starts_with("skills/alpha/SKILL.md:6:") && f.contains("comms_frobnicate")),
        "{rendered:#?}"
    );
    assert!(
        rendered.iter().any(|f| f.starts_with("agents/implementer.md:8:") && f.contains("agents_spawn_peer")),
        "{rendered:#?}"
    );
}

/// The issue tools are a tool family: a run (which has none) naming one is caught, and a
/// line that requires one is kept only for roles that have it.
#[test]
fn the_lint_knows_the_issue_tools() {
    let (_dir, bundle) = planted(|root| {
        let delta = root.join("agents/implementer.md");
        let text = std::fs::read_to_string(&delta).unwrap();
        std::fs::write(&delta, format!("{text}Close your issue with `issues_update`.\n")).unwrap();
        let skill = root.join("skills/alpha/SKILL.md");
        let text = std::fs::read_to_string(&skill).unwrap();
        std::fs::write(&skill, format!("{text}Move it with `issues_update`. <!-- requires: issues_update -->\n"))
            .unwrap();
    });
    let bundle = Arc::new(bundle.unwrap());
    let catalog: Vec<&str> = CATALOG.iter().copied().chain(["issues_update"]).collect();
    let findings: Vec<String> = lint(&Renderer::new(bundle.clone(), &catalog)).iter().map(|f| f.to_string()).collect();
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert!(
        findings[0].starts_with("agents/implementer.md:8:") && findings[0].contains("issues_update"),
        "{findings:#?}"
    );
    // The manager (no issue tools in its role) does not see the line, the supervisor (all) does.
    let renderer = Renderer::new(bundle, &catalog);
    let gated = canopy_prompt::gated(&renderer);
    assert!(gated.iter().any(|g| g.role == "manager" && g.waits_for == ["issues_update"]), "{gated:#?}");
    assert!(!gated.iter().any(|g| g.role == "supervisor"), "{gated:#?}");
}

#[test]
fn frontmatter_errors_name_the_file_and_line() {
    let (_dir, bundle) = planted(|root| {
        std::fs::write(root.join("rules/bad.md"), "---\ndescription: x\nalwaysApply: maybe\n---\nbody\n").unwrap();
    });
    assert_eq!(bundle.unwrap_err().to_string(), "rules/bad.md:3: `alwaysApply` must be true or false");
    let (_dir, bundle) = planted(|root| {
        std::fs::write(root.join("agents/x.md"), "---\nname: x\ndescription: d\ncolour: red\n---\n").unwrap();
    });
    assert_eq!(
        bundle.unwrap_err().to_string(),
        "agents/x.md:4: unknown key `colour` (expected one of: name, description, tools, model)"
    );
    let (_dir, bundle) = planted(|root| {
        std::fs::write(
            root.join("config/roles/manager.toml"),
            "id = \"manager\"\nblock0 = \"manager\"\nmode = \"sideways\"\n",
        )
        .unwrap();
    });
    assert_eq!(
        bundle.unwrap_err().to_string(),
        "config/roles/manager.toml:3: `mode`: \"sideways\" is not one of: replace, delta"
    );
}

#[test]
fn names_and_links_cannot_leave_the_bundle() {
    let (_dir, bundle) = planted(|root| {
        std::fs::create_dir_all(root.join("skills/Bad Name")).unwrap();
        std::fs::write(root.join("skills/Bad Name/SKILL.md"), "---\nname: x\ndescription: d\n---\n").unwrap();
    });
    assert!(bundle.unwrap_err().to_string().contains("is not a valid name"));
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.md"), "---\ndescription: d\n---\n").unwrap();
    let target = outside.path().join("secret.md");
    let (_dir, bundle) = planted(move |root| {
        std::os::unix::fs::symlink(&target, root.join("rules/leak.md")).unwrap();
    });
    assert_eq!(bundle.unwrap_err().to_string(), "rules/leak.md: points outside the bundle");
}

#[test]
fn the_lint_catches_a_role_listing_a_skill_that_does_not_exist() {
    let (_dir, bundle) = planted(|root| {
        let role = root.join("config/roles/manager.toml");
        let text = std::fs::read_to_string(&role)
            .unwrap()
            .replace("skills = [\"alpha\", \"beta\"]", "skills = [\"alpha\", \"gamma\"]");
        std::fs::write(&role, text).unwrap();
    });
    let findings = lint(&Renderer::new(Arc::new(bundle.unwrap()), CATALOG));
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert_eq!(
        findings[0].to_string(),
        "config/roles/manager.toml: skills lists \"gamma\", but there is no skills/gamma/SKILL.md (role manager)"
    );
}
