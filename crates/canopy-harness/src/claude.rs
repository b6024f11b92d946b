//! The Claude Code adapter: `claude -p` in stream-json mode, one long-lived process per session.
//!
//! Owns the command line (lean flags, the prompt file for replace or append mode, Canopy's
//! tools as one HTTP MCP server, nothing else allowed), the per-session `HOME`, the per-agent
//! `CLAUDE_CONFIG_DIR`, and the mapping of Claude Code's stream-json lines onto the
//! normalised events. It does not decide when to send: the runner starts turns and asks for
//! steers; this codec says what Claude Code made of them.
//!
//! Conversations survive incarnations on the same machine: `CLAUDE_CONFIG_DIR` lives in the
//! agent's directory (`sessions/<agent>/claude-config`, where Claude Code keeps its
//! transcripts), a new conversation gets `--session-id <uuid>`, the codec records the id from
//! `system/init` in `sessions/<agent>/claude-session`, and the next launch passes `--resume
//! <id>` (with `--system-prompt-snapshot off`, so this incarnation's prompt is what is sent).
//! A conversation Claude Code cannot find makes it exit before it is ready; the session then
//! starts once more with a fresh conversation (see `Session::launch`). Without an agent
//! directory nothing is kept (`--no-session-persistence`).
//!
//! Protocol facts this relies on (Claude Code 2.1.332, see docs/harnesses/claude.md):
//! - Nothing is printed until the first stdin line, so the codec opens with an `initialize`
//!   control request; its `control_response` is the readiness signal.
//! - Every stdin user line carries a `uuid`, and Claude Code reports its `command_lifecycle`
//!   by that uuid: `queued`, `started` at the moment it enters the conversation, `completed`
//!   or `cancelled`. (With `--replay-user-messages` it also echoes the line, `isReplay`, but
//!   only once the model's first reply arrives, so the echo is a fallback signal.) For a line
//!   that starts a turn, `started` is the turn start; for a line written mid-turn, it is either
//!   the injection at a tool boundary (the same turn goes on) or, when the line arrived during
//!   the turn's final model call, the start of a turn of its own after `result`.
//! - `result` ends a turn (with usage and cost); `cancelled` says a queued line was dropped by
//!   an interrupt (`cancel_queued`).
//!
//! Steers therefore resolve like this: written while a tool runs, `Steered` at once (the
//! line is taken at that tool's boundary); written during a model call, the answer waits for
//! that call's outcome: a tool call (`Steered`), the echo (`Steered`, injected), or `result`
//! (`FellBack`: the line runs as the next turn). Wherever the line lands, its echo reports
//! `SteerInjected` with the turn it landed in, so the runner never delivers it twice.

use std::collections::HashMap;

use serde_json::{Value, json};
use tokio::process::Command;

use crate::HarnessKind;
use crate::PromptMode;
use crate::codec::{Codec, Decoded};
use crate::event::{Capabilities, HarnessEvent, SendMode, SendOutcome, TurnStatus, Usage};
use crate::launch::{InputContext, LaunchError, LaunchSpec, Resume};

pub const CAPABILITIES: Capabilities = HarnessKind::Claude.capabilities();

/// Files and directories inside the session directory.
pub const PROMPT_FILE: &str = "system-prompt.md";
pub const MCP_CONFIG_FILE: &str = "mcp.json";
/// `CLAUDE_CONFIG_DIR`: in the agent's directory when there is one (it holds the transcripts
/// a later incarnation resumes), else in the session directory.
pub const CONFIG_DIR: &str = "claude-config";
/// The file in the agent's directory that names the conversation to resume (a session id).
pub const CONVERSATION_FILE: &str = "claude-session";

/// Claude Code's own subagent tool (2.1.332; `Task` in older builds).
pub const SUBAGENT_TOOL: &str = "Agent";

/// Settings for a session without `--bare`: no commit or PR attribution reminder.
const NO_ATTRIBUTION: &str = r#"{"includeCoAuthoredBy":false,"attribution":{"commit":"","pr":""}}"#;

/// The MCP server name, so Canopy's tools arrive as `mcp__canopy__<tool>`.
const MCP_SERVER: &str = "canopy";
const INIT_REQUEST: &str = "canopy-initialize";

/// Environment that keeps Claude Code from phoning home or updating itself, and keeps
/// Canopy's tools in the plain tool list (no tool-search indirection).
const QUIET_ENV: &[(&str, &str)] = &[
    ("LANG", "C.UTF-8"),
    ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ("DISABLE_TELEMETRY", "1"),
    ("DISABLE_AUTOUPDATER", "1"),
    ("DISABLE_ERROR_REPORTING", "1"),
    ("CLAUDE_CODE_ATTRIBUTION_HEADER", "0"),
    ("CLAUDE_AGENT_SDK_DISABLE_BUILTIN_AGENTS", "1"),
    ("ENABLE_TOOL_SEARCH", "false"),
];

/// The credential variables a session inherits from Canopy's own environment when
/// `[harness.claude.env]` does not set them; nothing else is inherited.
pub const CREDENTIAL_ENV: &[&str] = &["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"];

/// Whether a session of this configuration has a credential: in `env`, or inherited.
pub fn has_credentials(env: &[(String, String)]) -> bool {
    CREDENTIAL_ENV.iter().any(|key| env.iter().any(|(k, _)| k == key) || std::env::var_os(key).is_some())
}

/// Which conversation a launch runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conversation {
    /// Nothing is kept on disk (`--no-session-persistence`): no agent directory.
    Ephemeral,
    /// A new conversation with this session id (`--session-id`), kept for a later resume.
    New(String),
    /// The agent's previous conversation (`--resume`), continued under the same id.
    Resume(String),
}

/// The arguments for one session, without the program. Public so tests can show exactly what
/// a session runs.
pub fn arguments(spec: &LaunchSpec, conversation: &Conversation) -> Vec<String> {
    let dir = &spec.session_dir;
    let mut args: Vec<String> = [
        "-p",
        "--input-format",
        "stream-json",
        "--output-format",
        "stream-json",
        "--verbose",
        "--replay-user-messages",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let prompt_flag = match spec.prompt.mode {
        PromptMode::Replace => "--system-prompt-file",
        PromptMode::Append => "--append-system-prompt-file",
    };
    args.push(prompt_flag.into());
    args.push(dir.join(PROMPT_FILE).display().to_string());
    // Its own subagents, when the role delegates natively: the `Agent` tool, with the
    // definitions as `--agents` (each body is the subagent's whole prompt in Claude Code).
    let mut builtin = spec.builtin_tools.clone();
    if !spec.subagents.is_empty() {
        builtin.push(SUBAGENT_TOOL.to_owned());
    }
    args.extend([
        "--strict-mcp-config".to_owned(),
        "--mcp-config".to_owned(),
        dir.join(MCP_CONFIG_FILE).display().to_string(),
        "--allowedTools".to_owned(),
        std::iter::once(format!("mcp__{MCP_SERVER}__*")).chain(builtin.iter().cloned()).collect::<Vec<_>>().join(","),
    ]);
    if !spec.subagents.is_empty() {
        let agents: serde_json::Map<String, Value> = spec
            .subagents
            .iter()
            .map(|a| (a.name.clone(), json!({ "description": a.description, "prompt": a.body })))
            .collect();
        args.extend(["--agents".to_owned(), Value::Object(agents).to_string()]);
    }
    if let Some(model) = &spec.model {
        args.push("--model".into());
        args.push(model.clone());
    }
    // Only the built-in tools the role allows (none by default), no slash commands, and no
    // settings, hooks or CLAUDE.md from the user or the project: the session sees its prompt,
    // Canopy's tools and its role's built-ins only. `--bare` would also drop the default
    // prompt that append mode keeps, so append mode turns off the setting sources instead.
    // Neither stops the transcript from being written.
    args.extend(["--tools".to_owned(), builtin.join(","), "--disable-slash-commands".to_owned()]);
    match conversation {
        Conversation::Ephemeral => args.push("--no-session-persistence".into()),
        Conversation::New(id) => args.extend(["--session-id".into(), id.clone()]),
        Conversation::Resume(id) => args.extend(["--resume".into(), id.clone()]),
    }
    if *conversation != Conversation::Ephemeral {
        // Without this, append mode (no `--bare`) records the first prompt and a resumed
        // conversation keeps sending it; this incarnation's prompt file is what counts.
        args.extend(["--system-prompt-snapshot", "off"].map(String::from));
    }
    // `--bare` also removes the `Agent` tool: a session with subagents turns off the setting
    // sources instead (as append mode does), and Claude Code's commit attribution with them.
    match (spec.prompt.mode, spec.subagents.is_empty()) {
        (PromptMode::Replace, true) => args.push("--bare".into()),
        (PromptMode::Replace, false) => {
            args.push("--setting-sources=".into());
            args.extend(["--settings".to_owned(), NO_ATTRIBUTION.to_owned()]);
        }
        (PromptMode::Append, _) => args.push("--setting-sources=".into()),
    }
    args
}

/// The `--mcp-config` document: Canopy's endpoint with this session's bearer token.
pub fn mcp_config(url: &str, token: &str) -> Value {
    json!({
        "mcpServers": {
            MCP_SERVER: { "type": "http", "url": url, "headers": { "Authorization": format!("Bearer {token}") } }
        }
    })
}

/// Whether `text` is a UUID as Claude Code's `--session-id` and `--resume` take it.
fn is_uuid(text: &str) -> bool {
    text.len() == 36
        && text.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// A fresh session id: random, version 4, variant 10xx, as Claude Code expects a UUID.
fn new_uuid() -> String {
    let hex = canopy_sys::random_hex(16).unwrap_or_else(|_| format!("{:032x}", std::process::id()));
    // 32 hex digits either way; `get` keeps a short string from panicking regardless.
    let part = |a: usize, b: usize| hex.get(a..b).unwrap_or("0").to_owned();
    format!("{}-{}-4{}-8{}-{}", part(0, 8), part(8, 12), part(13, 16), part(17, 20), part(20, 32))
}

/// Picks the conversation for this launch from the agent directory's record, and says why
/// when a record exists but cannot be used.
fn conversation(spec: &LaunchSpec, resume: Resume) -> (Conversation, Option<String>) {
    let Some(agent_dir) = &spec.agent_dir else { return (Conversation::Ephemeral, None) };
    let record = agent_dir.join(CONVERSATION_FILE);
    if resume == Resume::Fresh {
        // The resume failed: forget it, so the next start does not try it again.
        crate::launch::forget_record(&record);
        return (Conversation::New(new_uuid()), None);
    }
    match std::fs::read_to_string(&record) {
        Ok(text) if is_uuid(text.trim()) => (Conversation::Resume(text.trim().to_owned()), None),
        Ok(text) => {
            crate::launch::forget_record(&record);
            let note = format!(
                "the recorded conversation id {:?} in {} is not a session id; started a fresh conversation",
                text.trim(),
                record.display()
            );
            (Conversation::New(new_uuid()), Some(note))
        }
        Err(_) => (Conversation::New(new_uuid()), None),
    }
}

/// Writes the prompt and MCP files and adds Claude Code's arguments and environment.
pub(crate) fn prepare(spec: &LaunchSpec, command: &mut Command, resume: Resume) -> Result<Box<dyn Codec>, LaunchError> {
    let write = |name: &str, text: &[u8]| {
        let path = spec.session_dir.join(name);
        std::fs::write(&path, text).map_err(LaunchError::files(path))
    };
    write(PROMPT_FILE, spec.prompt.text().as_bytes())?;
    let mcp = serde_json::to_vec_pretty(&mcp_config(&spec.mcp_url, &spec.mcp_token)).unwrap_or_default();
    // The token is a credential: the file is created readable by the session's user only.
    crate::launch::write_private(spec.session_dir.join(MCP_CONFIG_FILE), &mcp)?;
    let config_dir = spec.agent_dir.as_ref().unwrap_or(&spec.session_dir).join(CONFIG_DIR);
    std::fs::create_dir_all(&config_dir).map_err(LaunchError::files(config_dir.clone()))?;
    let (conversation, note) = conversation(spec, resume);
    command.args(arguments(spec, &conversation)).env("CLAUDE_CONFIG_DIR", &config_dir);
    for (key, value) in QUIET_ENV {
        command.env(key, value);
    }
    for key in CREDENTIAL_ENV {
        if !spec.env.iter().any(|(k, _)| k == key)
            && let Some(value) = std::env::var_os(key)
        {
            command.env(key, value);
        }
    }
    let mut codec = ClaudeCodec { ready_note: note, ..ClaudeCodec::default() };
    if let Some(agent_dir) = &spec.agent_dir {
        codec.record = Some(agent_dir.join(CONVERSATION_FILE));
    }
    match conversation {
        Conversation::Resume(id) => {
            codec.resuming = Some(id.clone());
            codec.recorded = Some(id);
        }
        Conversation::New(_) | Conversation::Ephemeral => {}
    }
    Ok(Box::new(codec))
}

/// One stdin line Canopy wrote, by the uuid it carried.
struct Input {
    input_id: String,
    steer: bool,
    /// The send is still waiting for its answer.
    unanswered: bool,
}

struct Turn {
    id: String,
    /// Its first line entered the conversation: the model is at work.
    started: bool,
    /// Lines that entered this turn so far (the first is 0).
    lines: u32,
    interrupted: bool,
}

#[derive(Default)]
struct ClaudeCodec {
    turns: u64,
    requests: u64,
    /// The running turn (or the one Claude Code is about to start with a queued line).
    turn: Option<Turn>,
    /// Lines written that have not yet entered the conversation or been cancelled, by uuid.
    inputs: HashMap<String, Input>,
    /// Tool calls started and not yet answered: call id -> tool name.
    tools: HashMap<String, String>,
    /// The answer `written` gives for the line just written.
    answer_after_write: Option<(String, SendOutcome)>,
    compacting: bool,
    /// The agent directory's conversation record, rewritten when `system/init` names a
    /// session id other than the one recorded; `None` when nothing is kept.
    record: Option<std::path::PathBuf>,
    /// The session id the record holds.
    recorded: Option<String>,
    /// The conversation this launch resumes.
    resuming: Option<String>,
    /// A status reported right after `Ready` (why a recorded conversation was not resumed).
    ready_note: Option<String>,
}

impl ClaudeCodec {
    fn uuid() -> String {
        new_uuid()
    }

    /// Records the conversation's session id in the agent's directory, once per id: from the
    /// first `system/init` on, the transcript is on disk and a later incarnation can resume it.
    fn record(&mut self, session_id: &str, out: &mut Vec<Decoded>) {
        let Some(path) = &self.record else { return };
        if self.recorded.as_deref() == Some(session_id) || !is_uuid(session_id) {
            return;
        }
        match std::fs::write(path, format!("{session_id}\n")) {
            Ok(()) => self.recorded = Some(session_id.to_owned()),
            Err(e) => {
                // Once is enough: the next start simply begins a fresh conversation.
                self.recorded = Some(session_id.to_owned());
                out.push(Decoded::Event(HarnessEvent::Status {
                    text: format!("could not record the conversation id in {}: {e}", path.display()),
                }));
            }
        }
    }

    fn user_line(text: &str, uuid: &str) -> Vec<u8> {
        let line = json!({
            "type": "user",
            "message": { "role": "user", "content": text },
            "parent_tool_use_id": null,
            "session_id": "",
            "uuid": uuid,
        });
        serde_json::to_vec(&line).unwrap_or_default()
    }

    fn turn_id(&self) -> Option<String> {
        self.turn.as_ref().map(|t| t.id.clone())
    }

    fn new_turn(&mut self) -> Turn {
        self.turns += 1;
        Turn { id: format!("t{}", self.turns), started: false, lines: 0, interrupted: false }
    }

    /// Answers every steer still waiting with `outcome`.
    fn answer_steers(&mut self, out: &mut Vec<Decoded>, outcome: impl Fn() -> SendOutcome) {
        for input in self.inputs.values_mut().filter(|i| i.steer && i.unanswered) {
            input.unanswered = false;
            out.push(Decoded::Ack { input_id: input.input_id.clone(), outcome: outcome() });
        }
    }

    fn on_replay(&mut self, uuid: &str, out: &mut Vec<Decoded>) {
        let Some(input) = self.inputs.remove(uuid) else { return };
        if self.turn.is_none() {
            // Echoed with no turn known (a line Claude Code took on its own): a new turn.
            self.turn = Some(self.new_turn());
        }
        let Some(turn) = self.turn.as_mut() else { return };
        let turn_id = turn.id.clone();
        if !turn.started {
            turn.started = true;
            out.push(Decoded::Event(HarnessEvent::TurnStarted { turn_id: turn_id.clone() }));
        } else {
            turn.lines += 1;
        }
        let position = turn.lines;
        if !input.steer {
            out.push(Decoded::Ack { input_id: input.input_id, outcome: SendOutcome::Started { turn_id } });
            return;
        }
        if input.unanswered {
            out.push(Decoded::Ack {
                input_id: input.input_id.clone(),
                outcome: SendOutcome::Steered { turn_id: turn_id.clone() },
            });
        }
        out.push(Decoded::Event(HarnessEvent::SteerInjected { input_id: input.input_id, turn_id, position }));
    }

    fn on_assistant(&mut self, line: &Value, out: &mut Vec<Decoded>) {
        let turn_id = self.turn_id();
        let Some(blocks) = own_blocks(line, "assistant", out) else { return };
        let mut calls_tool = false;
        for block in blocks {
            match block.get("type").and_then(Value::as_str) {
                Some("text") => {
                    let text = block.get("text").and_then(Value::as_str).unwrap_or_default();
                    if !text.is_empty() {
                        out.push(Decoded::Event(HarnessEvent::Text {
                            turn_id: turn_id.clone(),
                            text: text.to_owned(),
                        }));
                    }
                }
                Some("tool_use") => {
                    calls_tool = true;
                    let call_id = block.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
                    let name = block.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
                    self.tools.insert(call_id.clone(), name.clone());
                    out.push(Decoded::Event(HarnessEvent::ToolRunning {
                        turn_id: turn_id.clone(),
                        call_id,
                        name,
                        args: block.get("input").cloned().unwrap_or(Value::Null),
                    }));
                }
                // Raw reasoning is never shown; other block kinds carry nothing to report.
                _ => {}
            }
        }
        if calls_tool && let Some(turn_id) = turn_id {
            // A model call that produced a tool call: lines waiting now are taken at its
            // boundary, in this turn.
            self.answer_steers(out, || SendOutcome::Steered { turn_id: turn_id.clone() });
        }
    }

    fn on_user(&mut self, line: &Value, out: &mut Vec<Decoded>) {
        if line.get("isReplay").and_then(Value::as_bool) == Some(true) {
            if let Some(uuid) = line.get("uuid").and_then(Value::as_str) {
                let uuid = uuid.to_owned();
                self.on_replay(&uuid, out);
            }
            return;
        }
        let Some(blocks) = own_blocks(line, "tool_results", out) else { return };
        let turn_id = self.turn_id();
        for block in blocks.iter().filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result")) {
            let call_id = block.get("tool_use_id").and_then(Value::as_str).unwrap_or_default().to_owned();
            let name = self.tools.remove(&call_id).unwrap_or_default();
            let output = block.get("content").cloned().unwrap_or(Value::Null);
            let interrupted = self.turn.as_ref().is_some_and(|t| t.interrupted);
            let event = match block.get("is_error").and_then(Value::as_bool) {
                Some(true) if interrupted => HarnessEvent::ToolAborted { turn_id: turn_id.clone(), call_id, name },
                Some(true) => HarnessEvent::ToolFailed { turn_id: turn_id.clone(), call_id, name, output },
                _ => HarnessEvent::ToolResult { turn_id: turn_id.clone(), call_id, name, output },
            };
            out.push(Decoded::Event(event));
        }
    }

    fn on_result(&mut self, line: &Value, out: &mut Vec<Decoded>) {
        let Some(turn) = self.turn.take() else { return };
        let number = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
        let usage = line.get("usage");
        let usage = Usage {
            input_tokens: number(usage.and_then(|u| u.get("input_tokens"))),
            output_tokens: number(usage.and_then(|u| u.get("output_tokens"))),
            cache_read_tokens: number(usage.and_then(|u| u.get("cache_read_input_tokens"))),
            cache_write_tokens: number(usage.and_then(|u| u.get("cache_creation_input_tokens"))),
            cost_usd: line.get("total_cost_usd").and_then(Value::as_f64),
        };
        out.push(Decoded::Event(HarnessEvent::Usage { turn_id: Some(turn.id.clone()), usage }));
        let status = match line.get("subtype").and_then(Value::as_str) {
            Some("success") => TurnStatus::Completed,
            _ if turn.interrupted => TurnStatus::Interrupted,
            _ => TurnStatus::Failed,
        };
        if status == TurnStatus::Failed {
            let reason = line
                .get("result")
                .or_else(|| line.get("errors"))
                .or_else(|| line.get("subtype"))
                .map(Value::to_string)
                .unwrap_or_default();
            out.push(Decoded::Event(HarnessEvent::Status { text: format!("the turn failed: {reason}") }));
        }
        for (call_id, name) in self.tools.drain() {
            out.push(Decoded::Event(HarnessEvent::ToolAborted { turn_id: Some(turn.id.clone()), call_id, name }));
        }
        out.push(Decoded::Event(HarnessEvent::TurnEnded { turn_id: turn.id, status }));
        // Lines that arrived during the final model call were not taken into this turn:
        // the caller learns they fell back, and Claude Code runs them as the next turn.
        self.answer_steers(out, || SendOutcome::FellBack {
            reason: "it arrived during the turn's final model call; it runs as the next turn".into(),
        });
        if !self.inputs.is_empty() {
            self.turn = Some(self.new_turn());
        }
    }

    fn on_lifecycle(&mut self, line: &Value, out: &mut Vec<Decoded>) {
        let Some(uuid) = line.get("command_uuid").and_then(Value::as_str) else { return };
        match line.get("state").and_then(Value::as_str) {
            // The line entered the conversation: a turn start, or a steer taken at a tool
            // boundary (or opening a turn of its own). The echo that follows is a no-op.
            Some("started") => {
                let uuid = uuid.to_owned();
                return self.on_replay(&uuid, out);
            }
            Some("cancelled") => {}
            _ => return,
        }
        let Some(input) = self.inputs.remove(uuid) else { return };
        let reason = "the turn was interrupted before it was taken".to_owned();
        if input.unanswered {
            let outcome = if input.steer {
                SendOutcome::FellBack { reason: reason.clone() }
            } else {
                SendOutcome::Refused { reason: reason.clone() }
            };
            out.push(Decoded::Ack { input_id: input.input_id.clone(), outcome });
        }
        if input.steer {
            out.push(Decoded::Event(HarnessEvent::SteerDropped { input_id: input.input_id, reason }));
        }
        // A turn Claude Code was about to start only for cancelled lines never starts.
        if self.turn.as_ref().is_some_and(|t| !t.started) && self.inputs.is_empty() {
            self.turn = None;
        }
    }

    fn on_system(&mut self, line: &Value, out: &mut Vec<Decoded>) {
        let event = |e| Decoded::Event(e);
        match line.get("subtype").and_then(Value::as_str) {
            Some("init") => {
                if let Some(session_id) = line.get("session_id").and_then(Value::as_str) {
                    self.record(session_id, out);
                }
                let servers = line.get("mcp_servers").and_then(Value::as_array).cloned().unwrap_or_default();
                let canopy = servers
                    .iter()
                    .find(|s| s.get("name").and_then(Value::as_str) == Some(MCP_SERVER))
                    .and_then(|s| s.get("status"))
                    .and_then(Value::as_str)
                    .unwrap_or("missing");
                if canopy != "connected" {
                    out.push(event(HarnessEvent::Status {
                        text: format!("Canopy's tools are not available to the model (MCP server {canopy})"),
                    }));
                }
            }
            Some("status") => match line.get("status").and_then(Value::as_str) {
                Some("compacting") if !self.compacting => {
                    self.compacting = true;
                    out.push(event(HarnessEvent::CompactionStarted));
                }
                Some("compacting") => {}
                _ if self.compacting => {
                    self.compacting = false;
                    out.push(event(HarnessEvent::CompactionEnded));
                }
                _ => {}
            },
            Some("compact_boundary") => {
                if !self.compacting {
                    out.push(event(HarnessEvent::CompactionStarted));
                }
                self.compacting = false;
                out.push(event(HarnessEvent::CompactionEnded));
            }
            Some("api_retry") => out.push(event(api_retry(line))),
            Some(kind @ ("task_started" | "task_progress" | "task_notification")) => {
                out.push(event(subagent(kind, line)));
            }
            _ => {}
        }
    }
}

/// A model call Claude Code retries: a refused credential cannot succeed by retrying (it
/// retries for minutes); anything else is a retry worth showing.
fn api_retry(line: &Value) -> HarnessEvent {
    let status = line.get("error_status").and_then(Value::as_u64);
    let error = line.get("error").and_then(Value::as_str).unwrap_or("unknown error");
    let attempt = line.get("attempt").and_then(Value::as_u64).unwrap_or(0);
    let max = line.get("max_retries").and_then(Value::as_u64).unwrap_or(0);
    let http = status.map(|s| format!("HTTP {s}, ")).unwrap_or_default();
    match matches!(status, Some(401 | 403)) || error == "authentication_failed" {
        true => HarnessEvent::ModelError {
            text: format!(
                "the model API refused the credential ({http}{error}): set a working key ({}) in [harness.claude.env] \
                 or the environment that runs canopy; `canopy doctor` checks it",
                CREDENTIAL_ENV.join(" or ")
            ),
            fatal: true,
        },
        false => HarnessEvent::ModelError {
            text: format!("the model API call failed ({http}{error}); retry {attempt} of {max}"),
            fatal: false,
        },
    }
}

/// The content blocks of an `assistant` or `user` line's message, or `None` for a subagent's
/// step (the line names a `parent_tool_use_id`): that is reported as progress of the task its
/// parent tool call started, the blocks under `key`, and is not the turn's own.
fn own_blocks(line: &Value, key: &str, out: &mut Vec<Decoded>) -> Option<Vec<Value>> {
    let blocks = line.pointer("/message/content").and_then(Value::as_array).cloned().unwrap_or_default();
    let Some(parent) = line.get("parent_tool_use_id").and_then(Value::as_str) else { return Some(blocks) };
    out.push(Decoded::Event(HarnessEvent::SubagentProgress { id: parent.to_owned(), detail: json!({ key: blocks }) }));
    None
}

/// A background task or subagent event (`task_started`, `task_progress`, `task_notification`).
fn subagent(kind: &str, line: &Value) -> HarnessEvent {
    let id =
        line.get("task_id").or_else(|| line.get("tool_use_id")).and_then(Value::as_str).unwrap_or_default().to_owned();
    let detail = line.clone();
    match kind {
        "task_started" => HarnessEvent::SubagentStarted { id, detail },
        "task_progress" => HarnessEvent::SubagentProgress { id, detail },
        _ => HarnessEvent::SubagentEnded { id, detail },
    }
}

impl Codec for ClaudeCodec {
    fn resuming(&self) -> Option<String> {
        self.resuming.clone()
    }

    fn start(&mut self) -> Vec<Vec<u8>> {
        let line =
            json!({ "type": "control_request", "request_id": INIT_REQUEST, "request": { "subtype": "initialize" } });
        vec![serde_json::to_vec(&line).unwrap_or_default()]
    }

    fn answer_now(&mut self, mode: &SendMode) -> Option<SendOutcome> {
        match (mode, &self.turn) {
            (SendMode::NextTurn, Some(turn)) => {
                Some(SendOutcome::Refused { reason: format!("turn {} is running", turn.id) })
            }
            (SendMode::NextTurn, None) => None,
            (SendMode::Steer { turn_id }, Some(turn)) if turn.started && &turn.id == turn_id && !turn.interrupted => {
                None
            }
            (SendMode::Steer { turn_id }, _) => {
                Some(SendOutcome::FellBack { reason: format!("turn {turn_id} is over") })
            }
        }
    }

    fn encode_send(&mut self, input_id: &str, text: &str, _context: &InputContext, mode: &SendMode) -> Vec<u8> {
        let uuid = Self::uuid();
        let steer = matches!(mode, SendMode::Steer { .. });
        if !steer && self.turn.is_none() {
            self.turn = Some(self.new_turn());
        }
        if steer && !self.tools.is_empty() {
            // A tool is running: Claude Code takes the line at that tool's boundary.
            let turn_id = self.turn_id().unwrap_or_default();
            self.answer_after_write = Some((input_id.to_owned(), SendOutcome::Steered { turn_id }));
        }
        let unanswered = !(steer && self.answer_after_write.is_some());
        self.inputs.insert(uuid.clone(), Input { input_id: input_id.to_owned(), steer, unanswered });
        Self::user_line(text, &uuid)
    }

    fn written(&mut self, input_id: &str) -> Option<SendOutcome> {
        match self.answer_after_write.take() {
            Some((id, outcome)) if id == input_id => Some(outcome),
            other => {
                self.answer_after_write = other;
                None
            }
        }
    }

    fn encode_interrupt(&mut self) -> Vec<u8> {
        let Some(turn) = self.turn.as_mut() else { return Vec::new() };
        turn.interrupted = true;
        self.requests += 1;
        let line = json!({
            "type": "control_request",
            "request_id": format!("canopy-interrupt-{}", self.requests),
            "request": { "subtype": "interrupt", "cancel_queued": true },
        });
        serde_json::to_vec(&line).unwrap_or_default()
    }

    fn encode_shutdown(&mut self) -> Vec<u8> {
        // Closing stdin is Claude Code's stop: the current turn finishes, then it exits 0.
        Vec::new()
    }

    fn decode(&mut self, bytes: &[u8]) -> Vec<Decoded> {
        let line: Value = match serde_json::from_slice(bytes) {
            Ok(Value::Object(map)) => Value::Object(map),
            Ok(_) => return vec![Decoded::Event(HarnessEvent::Malformed { reason: "not a JSON object".into() })],
            Err(e) => return vec![Decoded::Event(HarnessEvent::Malformed { reason: e.to_string() })],
        };
        let mut out = Vec::new();
        match line.get("type").and_then(Value::as_str) {
            Some("control_response") => {
                let response = line.get("response");
                let id = response.and_then(|r| r.get("request_id")).and_then(Value::as_str);
                if id == Some(INIT_REQUEST) {
                    if response.and_then(|r| r.get("subtype")).and_then(Value::as_str) != Some("success") {
                        let text = format!("Claude Code refused initialize: {}", response.cloned().unwrap_or_default());
                        out.push(Decoded::Event(HarnessEvent::Status { text }));
                    }
                    out.push(Decoded::Event(HarnessEvent::Ready));
                    if let Some(text) = self.ready_note.take() {
                        out.push(Decoded::Event(HarnessEvent::Status { text }));
                    }
                }
            }
            Some("control_request") => {
                // Claude Code asks the host something (a permission, a hook). Canopy grants
                // nothing beyond `--allowedTools`, so the answer is a refusal, never silence.
                let request_id = line.get("request_id").cloned().unwrap_or(Value::Null);
                let reply = json!({
                    "type": "control_response",
                    "response": { "subtype": "error", "request_id": request_id, "error": "not supported by Canopy" },
                });
                out.push(Decoded::Write(serde_json::to_vec(&reply).unwrap_or_default()));
            }
            Some("system") => self.on_system(&line, &mut out),
            Some("assistant") => self.on_assistant(&line, &mut out),
            Some("user") => self.on_user(&line, &mut out),
            Some("result") => self.on_result(&line, &mut out),
            Some("command_lifecycle") => self.on_lifecycle(&line, &mut out),
            Some("rate_limit_event") => {
                let info = line.get("rate_limit_info").cloned().unwrap_or(Value::Null);
                let status = info.get("status").and_then(Value::as_str).unwrap_or("unknown");
                if status != "allowed" {
                    out.push(Decoded::Event(HarnessEvent::RateLimited { detail: info.to_string() }));
                }
            }
            Some(kind @ ("task_started" | "task_progress" | "task_notification")) => {
                out.push(Decoded::Event(subagent(kind, &line)));
            }
            // Partial messages, tool heartbeats, UI hints: nothing the operator needs.
            _ => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

    use super::*;
    use crate::launch::Prompt;

    fn decode(codec: &mut ClaudeCodec, line: Value) -> Vec<Decoded> {
        codec.decode(&serde_json::to_vec(&line).unwrap())
    }

    fn events(decoded: &[Decoded]) -> Vec<HarnessEvent> {
        decoded
            .iter()
            .filter_map(|d| match d {
                Decoded::Event(e) => Some(e.clone()),
                _ => None,
            })
            .collect()
    }

    fn acks(decoded: &[Decoded]) -> Vec<(String, SendOutcome)> {
        decoded
            .iter()
            .filter_map(|d| match d {
                Decoded::Ack { input_id, outcome } => Some((input_id.clone(), outcome.clone())),
                _ => None,
            })
            .collect()
    }

    fn uuid_of(line: &[u8]) -> String {
        let v: Value = serde_json::from_slice(line).unwrap();
        v["uuid"].as_str().unwrap().to_owned()
    }

    fn replay(uuid: &str) -> Value {
        json!({"type":"user","message":{"role":"user","content":"x"},"uuid":uuid,"isReplay":true,"parent_tool_use_id":null})
    }

    fn start_turn(codec: &mut ClaudeCodec) -> String {
        assert!(codec.answer_now(&SendMode::NextTurn).is_none());
        let line = codec.encode_send("first", "hello", &InputContext::default(), &SendMode::NextTurn);
        let out = decode(codec, replay(&uuid_of(&line)));
        assert_eq!(acks(&out), vec![("first".into(), SendOutcome::Started { turn_id: "t1".into() })]);
        "t1".into()
    }

    fn spec(agent_dir: Option<&std::path::Path>, prompt: Prompt) -> LaunchSpec {
        LaunchSpec {
            session_dir: "/s/a/1".into(),
            agent_dir: agent_dir.map(std::path::Path::to_owned),
            cwd: "/w".into(),
            prompt,
            ..crate::launch::test_spec(crate::HarnessKind::Claude, std::path::Path::new("/nonexistent"))
        }
    }

    #[test]
    fn a_recorded_session_id_is_resumed_and_an_unreadable_one_is_replaced_with_a_note() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join(CONVERSATION_FILE);
        let replace = spec(Some(dir.path()), Prompt::replace("p".into()));
        let (first, note) = conversation(&replace, Resume::IfRecorded);
        assert!(matches!(&first, Conversation::New(id) if is_uuid(id)) && note.is_none(), "{first:?}");
        let args = arguments(&replace, &first);
        assert!(args.contains(&"--session-id".into()) && !args.contains(&"--no-session-persistence".into()));
        assert!(args.windows(2).any(|w| w == ["--system-prompt-snapshot", "off"]), "{args:?}");

        let id = "0badc0de-0000-4000-8000-000000000000";
        std::fs::write(&record, format!("{id}\n")).unwrap();
        assert_eq!(conversation(&replace, Resume::IfRecorded), (Conversation::Resume(id.into()), None));
        let append = spec(Some(dir.path()), Prompt::append("d".into()));
        let args = arguments(&append, &Conversation::Resume(id.into()));
        assert!(args.windows(2).any(|w| w == ["--resume", id]) && args.contains(&"--setting-sources=".into()));
        // A failed resume forgets the record.
        assert!(matches!(conversation(&replace, Resume::Fresh), (Conversation::New(_), None)));
        assert!(!record.exists());

        std::fs::write(&record, "not-a-uuid").unwrap();
        let (fresh, note) = conversation(&replace, Resume::IfRecorded);
        assert!(matches!(fresh, Conversation::New(_)) && note.unwrap().contains("not-a-uuid"));

        let ephemeral = spec(None, Prompt::replace("p".into()));
        assert_eq!(conversation(&ephemeral, Resume::IfRecorded), (Conversation::Ephemeral, None));
        let args = arguments(&ephemeral, &Conversation::Ephemeral);
        assert!(
            args.contains(&"--no-session-persistence".into()) && !args.contains(&"--system-prompt-snapshot".into())
        );
    }

    #[test]
    fn init_records_the_session_id_once() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join(CONVERSATION_FILE);
        let mut codec = ClaudeCodec { record: Some(record.clone()), ..ClaudeCodec::default() };
        let id = "0badc0de-0000-4000-8000-000000000001";
        let init = json!({"type":"system","subtype":"init","session_id":id,
                          "mcp_servers":[{"name":"canopy","status":"connected"}]});
        assert!(decode(&mut codec, init.clone()).is_empty());
        assert_eq!(std::fs::read_to_string(&record).unwrap().trim(), id);
        std::fs::remove_file(&record).unwrap();
        decode(&mut codec, init);
        assert!(!record.exists(), "written once per id");
    }

    #[test]
    fn readiness_is_the_answer_to_initialize() {
        let mut codec = ClaudeCodec::default();
        let start = codec.start();
        assert!(String::from_utf8_lossy(&start[0]).contains("initialize"));
        let out = decode(
            &mut codec,
            json!({"type":"control_response","response":{"subtype":"success","request_id":INIT_REQUEST,"response":{}}}),
        );
        assert_eq!(events(&out), vec![HarnessEvent::Ready]);
    }

    #[test]
    fn a_turn_maps_tools_text_usage_and_end() {
        let mut codec = ClaudeCodec::default();
        let turn = start_turn(&mut codec);
        let out = decode(
            &mut codec,
            json!({"type":"assistant","parent_tool_use_id":null,"message":{"content":[
                {"type":"text","text":"on it"},
                {"type":"tool_use","id":"toolu_1","name":"mcp__canopy__comms_post_message","input":{"body":"hi"}}]}}),
        );
        assert!(matches!(&events(&out)[..], [HarnessEvent::Text { .. }, HarnessEvent::ToolRunning { name, .. }]
            if name == "mcp__canopy__comms_post_message"));
        let out = decode(
            &mut codec,
            json!({"type":"user","parent_tool_use_id":null,"message":{"content":[
                {"type":"tool_result","tool_use_id":"toolu_1","content":"boom","is_error":true}]}}),
        );
        assert!(
            matches!(&events(&out)[..], [HarnessEvent::ToolFailed { name, .. }] if name == "mcp__canopy__comms_post_message")
        );
        let out = decode(
            &mut codec,
            json!({"type":"result","subtype":"success","total_cost_usd":0.5,
                   "usage":{"input_tokens":10,"output_tokens":3,"cache_read_input_tokens":2,"cache_creation_input_tokens":1}}),
        );
        let usage = Usage {
            input_tokens: 10,
            output_tokens: 3,
            cache_read_tokens: 2,
            cache_write_tokens: 1,
            cost_usd: Some(0.5),
        };
        assert_eq!(
            events(&out),
            vec![
                HarnessEvent::Usage { turn_id: Some(turn.clone()), usage },
                HarnessEvent::TurnEnded { turn_id: turn, status: TurnStatus::Completed }
            ]
        );
        assert!(codec.answer_now(&SendMode::NextTurn).is_none(), "idle again");
    }

    #[test]
    fn a_subagents_steps_are_progress_of_its_parent_task_not_the_turns_own() {
        let mut codec = ClaudeCodec::default();
        start_turn(&mut codec);
        let out = decode(
            &mut codec,
            json!({"type":"assistant","parent_tool_use_id":"toolu_task","message":{"content":[
                {"type":"text","text":"looking"},
                {"type":"tool_use","id":"toolu_2","name":"Read","input":{}}]}}),
        );
        assert_eq!(
            events(&out),
            vec![HarnessEvent::SubagentProgress {
                id: "toolu_task".into(),
                detail: json!({"assistant": [
                    {"type":"text","text":"looking"},
                    {"type":"tool_use","id":"toolu_2","name":"Read","input":{}}]}),
            }]
        );
        let out = decode(
            &mut codec,
            json!({"type":"user","parent_tool_use_id":"toolu_task","message":{"content":[
                {"type":"tool_result","tool_use_id":"toolu_2","content":"text"}]}}),
        );
        assert_eq!(
            events(&out),
            vec![HarnessEvent::SubagentProgress {
                id: "toolu_task".into(),
                detail: json!({"tool_results": [{"type":"tool_result","tool_use_id":"toolu_2","content":"text"}]}),
            }]
        );
    }

    #[test]
    fn a_steer_during_a_tool_call_is_steered_then_injected() {
        let mut codec = ClaudeCodec::default();
        let turn = start_turn(&mut codec);
        decode(
            &mut codec,
            json!({"type":"assistant","message":{"content":[{"type":"tool_use","id":"a","name":"t","input":{}}]}}),
        );
        let mode = SendMode::Steer { turn_id: turn.clone() };
        assert!(codec.answer_now(&mode).is_none());
        let line = codec.encode_send("steer-7", "news", &InputContext::default(), &mode);
        assert_eq!(codec.written("steer-7"), Some(SendOutcome::Steered { turn_id: turn.clone() }));
        decode(
            &mut codec,
            json!({"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"a","content":"ok"}]}}),
        );
        let out = decode(&mut codec, replay(&uuid_of(&line)));
        assert_eq!(
            events(&out),
            vec![HarnessEvent::SteerInjected { input_id: "steer-7".into(), turn_id: turn, position: 1 }]
        );
        assert!(acks(&out).is_empty(), "answered already");
    }

    #[test]
    fn a_steer_during_the_final_call_falls_back_and_runs_as_the_next_turn() {
        let mut codec = ClaudeCodec::default();
        let turn = start_turn(&mut codec);
        let mode = SendMode::Steer { turn_id: turn.clone() };
        let line = codec.encode_send("steer-9", "late", &InputContext::default(), &mode);
        assert_eq!(codec.written("steer-9"), None, "the answer waits for the model call");
        decode(&mut codec, json!({"type":"assistant","message":{"content":[{"type":"text","text":"done"}]}}));
        let out = decode(&mut codec, json!({"type":"result","subtype":"success","usage":{}}));
        assert!(matches!(&acks(&out)[..], [(id, SendOutcome::FellBack { .. })] if id == "steer-9"));
        assert!(matches!(codec.answer_now(&SendMode::NextTurn), Some(SendOutcome::Refused { .. })), "busy");
        let out = decode(&mut codec, replay(&uuid_of(&line)));
        assert_eq!(
            events(&out),
            vec![
                HarnessEvent::TurnStarted { turn_id: "t2".into() },
                HarnessEvent::SteerInjected { input_id: "steer-9".into(), turn_id: "t2".into(), position: 0 }
            ]
        );
    }

    #[test]
    fn an_interrupt_cancels_queued_steers_and_ends_the_turn_interrupted() {
        let mut codec = ClaudeCodec::default();
        let turn = start_turn(&mut codec);
        let mode = SendMode::Steer { turn_id: turn.clone() };
        let line = codec.encode_send("steer-3", "x", &InputContext::default(), &mode);
        assert!(String::from_utf8_lossy(&codec.encode_interrupt()).contains("interrupt"));
        let out =
            decode(&mut codec, json!({"type":"command_lifecycle","command_uuid":uuid_of(&line),"state":"cancelled"}));
        assert!(matches!(&acks(&out)[..], [(_, SendOutcome::FellBack { .. })]));
        assert!(matches!(&events(&out)[..], [HarnessEvent::SteerDropped { .. }]));
        let out = decode(&mut codec, json!({"type":"result","subtype":"error_during_execution","usage":{}}));
        assert!(events(&out).contains(&HarnessEvent::TurnEnded { turn_id: turn, status: TurnStatus::Interrupted }));
        assert!(codec.answer_now(&SendMode::NextTurn).is_none(), "usable again");
    }

    #[test]
    fn lifecycle_started_opens_the_turn_and_the_later_echo_is_a_no_op() {
        let mut codec = ClaudeCodec::default();
        let line = codec.encode_send("first", "hi", &InputContext::default(), &SendMode::NextTurn);
        let uuid = uuid_of(&line);
        let out = decode(&mut codec, json!({"type":"command_lifecycle","command_uuid":uuid,"state":"queued"}));
        assert!(out.is_empty());
        let out = decode(&mut codec, json!({"type":"command_lifecycle","command_uuid":uuid,"state":"started"}));
        assert_eq!(acks(&out), vec![("first".into(), SendOutcome::Started { turn_id: "t1".into() })]);
        assert_eq!(events(&out), vec![HarnessEvent::TurnStarted { turn_id: "t1".into() }]);
        assert!(decode(&mut codec, replay(&uuid)).is_empty());
    }

    #[test]
    fn unreadable_lines_are_malformed_not_fatal() {
        let mut codec = ClaudeCodec::default();
        assert!(matches!(&events(&codec.decode(b"{nope"))[..], [HarnessEvent::Malformed { .. }]));
        assert!(matches!(&events(&codec.decode(b"[1]"))[..], [HarnessEvent::Malformed { .. }]));
        assert!(codec.decode(br#"{"type":"result"}"#).is_empty(), "a result with no turn is ignored");
    }

    #[test]
    fn permission_requests_are_refused_not_ignored() {
        let mut codec = ClaudeCodec::default();
        let out = decode(
            &mut codec,
            json!({"type":"control_request","request_id":"q1","request":{"subtype":"can_use_tool"}}),
        );
        assert!(matches!(&out[..], [Decoded::Write(line)] if String::from_utf8_lossy(line).contains("q1")));
    }
}
