//! `canopy demo --yes` plays the four flows, exits 0, and leaves no process behind.

use crate::env::{CANOPY, text};

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
                    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                    let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                    let zombie = stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z');
                    (cmdline.contains(needle) && !zombie).then_some(cmdline)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_demo_plays_the_four_flows_and_cleans_up() {
    let scratch = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(CANOPY)
        .arg("demo")
        .arg("--yes")
        .env("TMPDIR", scratch.path())
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "the demo failed: {stdout}{}", text(&out.stderr));
    for line in [
        "req-1 appears in #home-ci-manager",
        "approving req-1 automatically (--yes)",
        "started with the Manager prompt and its charter",
        "docs: woke",
        "builder: steered",
        "#announcements reached all 4 agents",
        "Add the 2.4 changelog entry",
        "check on the merged tree: passed",
        "approving merge-1 automatically (--yes)",
        "merge-1 is merged: web's main now has CHANGELOG.md",
        "Release notes drafted in the Canopy demo.",
    ] {
        assert!(stdout.contains(line), "the narration lacks {line:?}:\n{stdout}");
    }
    let left = processes_mentioning(&scratch.path().display().to_string());
    assert!(left.is_empty(), "the demo left processes behind: {left:?}");
}
