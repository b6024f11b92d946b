//! The oh-my-pi adapter: `omp --mode rpc`, newline-delimited JSON commands and events on
//! stdio, one long-lived process per session ([notes](../../../docs/harnesses/omp.md)).
//!
//! Owns omp's private agent directory (`PI_CODING_AGENT_DIR`, in the agent's directory so a
//! later incarnation resumes): `models.yml` with the one configured provider, `config.yml`
//! with update checks, auto-QA, web search, background bash, async tasks and every built-in
//! and foreign provider off (so nothing but the model endpoint and the MCP endpoint is
//! contacted), `mcp.json` for Canopy's endpoint with the session's bearer token and top-level
//! tools (`tools.xdev: false`); the subagent definitions in the session's private
//! `$HOME/.omp/agent/agents/`, where omp's `task` tool finds them; the command line (replace
//! or append prompt file, `--resume`); and the mapping of omp's events onto the normalised
//! ones. It does not decide when to send.
//!
//! The codec also speaks pi's dialect of the same protocol (`pi.rs` prepares pi's launch).
//!
//! Protocol facts this relies on (omp 18.2.3, see docs/harnesses/omp.md):
//! - The first line is `{"type":"ready",...}`: the readiness signal.
//! - omp has no turn id: a turn is Canopy's, from a `prompt`'s success response to the
//!   terminal `agent_end`, numbered `t1`, `t2`, ... by this codec.
//! - A `steer` is queued and, with background bash off, lands at the next step boundary
//!   (after the running tool) as a user message flagged `steering: true`, in the same run.
//! - `abort` ends the run with an aborted assistant message; the abort's response comes last.
//! - `get_state` answers with the session file, recorded so the next launch resumes it.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;

use serde_json::{Value, json};
use tokio::process::Command;

use crate::HarnessKind;
use crate::PromptMode;
use crate::codec::{Codec, Decoded};
use crate::event::{Capabilities, HarnessEvent, SendMode, SendOutcome, TurnStatus, Usage};
use crate::launch::{InputContext, LaunchError, LaunchSpec, Resume, write_private};

pub const CAPABILITIES: Capabilities = HarnessKind::Omp.capabilities();

/// The prompt file in the session directory.
pub const PROMPT_FILE: &str = "system-prompt.md";
/// omp's agent directory, in the agent's directory (it holds the sessions a later
/// incarnation resumes).
pub const AGENT_DIR: &str = "omp-agent";
/// The file in the agent's directory that names the session file to resume.
pub const CONVERSATION_FILE: &str = "omp-session";
/// The provider id in `models.yml`, so the model is `canopy/<model>`.
const PROVIDER: &str = "canopy";
/// The MCP server name: Canopy's tools arrive as `mcp__canopy_<tool>`.
pub const MCP_SERVER: &str = "canopy";
const STATE_REQUEST: &str = "canopy-state";
/// pi prints nothing until asked: its first `get_state` answer is the readiness signal.
const READY_REQUEST: &str = "canopy-ready";
const SUBSCRIBE_REQUEST: &str = "canopy-subagents";
const ABORT_REQUEST: &str = "canopy-abort";

/// Every provider id omp 18.2.3 knows (its catalog), all disabled so startup contacts none.
const BUILTIN_PROVIDERS: &str = include_str!("omp-disabled-providers.json");
/// Other tools' configuration omp would read from the project (`.claude/`, `CLAUDE.md`, ...).
const FOREIGN_PROVIDERS: &[&str] = &[
    "claude",
    "codex",
    "gemini",
    "opencode",
    "cursor",
    "windsurf",
    "cline",
    "github",
    "vscode",
    "claude-plugins",
    "agent-plugins",
];

/// Environment that keeps omp quiet and its behaviour fixed.
const QUIET_ENV: &[(&str, &str)] =
    &[("LANG", "C.UTF-8"), ("TERM", "dumb"), ("PI_AUTO_QA", "0"), ("OTEL_SDK_DISABLED", "true"), ("NO_COLOR", "1")];

/// Claude Code's tool names (the roles' `harness_tools`) as omp's.
pub(crate) fn omp_tool(name: &str) -> String {
    name.to_ascii_lowercase()
}

/// The `config.yml` document (JSON is YAML).
pub fn config() -> Value {
    let mut disabled: Vec<Value> = serde_json::from_str(BUILTIN_PROVIDERS).unwrap_or_default();
    disabled.extend(FOREIGN_PROVIDERS.iter().map(|p| Value::String((*p).to_owned())));
    json!({
        "startup": { "checkUpdate": false },
        "dev": { "autoqa": false },
        "disabledProviders": disabled,
        "web_search": { "enabled": false },
        "tools": { "xdev": false },
        "bash": { "autoBackground": { "enabled": false } },
        "async": { "enabled": false },
    })
}

/// The `models.yml` document: the one provider and model a session may use.
pub fn models(base_url: &str, api: &str, api_key_env: Option<&str>, model: &str) -> Value {
    json!({
        "providers": {
            PROVIDER: {
                "baseUrl": base_url,
                "apiKey": api_key_env.unwrap_or("CANOPY_OMP_NO_KEY"),
                "auth": "apiKey",
                "api": api,
                "models": [{
                    "id": model, "name": model, "reasoning": false, "input": ["text"],
                    "contextWindow": 200000, "maxTokens": 8192,
                    "cost": { "input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0 }
                }]
            }
        }
    })
}

/// The `mcp.json` document: Canopy's endpoint with this session's token.
pub fn mcp_config(url: &str, token: &str) -> Value {
    json!({
        "mcpServers": {
            MCP_SERVER: { "type": "http", "url": url, "headers": { "Authorization": format!("Bearer {token}") } }
        }
    })
}

/// The one provider and the model `[harness.<table>]` must name for omp and pi.
pub(crate) fn provider_and_model<'a>(
    spec: &'a LaunchSpec,
    table: &str,
) -> Result<(&'a crate::ProviderSettings, &'a str), LaunchError> {
    let provider = spec.provider.as_ref().ok_or_else(|| {
        LaunchError::Invalid(format!(
            "[harness.{table}.provider] is not set: {table} needs the one model endpoint it may use"
        ))
    })?;
    let model = spec.model.as_deref().ok_or_else(|| {
        LaunchError::Invalid(format!("[harness.{table}] model is not set: name the model id at the provider"))
    })?;
    Ok((provider, model))
}

/// The session file a launch resumes: the one `record` names when it exists (and an agent
/// directory keeps it); after a failed resume, none, and the record is dropped.
pub(crate) fn recorded_session(spec: &LaunchSpec, record: &std::path::Path, resume: Resume) -> Option<String> {
    match resume {
        Resume::Fresh => {
            crate::launch::forget_record(record);
            None
        }
        Resume::IfRecorded if spec.agent_dir.is_some() => std::fs::read_to_string(record)
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|path| !path.is_empty() && std::path::Path::new(path).is_file()),
        Resume::IfRecorded => None,
    }
}

/// Adds `quiet` and the provider's API key (inherited by name when `[harness.<h>.env]` does
/// not set it) to the command's environment.
pub(crate) fn quiet_env(
    command: &mut Command,
    spec: &LaunchSpec,
    provider: &crate::ProviderSettings,
    quiet: &[(&str, &str)],
) {
    for (key, value) in quiet {
        command.env(key, value);
    }
    if let Some(key) = &provider.api_key_env
        && !spec.env.iter().any(|(k, _)| k == key)
        && let Some(value) = std::env::var_os(key)
    {
        command.env(key, value);
    }
}

/// Writes omp's agent directory, the prompt and the subagent definitions, and adds omp's
/// arguments and environment.
pub(crate) fn prepare(spec: &LaunchSpec, command: &mut Command, resume: Resume) -> Result<Box<dyn Codec>, LaunchError> {
    let (provider, model) = provider_and_model(spec, "omp")?;
    let keep = spec.agent_dir.as_ref().unwrap_or(&spec.session_dir);
    let agent_dir = keep.join(AGENT_DIR);
    std::fs::create_dir_all(&agent_dir).map_err(LaunchError::files(agent_dir.clone()))?;
    let api = provider.api.as_deref().unwrap_or("anthropic-messages");
    let docs = [
        ("models.yml", models(&provider.base_url, api, provider.api_key_env.as_deref(), model)),
        ("config.yml", config()),
        ("mcp.json", mcp_config(&spec.mcp_url, &spec.mcp_token)),
    ];
    for (name, doc) in docs {
        write_private(agent_dir.join(name), &serde_json::to_vec_pretty(&doc).unwrap_or_default())?;
    }
    write_private(spec.session_dir.join(PROMPT_FILE), spec.prompt.text().as_bytes())?;
    let agents = spec.session_dir.join("home/.omp/agent/agents");
    std::fs::create_dir_all(&agents).map_err(LaunchError::files(agents.clone()))?;
    for agent in &spec.subagents {
        let description = agent.description.replace(['\n', '"'], " ");
        let text =
            format!("---\nname: {}\ndescription: \"{description}\"\n---\n{}", agent.name, agent.body.trim_start());
        write_private(agents.join(format!("{}.md", agent.name)), text.as_bytes())?;
    }

    let record = keep.join(CONVERSATION_FILE);
    let resumed = recorded_session(spec, &record, resume);
    command.args(arguments(spec, model, resumed.as_deref())).env("PI_CODING_AGENT_DIR", &agent_dir);
    quiet_env(command, spec, provider, QUIET_ENV);
    Ok(Box::new(OmpCodec::new(Dialect::Omp, spec.agent_dir.as_ref().map(|_| record), resumed)))
}

/// The arguments for one session, without the program.
pub fn arguments(spec: &LaunchSpec, model: &str, resume: Option<&str>) -> Vec<String> {
    let prompt = spec.session_dir.join(PROMPT_FILE).display().to_string();
    let mut args = vec!["--mode".to_owned(), "rpc".to_owned(), "--model".to_owned(), format!("{PROVIDER}/{model}")];
    args.push(
        match spec.prompt.mode {
            PromptMode::Replace => "--system-prompt",
            PromptMode::Append => "--append-system-prompt",
        }
        .into(),
    );
    args.push(prompt);
    // Only the role's built-in tools (and `task` for its subagents); none at all is
    // `--no-tools`, which keeps Canopy's MCP tools.
    let mut tools: Vec<String> = spec.builtin_tools.iter().map(|t| omp_tool(t)).collect();
    if !spec.subagents.is_empty() {
        tools.push("task".into());
    }
    tools.dedup();
    match tools.is_empty() {
        true => args.push("--no-tools".to_owned()),
        false => args.extend(["--tools".to_owned(), tools.join(",")]),
    }
    if let Some(path) = resume {
        args.extend(["--resume".to_owned(), path.to_owned()]);
    }
    args
}

/// Which of the two RPC protocols the codec speaks: omp's, or pi's (which omp grew from: the
/// same commands and events, but no `ready` frame, no `steering` flag on an injected steer,
/// no `isTerminal` on `agent_end`, and no subagents).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Dialect {
    #[default]
    Omp,
    Pi,
}

/// The codec of both RPC dialects.
#[derive(Default)]
pub(crate) struct OmpCodec {
    dialect: Dialect,
    /// User messages that entered the running turn (pi: the second and later are steers).
    users: u32,
    turns: u64,
    /// The running turn.
    turn: Option<String>,
    /// The prompt written that has not been answered yet.
    prompt: Option<String>,
    /// Steers written and not yet injected, in order.
    steers: VecDeque<String>,
    /// Steers written whose response has not come yet (they are answered `Steered` then).
    unanswered: HashMap<String, String>,
    /// Lines injected into the running turn so far.
    position: u32,
    interrupted: bool,
    /// Tool calls running: call id -> tool name.
    tools: HashMap<String, String>,
    /// The agent directory's record of the session file; `None` when nothing is kept.
    record: Option<PathBuf>,
    recorded: Option<String>,
    resuming: Option<String>,
    last_error: Option<String>,
}

fn line(value: Value) -> Vec<u8> {
    serde_json::to_vec(&value).unwrap_or_default()
}

fn str_of<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or_default()
}

impl OmpCodec {
    pub(crate) fn new(dialect: Dialect, record: Option<PathBuf>, resuming: Option<String>) -> OmpCodec {
        OmpCodec { dialect, record, resuming, ..OmpCodec::default() }
    }

    fn usage(message: &Value) -> Option<Usage> {
        let usage = message.get("usage")?;
        let n = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
        Some(Usage {
            input_tokens: n("input"),
            output_tokens: n("output"),
            cache_read_tokens: n("cacheRead"),
            cache_write_tokens: n("cacheWrite"),
            cost_usd: usage.get("cost").and_then(|c| c.get("total")).and_then(Value::as_f64).filter(|c| *c > 0.0),
        })
    }

    fn on_response(&mut self, frame: &Value, out: &mut Vec<Decoded>) {
        let id = str_of(frame, "id").to_owned();
        let ok = frame.get("success").and_then(Value::as_bool) == Some(true);
        let error = str_of(frame, "error").to_owned();
        match str_of(frame, "command") {
            "prompt" if self.prompt.as_deref() == Some(id.as_str()) => {
                self.prompt = None;
                if !ok {
                    out.push(Decoded::Ack { input_id: id, outcome: SendOutcome::Refused { reason: error } });
                    return;
                }
                if self.turn.is_none() {
                    self.start_turn(out);
                }
                let turn_id = self.turn.clone().unwrap_or_default();
                out.push(Decoded::Ack { input_id: id, outcome: SendOutcome::Started { turn_id } });
            }
            "prompt" => {
                // A second answer to a prompt sent while busy: nothing more to say.
            }
            "steer" => {
                let Some(turn_id) = self.unanswered.remove(&id) else { return };
                let outcome = match ok {
                    true => SendOutcome::Steered { turn_id },
                    false => {
                        self.steers.retain(|s| *s != id);
                        SendOutcome::FellBack { reason: error }
                    }
                };
                out.push(Decoded::Ack { input_id: id, outcome });
            }
            "get_state" if id == STATE_REQUEST || id == READY_REQUEST => {
                if id == READY_REQUEST {
                    out.push(Decoded::Event(HarnessEvent::Ready));
                }
                let file = frame.get("data").map(|d| str_of(d, "sessionFile")).unwrap_or_default().to_owned();
                self.record(&file, out);
            }
            _ => {}
        }
    }

    /// Records the session file in the agent's directory, once per file.
    fn record(&mut self, file: &str, out: &mut Vec<Decoded>) {
        let Some(path) = &self.record else { return };
        if file.is_empty() || self.recorded.as_deref() == Some(file) {
            return;
        }
        self.recorded = Some(file.to_owned());
        if let Err(e) = std::fs::write(path, format!("{file}\n")) {
            out.push(Decoded::Event(HarnessEvent::Status {
                text: format!("could not record the session file in {}: {e}", path.display()),
            }));
        }
    }

    fn start_turn(&mut self, out: &mut Vec<Decoded>) {
        self.turns += 1;
        let turn_id = format!("t{}", self.turns);
        self.turn = Some(turn_id.clone());
        self.position = 0;
        self.users = 0;
        self.interrupted = false;
        self.last_error = None;
        out.push(Decoded::Event(HarnessEvent::TurnStarted { turn_id }));
    }

    fn end_turn(&mut self, out: &mut Vec<Decoded>) {
        let Some(turn_id) = self.turn.take() else { return };
        // A steer never taken by the run falls back to the next turn start.
        for input_id in self.steers.drain(..) {
            out.push(Decoded::Event(HarnessEvent::SteerDropped {
                input_id,
                reason: "the turn ended before the steer was taken".into(),
            }));
        }
        for (input_id, _) in self.unanswered.drain() {
            out.push(Decoded::Ack { input_id, outcome: SendOutcome::FellBack { reason: "the turn ended".into() } });
        }
        for (call_id, name) in self.tools.drain() {
            out.push(Decoded::Event(HarnessEvent::ToolAborted { turn_id: Some(turn_id.clone()), call_id, name }));
        }
        let status = match (self.interrupted, &self.last_error) {
            (true, _) => TurnStatus::Interrupted,
            (false, Some(_)) => TurnStatus::Failed,
            (false, None) => TurnStatus::Completed,
        };
        out.push(Decoded::Event(HarnessEvent::TurnEnded { turn_id, status }));
        // Ask for the session file: from the first turn on it is on disk and can be resumed.
        out.push(Decoded::Write(line(json!({ "id": STATE_REQUEST, "type": "get_state" }))));
    }

    fn on_message_start(&mut self, message: &Value, out: &mut Vec<Decoded>) {
        if str_of(message, "role") != "user" {
            return;
        }
        self.users += 1;
        let steer = match self.dialect {
            Dialect::Omp => message.get("steering").and_then(Value::as_bool) == Some(true),
            // pi marks nothing: a user message after the turn's own prompt is a steer taken.
            Dialect::Pi => self.users > 1,
        };
        if !steer {
            return;
        }
        let (Some(turn_id), Some(input_id)) = (self.turn.clone(), self.steers.pop_front()) else { return };
        self.position += 1;
        if let Some(turn) = self.unanswered.remove(&input_id) {
            out.push(Decoded::Ack { input_id: input_id.clone(), outcome: SendOutcome::Steered { turn_id: turn } });
        }
        out.push(Decoded::Event(HarnessEvent::SteerInjected { input_id, turn_id, position: self.position }));
    }

    fn on_message_end(&mut self, message: &Value, out: &mut Vec<Decoded>) {
        if str_of(message, "role") != "assistant" {
            return;
        }
        let turn_id = self.turn.clone();
        for block in message.get("content").and_then(Value::as_array).into_iter().flatten() {
            if str_of(block, "type") == "text" {
                let text = str_of(block, "text");
                if !text.is_empty() {
                    out.push(Decoded::Event(HarnessEvent::Text { turn_id: turn_id.clone(), text: text.to_owned() }));
                }
            }
        }
        if let Some(usage) = OmpCodec::usage(message) {
            out.push(Decoded::Event(HarnessEvent::Usage { turn_id: turn_id.clone(), usage }));
        }
        match str_of(message, "stopReason") {
            "error" => {
                let error = str_of(message, "errorMessage").to_owned();
                out.push(Decoded::Event(HarnessEvent::Status { text: format!("the model call failed: {error}") }));
                self.last_error = Some(error);
            }
            "aborted" => self.interrupted = true,
            _ => {}
        }
    }

    fn on_tool_end(&mut self, frame: &Value, out: &mut Vec<Decoded>) {
        let call_id = str_of(frame, "toolCallId").to_owned();
        let name = self.tools.remove(&call_id).unwrap_or_else(|| str_of(frame, "toolName").to_owned());
        let turn_id = self.turn.clone();
        let output = frame.get("result").cloned().unwrap_or(Value::Null);
        let failed = frame.get("isError").and_then(Value::as_bool) == Some(true);
        // omp says `[Command cancelled]`, pi `Command aborted`.
        let text = output.to_string();
        let cancelled = text.contains("[Command cancelled]") || text.contains("Command aborted");
        out.push(Decoded::Event(match (failed, cancelled && self.interrupted) {
            (true, true) => HarnessEvent::ToolAborted { turn_id, call_id, name },
            (true, false) => HarnessEvent::ToolFailed { turn_id, call_id, name, output },
            (false, _) => HarnessEvent::ToolResult { turn_id, call_id, name, output },
        }));
    }
}

impl Codec for OmpCodec {
    fn resuming(&self) -> Option<String> {
        self.resuming.clone()
    }

    fn start(&mut self) -> Vec<Vec<u8>> {
        match self.dialect {
            Dialect::Omp => Vec::new(),
            Dialect::Pi => vec![line(json!({ "id": READY_REQUEST, "type": "get_state" }))],
        }
    }

    fn answer_now(&mut self, mode: &SendMode) -> Option<SendOutcome> {
        match (mode, &self.turn) {
            (SendMode::NextTurn, Some(turn_id)) => {
                Some(SendOutcome::Refused { reason: format!("turn {turn_id} is running") })
            }
            (SendMode::Steer { turn_id }, Some(running)) if running != turn_id => {
                Some(SendOutcome::FellBack { reason: format!("turn {turn_id} has ended") })
            }
            (SendMode::Steer { turn_id }, None) => {
                Some(SendOutcome::FellBack { reason: format!("turn {turn_id} has ended") })
            }
            _ => None,
        }
    }

    fn encode_send(&mut self, input_id: &str, text: &str, _context: &InputContext, mode: &SendMode) -> Vec<u8> {
        match mode {
            SendMode::NextTurn => {
                self.prompt = Some(input_id.to_owned());
                line(json!({ "id": input_id, "type": "prompt", "message": text }))
            }
            SendMode::Steer { turn_id } => {
                self.steers.push_back(input_id.to_owned());
                self.unanswered.insert(input_id.to_owned(), turn_id.clone());
                line(json!({ "id": input_id, "type": "steer", "message": text }))
            }
        }
    }

    fn encode_interrupt(&mut self) -> Vec<u8> {
        if self.turn.is_none() {
            return Vec::new();
        }
        self.interrupted = true;
        line(json!({ "id": ABORT_REQUEST, "type": "abort" }))
    }

    fn encode_shutdown(&mut self) -> Vec<u8> {
        Vec::new()
    }

    fn decode(&mut self, raw: &[u8]) -> Vec<Decoded> {
        let mut out = Vec::new();
        let frame: Value = match serde_json::from_slice(raw) {
            Ok(frame) => frame,
            Err(e) => {
                out.push(Decoded::Event(HarnessEvent::Malformed { reason: format!("not JSON: {e}") }));
                return out;
            }
        };
        match str_of(&frame, "type") {
            "ready" => {
                out.push(Decoded::Event(HarnessEvent::Ready));
                out.push(Decoded::Write(line(json!({
                    "id": SUBSCRIBE_REQUEST, "type": "set_subagent_subscription", "level": "progress"
                }))));
                out.push(Decoded::Write(line(json!({ "id": STATE_REQUEST, "type": "get_state" }))));
            }
            "response" => self.on_response(&frame, &mut out),
            "agent_start" if self.turn.is_none() => self.start_turn(&mut out),
            "message_start" => self.on_message_start(frame.get("message").unwrap_or(&Value::Null), &mut out),
            "message_end" => self.on_message_end(frame.get("message").unwrap_or(&Value::Null), &mut out),
            "tool_execution_start" => {
                let call_id = str_of(&frame, "toolCallId").to_owned();
                let name = str_of(&frame, "toolName").to_owned();
                self.tools.insert(call_id.clone(), name.clone());
                out.push(Decoded::Event(HarnessEvent::ToolRunning {
                    turn_id: self.turn.clone(),
                    call_id,
                    name,
                    args: frame.get("args").cloned().unwrap_or(Value::Null),
                }));
            }
            "tool_execution_end" => self.on_tool_end(&frame, &mut out),
            "agent_end"
                if self.dialect == Dialect::Pi || frame.get("isTerminal").and_then(Value::as_bool) != Some(false) =>
            {
                self.end_turn(&mut out)
            }
            // omp's names, then pi's.
            "auto_compaction_start" | "compaction_start" => out.push(Decoded::Event(HarnessEvent::CompactionStarted)),
            "auto_compaction_end" | "compaction_end" => out.push(Decoded::Event(HarnessEvent::CompactionEnded)),
            "auto_retry_start" => {
                let error = str_of(&frame, "errorMessage");
                out.push(Decoded::Event(HarnessEvent::ModelError {
                    text: format!("the model API call failed, retrying: {error}"),
                    fatal: crate::event::credential_refused(error),
                }));
            }
            "subagent_lifecycle" => {
                let payload = frame.get("payload").cloned().unwrap_or(Value::Null);
                let id = str_of(&payload, "id").to_owned();
                out.push(Decoded::Event(match str_of(&payload, "status") {
                    "started" => HarnessEvent::SubagentStarted { id, detail: payload },
                    _ => HarnessEvent::SubagentEnded { id, detail: payload },
                }));
            }
            "subagent_progress" => {
                let payload = frame.get("payload").cloned().unwrap_or(Value::Null);
                let id = payload.get("progress").map(|p| str_of(p, "id")).unwrap_or_default().to_owned();
                out.push(Decoded::Event(HarnessEvent::SubagentProgress { id, detail: payload }));
            }
            _ => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    fn decode(codec: &mut OmpCodec, frame: Value) -> Vec<String> {
        codec
            .decode(&serde_json::to_vec(&frame).unwrap())
            .into_iter()
            .map(|d| match d {
                Decoded::Event(e) => e.kind().to_owned(),
                Decoded::Ack { input_id, outcome } => format!("ack {input_id} {outcome:?}"),
                Decoded::Write(_) => "write".to_owned(),
            })
            .collect()
    }

    #[test]
    fn a_turn_is_numbered_by_canopy_and_a_steer_lands_at_the_step_boundary() {
        let mut codec = OmpCodec::default();
        assert_eq!(decode(&mut codec, json!({"type": "ready"})), ["ready", "write", "write"]);
        codec.encode_send("p1", "hi", &InputContext::default(), &SendMode::NextTurn);
        let started = decode(&mut codec, json!({"id": "p1", "type": "response", "command": "prompt", "success": true}));
        assert_eq!(started, ["turn_started", "ack p1 Started { turn_id: \"t1\" }"]);
        assert!(codec.answer_now(&SendMode::NextTurn).is_some(), "a second prompt waits for the turn");
        codec.encode_send("s1", "steer", &InputContext::default(), &SendMode::Steer { turn_id: "t1".into() });
        let steered = decode(&mut codec, json!({"id": "s1", "type": "response", "command": "steer", "success": true}));
        assert_eq!(steered, ["ack s1 Steered { turn_id: \"t1\" }"]);
        let injected = decode(
            &mut codec,
            json!({"type": "message_start", "message": {"role": "user", "steering": true, "content": []}}),
        );
        assert_eq!(injected, ["steer_injected"]);
        let tool = json!({"type": "tool_execution_end", "toolCallId": "c1", "toolName": "bash", "result": {}, "isError": false});
        assert_eq!(decode(&mut codec, tool), ["tool_result"]);
        let ended = decode(&mut codec, json!({"type": "agent_end", "isTerminal": true}));
        assert_eq!(ended, ["turn_ended", "write"]);
        assert!(codec.answer_now(&SendMode::Steer { turn_id: "t1".into() }).is_some(), "the turn has ended");
    }

    #[test]
    fn in_pis_dialect_readiness_is_a_state_answer_and_a_later_user_message_is_the_steer() {
        let mut codec = OmpCodec::new(Dialect::Pi, None, None);
        assert_eq!(codec.start().len(), 1, "pi is asked for its state at once");
        let ready =
            json!({"id": "canopy-ready", "type": "response", "command": "get_state", "success": true, "data": {}});
        assert_eq!(decode(&mut codec, ready), ["ready"]);
        codec.encode_send("p1", "hi", &InputContext::default(), &SendMode::NextTurn);
        decode(&mut codec, json!({"id": "p1", "type": "response", "command": "prompt", "success": true}));
        let user = json!({"type": "message_start", "message": {"role": "user", "content": []}});
        assert!(decode(&mut codec, user.clone()).is_empty(), "the turn's own prompt is no steer");
        codec.encode_send("s1", "steer", &InputContext::default(), &SendMode::Steer { turn_id: "t1".into() });
        decode(&mut codec, json!({"id": "s1", "type": "response", "command": "steer", "success": true}));
        assert_eq!(decode(&mut codec, user), ["steer_injected"]);
        assert_eq!(decode(&mut codec, json!({"type": "agent_end"})), ["turn_ended", "write"], "pi's runs always end");
    }

    #[test]
    fn the_config_turns_off_every_provider_and_background_work() {
        let config = config();
        let disabled = config["disabledProviders"].as_array().unwrap();
        assert!(
            disabled.len() > 77 && disabled.iter().any(|p| p == "anthropic") && disabled.iter().any(|p| p == "claude")
        );
        assert_eq!(config["tools"]["xdev"], false);
        assert_eq!(config["bash"]["autoBackground"]["enabled"], false);
        assert_eq!(config["web_search"]["enabled"], false);
    }
}

#[cfg(test)]
mod network {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    /// What a confined omp session may connect to: its MCP endpoint and its one provider's
    /// port, nothing else (Landlock refuses every other TCP connect, omp's own included).
    #[test]
    fn an_omp_session_reaches_only_its_mcp_endpoint_and_its_provider() {
        let dir = tempfile::tempdir().unwrap();
        let spec = LaunchSpec {
            program: PathBuf::from("/bin/sh"),
            mcp_url: "http://127.0.0.1:4101/mcp".into(),
            model: Some("m".into()),
            provider: Some(crate::ProviderSettings {
                base_url: "http://127.0.0.1:4102".into(),
                api_key_env: None,
                api: Some("anthropic-messages".into()),
            }),
            max_line_bytes: 1 << 20,
            sandbox: crate::SandboxSettings::required(dir.path().join("data")),
            ..crate::launch::test_spec(HarnessKind::Omp, dir.path())
        };
        let grants = crate::launch::grants(&spec).unwrap();
        assert_eq!(grants.connect_ports, vec![4101, 4102]);
        // A role without built-in tools gets none of omp's.
        assert!(arguments(&spec, "m", None).contains(&"--no-tools".to_owned()));
    }
}
