//! The text forms of the pictures: spend over time (`canopy usage --series`) as a column of
//! bars, and an agent's timeline (`canopy watch --timeline`) as its turns with their tool
//! calls, waits, steers and deliveries. `--json` prints the API's series and
//! `canopy_core::timeline` as they are, for users who plot them themselves. Does not compute
//! either: the daemon sums the series, `canopy_core::timeline` builds the timeline.

use canopy_core::timeline::Timeline;
use canopy_proto::api::{SeriesBucket, UsageSeriesResponse};

use crate::output::{budgets, time};
use crate::writer::outln;

/// The widest bar, in cells.
const BAR: usize = 30;

/// `canopy usage --series`: a line per bucket, its dollars, tokens and a bar scaled to the
/// largest bucket; then the budgets covering it.
pub fn usage_series(r: &UsageSeriesResponse) {
    let (each, span) = match r.bucket {
        SeriesBucket::Hour => ("hour", "24 hours"),
        SeriesBucket::Day => ("day", "30 days"),
    };
    let total: f64 = r.points.iter().map(|p| p.usd).sum();
    outln!(
        "spend per {each} over the last {span}: ${total:.4} in {} reports",
        r.points.iter().map(|p| p.reports).sum::<u64>()
    );
    let top = r.points.iter().map(|p| p.usd).fold(0.0_f64, f64::max);
    for p in &r.points {
        let cells = if top > 0.0 { ((p.usd / top) * BAR as f64).round() as usize } else { 0 };
        let cells = if p.usd > 0.0 { cells.max(1) } else { 0 };
        let at = time(&p.start);
        let at = match r.bucket {
            SeriesBucket::Hour => at.get(..16).unwrap_or(&at).to_owned(),
            SeriesBucket::Day => at.get(..10).unwrap_or(&at).to_owned(),
        };
        outln!("{at}  ${:>9.4}  {:>10} tokens  {}", p.usd, p.tokens, "█".repeat(cells));
    }
    if !r.budgets.is_empty() {
        outln!();
        outln!("budgets");
        budgets(&r.budgets);
    }
}

/// A duration in seconds or minutes, short.
fn took(ms: i64) -> String {
    match ms.max(0) {
        ms if ms < 10_000 => format!("{:.1}s", ms as f64 / 1000.0),
        ms if ms < 3_600_000 => format!("{}m {}s", ms / 60_000, ms % 60_000 / 1000),
        ms => format!("{}h {}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

fn at(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    time(&humantime::format_rfc3339_millis(t).to_string())
}

/// `canopy watch --timeline`: each turn with how long it took and what it did, the waits
/// between, and the steers and deliveries in place.
pub fn timeline(handle: &str, t: &Timeline) {
    if t.turns.is_empty() && t.marks.is_empty() {
        outln!("{handle}: no turns in the last 24 hours");
        return;
    }
    let busy: i64 = t.turns.iter().map(|turn| turn.end_ms.unwrap_or(t.to_ms) - turn.start_ms).sum();
    outln!("{handle}: {} turns in the last 24 hours, {} working", t.turns.len(), took(busy));
    let mut marks = t.marks.iter().peekable();
    let mut previous_end: Option<i64> = None;
    for turn in &t.turns {
        while let Some(mark) = marks.next_if(|m| m.at_ms <= turn.start_ms) {
            outln!("  {}  {:8} {}", at(mark.at_ms), mark.kind, mark.summary);
        }
        if let Some(end) = previous_end {
            outln!("  {:>25}  waited {}", "", took(turn.start_ms - end));
        }
        let end = turn.end_ms.unwrap_or(t.to_ms);
        let status = turn.status.as_deref().unwrap_or("running");
        outln!(
            "  {}  turn {} ({}, {status}, session {})",
            at(turn.start_ms),
            turn.turn_id,
            took(end - turn.start_ms),
            turn.incarnation
        );
        for tool in &turn.tools {
            let outcome = tool.outcome.as_deref().unwrap_or("running");
            let took_tool = took(tool.end_ms.unwrap_or(end) - tool.start_ms);
            outln!("  {}    {} ({took_tool}, {outcome})", at(tool.start_ms), tool.name);
        }
        while let Some(mark) = marks.next_if(|m| m.at_ms <= end) {
            outln!("  {}    {:8} {}", at(mark.at_ms), mark.kind, mark.summary);
        }
        previous_end = turn.end_ms;
    }
    for mark in marks {
        outln!("  {}  {:8} {}", at(mark.at_ms), mark.kind, mark.summary);
    }
}
