//! What an agent gets back for continuity: `history_search` results, their cursor, and the
//! continuity block at the head of a session's first input after a start or a compaction.
//!
//! Owns the shapes (`HistoryItem`, `ContinuityFacts`), the history cursor's grammar, the
//! excerpt rules (redacted, bounded, centred on the match) and `continuity_block`, a pure
//! function of the facts that never exceeds `MAX_CONTINUITY_CHARS`. It does not read the
//! store (the store gathers the facts) and does not decide when a block is owed (the
//! runner asks at a session start and after a compaction).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::ids::{Incarnation, Seq};
use crate::model::Message;
use crate::redact::{cut, redact};

/// Default and largest page of `history_search`.
pub const DEFAULT_HISTORY_LIMIT: u32 = 10;
pub const MAX_HISTORY_LIMIT: u32 = 50;
/// Longest message excerpt in a history result, in characters.
pub const EXCERPT_CHARS: usize = 400;
/// Longest tool-event preview in a history result, in characters.
pub const PREVIEW_CHARS: usize = 200;
/// Longest continuity block, in characters.
pub const MAX_CONTINUITY_CHARS: usize = 1500;

/// One result of `history_search`, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum HistoryItem {
    /// A message the agent sent or received; `body` is a redacted, bounded excerpt.
    Message {
        message: Message,
        /// True when the agent sent it.
        sent: bool,
        /// True when it was handed to a later session because the session first handed it
        /// ended before confirming it: an earlier session may have acted on it already.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        redelivered: bool,
    },
    /// A tool call of one of the agent's sessions: name, status and a short preview only.
    ToolEvent {
        at: String,
        incarnation: Incarnation,
        #[serde(default)]
        turn_id: Option<String>,
        name: String,
        /// `ok`, `failed`, `blocked` or `aborted`.
        status: String,
        preview: String,
    },
}

/// Where a history page ends: items strictly older than this come next.
///
/// Written `h<at_ms>.<source>.<id>` (source 0 for messages, 1 for tool events), so one
/// cursor orders both sources by time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HistoryCursor {
    pub at_ms: i64,
    pub source: u8,
    pub id: i64,
}

impl HistoryCursor {
    /// The cursor that comes before everything.
    pub const NEWEST: HistoryCursor = HistoryCursor { at_ms: i64::MAX, source: u8::MAX, id: i64::MAX };

    pub fn parse(text: &str) -> Result<HistoryCursor, Error> {
        let bad = || Error::invalid("before", format!("{text:?} is not a history cursor (pass next_before as given)"));
        let rest = text.strip_prefix('h').ok_or_else(bad)?;
        let mut parts = rest.split('.');
        let at_ms = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let source = parts.next().and_then(|p| p.parse().ok()).filter(|s| *s <= 1).ok_or_else(bad)?;
        let id = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(HistoryCursor { at_ms, source, id })
    }
}

impl std::fmt::Display for HistoryCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "h{}.{}.{}", self.at_ms, self.source, self.id)
    }
}

/// A redacted excerpt of `text` at most `max_chars` long, centred on the first
/// case-insensitive match of `query` when there is one.
pub fn excerpt(text: &str, query: Option<&str>, max_chars: usize) -> String {
    let clean = redact(text, usize::MAX);
    let chars: Vec<char> = clean.chars().collect();
    if chars.len() <= max_chars {
        return clean;
    }
    let hit = query.filter(|q| !q.is_empty()).and_then(|q| {
        let lower = clean.to_lowercase();
        let at = lower.find(&q.to_lowercase())?;
        // Lowercasing can change byte lengths; count characters in the original up to it.
        Some(lower[..at].chars().count().min(chars.len()))
    });
    let start = hit.map_or(0, |at| at.saturating_sub(max_chars / 3)).min(chars.len().saturating_sub(max_chars));
    let end = (start + max_chars).min(chars.len());
    let mut out = String::new();
    if start > 0 {
        out.push_str(&format!("[{start} chars before] …"));
    }
    out.extend(&chars[start..end]);
    if end < chars.len() {
        out.push_str(&format!("… [{} more chars]", chars.len() - end));
    }
    out
}

/// A compaction the harness reported, as a point the agent can search back from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub at: String,
    pub incarnation: Incarnation,
    /// The newest message sequence in the workspace at that moment.
    pub seq: Seq,
}

/// A pinned message, as the block shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedLine {
    pub channel: String,
    pub seq: Seq,
    pub sender: String,
    pub body: String,
}

/// Why the block is being given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContinuityReason {
    /// A session started; `previous` says how the one before it ended (none for the first).
    Start { previous: Option<String> },
    /// The harness compacted its context.
    Compaction,
}

/// Everything the continuity block says. The daemon fills it from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContinuityFacts {
    pub agent: String,
    pub display_name: String,
    pub role: String,
    pub incarnation: Incarnation,
    pub home_channel: String,
    pub reason: ContinuityReason,
    /// Newest first.
    pub checkpoints: Vec<Checkpoint>,
    /// One line each, e.g. `req-3: @flaky-tests (pending)`.
    pub open_spawn_requests: Vec<String>,
    /// Pins of the home and coordination channels.
    pub pins: Vec<PinnedLine>,
    /// Subagent runs that have not reported back, one line each.
    pub runs_out: Vec<String>,
}

/// The line that always closes the block.
pub const HISTORY_HINT: &str = "Before asking anyone to repeat context, call history_search (query, before, limit) \
     to recover earlier messages and tool results of your own sessions.";

/// Renders the continuity block: at most `MAX_CONTINUITY_CHARS` characters, whatever the facts.
pub fn continuity_block(facts: &ContinuityFacts) -> String {
    let mut head = String::from("[canopy continuity]\n");
    let why = match &facts.reason {
        ContinuityReason::Start { previous: None } => "first start".to_owned(),
        ContinuityReason::Start { previous: Some(how) } => {
            format!("restarted; the previous session {}", one_line(how, 80))
        }
        ContinuityReason::Compaction => "your context was just compacted".to_owned(),
    };
    head.push_str(&format!(
        "You are @{} ({}, role {}), session {} ({why}). Home channel #{}.\n",
        one_line(&facts.agent, 64),
        one_line(&facts.display_name, 64),
        one_line(&facts.role, 32),
        facts.incarnation,
        one_line(&facts.home_channel, 80),
    ));
    let tail = HISTORY_HINT;
    let mut budget = MAX_CONTINUITY_CHARS.saturating_sub(head.chars().count() + tail.chars().count());
    let mut body = String::new();
    let sections: [(&str, Vec<String>); 4] = [
        (
            "Compaction checkpoints",
            facts
                .checkpoints
                .iter()
                .map(|c| format!("{} (session {}, messages up to {})", c.at, c.incarnation, c.seq))
                .collect(),
        ),
        ("Open spawn requests", facts.open_spawn_requests.iter().map(|r| one_line(r, 120)).collect()),
        ("Subagent runs still out", facts.runs_out.iter().map(|r| one_line(r, 120)).collect()),
        (
            "Pinned",
            facts
                .pins
                .iter()
                .map(|p| format!("#{} [{}] @{}: {}", p.channel, p.seq, p.sender, one_line(&redact(&p.body, 200), 100)))
                .collect(),
        ),
    ];
    for (title, lines) in sections {
        if lines.is_empty() {
            continue;
        }
        let heading = format!("{title}:\n");
        if heading.chars().count() + 8 > budget {
            break;
        }
        body.push_str(&heading);
        budget -= heading.chars().count();
        for (index, line) in lines.iter().enumerate() {
            let line = format!("- {line}\n");
            let left = lines.len() - index;
            let more = format!("- and {left} more\n");
            // Keep room to say how many did not fit.
            if line.chars().count() + more.chars().count() > budget && left > 1 || line.chars().count() > budget {
                if more.chars().count() <= budget {
                    body.push_str(&more);
                    budget -= more.chars().count();
                }
                break;
            }
            body.push_str(&line);
            budget -= line.chars().count();
        }
    }
    let block = format!("{head}{body}{tail}");
    cut(&block, MAX_CONTINUITY_CHARS)
}

/// One line of at most `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    match flat.char_indices().nth(max) {
        None => flat,
        Some((at, _)) => format!("{}…", &flat[..at]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(n: usize) -> ContinuityFacts {
        ContinuityFacts {
            agent: "ci-manager".into(),
            display_name: "CI Manager".into(),
            role: "manager".into(),
            incarnation: Incarnation(7),
            home_channel: "home-ci-manager".into(),
            reason: ContinuityReason::Start { previous: Some("crashed (exit 101)".into()) },
            checkpoints: (0..n)
                .map(|i| Checkpoint {
                    at: "2026-11-30T12:00:00.000Z".into(),
                    incarnation: Incarnation(6),
                    seq: Seq(i as u64),
                })
                .collect(),
            open_spawn_requests: (0..n).map(|i| format!("req-{i}: @child-{i} (pending)")).collect(),
            pins: (0..n)
                .map(|i| PinnedLine {
                    channel: "home-ci-manager".into(),
                    seq: Seq(i as u64),
                    sender: "ops".into(),
                    body: format!("pin {i} {}", "x".repeat(500)),
                })
                .collect(),
            runs_out: (0..n).map(|i| format!("run-{i}: fix the flaky test")).collect(),
        }
    }

    #[test]
    fn the_block_stays_within_its_bound_with_a_large_history() {
        for n in [0, 1, 3, 10, 1000] {
            let block = continuity_block(&facts(n));
            assert!(block.chars().count() <= MAX_CONTINUITY_CHARS, "n={n}: {} chars", block.chars().count());
            assert!(block.ends_with(HISTORY_HINT), "n={n}: the history line must survive:\n{block}");
            assert!(block.contains("@ci-manager") && block.contains("session 7"), "{block}");
        }
        let block = continuity_block(&facts(1000));
        assert!(block.contains("more\n"), "a full block says how much did not fit:\n{block}");
    }

    #[test]
    fn the_block_redacts_pins() {
        let mut facts = facts(1);
        facts.pins[0].body = "deploy key sk-ant-api03-Q7zabcdefghijklmnop1234".into();
        let block = continuity_block(&facts);
        assert!(!block.contains("Q7zabcdefghij"), "{block}");
    }

    #[test]
    fn cursors_round_trip_and_bad_ones_name_the_field() {
        let cursor = HistoryCursor { at_ms: 1_700_000_000_000, source: 1, id: 42 };
        assert_eq!(HistoryCursor::parse(&cursor.to_string()).ok(), Some(cursor));
        for bad in ["", "h", "h1.2.3", "x1.0.1", "h1.0.1.4", "h1.0.x"] {
            let err = HistoryCursor::parse(bad).err();
            assert_eq!(err.as_ref().and_then(|e| e.field()), Some("before"), "{bad}");
        }
    }

    #[test]
    fn excerpts_centre_on_the_match_and_are_redacted() {
        let text = format!("{} needle ghp_Q7zabcdefghijklmnop1234 {}", "a ".repeat(400), "b ".repeat(400));
        let out = excerpt(&text, Some("NEEDLE"), 100);
        assert!(out.contains("needle") && !out.contains("ghp_Q7z"), "{out}");
        assert!(out.chars().count() < 160, "{out}");
        assert_eq!(excerpt("short", None, 100), "short");
    }
}
