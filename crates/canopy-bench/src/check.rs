//! `canopy-bench --check`: the regression guard. Each guarded figure's ratio to its own
//! baseline (never an absolute time) must stay on the right side of a floor; `check` names
//! every figure that does not, and the binary exits non-zero.
//!
//! The floors are set for `.ci/run`'s run (`--quick`, a debug build, a loaded two-core
//! machine) and hold for a release run too, with headroom under what both measure so noise
//! does not fail them, and far enough from them that a real regression does. `docs/benchmarks.md` lists them
//! beside the figures they were set from. Owns the floors only; the figures are measured
//! elsewhere.

use serde::Serialize;

use crate::figure::Figure;

/// Which side of its floor a figure's ratio must stay on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Guard {
    /// Throughput: the ratio must be at least this.
    AtLeast(f64),
    /// Time: the ratio must be at most this.
    AtMost(f64),
}

impl Guard {
    pub fn holds(self, ratio: f64) -> bool {
        match self {
            Guard::AtLeast(floor) => ratio >= floor,
            Guard::AtMost(ceiling) => ratio <= ceiling,
        }
    }
}

impl std::fmt::Display for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Guard::AtLeast(floor) => write!(f, ">= {floor}x"),
            Guard::AtMost(ceiling) => write!(f, "<= {ceiling}x"),
        }
    }
}

/// The guarded figures, by the start of their name, with their floors.
const GUARDS: &[(&str, Guard)] = &[
    // Measured in that run on 2026-12-02: 0.32 (release: 0.36-0.46; the target is 0.7, not
    // met yet). Was 0.17-0.21 before the writer's plans, checkpoints and memo.
    ("post throughput, durable", Guard::AtLeast(0.2)),
    // 0.99-1.06.
    ("post throughput with the budget check", Guard::AtLeast(0.8)),
    // 1.1-2.1; the DESIGN target is 5x.
    ("post-to-steer latency p99", Guard::AtMost(5.0)),
    // Measured 2026-12-03 in that run: 1.85-2.5 at one caller, 2.6-3.4 at 16 and 64 (release:
    // 1.7-2.6). Before reads ran inline, in-process calls in their caller's task and a plain
    // tools/call skipped rmcp's per-request service: 3.9-5.6 (debug); the 40 ms delayed-ACK
    // floor this also guards against is 100x (debug) to 400x.
    ("MCP tool call p50, 1 concurrent", Guard::AtMost(4.0)),
    ("MCP tool call p50, 16 concurrent", Guard::AtMost(5.0)),
    ("MCP tool call p50, 64 concurrent", Guard::AtMost(5.0)),
    ("MCP tool call p50 through a session's relay, 1 concurrent", Guard::AtMost(4.0)),
    // 2.9 release, 3.7 in CI's debug build (over NATS it was 4.8-5.0 in release).
    ("MCP tool call p50 from a runner on another machine, 1 concurrent", Guard::AtMost(5.0)),
    // 0.93-1.15: throughput holds past 16 callers.
    ("MCP throughput from 16 to 64", Guard::AtLeast(0.7)),
    // 1.3.
    ("broadcast to 1000 agents", Guard::AtMost(8.0)),
    // 0.35-0.44 of reading the files.
    ("prompt render, warm", Guard::AtMost(1.0)),
    // 1.4-1.6.
    // A session's cgroup costs its start a kernel wait (5-15 ms on cgroup v1) against a
    // scripted start of about 5 ms: 2-4x measured (decisions, "Limits per session").
    ("session start, confined", Guard::AtMost(6.0)),
];

/// The guard of a figure, if it has one.
pub fn guard(figure: &Figure) -> Option<Guard> {
    GUARDS.iter().find(|(prefix, _)| figure.figure.starts_with(prefix)).map(|(_, guard)| *guard)
}

/// Every guarded figure whose ratio is past its floor, as a line naming both.
pub fn check(figures: &[Figure]) -> Vec<String> {
    figures
        .iter()
        .filter_map(|f| {
            let guard = guard(f)?;
            (!guard.holds(f.ratio)).then(|| format!("{}: ratio {:.2}, guard {guard}", f.figure, f.ratio))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(name: &str, ratio: f64) -> Figure {
        Figure {
            figure: name.into(),
            value: 0.0,
            unit: String::new(),
            baseline: 0.0,
            baseline_name: String::new(),
            ratio,
            target: String::new(),
            met: true,
            note: String::new(),
        }
    }

    #[test]
    fn a_ratio_past_its_floor_fails_the_check_and_unguarded_figures_never_do() {
        let figures = [
            figure("post throughput, durable, 64 concurrent posters, one recipient each", 0.05),
            figure("post-to-steer latency p99", 1.4),
            figure("MCP tool call p50, 1 concurrent caller", 45.0),
            figure("daemon memory after ready", 1e9),
        ];
        let failed = check(&figures);
        assert_eq!(failed.len(), 2, "{failed:?}");
        assert!(failed[0].starts_with("post throughput") && failed[0].contains(">= 0.2x"), "{failed:?}");
        assert!(failed[1].starts_with("MCP tool call p50, 1") && failed[1].contains("<= 4x"), "{failed:?}");
    }

    #[test]
    fn every_guard_names_a_figure_the_bench_measures() {
        // Prefixes are matched against the names the figures are built with; a renamed
        // figure must not silently lose its guard.
        let names = [
            "post throughput, durable, 64 concurrent posters, one recipient each",
            "post throughput with the budget check: a budget on every recipient, a spent one holding an agent",
            "post-to-steer latency p99",
            "MCP tool call p50, 1 concurrent caller",
            "MCP tool call p50, 16 concurrent callers",
            "MCP tool call p50, 64 concurrent callers",
            "MCP tool call p50 through a session's relay, 1 concurrent caller",
            "MCP tool call p50 from a runner on another machine, 1 concurrent caller",
            "MCP throughput from 16 to 64 callers",
            "broadcast to 1000 agents: commit until every online agent's runner is notified",
            "prompt render, warm (sections cached), median",
            "session start, confined (bubblewrap with its own network + Landlock), launch to ready p50",
        ];
        for (prefix, _) in GUARDS {
            assert!(names.iter().any(|n| n.starts_with(prefix)), "no figure starts with {prefix:?}");
        }
    }
}
