//! The Codex adapter: `codex app-server`, JSON-RPC over stdio (one object per line, no
//! `jsonrpc` field), mapped onto the normalised session vocabulary.
//!
//! Owns `CODEX_HOME` (per agent, so the rollout files of its threads survive incarnations; a
//! generated `config.toml`: model, provider, approval `never`, analytics and feedback off,
//! plugins and apps off), the handshake (`initialize`, `initialized`, `thread/start` with the
//! prompt and Canopy's MCP server defined for the thread, or `thread/resume` of the thread
//! recorded in `sessions/<agent>/codex-thread` with the same parameters, falling back to
//! `thread/start` with a status when Codex cannot load it; then the wait for that server's
//! `ready`), and the correlation of JSON-RPC ids
//! with Canopy's inputs: a `turn/start` answer is a `Started`, a `turn/steer` answer a
//! `Steered`, a `turn/steer` error a `FellBack`. A steer's injection is recognised by the
//! user-message item carrying the steer's input id as its client id.
//!
//! Does not decide when to steer or deliver (the runner does), does not talk to the model
//! API (Codex does), and does not read Canopy's configuration: model and provider arrive in
//! the `LaunchSpec`.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Value, json};
use tokio::process::Command;

use crate::HarnessKind;
use crate::PromptMode;
use crate::ProviderSettings;
use crate::codec::{Codec, Decoded};
use crate::event::{Capabilities, HarnessEvent, SendMode, SendOutcome, TurnStatus, Usage};
use crate::launch::{InputContext, LaunchError, LaunchSpec, Resume};
use crate::sandbox::SandboxMode;

pub const CAPABILITIES: Capabilities = HarnessKind::Codex.capabilities();

/// `CODEX_HOME`: in the agent's directory when there is one (its rollout files are the
/// threads a later incarnation resumes), else in the session directory. Not under the system
/// temporary directory: Codex refuses to create its helper binaries there.
pub const CODEX_HOME_DIR: &str = "codex-home";
/// The file in the agent's directory that names the thread to resume.
pub const THREAD_FILE: &str = "codex-thread";
pub const CONFIG_FILE: &str = "config.toml";
/// The session's system prompt (or appended delta), as sent, inside the session directory.
pub const PROMPT_FILE: &str = "system-prompt.md";
/// The name Canopy's MCP server has inside Codex; its tools arrive as the namespace
/// `mcp__canopy`.
pub const MCP_SERVER: &str = "canopy";
/// The environment variable that carries the session's bearer token to Codex's MCP client
/// (`bearer_token_env_var`), so the token is never written to a file or the thread config.
pub const TOKEN_ENV: &str = "CANOPY_MCP_TOKEN";
/// The provider Canopy defines in `config.toml`.
const PROVIDER_ID: &str = "canopy";
/// Where the provider points when `[harness.codex.provider]` is not set.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
pub const OPENAI_KEY_ENV: &str = "OPENAI_API_KEY";

/// Writes `CODEX_HOME`, adds `app-server` and the environment to `command`, and returns the
/// codec that performs the handshake.
pub(crate) fn prepare(spec: &LaunchSpec, command: &mut Command, resume: Resume) -> Result<Box<dyn Codec>, LaunchError> {
    let home = spec.agent_dir.as_ref().unwrap_or(&spec.session_dir).join(CODEX_HOME_DIR);
    std::fs::create_dir_all(&home).map_err(LaunchError::files(home.clone()))?;
    // The prompt as given, for the operator (and tests) to compare with what the model got.
    let prompt_path = spec.session_dir.join(PROMPT_FILE);
    std::fs::write(&prompt_path, spec.prompt.text()).map_err(LaunchError::files(prompt_path))?;
    let config = config_toml(spec.model.as_deref(), spec.provider.as_ref(), spec.sandbox.mode)?;
    let config_path = home.join(CONFIG_FILE);
    std::fs::write(&config_path, config).map_err(LaunchError::files(config_path))?;
    command.arg("app-server").env("CODEX_HOME", &home).env(TOKEN_ENV, &spec.mcp_token);
    // The API key is the one credential passed through from Canopy's own environment, by
    // the name the configuration gives; an entry in `[harness.codex] env` wins.
    let key_env = match &spec.provider {
        Some(provider) => provider.api_key_env.as_deref(),
        None => Some(OPENAI_KEY_ENV),
    };
    if let Some(key_env) = key_env
        && !spec.env.iter().any(|(k, _)| k == key_env)
    {
        // Without it every turn would fail at its first model call; say so at launch.
        let key = std::env::var_os(key_env).ok_or_else(|| {
            LaunchError::Invalid(format!(
                "the codex harness needs the API key in {key_env}: set it in the environment Canopy runs in, \
                 or in [harness.codex.env]"
            ))
        })?;
        command.env(key_env, key);
    }
    let mut codec = CodexCodec::new(thread_start_params(spec));
    if let Some(agent_dir) = &spec.agent_dir {
        let record = agent_dir.join(THREAD_FILE);
        match resume {
            Resume::IfRecorded => {
                let recorded = std::fs::read_to_string(&record).ok().map(|t| t.trim().to_owned());
                codec.resume = recorded.filter(|id| !id.is_empty());
                codec.recorded.clone_from(&codec.resume);
            }
            // The resume failed at the process level: forget it.
            Resume::Fresh => {
                crate::launch::forget_record(&record);
            }
        }
        codec.record = Some(record);
    }
    Ok(Box::new(codec))
}

/// `config.toml` for one session: `model` when set, and a provider that is either the
/// configured endpoint or OpenAI's own with `OPENAI_API_KEY` (a private `CODEX_HOME` holds no
/// login, so the key comes from the environment).
pub fn config_toml(
    model: Option<&str>,
    provider: Option<&ProviderSettings>,
    sandbox: SandboxMode,
) -> Result<String, LaunchError> {
    let (base_url, key_env, retries) = match provider {
        Some(provider) => {
            if !(provider.base_url.starts_with("http://") || provider.base_url.starts_with("https://")) {
                return Err(LaunchError::Invalid(format!(
                    "harness.codex.provider.base_url must be an http(s) URL, not {:?}",
                    provider.base_url
                )));
            }
            if let Some(key_env) = &provider.api_key_env
                && (key_env.is_empty() || key_env.contains(['=', '\0']))
            {
                return Err(LaunchError::Invalid(format!(
                    "harness.codex.provider.api_key_env must name an environment variable, not {key_env:?}"
                )));
            }
            // A configured endpoint fails fast: Canopy supervises the session, and a test
            // provider answers at once or not at all.
            (provider.base_url.as_str(), provider.api_key_env.as_deref(), Some(0))
        }
        None => (OPENAI_BASE_URL, Some(OPENAI_KEY_ENV), None),
    };
    let mut text = String::from("# Written by Canopy for one session; rewritten at every start.\n");
    if let Some(model) = model {
        text.push_str(&format!("model = {}\n", quoted(model)));
    }
    text.push_str(&format!("model_provider = {}\n", quoted(PROVIDER_ID)));
    text.push_str(&format!("sandbox_mode = {}\n", quoted(own_sandbox(sandbox))));
    text.push_str(concat!(
        "approval_policy = \"never\"\n",
        "check_for_update_on_startup = false\n",
        "\n[analytics]\nenabled = false\n",
        "\n[feedback]\nenabled = false\n",
        "\n[features]\n",
        "# Otherwise start-up tries to reach github.com and the apps directory.\n",
        "plugins = false\napps = false\n",
    ));
    text.push_str(&format!("\n[model_providers.{PROVIDER_ID}]\n"));
    text.push_str("name = \"Canopy\"\n");
    text.push_str(&format!("base_url = {}\n", quoted(base_url)));
    if let Some(key_env) = key_env {
        text.push_str(&format!("env_key = {}\n", quoted(key_env)));
    }
    text.push_str("wire_api = \"responses\"\n");
    if let Some(retries) = retries {
        text.push_str(&format!("request_max_retries = {retries}\nstream_max_retries = {retries}\n"));
    }
    Ok(text)
}

/// Codex's own sandbox for its shell tool. Inside Canopy's sandbox it is off: Canopy's is
/// the boundary (mount, PID and user namespaces, Landlock), and Codex's Linux sandbox cannot
/// build its own namespaces inside it, so every command would fail. Unconfined sessions
/// keep Codex's `workspace-write`.
fn own_sandbox(sandbox: SandboxMode) -> &'static str {
    match sandbox {
        SandboxMode::Required => "danger-full-access",
        SandboxMode::Off => "workspace-write",
    }
}

/// A TOML basic string: JSON's string escapes are a subset TOML accepts.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

/// `thread/start` parameters: working directory, prompt, policy, and Canopy's MCP server
/// defined for this thread only.
fn thread_start_params(spec: &LaunchSpec) -> Value {
    let mut params = json!({
        "cwd": path_text(&spec.cwd),
        "approvalPolicy": "never",
        "sandbox": own_sandbox(spec.sandbox.mode),
        "config": {
            "mcp_servers": {
                MCP_SERVER: {
                    "url": spec.mcp_url,
                    "bearer_token_env_var": TOKEN_ENV,
                    // With approval `never`, tool calls are silently denied without this.
                    "default_tools_approval_mode": "approve",
                }
            }
        },
    });
    match spec.prompt.mode {
        PromptMode::Replace => params["baseInstructions"] = Value::String(spec.prompt.text.clone()),
        PromptMode::Append => params["developerInstructions"] = Value::String(spec.prompt.text.clone()),
    }
    params
}

fn path_text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// What a request in flight was for.
#[derive(Debug)]
enum Request {
    Initialize,
    ThreadStart,
    ThreadResume { thread_id: String },
    TurnStart { input_id: String },
    Steer { input_id: String, turn_id: String },
    Interrupt,
}

/// A tool item that started and has not completed.
struct RunningTool {
    turn_id: Option<String>,
    name: String,
}

struct CodexCodec {
    next_id: u64,
    requests: HashMap<u64, Request>,
    /// Sent once `initialize` is answered (after a failed `thread/resume`, once that failed).
    thread_start: Option<Value>,
    /// The agent's previous thread, resumed instead of starting one (`thread/resume`).
    resume: Option<String>,
    /// The agent directory's thread record, rewritten when the thread id changes; `None`
    /// when nothing is kept.
    record: Option<std::path::PathBuf>,
    /// The thread id the record holds.
    recorded: Option<String>,
    thread_id: Option<String>,
    mcp_ready: bool,
    /// `Ready` is reported once: the thread exists and Canopy's MCP server is up.
    ready_sent: bool,
    turn_id: Option<String>,
    /// Inputs given to the running turn so far (the first is position 0).
    inputs_in_turn: u32,
    /// Steers Codex took and has not injected yet: input id → turn id.
    steers: HashMap<String, String>,
    running_tools: HashMap<String, RunningTool>,
}

impl CodexCodec {
    fn new(thread_start: Value) -> CodexCodec {
        CodexCodec {
            next_id: 0,
            requests: HashMap::new(),
            thread_start: Some(thread_start),
            resume: None,
            record: None,
            recorded: None,
            thread_id: None,
            mcp_ready: false,
            ready_sent: false,
            turn_id: None,
            inputs_in_turn: 0,
            steers: HashMap::new(),
            running_tools: HashMap::new(),
        }
    }

    fn request(&mut self, request: Request, method: &str, params: Value) -> Vec<u8> {
        let id = self.next_id;
        self.next_id += 1;
        self.requests.insert(id, request);
        line(&json!({ "method": method, "id": id, "params": params }))
    }

    /// `thread/start`, once.
    fn start_thread(&mut self) -> Option<Decoded> {
        let params = self.thread_start.take()?;
        Some(Decoded::Write(self.request(Request::ThreadStart, "thread/start", params)))
    }

    /// `thread/resume` of `thread_id` with this launch's working directory, prompt, policy
    /// and Canopy's MCP server (the token is this incarnation's, read from the environment).
    fn resume_request(&mut self, thread_id: String) -> Vec<u8> {
        let mut params = self.thread_start.clone().unwrap_or_else(|| json!({}));
        params["threadId"] = Value::String(thread_id.clone());
        // The answer would otherwise carry every earlier turn, on one line.
        params["excludeTurns"] = Value::Bool(true);
        self.request(Request::ThreadResume { thread_id }, "thread/resume", params)
    }

    /// Records the thread id in the agent's directory when it changes.
    fn record_thread(&mut self, thread_id: &str, out: &mut Vec<Decoded>) {
        let Some(path) = &self.record else { return };
        if self.recorded.as_deref() == Some(thread_id) {
            return;
        }
        self.recorded = Some(thread_id.to_owned());
        if let Err(e) = std::fs::write(path, format!("{thread_id}\n")) {
            out.push(status(&format!("could not record the thread id in {}: {e}", path.display())));
        }
    }

    fn thread(&self) -> String {
        self.thread_id.clone().unwrap_or_default()
    }

    fn ready_if_due(&mut self, out: &mut Vec<Decoded>) {
        if !self.ready_sent && self.thread_id.is_some() && self.mcp_ready {
            self.ready_sent = true;
            out.push(Decoded::Event(HarnessEvent::Ready));
        }
    }

    fn on_response(&mut self, id: u64, message: &Value) -> Vec<Decoded> {
        let Some(request) = self.requests.remove(&id) else { return Vec::new() };
        let error = message.get("error").map(|e| {
            let text = e.get("message").and_then(Value::as_str).unwrap_or("unknown error");
            match e.get("code").and_then(Value::as_i64) {
                Some(code) => format!("{text} ({code})"),
                None => text.to_owned(),
            }
        });
        let result = message.get("result").cloned().unwrap_or(Value::Null);
        let mut out = Vec::new();
        match (request, error) {
            (Request::Initialize, None) => {
                out.push(Decoded::Write(line(&json!({ "method": "initialized" }))));
                match self.resume.clone() {
                    Some(thread_id) => out.push(Decoded::Write(self.resume_request(thread_id))),
                    None => out.extend(self.start_thread()),
                }
            }
            (Request::ThreadStart | Request::ThreadResume { .. }, None) => {
                match result.pointer("/thread/id").and_then(Value::as_str) {
                    Some(thread_id) => {
                        self.thread_id = Some(thread_id.to_owned());
                        self.record_thread(thread_id, &mut out);
                        self.ready_if_due(&mut out);
                    }
                    None => out.push(status("codex answered thread/start without a thread id")),
                }
            }
            // The recorded thread cannot be loaded (its rollout is gone or unreadable): say
            // so and start a fresh one; the session goes on.
            (Request::ThreadResume { thread_id }, Some(error)) => {
                out.push(status(&format!(
                    "could not resume the previous thread {thread_id} ({error}); started a fresh thread"
                )));
                out.extend(self.start_thread());
            }
            // The session is never ready; the launch times out and reports it.
            (Request::Initialize, Some(error)) => out.push(status(&format!("codex refused initialize: {error}"))),
            (Request::ThreadStart, Some(error)) => out.push(status(&format!("codex refused thread/start: {error}"))),
            (Request::TurnStart { input_id }, None) => {
                let outcome = match result.pointer("/turn/id").and_then(Value::as_str) {
                    Some(turn_id) => SendOutcome::Started { turn_id: turn_id.to_owned() },
                    None => SendOutcome::Refused { reason: "codex answered turn/start without a turn id".into() },
                };
                out.push(Decoded::Ack { input_id, outcome });
            }
            (Request::TurnStart { input_id }, Some(reason)) => {
                out.push(Decoded::Ack { input_id, outcome: SendOutcome::Refused { reason } });
            }
            (Request::Steer { input_id, turn_id }, None) => {
                let turn_id = result.get("turnId").and_then(Value::as_str).map_or(turn_id, str::to_owned);
                // Pending until its user-message item arrives, unless that came first.
                if self.steers.get(&input_id).is_some_and(String::is_empty) {
                    self.steers.remove(&input_id);
                } else {
                    self.steers.insert(input_id.clone(), turn_id.clone());
                }
                out.push(Decoded::Ack { input_id, outcome: SendOutcome::Steered { turn_id } });
            }
            // "no active turn to steer" or a turn id that is not the running one: the
            // caller delivers it at the next turn start instead.
            (Request::Steer { input_id, .. }, Some(reason)) => {
                out.push(Decoded::Ack { input_id, outcome: SendOutcome::FellBack { reason } });
            }
            (Request::Interrupt, None) => {}
            (Request::Interrupt, Some(error)) => out.push(status(&format!("codex refused turn/interrupt: {error}"))),
        }
        out
    }

    fn on_notification(&mut self, method: &str, params: &Value) -> Vec<Decoded> {
        let mut out = Vec::new();
        match method {
            "mcpServer/startupStatus/updated" => self.on_mcp_status(params, &mut out),
            "turn/started" => {
                if let Some(turn_id) = params.pointer("/turn/id").and_then(Value::as_str) {
                    self.turn_id = Some(turn_id.to_owned());
                    self.inputs_in_turn = 0;
                    out.push(Decoded::Event(HarnessEvent::TurnStarted { turn_id: turn_id.to_owned() }));
                }
            }
            "turn/completed" => self.on_turn_completed(params, &mut out),
            "item/started" => self.on_item_started(params, &mut out),
            "item/completed" => self.on_item_completed(params, &mut out),
            "thread/tokenUsage/updated" => out.extend(token_usage(params)),
            "error" => out.push(model_error(params)),
            "warning" | "configWarning" => {
                let text = params
                    .get("message")
                    .or_else(|| params.get("summary"))
                    .and_then(Value::as_str)
                    .unwrap_or("a warning without text");
                out.push(status(&format!("codex warning: {text}")));
            }
            _ => {}
        }
        out
    }

    /// Canopy's MCP server came up (the session may be ready) or failed to.
    fn on_mcp_status(&mut self, params: &Value, out: &mut Vec<Decoded>) {
        if params.get("name").and_then(Value::as_str) != Some(MCP_SERVER) {
            return;
        }
        match params.get("status").and_then(Value::as_str) {
            Some("ready") => {
                self.mcp_ready = true;
                self.ready_if_due(out);
            }
            Some(state @ ("failed" | "cancelled")) => {
                let error = params.get("error").and_then(Value::as_str).unwrap_or("no detail");
                out.push(status(&format!("Canopy's MCP server {state} to start inside codex: {error}")));
            }
            _ => {}
        }
    }

    /// A turn ended: its cut-off tools are aborted, its untaken steers dropped, then the end.
    fn on_turn_completed(&mut self, params: &Value, out: &mut Vec<Decoded>) {
        let Some(turn_id) = params.pointer("/turn/id").and_then(Value::as_str).map(str::to_owned) else {
            return;
        };
        let turn_status = match params.pointer("/turn/status").and_then(Value::as_str) {
            Some("completed") => TurnStatus::Completed,
            Some("interrupted") => TurnStatus::Interrupted,
            _ => TurnStatus::Failed,
        };
        if let Some(error) = params.pointer("/turn/error/message").and_then(Value::as_str) {
            out.push(status(&format!("turn {turn_id} failed: {error}")));
        }
        // Tools cut off by an interrupt never complete.
        let mut aborted: Vec<(String, RunningTool)> =
            self.running_tools.extract_if(|_, tool| tool.turn_id.as_deref() == Some(turn_id.as_str())).collect();
        aborted.sort_by(|a, b| a.0.cmp(&b.0));
        for (call_id, tool) in aborted {
            out.push(Decoded::Event(HarnessEvent::ToolAborted { turn_id: tool.turn_id, call_id, name: tool.name }));
        }
        // Steers taken for this turn and never injected go at the next turn start.
        let mut dropped: Vec<String> =
            self.steers.extract_if(|_, t| *t == turn_id).map(|(input_id, _)| input_id).collect();
        dropped.sort();
        for input_id in dropped {
            out.push(Decoded::Event(HarnessEvent::SteerDropped {
                input_id,
                reason: format!("turn {turn_id} ended before the steer reached the model"),
            }));
        }
        // Markers of steers injected before their answer (see `on_user_message`).
        self.steers.retain(|_, t| !t.is_empty());
        if self.turn_id.as_deref() == Some(turn_id.as_str()) {
            self.turn_id = None;
        }
        out.push(Decoded::Event(HarnessEvent::TurnEnded { turn_id, status: turn_status }));
    }

    /// An item began: a user message (input or steer), a compaction, or a tool call.
    fn on_item_started(&mut self, params: &Value, out: &mut Vec<Decoded>) {
        let turn_id = turn_of(params);
        let Some(item) = params.get("item") else { return };
        match item_type(item) {
            "userMessage" => self.on_user_message(item, turn_id, out),
            "contextCompaction" => out.push(Decoded::Event(HarnessEvent::CompactionStarted)),
            _ => {
                if let Some((call_id, name, args)) = tool_started(item) {
                    self.running_tools
                        .insert(call_id.clone(), RunningTool { turn_id: turn_id.clone(), name: name.clone() });
                    out.push(Decoded::Event(HarnessEvent::ToolRunning { turn_id, call_id, name, args }));
                }
            }
        }
    }

    /// An item finished: the agent's text, a compaction, or a tool call's result.
    fn on_item_completed(&mut self, params: &Value, out: &mut Vec<Decoded>) {
        let turn_id = turn_of(params);
        let Some(item) = params.get("item") else { return };
        match item_type(item) {
            "agentMessage" => {
                let text = item.get("text").and_then(Value::as_str).unwrap_or_default();
                if !text.is_empty() {
                    out.push(Decoded::Event(HarnessEvent::Text { turn_id, text: text.to_owned() }));
                }
            }
            "contextCompaction" => out.push(Decoded::Event(HarnessEvent::CompactionEnded)),
            _ => {
                if let Some(event) = tool_completed(item, turn_id) {
                    if let Some(id) = item.get("id").and_then(Value::as_str) {
                        self.running_tools.remove(id);
                    }
                    out.push(Decoded::Event(event));
                }
            }
        }
    }

    /// A user message recorded in the turn: the turn's own input, or a steer landing.
    fn on_user_message(&mut self, item: &Value, turn_id: Option<String>, out: &mut Vec<Decoded>) {
        let position = self.inputs_in_turn;
        self.inputs_in_turn += 1;
        let Some(client_id) = item.get("clientId").and_then(Value::as_str) else { return };
        let turn_id = turn_id.or_else(|| self.turn_id.clone()).unwrap_or_default();
        if self.steers.remove(client_id).is_none() {
            // Injected before Codex answered `turn/steer`: a marker keeps the answer from
            // registering it as pending.
            self.steers.insert(client_id.to_owned(), String::new());
        }
        out.push(Decoded::Event(HarnessEvent::SteerInjected { input_id: client_id.to_owned(), turn_id, position }));
    }

    /// Answers a request Codex makes of the client. With approval `never` none is expected;
    /// anything that asks for a decision is declined rather than left hanging.
    fn on_server_request(&mut self, id: &Value, method: &str) -> Vec<Decoded> {
        let result = match method {
            "item/commandExecution/requestApproval" | "item/fileChange/requestApproval" => {
                Some(json!({ "decision": "decline" }))
            }
            "mcpServer/elicitation/request" => Some(json!({ "action": "decline" })),
            _ => None,
        };
        let answer = match result {
            Some(result) => json!({ "id": id, "result": result }),
            None => {
                json!({ "id": id, "error": { "code": -32601, "message": format!("Canopy does not handle {method}") } })
            }
        };
        vec![Decoded::Write(line(&answer)), status(&format!("codex asked {method}; Canopy declined"))]
    }
}

fn line(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

fn status(text: &str) -> Decoded {
    Decoded::Event(HarnessEvent::Status { text: text.to_owned() })
}

/// The turn a notification names, if any.
fn turn_of(params: &Value) -> Option<String> {
    params.get("turnId").and_then(Value::as_str).map(str::to_owned)
}

/// The last model call's token counts (`thread/tokenUsage/updated`).
fn token_usage(params: &Value) -> Option<Decoded> {
    let last = params.pointer("/tokenUsage/last")?;
    let count = |key: &str| last.get(key).and_then(Value::as_u64).unwrap_or(0);
    let usage = Usage {
        input_tokens: count("inputTokens"),
        output_tokens: count("outputTokens"),
        cache_read_tokens: count("cachedInputTokens"),
        cache_write_tokens: count("cacheWriteInputTokens"),
        cost_usd: None,
    };
    Some(Decoded::Event(HarnessEvent::Usage { turn_id: turn_of(params), usage }))
}

/// A failed model call (`error`): a rate limit, or an error that is fatal when the
/// credential was refused.
fn model_error(params: &Value) -> Decoded {
    let message = params.pointer("/error/message").and_then(Value::as_str).unwrap_or("unknown error");
    let info = params.pointer("/error/codexErrorInfo");
    let limited = info.and_then(Value::as_str).is_some_and(|i| i.contains("Limit"))
        || info.and_then(Value::as_object).is_some_and(|o| o.keys().any(|k| k.contains("Limit")));
    if limited {
        Decoded::Event(HarnessEvent::RateLimited { detail: message.to_owned() })
    } else {
        Decoded::Event(HarnessEvent::ModelError {
            text: format!("the model API call failed: {message}"),
            fatal: crate::event::credential_refused(message),
        })
    }
}

fn item_type(item: &Value) -> &str {
    item.get("type").and_then(Value::as_str).unwrap_or_default()
}

/// A tool name as the operator reads it: Canopy's own tools by their name, others'
/// qualified by their server.
fn mcp_name(item: &Value) -> String {
    let server = item.get("server").and_then(Value::as_str).unwrap_or_default();
    let tool = item.get("tool").and_then(Value::as_str).unwrap_or_default();
    if server == MCP_SERVER { tool.to_owned() } else { format!("mcp__{server}__{tool}") }
}

/// (call id, name, arguments) of a tool item that started.
fn tool_started(item: &Value) -> Option<(String, String, Value)> {
    let call_id = item.get("id").and_then(Value::as_str)?.to_owned();
    let (name, args) = match item_type(item) {
        "mcpToolCall" => (mcp_name(item), item.get("arguments").cloned().unwrap_or(Value::Null)),
        "commandExecution" => ("command".to_owned(), json!({ "command": item.get("command"), "cwd": item.get("cwd") })),
        "fileChange" => ("file_change".to_owned(), json!({ "changes": item.get("changes") })),
        "dynamicToolCall" => (
            item.get("tool").and_then(Value::as_str).unwrap_or("dynamic_tool").to_owned(),
            item.get("arguments").cloned().unwrap_or(Value::Null),
        ),
        "webSearch" => ("web_search".to_owned(), json!({ "query": item.get("query") })),
        _ => return None,
    };
    Some((call_id, name, args))
}

/// The result event of a tool item that completed.
fn tool_completed(item: &Value, turn_id: Option<String>) -> Option<HarnessEvent> {
    let (call_id, name, _) = tool_started(item)?;
    let state = item.get("status").and_then(Value::as_str).unwrap_or_default();
    let (ok, output) = match item_type(item) {
        "mcpToolCall" => {
            // A tool error (`isError`) arrives as status `failed` with the result; a transport
            // failure as `error`.
            let result = item.get("result").filter(|r| !r.is_null());
            let output = match result {
                Some(result) => {
                    result.get("structuredContent").filter(|s| !s.is_null()).cloned().unwrap_or_else(|| {
                        let text = result.pointer("/content/0/text").and_then(Value::as_str).unwrap_or_default();
                        serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
                    })
                }
                None => item.get("error").cloned().unwrap_or(Value::Null),
            };
            (state == "completed", output)
        }
        "commandExecution" => (
            state == "completed" && item.get("exitCode").and_then(Value::as_i64).unwrap_or(0) == 0,
            json!({ "exit_code": item.get("exitCode"), "output": item.get("aggregatedOutput") }),
        ),
        "dynamicToolCall" => (state == "completed", item.get("contentItems").cloned().unwrap_or(Value::Null)),
        _ => (state == "completed", json!({ "status": state })),
    };
    Some(if ok {
        HarnessEvent::ToolResult { turn_id, call_id, name, output }
    } else {
        HarnessEvent::ToolFailed { turn_id, call_id, name, output }
    })
}

impl Codec for CodexCodec {
    fn resuming(&self) -> Option<String> {
        self.resume.clone()
    }

    fn start(&mut self) -> Vec<Vec<u8>> {
        let params = json!({
            "clientInfo": { "name": "canopy", "title": "Canopy", "version": env!("CARGO_PKG_VERSION") },
            "capabilities": { "experimentalApi": true, "optOutNotificationMethods": [
                "item/agentMessage/delta", "item/commandExecution/outputDelta", "item/reasoning/summaryTextDelta",
                "item/reasoning/textDelta", "account/rateLimits/updated", "thread/readState/changed",
            ] },
        });
        vec![self.request(Request::Initialize, "initialize", params)]
    }

    /// Codex takes a `turn/start` during a running turn into that turn (answering with the
    /// running turn's id), which is not a turn start: refuse it, as the caller expects.
    fn answer_now(&mut self, mode: &SendMode) -> Option<SendOutcome> {
        match (mode, &self.turn_id) {
            (SendMode::NextTurn, Some(turn_id)) => {
                Some(SendOutcome::Refused { reason: format!("turn {turn_id} is running") })
            }
            _ => None,
        }
    }

    fn encode_send(&mut self, input_id: &str, text: &str, _context: &InputContext, mode: &SendMode) -> Vec<u8> {
        let input = json!([{ "type": "text", "text": text }]);
        match mode {
            SendMode::NextTurn => {
                let params = json!({ "threadId": self.thread(), "input": input });
                self.request(Request::TurnStart { input_id: input_id.to_owned() }, "turn/start", params)
            }
            SendMode::Steer { turn_id } => {
                let params = json!({
                    "threadId": self.thread(),
                    "expectedTurnId": turn_id,
                    "clientUserMessageId": input_id,
                    "input": input,
                });
                let request = Request::Steer { input_id: input_id.to_owned(), turn_id: turn_id.clone() };
                self.request(request, "turn/steer", params)
            }
        }
    }

    fn encode_interrupt(&mut self) -> Vec<u8> {
        match self.turn_id.clone() {
            Some(turn_id) => {
                let params = json!({ "threadId": self.thread(), "turnId": turn_id });
                self.request(Request::Interrupt, "turn/interrupt", params)
            }
            None => Vec::new(),
        }
    }

    /// Codex exits when its stdin closes, which the session does after this.
    fn encode_shutdown(&mut self) -> Vec<u8> {
        Vec::new()
    }

    fn decode(&mut self, bytes: &[u8]) -> Vec<Decoded> {
        let message: Value = match serde_json::from_slice(bytes) {
            Ok(Value::Object(message)) => Value::Object(message),
            Ok(_) => return vec![malformed("a JSON-RPC message must be an object")],
            Err(e) => return vec![malformed(&e.to_string())],
        };
        let method = message.get("method").and_then(Value::as_str);
        match (message.get("id"), method) {
            (Some(id), Some(method)) => self.on_server_request(id, method),
            (Some(id), None) => match id.as_u64() {
                Some(id) => self.on_response(id, &message),
                None => vec![malformed("a response id that Canopy never sent")],
            },
            (None, Some(method)) => {
                let params = message.get("params").cloned().unwrap_or(Value::Null);
                self.on_notification(method, &params)
            }
            (None, None) => vec![malformed("neither a method nor an id")],
        }
    }
}

fn malformed(reason: &str) -> Decoded {
    Decoded::Event(HarnessEvent::Malformed { reason: reason.to_owned() })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

    use super::*;

    fn decode(codec: &mut CodexCodec, value: Value) -> Vec<Decoded> {
        codec.decode(value.to_string().as_bytes())
    }

    fn written(decoded: &[Decoded]) -> Vec<Value> {
        decoded
            .iter()
            .filter_map(|d| match d {
                Decoded::Write(line) => serde_json::from_slice(line).ok(),
                _ => None,
            })
            .collect()
    }

    fn events(decoded: Vec<Decoded>) -> Vec<HarnessEvent> {
        decoded
            .into_iter()
            .filter_map(|d| match d {
                Decoded::Event(e) => Some(e),
                _ => None,
            })
            .collect()
    }

    fn acks(decoded: Vec<Decoded>) -> Vec<(String, SendOutcome)> {
        decoded
            .into_iter()
            .filter_map(|d| match d {
                Decoded::Ack { input_id, outcome } => Some((input_id, outcome)),
                _ => None,
            })
            .collect()
    }

    /// A codec past its handshake, with thread `thr` and turn `t1` running.
    fn ready_codec() -> CodexCodec {
        let mut codec = CodexCodec::new(json!({ "cwd": "/w", "baseInstructions": "P" }));
        codec.start();
        decode(&mut codec, json!({ "id": 0, "result": {} }));
        decode(&mut codec, json!({ "id": 1, "result": { "thread": { "id": "thr" } } }));
        decode(
            &mut codec,
            json!({ "method": "mcpServer/startupStatus/updated", "params": { "name": "canopy", "status": "ready" } }),
        );
        decode(&mut codec, json!({ "method": "turn/started", "params": { "turn": { "id": "t1" } } }));
        codec
    }

    #[test]
    fn the_handshake_waits_for_the_thread_and_canopy_s_mcp_server() {
        let mut codec = CodexCodec::new(json!({ "cwd": "/w", "baseInstructions": "P" }));
        let first: Value = serde_json::from_slice(&codec.start()[0]).unwrap();
        assert_eq!(first["method"], "initialize");
        assert_eq!(first["params"]["capabilities"]["experimentalApi"], true);
        assert!(first.get("jsonrpc").is_none());

        let after_init = written(&decode(&mut codec, json!({ "id": 0, "result": {} })));
        assert_eq!(after_init[0], json!({ "method": "initialized" }));
        assert_eq!(after_init[1]["method"], "thread/start");
        assert_eq!(after_init[1]["params"]["baseInstructions"], "P");

        let thread = decode(&mut codec, json!({ "id": 1, "result": { "thread": { "id": "thr" } } }));
        assert!(events(thread).is_empty(), "ready before the MCP server was");
        let other =
            json!({ "method": "mcpServer/startupStatus/updated", "params": { "name": "other", "status": "ready" } });
        assert!(events(decode(&mut codec, other)).is_empty());
        let failed = json!({ "method": "mcpServer/startupStatus/updated",
            "params": { "name": "canopy", "status": "failed", "error": "401" } });
        assert!(
            matches!(&events(decode(&mut codec, failed))[..], [HarnessEvent::Status { text }] if text.contains("401"))
        );
        let ready =
            json!({ "method": "mcpServer/startupStatus/updated", "params": { "name": "canopy", "status": "ready" } });
        assert_eq!(events(decode(&mut codec, ready.clone())), vec![HarnessEvent::Ready]);
        assert!(events(decode(&mut codec, ready)).is_empty(), "ready is reported once");
    }

    #[test]
    fn a_recorded_thread_is_resumed_and_a_failed_resume_starts_a_fresh_thread() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join(THREAD_FILE);
        let mut codec = CodexCodec::new(json!({ "cwd": "/w", "baseInstructions": "P", "config": { "k": 1 } }));
        codec.resume = Some("thr-old".into());
        codec.recorded = Some("thr-old".into());
        codec.record = Some(record.clone());
        assert_eq!(codec.resuming().as_deref(), Some("thr-old"));
        codec.start();
        let resume = written(&decode(&mut codec, json!({ "id": 0, "result": {} })));
        assert_eq!(resume[1]["method"], "thread/resume");
        let params = &resume[1]["params"];
        assert_eq!((params["threadId"].as_str(), params["excludeTurns"].as_bool()), (Some("thr-old"), Some(true)));
        assert_eq!((params["baseInstructions"].as_str(), params["config"]["k"].as_i64()), (Some("P"), Some(1)));

        let refused = decode(&mut codec, json!({ "id": 1, "error": { "code": -32600, "message": "no rollout" } }));
        assert_eq!(written(&refused)[0]["method"], "thread/start");
        assert!(
            matches!(&events(refused)[..], [HarnessEvent::Status { text }] if text.contains("could not resume") && text.contains("thr-old"))
        );
        decode(&mut codec, json!({ "id": 2, "result": { "thread": { "id": "thr-new" } } }));
        assert_eq!(std::fs::read_to_string(&record).unwrap().trim(), "thr-new");
    }

    #[test]
    fn steer_answers_are_correlated_by_request_id() {
        let mut codec = ready_codec();
        let context = InputContext::default();
        let steer: Value = serde_json::from_slice(&codec.encode_send(
            "steer-1",
            "hi",
            &context,
            &SendMode::Steer { turn_id: "t1".into() },
        ))
        .unwrap();
        assert_eq!(steer["method"], "turn/steer");
        assert_eq!(steer["params"]["expectedTurnId"], "t1");
        assert_eq!(steer["params"]["clientUserMessageId"], "steer-1");
        let late: Value = serde_json::from_slice(&codec.encode_send(
            "steer-2",
            "late",
            &context,
            &SendMode::Steer { turn_id: "t1".into() },
        ))
        .unwrap();

        // Answers may come in any order.
        let refused = json!({ "id": late["id"], "error": { "code": -32600, "message": "no active turn to steer" } });
        assert_eq!(
            acks(decode(&mut codec, refused)),
            vec![("steer-2".to_owned(), SendOutcome::FellBack { reason: "no active turn to steer (-32600)".into() })]
        );
        let taken = json!({ "id": steer["id"], "result": { "turnId": "t1" } });
        assert_eq!(
            acks(decode(&mut codec, taken)),
            vec![("steer-1".to_owned(), SendOutcome::Steered { turn_id: "t1".into() })]
        );
        let landed = json!({ "method": "item/started", "params": { "turnId": "t1",
            "item": { "type": "userMessage", "id": "u", "clientId": "steer-1", "content": [] } } });
        assert_eq!(
            events(decode(&mut codec, landed)),
            vec![HarnessEvent::SteerInjected { input_id: "steer-1".into(), turn_id: "t1".into(), position: 0 }]
        );
        let ended = json!({ "method": "turn/completed", "params": { "turn": { "id": "t1", "status": "completed" } } });
        assert_eq!(
            events(decode(&mut codec, ended)),
            vec![HarnessEvent::TurnEnded { turn_id: "t1".into(), status: TurnStatus::Completed }]
        );
    }

    #[test]
    fn a_next_turn_send_while_a_turn_runs_is_refused_without_writing() {
        let mut codec = ready_codec();
        let refused = codec.answer_now(&SendMode::NextTurn);
        assert!(matches!(refused, Some(SendOutcome::Refused { reason }) if reason.contains("t1")));
        assert_eq!(codec.answer_now(&SendMode::Steer { turn_id: "t1".into() }), None);
        let ended = json!({ "method": "turn/completed", "params": { "turn": { "id": "t1", "status": "completed" } } });
        decode(&mut codec, ended);
        assert_eq!(codec.answer_now(&SendMode::NextTurn), None);
    }

    #[test]
    fn a_steer_still_pending_when_its_turn_ends_is_dropped_and_running_tools_aborted() {
        let mut codec = ready_codec();
        let line =
            codec.encode_send("steer-1", "x", &InputContext::default(), &SendMode::Steer { turn_id: "t1".into() });
        let id = serde_json::from_slice::<Value>(&line).unwrap()["id"].clone();
        decode(&mut codec, json!({ "id": id, "result": { "turnId": "t1" } }));
        let started = json!({ "method": "item/started", "params": { "turnId": "t1", "item": {
            "type": "mcpToolCall", "id": "c1", "server": "canopy", "tool": "comms_post_message", "arguments": { "a": 1 } } } });
        assert_eq!(
            events(decode(&mut codec, started)),
            vec![HarnessEvent::ToolRunning {
                turn_id: Some("t1".into()),
                call_id: "c1".into(),
                name: "comms_post_message".into(),
                args: json!({ "a": 1 }),
            }]
        );
        let ended =
            json!({ "method": "turn/completed", "params": { "turn": { "id": "t1", "status": "interrupted" } } });
        let ended = events(decode(&mut codec, ended));
        assert!(matches!(&ended[0], HarnessEvent::ToolAborted { call_id, .. } if call_id == "c1"), "{ended:?}");
        assert!(matches!(&ended[1], HarnessEvent::SteerDropped { input_id, .. } if input_id == "steer-1"), "{ended:?}");
        assert_eq!(ended[2], HarnessEvent::TurnEnded { turn_id: "t1".into(), status: TurnStatus::Interrupted });
        assert!(codec.encode_interrupt().is_empty(), "nothing to interrupt after the turn");
    }

    #[test]
    fn tool_errors_usage_and_server_requests_are_mapped() {
        let mut codec = ready_codec();
        let failed = json!({ "method": "item/completed", "params": { "turnId": "t1", "item": {
            "type": "mcpToolCall", "id": "c1", "server": "canopy", "tool": "comms_post_message", "status": "failed",
            "arguments": {}, "result": { "content": [{ "type": "text", "text": "{}" }],
            "structuredContent": { "error": { "code": "forbidden" } } } } } });
        let failed = events(decode(&mut codec, failed));
        assert!(
            matches!(&failed[..], [HarnessEvent::ToolFailed { output, .. }] if output["error"]["code"] == "forbidden"),
            "{failed:?}"
        );
        let usage = json!({ "method": "thread/tokenUsage/updated", "params": { "turnId": "t1", "tokenUsage": {
            "last": { "inputTokens": 10, "cachedInputTokens": 4, "outputTokens": 3, "cacheWriteInputTokens": 1 },
            "total": {} } } });
        let usage = events(decode(&mut codec, usage));
        assert!(
            matches!(&usage[..], [HarnessEvent::Usage { usage, .. }] if usage.input_tokens == 10 && usage.cache_read_tokens == 4 && usage.output_tokens == 3),
            "{usage:?}"
        );
        let asked =
            decode(&mut codec, json!({ "id": "s1", "method": "item/commandExecution/requestApproval", "params": {} }));
        assert_eq!(written(&asked), vec![json!({ "id": "s1", "result": { "decision": "decline" } })]);
        let unknown = decode(&mut codec, json!({ "id": 7, "method": "item/tool/call", "params": {} }));
        assert_eq!(written(&unknown)[0]["error"]["code"], -32601);
        assert!(matches!(&events(decode(&mut codec, json!([1])))[..], [HarnessEvent::Malformed { .. }]));
        assert!(matches!(&events(codec.decode(b"not json"))[..], [HarnessEvent::Malformed { .. }]));
    }

    #[test]
    fn a_missing_api_key_fails_the_launch_naming_the_variable() {
        let dir = tempfile::tempdir().unwrap();
        let provider = ProviderSettings {
            base_url: "http://127.0.0.1:9/v1".into(),
            api_key_env: Some("CANOPY_TEST_KEY_THAT_IS_NEVER_SET".into()),
            api: None,
        };
        let mut spec = LaunchSpec {
            session_dir: dir.path().to_owned(),
            cwd: dir.path().join("work"),
            provider: Some(provider),
            prompt: crate::launch::Prompt::replace("p".into()),
            ..crate::launch::test_spec(crate::HarnessKind::Codex, dir.path())
        };
        let error = prepare(&spec, &mut Command::new("codex"), Resume::IfRecorded)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("CANOPY_TEST_KEY_THAT_IS_NEVER_SET"), "{error}");
        spec.env.push(("CANOPY_TEST_KEY_THAT_IS_NEVER_SET".into(), "k".into()));
        assert!(prepare(&spec, &mut Command::new("codex"), Resume::IfRecorded).is_ok());
        assert!(dir.path().join("codex-home/config.toml").is_file());
        assert_eq!(std::fs::read_to_string(dir.path().join(PROMPT_FILE)).unwrap(), "p");
    }

    #[test]
    fn config_toml_names_the_provider_or_falls_back_to_openai() {
        let provider =
            ProviderSettings { base_url: "http://127.0.0.1:9/v1".into(), api_key_env: Some("KEY".into()), api: None };
        let text = config_toml(Some("gpt-\"x\""), Some(&provider), SandboxMode::Off).unwrap();
        let expected = [
            "model = \"gpt-\\\"x\\\"\"",
            "model_provider = \"canopy\"",
            "approval_policy = \"never\"",
            "sandbox_mode = \"workspace-write\"",
            "base_url = \"http://127.0.0.1:9/v1\"",
            "env_key = \"KEY\"",
            "wire_api = \"responses\"",
            "request_max_retries = 0",
            "plugins = false",
            "[analytics]\nenabled = false",
            "[feedback]\nenabled = false",
        ];
        for line in expected {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
        let openai = config_toml(None, None, SandboxMode::Required).unwrap();
        assert!(openai.contains(OPENAI_BASE_URL) && openai.contains("env_key = \"OPENAI_API_KEY\""), "{openai}");
        assert!(!openai.contains("model =") && !openai.contains("retries"), "{openai}");
        assert!(openai.contains("sandbox_mode = \"danger-full-access\""), "Canopy's sandbox is the boundary: {openai}");

        let bad = ProviderSettings { base_url: "127.0.0.1:9".into(), api_key_env: None, api: None };
        let error = config_toml(None, Some(&bad), SandboxMode::Off).unwrap_err().to_string();
        assert!(error.contains("harness.codex.provider.base_url"), "{error}");
    }
}
