//! The normalised vocabulary every adapter maps its harness onto.

use serde::Serialize;
use serde_json::Value;

pub use canopy_core::harness::Capabilities;

/// How an input should reach the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendMode {
    /// Start a turn with it (the session must be idle).
    NextTurn,
    /// Inject it into the running turn `turn_id` at its next step boundary.
    Steer { turn_id: String },
}

/// What actually happened to an input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum SendOutcome {
    /// A turn started with it.
    Started { turn_id: String },
    /// The harness took it for the running turn; it is injected at the next step boundary
    /// (a `SteerInjected` event follows, or `SteerDropped` if the turn is interrupted first).
    Steered { turn_id: String },
    /// It could not be steered (the turn ended, or the harness cannot steer): the caller
    /// delivers it at the next turn start instead.
    FellBack { reason: String },
    /// The harness refused it (a turn is running, for a next-turn send).
    Refused { reason: String },
}

/// Token counts (and cost where known) a harness reports for a turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    /// In US dollars, when the harness knows it.
    pub cost_usd: Option<f64>,
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    Completed,
    Interrupted,
    Failed,
}

/// Everything a session reports, in one closed set.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HarnessEvent {
    /// The process is up and accepts input.
    Ready,
    TurnStarted {
        turn_id: String,
    },
    TurnEnded {
        turn_id: String,
        status: TurnStatus,
    },
    Text {
        turn_id: Option<String>,
        text: String,
    },
    ToolRunning {
        turn_id: Option<String>,
        call_id: String,
        name: String,
        args: Value,
    },
    ToolResult {
        turn_id: Option<String>,
        call_id: String,
        name: String,
        output: Value,
    },
    ToolFailed {
        turn_id: Option<String>,
        call_id: String,
        name: String,
        output: Value,
    },
    ToolBlocked {
        turn_id: Option<String>,
        call_id: String,
        name: String,
        reason: String,
    },
    ToolAborted {
        turn_id: Option<String>,
        call_id: String,
        name: String,
    },
    CompactionStarted,
    CompactionEnded,
    /// Tokens (and cost, when the harness reports it) one model turn used.
    Usage {
        turn_id: Option<String>,
        usage: Usage,
    },
    RateLimited {
        detail: String,
    },
    /// The model API refused or failed a call. `fatal` when retrying cannot help without the
    /// operator (a credential refused): the session is stopped at once, with `text`.
    ModelError {
        text: String,
        fatal: bool,
    },
    Status {
        text: String,
    },
    SubagentStarted {
        id: String,
        detail: Value,
    },
    SubagentProgress {
        id: String,
        detail: Value,
    },
    SubagentEnded {
        id: String,
        detail: Value,
    },
    /// A steer taken earlier was injected into the turn at `position`.
    SteerInjected {
        input_id: String,
        turn_id: String,
        position: u32,
    },
    /// A steer taken earlier was dropped before injection (its turn was interrupted).
    SteerDropped {
        input_id: String,
        reason: String,
    },
    /// A line the adapter could not read (counted; never fatal).
    Malformed {
        reason: String,
    },
    /// The sandbox's egress proxy refused a connection the session asked for.
    EgressRefused {
        host: String,
        port: u16,
        reason: String,
    },
    /// The session passed one of its limits (`memory limit 2 GiB reached`) and is being
    /// ended; its exit follows.
    LimitReached {
        reason: String,
    },
    /// The process exited.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
}

impl HarnessEvent {
    /// The event's kind, as stored in activity.
    pub fn kind(&self) -> &'static str {
        match self {
            HarnessEvent::Ready => "ready",
            HarnessEvent::TurnStarted { .. } => "turn_started",
            HarnessEvent::TurnEnded { .. } => "turn_ended",
            HarnessEvent::Text { .. } => "text",
            HarnessEvent::ToolRunning { .. } => "tool_running",
            HarnessEvent::ToolResult { .. } => "tool_result",
            HarnessEvent::ToolFailed { .. } => "tool_failed",
            HarnessEvent::ToolBlocked { .. } => "tool_blocked",
            HarnessEvent::ToolAborted { .. } => "tool_aborted",
            HarnessEvent::CompactionStarted => "compaction_started",
            HarnessEvent::CompactionEnded => "compaction_ended",
            HarnessEvent::Usage { .. } => "usage",
            HarnessEvent::RateLimited { .. } => "rate_limited",
            HarnessEvent::ModelError { .. } => "model_error",
            HarnessEvent::Status { .. } => "status",
            HarnessEvent::SubagentStarted { .. } => "subagent_started",
            HarnessEvent::SubagentProgress { .. } => "subagent_progress",
            HarnessEvent::SubagentEnded { .. } => "subagent_ended",
            HarnessEvent::SteerInjected { .. } => "steer_injected",
            HarnessEvent::SteerDropped { .. } => "steer_dropped",
            HarnessEvent::Malformed { .. } => "malformed",
            HarnessEvent::EgressRefused { .. } => "egress_refused",
            HarnessEvent::LimitReached { .. } => "limit_reached",
            HarnessEvent::Exited { .. } => "exited",
        }
    }

    /// The turn the event belongs to, when it names one.
    pub fn turn_id(&self) -> Option<&str> {
        match self {
            HarnessEvent::TurnStarted { turn_id } | HarnessEvent::TurnEnded { turn_id, .. } => Some(turn_id),
            HarnessEvent::Text { turn_id, .. }
            | HarnessEvent::ToolRunning { turn_id, .. }
            | HarnessEvent::ToolResult { turn_id, .. }
            | HarnessEvent::ToolFailed { turn_id, .. }
            | HarnessEvent::ToolBlocked { turn_id, .. }
            | HarnessEvent::ToolAborted { turn_id, .. }
            | HarnessEvent::Usage { turn_id, .. } => turn_id.as_deref(),
            _ => None,
        }
    }

    /// A one-line summary for the operator's watch view.
    pub fn summary(&self) -> String {
        fn short(value: &Value) -> String {
            let text = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let mut line: String = text.chars().take(160).collect();
            if text.chars().count() > 160 {
                line.push('…');
            }
            line.replace('\n', " ")
        }
        match self {
            HarnessEvent::Ready => "session ready".into(),
            HarnessEvent::TurnStarted { turn_id } => format!("turn {turn_id} started"),
            HarnessEvent::TurnEnded { turn_id, status } => format!("turn {turn_id} ended ({status:?})").to_lowercase(),
            HarnessEvent::Text { text, .. } => short(&Value::String(text.clone())),
            HarnessEvent::ToolRunning { name, args, .. } => format!("▶ {name} {}", short(args)),
            HarnessEvent::ToolResult { name, .. } => format!("✓ {name}"),
            HarnessEvent::ToolFailed { name, output, .. } => format!("✗ {name} failed: {}", short(output)),
            HarnessEvent::ToolBlocked { name, reason, .. } => format!("⊘ {name} blocked: {reason}"),
            HarnessEvent::ToolAborted { name, .. } => format!("⊘ {name} aborted"),
            HarnessEvent::CompactionStarted => "compacting context".into(),
            HarnessEvent::CompactionEnded => "compaction done".into(),
            HarnessEvent::Usage { usage, .. } => format!(
                "used {} input and {} output tokens{}",
                usage.input_tokens,
                usage.output_tokens,
                usage.cost_usd.map(|c| format!(" (${c:.4})")).unwrap_or_default()
            ),
            HarnessEvent::RateLimited { detail } => format!("rate limited: {detail}"),
            HarnessEvent::ModelError { text, .. } => text.clone(),
            HarnessEvent::Status { text } => text.clone(),
            HarnessEvent::SubagentStarted { id, .. } => format!("subagent {id} started"),
            HarnessEvent::SubagentProgress { id, .. } => format!("subagent {id} progress"),
            HarnessEvent::SubagentEnded { id, .. } => format!("subagent {id} ended"),
            HarnessEvent::SteerInjected { turn_id, position, .. } => {
                format!("a message was steered into turn {turn_id} (input {position})")
            }
            HarnessEvent::SteerDropped { reason, .. } => format!("a steer was dropped: {reason}"),
            HarnessEvent::Malformed { reason } => format!("unreadable line from the harness: {reason}"),
            HarnessEvent::EgressRefused { host, port, reason } => {
                format!("egress to {host}:{port} refused: {reason}")
            }
            HarnessEvent::LimitReached { reason } => format!("session ended: {reason}"),
            HarnessEvent::Exited { code, signal } => match (code, signal) {
                (Some(code), _) => format!("session exited with code {code}"),
                (None, Some(signal)) => format!("session killed by signal {signal}"),
                _ => "session exited".into(),
            },
        }
    }
}

/// Whether a model API error text says the credential was refused (retrying cannot help).
pub fn credential_refused(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    ["401", "unauthorized", "authentication_error", "authentication failed", "invalid api key", "invalid x-api-key"]
        .iter()
        .any(|needle| lower.contains(needle))
}
