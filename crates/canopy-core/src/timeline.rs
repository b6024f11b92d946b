//! An agent's timeline, built from its stored activity: each turn a span, the tool calls inside
//! it spans too, and the steers and deliveries that reached it marks; the gaps between turns
//! are its waits. Pure: the console draws it as SVG and `canopy watch --timeline --json`
//! prints it. Does not read activity (the caller passes what it read) or draw anything.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ActivityItem;

/// The timeline of one agent over `[from_ms, to_ms]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Timeline {
    pub from_ms: i64,
    pub to_ms: i64,
    /// Oldest first.
    pub turns: Vec<TurnSpan>,
    /// Steers and deliveries, oldest first.
    pub marks: Vec<Mark>,
}

/// One turn: from `turn_started` to `turn_ended` (still running: no end).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TurnSpan {
    pub turn_id: String,
    /// The session it ran in.
    pub incarnation: u64,
    pub start_ms: i64,
    pub end_ms: Option<i64>,
    /// `completed`, `interrupted`, ... as the harness said.
    pub status: Option<String>,
    /// Oldest first.
    pub tools: Vec<ToolSpan>,
}

/// One tool call inside a turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolSpan {
    pub call_id: String,
    pub name: String,
    pub start_ms: i64,
    pub end_ms: Option<i64>,
    /// `result`, `failed`, `blocked` or `aborted`; none while it runs.
    pub outcome: Option<String>,
}

/// Something that reached the agent at a moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Mark {
    /// `steer` (injected mid-turn) or `delivery` (handed over at a turn's start).
    pub kind: String,
    pub at_ms: i64,
    pub summary: String,
}

/// Milliseconds since the epoch of an RFC 3339 time.
pub fn ms_of(at: &str) -> Option<i64> {
    let then = humantime::parse_rfc3339_weak(at).ok()?;
    i64::try_from(then.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis()).ok()
}

/// Ends the open turns `keys` at `at`, with their session.
fn close(
    timeline: &mut Timeline,
    open: &mut std::collections::HashMap<(u64, String), usize>,
    keys: &[(u64, String)],
    at: i64,
) {
    for key in keys {
        if let Some(index) = open.remove(key) {
            let span = &mut timeline.turns[index];
            span.end_ms = Some(at);
            span.status = Some("ended with its session".into());
        }
    }
}

/// The timeline of `items` (one agent's activity, in any order) within `[from_ms, to_ms]`.
/// A turn that started before `from_ms` and ended inside is kept whole; an item whose time
/// does not parse is skipped.
pub fn build(items: &[ActivityItem], from_ms: i64, to_ms: i64) -> Timeline {
    let mut items: Vec<(i64, &ActivityItem)> = items.iter().filter_map(|i| Some((ms_of(&i.at)?, i))).collect();
    items.sort_by_key(|(at, item)| (*at, item.id));
    let mut timeline = Timeline { from_ms, to_ms, ..Timeline::default() };
    // The index of each open turn (by incarnation and turn id) in `timeline.turns`.
    let mut open: std::collections::HashMap<(u64, String), usize> = std::collections::HashMap::new();
    for (at, item) in items {
        let incarnation = item.incarnation.get();
        let turn = item.turn_id.clone().or_else(|| item.detail["turn_id"].as_str().map(str::to_owned));
        let key = turn.clone().map(|t| (incarnation, t));
        let index = key.as_ref().and_then(|k| open.get(k).copied());
        match item.kind.as_str() {
            "turn_started" => {
                if let Some(key) = key {
                    // A turn still open from an earlier session, or started again under the same
                    // id, ended when its session did: it is not running now.
                    let stale: Vec<(u64, String)> =
                        open.keys().filter(|k| k.0 < incarnation || **k == key).cloned().collect();
                    close(&mut timeline, &mut open, &stale, at);
                    open.insert(key.clone(), timeline.turns.len());
                    let span = TurnSpan {
                        turn_id: key.1,
                        incarnation,
                        start_ms: at,
                        end_ms: None,
                        status: None,
                        tools: Vec::new(),
                    };
                    timeline.turns.push(span);
                }
            }
            "turn_ended" => {
                if let (Some(index), Some(key)) = (index, key) {
                    let span = &mut timeline.turns[index];
                    span.end_ms = Some(at);
                    span.status = item.detail["status"].as_str().map(str::to_owned);
                    open.remove(&key);
                }
            }
            "tool_running" => {
                if let Some(index) = index {
                    let call_id = item.detail["call_id"].as_str().unwrap_or_default().to_owned();
                    let name = item.detail["name"].as_str().unwrap_or("tool").to_owned();
                    let tool = ToolSpan { call_id, name, start_ms: at, end_ms: None, outcome: None };
                    timeline.turns[index].tools.push(tool);
                }
            }
            kind @ ("tool_result" | "tool_failed" | "tool_blocked" | "tool_aborted") => {
                let call_id = item.detail["call_id"].as_str().unwrap_or_default();
                if let Some(tool) = index.and_then(|i| {
                    timeline.turns[i].tools.iter_mut().rev().find(|t| t.call_id == call_id && t.end_ms.is_none())
                }) {
                    tool.end_ms = Some(at);
                    tool.outcome = Some(kind.trim_start_matches("tool_").to_owned());
                }
            }
            "exited" | "session_exited" | "session_failed" => {
                let ended: Vec<(u64, String)> = open.keys().filter(|k| k.0 == incarnation).cloned().collect();
                close(&mut timeline, &mut open, &ended, at);
            }
            "steer_injected" => {
                timeline.marks.push(Mark { kind: "steer".into(), at_ms: at, summary: item.summary.clone() })
            }
            "input" => timeline.marks.push(Mark { kind: "delivery".into(), at_ms: at, summary: item.summary.clone() }),
            _ => {}
        }
    }
    timeline.turns.retain(|t| t.end_ms.unwrap_or(to_ms) >= from_ms && t.start_ms <= to_ms);
    timeline.marks.retain(|m| m.at_ms >= from_ms && m.at_ms <= to_ms);
    timeline
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;
    use crate::{Handle, Incarnation};

    fn item(id: u64, second: u32, kind: &str, turn: Option<&str>, detail: serde_json::Value) -> ActivityItem {
        ActivityItem {
            id,
            agent: Handle::parse("lead").unwrap(),
            incarnation: Incarnation(1),
            at: format!("2026-12-05T10:00:{second:02}.000Z"),
            kind: kind.into(),
            turn_id: turn.map(str::to_owned),
            summary: kind.into(),
            detail,
        }
    }

    #[test]
    fn turns_hold_their_tool_calls_and_marks_fall_between() {
        let at = |s: u32| ms_of(&format!("2026-12-05T10:00:{s:02}.000Z")).unwrap();
        let items = vec![
            item(1, 1, "input", None, serde_json::json!({})),
            item(2, 2, "turn_started", Some("t1"), serde_json::json!({})),
            item(3, 3, "tool_running", Some("t1"), serde_json::json!({ "call_id": "c1", "name": "bash" })),
            item(5, 5, "steer_injected", None, serde_json::json!({})),
            item(4, 4, "tool_result", Some("t1"), serde_json::json!({ "call_id": "c1", "name": "bash" })),
            item(6, 6, "turn_ended", Some("t1"), serde_json::json!({ "status": "completed" })),
            item(7, 9, "turn_started", Some("t2"), serde_json::json!({})),
            item(8, 9, "tool_running", Some("t2"), serde_json::json!({ "call_id": "c9", "name": "sleep" })),
            item(9, 9, "text", Some("t2"), serde_json::json!({})),
        ];
        let timeline = build(&items, at(0), at(30));
        assert_eq!(timeline.turns.len(), 2);
        let first = &timeline.turns[0];
        assert_eq!((first.turn_id.as_str(), first.start_ms, first.end_ms), ("t1", at(2), Some(at(6))));
        assert_eq!(first.status.as_deref(), Some("completed"));
        assert_eq!(first.tools[0].name, "bash");
        assert_eq!((first.tools[0].start_ms, first.tools[0].end_ms), (at(3), Some(at(4))));
        assert_eq!(first.tools[0].outcome.as_deref(), Some("result"));
        let running = &timeline.turns[1];
        assert_eq!((running.end_ms, running.tools[0].end_ms), (None, None), "still running");
        let kinds: Vec<&str> = timeline.marks.iter().map(|m| m.kind.as_str()).collect();
        assert_eq!(kinds, ["delivery", "steer"]);
        // A window that ends before the second turn leaves it out.
        assert_eq!(build(&items, at(0), at(7)).turns.len(), 1);
        // A session that crashed mid-turn: its turn ends with it, not at now.
        let mut crashed = items.clone();
        crashed.push(item(10, 12, "exited", None, serde_json::json!({})));
        let t = build(&crashed, at(0), at(30));
        assert_eq!((t.turns[1].end_ms, t.turns[1].status.as_deref()), (Some(at(12)), Some("ended with its session")));
    }
}
