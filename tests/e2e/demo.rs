//! `canopy demo --yes` plays the four flows, exits 0, and leaves no process behind; the
//! repository flow ends with the Web Manager closing the issue it was given.

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
        "check changelog passed",
        "review by run-2 (a reviewer run on the merged tree, read-only): approve",
        "merge-1 is in web's merge queue",
        "approving merge-1 automatically (--yes)",
        "merge-1 is merged: web's main now has CHANGELOG.md",
        "Release notes drafted in the Canopy demo.",
        // The repository flow runs on an issue the Web Manager owns end to end.
        "operator files #1 \"Changelog for release 2.4\" for the Web Manager",
        "topic \"issue #1: Changelog for release 2.4\"",
        "the Web Manager moved #1 to in_progress",
        "linking #1 (merge_request, issues = [1])",
        "the Web Manager closed #1 itself at its next turn: done, resolution \"The 2.4 changelog entry is on web's main (merge-1).\"",
        "canopy issues show 1:",
        "#1 Changelog for release 2.4 (done, owner web-lead)",
        "open -> in_progress: Briefing a run to write the entry.",
        "run-1 briefed",
        "merge-1 asks to land it",
        "merge-1 landed",
        "in_review -> done: merge-1 landed;",
        "links: run-1, run-2, merge-1",
        "| spend: $",
    ] {
        assert!(stdout.contains(line), "the narration lacks {line:?}:\n{stdout}");
    }
    // In #1's history the merge lands (and closes nothing), then its owner closes it.
    let landed = stdout.find("merge-1 landed (").unwrap_or(usize::MAX);
    let closed = stdout.find("in_review -> done").unwrap_or(0);
    assert!(landed < closed, "#1's history does not show the landing before the close:\n{stdout}");
    // Its spend counts the run's usage and the Manager's turns while #1 was in progress.
    assert!(!stdout.contains("| spend: $0.00 "), "#1 shows no spend:\n{stdout}");
    let left = processes_mentioning(&scratch.path().display().to_string());
    assert!(left.is_empty(), "the demo left processes behind: {left:?}");
}
