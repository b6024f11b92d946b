//! The scripted harness's wire protocol: JSON lines over stdio, one object per line.
//!
//! Modelled on real harness RPC modes (pi/omp `--mode rpc`, Codex app-server): the host
//! writes `Input` lines to the harness's stdin; the harness writes `Output` lines to its
//! stdout. Both sides tolerate unknown fields so either can grow. Owns the shapes only.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Facts about where an input came from, used by script rules to match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputMeta {
    /// Sender handle, when the input is a message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
    /// Channel the message was posted in, when the input is a message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// Topic within `channel`, when the input is a message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// `"start"` for the first input of a session, `"message"` for deliveries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The newest delivered message's sequence number, when the input carries messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// True when the input carries a message an earlier session was handed and never
    /// confirmed (its fence says `redelivered`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub redelivered: bool,
}

/// Host -> harness.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Input {
    /// Start a turn with this input. Refused (`prompt_rejected`) while a turn runs.
    Prompt {
        id: String,
        text: String,
        #[serde(default)]
        meta: InputMeta,
    },
    /// Inject into the running turn `turn_id` at its next step boundary (between actions;
    /// a `sleep` action is a "tool call" that is never cut short). Answered with
    /// `steer_accepted` or `steer_rejected` (no such turn running).
    Steer {
        id: String,
        text: String,
        turn_id: String,
        #[serde(default)]
        meta: InputMeta,
    },
    /// Stop the running turn; it ends with status `interrupted`. A `sleep` action is cut off
    /// at once (`tool_aborted`); any other action finishes first.
    Abort,
    /// Finish the current action, then exit 0.
    Shutdown,
}

/// Harness -> host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Output {
    /// The harness has read its system prompt and script and accepts input.
    Ready { pid: u32 },
    /// A turn started for input `input_id`.
    TurnStarted { turn_id: String, input_id: String },
    /// Model text.
    Text { turn_id: String, text: String },
    /// A tool call began (`sleep` actions appear as tool `sleep`).
    ToolStarted { turn_id: String, call_id: String, name: String, args: Value },
    /// A tool call finished; `is_error` carries MCP tool errors and transport failures.
    ToolFinished { turn_id: String, call_id: String, name: String, is_error: bool, output: Value },
    /// A tool call was cut off by an abort and has no result.
    ToolAborted { turn_id: String, call_id: String, name: String },
    /// The turn ended: status `completed`, `interrupted` or `failed`.
    TurnEnded { turn_id: String, status: String },
    /// A steer was taken for the running turn (like Codex's `turn/steer` reply): it is
    /// injected at the turn's next step boundary (`steer_accepted`), or rejected if the
    /// turn is interrupted first (`steer_rejected`).
    SteerQueued { id: String, turn_id: String },
    /// A steer was injected into the running turn, at `position` (inputs seen so far in it).
    SteerAccepted { id: String, turn_id: String, position: u32 },
    /// A steer could not be injected (no turn running, or a different one).
    SteerRejected { id: String, reason: String },
    /// A prompt arrived while a turn ran.
    PromptRejected { id: String, reason: String },
    /// Context compaction, `phase` is `start` or `end`.
    Compaction { phase: String },
    /// Tokens (and cost, when known) one model call of the turn used.
    Usage {
        turn_id: String,
        input_tokens: u64,
        output_tokens: u64,
        #[serde(default)]
        cache_read_tokens: u64,
        #[serde(default)]
        cache_write_tokens: u64,
        #[serde(default)]
        cost_usd: Option<f64>,
    },
    /// A free-form status line.
    Status { text: String },
    /// Something went wrong that is not a tool error (a bad input line, say).
    Error { message: String },
}
