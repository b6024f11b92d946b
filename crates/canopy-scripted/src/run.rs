//! The harness runtime: command-line options, the stdin reader, the turn loop and the transcript.
//!
//! Owns turn bookkeeping (ids, steer injection at action boundaries, abort and shutdown), running
//! actions and writing `Output` lines and transcript lines. It does not parse scripts (`script`)
//! or speak HTTP (`mcp`); the host decides when to prompt, the harness never queues prompts.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::mcp::McpClient;
use crate::protocol::{Input, InputMeta, Output};
use crate::script::{Action, Placeholders, Script, ScriptUsage, ShellExpect};

/// The usage line printed for `--help` and bad arguments.
pub const USAGE: &str = "usage: canopy-scripted --script FILE [--system-prompt-file FILE] [--transcript FILE]";

/// The exit code of the `crash` action.
pub const CRASH_EXIT_CODE: i32 = 101;

/// Input lines longer than this are refused (and skipped) instead of buffered without bound.
pub const MAX_INPUT_LINE_BYTES: usize = 4 * 1024 * 1024;

/// Inputs read but not yet handled; the reader blocks beyond this, pushing back on the host.
const INPUT_QUEUE: usize = 64;

/// What the command line asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Run the harness.
    Run(Options),
    /// Print the usage and exit 0.
    Help,
}

/// The harness's command-line options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `--script FILE`.
    pub script: PathBuf,
    /// `--system-prompt-file FILE`; absent means an empty system prompt.
    pub system_prompt_file: Option<PathBuf>,
    /// `--transcript FILE`; absent means no transcript.
    pub transcript: Option<PathBuf>,
    /// `--state FILE`: what outlives a session (the start rules that already ran for the
    /// agent); absent means every session starts afresh.
    pub state: Option<PathBuf>,
}

/// A command line that cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    #[error("unknown argument `{0}`")]
    Unknown(String),
    #[error("`{0}` needs a value")]
    MissingValue(&'static str),
    #[error("`{0}` is given more than once")]
    Repeated(&'static str),
    #[error("`--script` is required")]
    NoScript,
}

/// Parses the arguments after the program name. `--flag value` and `--flag=value` both work.
pub fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<Command, ArgsError> {
    let mut script = None;
    let mut system_prompt_file = None;
    let mut transcript = None;
    let mut state = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy().into_owned();
        if text == "--help" || text == "-h" {
            return Ok(Command::Help);
        }
        let (flag, inline) = match text.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_owned(), Some(OsString::from(value))),
            _ => (text.clone(), None),
        };
        let (name, slot): (&'static str, &mut Option<PathBuf>) = match flag.as_str() {
            "--script" => ("--script", &mut script),
            "--system-prompt-file" => ("--system-prompt-file", &mut system_prompt_file),
            "--transcript" => ("--transcript", &mut transcript),
            "--state" => ("--state", &mut state),
            _ => return Err(ArgsError::Unknown(text)),
        };
        // Taken from the raw argument so a non-UTF-8 path survives intact.
        let value = match inline {
            Some(value) => value,
            None => args.next().ok_or(ArgsError::MissingValue(name))?,
        };
        if value.is_empty() {
            return Err(ArgsError::MissingValue(name));
        }
        if slot.replace(PathBuf::from(value)).is_some() {
            return Err(ArgsError::Repeated(name));
        }
    }
    let script = script.ok_or(ArgsError::NoScript)?;
    Ok(Command::Run(Options { script, system_prompt_file, transcript, state }))
}

/// The environment a real harness would get from the session host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HarnessEnv {
    /// `CANOPY_AGENT`: the agent handle, `{self}`.
    pub agent: String,
    /// `CANOPY_HOME_CHANNEL`: `{home}`.
    pub home: String,
    /// `CANOPY_MCP_URL`: the streamable HTTP endpoint.
    pub mcp_url: Option<String>,
    /// `CANOPY_MCP_TOKEN`: the bearer token.
    pub mcp_token: Option<String>,
    /// `CANOPY_INCARNATION`: which session of the agent this is.
    pub incarnation: String,
}

impl HarnessEnv {
    /// Reads the `CANOPY_*` variables; unset or non-UTF-8 values count as absent.
    pub fn from_env() -> Self {
        HarnessEnv {
            agent: std::env::var("CANOPY_AGENT").unwrap_or_default(),
            home: std::env::var("CANOPY_HOME_CHANNEL").unwrap_or_default(),
            mcp_url: std::env::var("CANOPY_MCP_URL").ok().filter(|url| !url.is_empty()),
            mcp_token: std::env::var("CANOPY_MCP_TOKEN").ok(),
            incarnation: std::env::var("CANOPY_INCARNATION").unwrap_or_default(),
        }
    }

    fn mcp_client(&self) -> Result<McpClient, String> {
        let url = self.mcp_url.as_deref().ok_or("CANOPY_MCP_URL is not set")?;
        let token = self.mcp_token.as_deref().ok_or("CANOPY_MCP_TOKEN is not set")?;
        McpClient::new(url, token).map_err(|e| e.to_string())
    }
}

/// Why the harness stopped with an error rather than an exit code.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot read system prompt file {}: {source}", path.display())]
    SystemPrompt { path: PathBuf, source: io::Error },
    #[error("cannot open transcript {}: {source}", path.display())]
    OpenTranscript { path: PathBuf, source: io::Error },
    #[error("cannot write transcript {}: {source}", path.display())]
    WriteTranscript { path: PathBuf, source: io::Error },
    #[error("cannot write to stdout: {0}")]
    Stdout(io::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(io::Error),
}

impl RunError {
    /// 2 for problems with what the harness was given, 1 for failures while it ran.
    pub fn exit_code(&self) -> i32 {
        match self {
            RunError::SystemPrompt { .. } | RunError::OpenTranscript { .. } => 2,
            RunError::WriteTranscript { .. } | RunError::Stdout(_) | RunError::Runtime(_) => 1,
        }
    }
}

/// Runs the harness to completion on the process's stdin and stdout; returns the exit code.
/// The caller should `std::process::exit` with it: the stdin reader thread may still be blocked
/// in a read, and nothing else would end it.
pub fn run_stdio(script: Script, options: &Options, env: HarnessEnv) -> Result<i32, RunError> {
    let system_prompt = match &options.system_prompt_file {
        Some(path) => {
            std::fs::read_to_string(path).map_err(|source| RunError::SystemPrompt { path: path.clone(), source })?
        }
        None => String::new(),
    };
    let transcript = match &options.transcript {
        Some(path) => {
            let file = File::options()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|source| RunError::OpenTranscript { path: path.clone(), source })?;
            Some((path.clone(), file))
        }
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(RunError::Runtime)?;
    let (tx, rx) = mpsc::channel(INPUT_QUEUE);
    spawn_stdin_reader(tx);
    let harness = Harness {
        script,
        env,
        out: Emitter { transcript },
        mcp: None,
        turns: 0,
        calls: 0,
        state: options.state.clone(),
        pending_start: None,
    };
    runtime.block_on(harness.run(system_prompt, rx))
}

/// What the stdin reader hands the turn loop.
#[derive(Debug)]
enum Event {
    Input(Input),
    /// A line that is not an `Input`; reported, then ignored.
    Malformed(String),
    /// Stdin is closed: finish the current turn, then exit 0.
    Eof,
}

/// Reads stdin on a plain thread: a blocking read there cannot hold up the runtime, and the
/// process exits without joining it.
fn spawn_stdin_reader(tx: mpsc::Sender<Event>) {
    std::thread::spawn(move || {
        let stdin = io::stdin();
        let mut reader = stdin.lock();
        let mut line = Vec::new();
        loop {
            let event = match read_line_bounded(&mut reader, &mut line, MAX_INPUT_LINE_BYTES) {
                Ok(LineRead::Eof) => {
                    // A closed channel means the harness loop already ended: no one to tell.
                    let _ = tx.blocking_send(Event::Eof);
                    return;
                }
                Ok(LineRead::TooLong) => {
                    Event::Malformed(format!("input line is longer than {MAX_INPUT_LINE_BYTES} bytes"))
                }
                Ok(LineRead::Line) => {
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    match serde_json::from_slice::<Input>(&line) {
                        Ok(input) => Event::Input(input),
                        Err(e) => Event::Malformed(format!("invalid input line: {e}")),
                    }
                }
                Err(e) => {
                    // A closed channel means the harness loop already ended: no one to tell.
                    let _ = tx.blocking_send(Event::Malformed(format!("cannot read stdin: {e}")));
                    let _ = tx.blocking_send(Event::Eof);
                    return;
                }
            };
            if tx.blocking_send(event).is_err() {
                return;
            }
        }
    });
}

#[derive(Debug, PartialEq, Eq)]
enum LineRead {
    /// `line` holds the next line, without its newline.
    Line,
    /// The line was over the limit and has been skipped.
    TooLong,
    Eof,
}

/// Reads one line into `line`, never holding more than `max` bytes of it.
fn read_line_bounded(reader: &mut impl BufRead, line: &mut Vec<u8>, max: usize) -> io::Result<LineRead> {
    line.clear();
    let mut too_long = false;
    let mut read_any = false;
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            // A last line without a newline still counts.
            return Ok(match (read_any, too_long) {
                (false, _) => LineRead::Eof,
                (true, true) => LineRead::TooLong,
                (true, false) => LineRead::Line,
            });
        }
        read_any = true;
        let (chunk, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(newline) => (&buf[..newline], Some(newline + 1)),
            None => (buf, None),
        };
        if !too_long {
            if line.len() + chunk.len() > max {
                too_long = true;
                line.clear();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let consumed = done.unwrap_or(buf.len());
        reader.consume(consumed);
        if done.is_some() {
            return Ok(if too_long { LineRead::TooLong } else { LineRead::Line });
        }
    }
}

/// Writes protocol lines to stdout and records to the transcript, each flushed at once
/// because the host and tests read them while the harness runs.
struct Emitter {
    transcript: Option<(PathBuf, File)>,
}

impl Emitter {
    fn emit(&mut self, output: &Output) -> Result<(), RunError> {
        let mut line = serde_json::to_string(output).map_err(|e| RunError::Stdout(io::Error::other(e)))?;
        line.push('\n');
        let mut stdout = io::stdout().lock();
        stdout.write_all(line.as_bytes()).and_then(|()| stdout.flush()).map_err(RunError::Stdout)
    }

    fn record(&mut self, value: Value) -> Result<(), RunError> {
        let Some((path, file)) = &mut self.transcript else {
            return Ok(());
        };
        let mut line = value.to_string();
        line.push('\n');
        file.write_all(line.as_bytes())
            .and_then(|()| file.flush())
            .map_err(|source| RunError::WriteTranscript { path: path.clone(), source })
    }
}

/// One input injected into a turn (the prompt, or an accepted steer).
#[derive(Debug)]
struct TurnInput {
    text: String,
    meta: InputMeta,
}

/// Why a turn stops early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Abort,
    Shutdown,
}

/// The state of the running turn that inputs arriving mid-turn can change.
#[derive(Debug)]
struct Turn {
    id: String,
    /// Inputs injected so far; an action remembers the index of the input it answers.
    inputs: Vec<TurnInput>,
    actions: VecDeque<(Action, usize)>,
    /// Steers accepted for this turn, waiting for the next action boundary.
    steers: VecDeque<(String, TurnInput)>,
    stop: Option<Stop>,
    /// Stdin is closed: no more events will come, and the harness exits after this turn.
    input_closed: bool,
    /// A `usage` action ran (a report, or `"none"`); otherwise the turn reports zero at its end.
    usage_said: bool,
}

struct Harness {
    script: Script,
    env: HarnessEnv,
    out: Emitter,
    /// Created at the first `call`, so scripts without calls need no MCP environment.
    mcp: Option<McpClient>,
    turns: u64,
    calls: u64,
    /// Where the start rules that ran are remembered, across the agent's sessions.
    state: Option<PathBuf>,
    /// The start rule of the running turn, remembered when the turn ends.
    pending_start: Option<usize>,
}

/// Adds `line` to the start rules `state` remembers (written whole, then renamed into place).
fn remember_start(state: &Path, line: usize) {
    let mut done = started(state);
    if !done.contains(&line) {
        done.push(line);
    }
    let tmp = state.with_extension("tmp");
    // Not remembered, a start rule runs again at the agent's next session: said on stderr
    // (the session's stderr.log), never a reason to stop this one.
    let written =
        std::fs::write(&tmp, json!({ "started": done }).to_string()).and_then(|()| std::fs::rename(&tmp, state));
    if let Err(e) = written {
        eprintln!("canopy-scripted: remembering start rule {line} in {}: {e}", state.display());
    }
}

/// The tools whose calls take an idempotency key: a repeated call returns the first result.
const IDEMPOTENT_TOOLS: [&str; 2] = ["comms_post_message", "agents_spawn_peer"];

/// The start rules (by line) that already ran for this agent.
fn started(state: &Path) -> Vec<usize> {
    std::fs::read_to_string(state)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v.get("started").and_then(|s| s.as_array()).cloned())
        .map(|list| list.iter().filter_map(|n| n.as_u64().map(|n| n as usize)).collect())
        .unwrap_or_default()
}

impl Harness {
    async fn run(mut self, system_prompt: String, mut rx: mpsc::Receiver<Event>) -> Result<i32, RunError> {
        self.out.record(json!({ "kind": "system_prompt", "text": system_prompt }))?;
        self.out.emit(&Output::Ready { pid: std::process::id() })?;
        loop {
            match rx.recv().await.unwrap_or(Event::Eof) {
                Event::Input(Input::Prompt { id, text, meta }) => {
                    if self.turn(id, text, meta, &mut rx).await? {
                        return Ok(0);
                    }
                }
                Event::Input(Input::Steer { id, .. }) => {
                    self.out.emit(&Output::SteerRejected { id, reason: "no turn is running".to_owned() })?;
                }
                // Nothing runs, so there is nothing to abort.
                Event::Input(Input::Abort) => {}
                Event::Input(Input::Shutdown) | Event::Eof => return Ok(0),
                Event::Malformed(message) => self.out.emit(&Output::Error { message })?,
            }
        }
    }

    /// Runs one turn to its end; returns whether the harness should exit afterwards.
    async fn turn(
        &mut self,
        input_id: String,
        text: String,
        meta: InputMeta,
        rx: &mut mpsc::Receiver<Event>,
    ) -> Result<bool, RunError> {
        self.turns += 1;
        let mut turn = Turn {
            id: format!("t{}", self.turns),
            inputs: Vec::new(),
            actions: VecDeque::new(),
            steers: VecDeque::new(),
            stop: None,
            input_closed: false,
            usage_said: false,
        };
        // Transcript lines are written before the matching stdout line, so whoever sees an
        // event on stdout finds it in the transcript too.
        let actions = self.inject(&mut turn, &input_id, TurnInput { text, meta }, false)?;
        turn.actions.extend(actions);
        self.out.emit(&Output::TurnStarted { turn_id: turn.id.clone(), input_id })?;

        loop {
            // The boundary: take what arrived during the last action, then inject steers.
            while let Ok(event) = rx.try_recv() {
                handle_mid_turn(&mut self.out, &mut turn, event)?;
            }
            if turn.stop.is_some() {
                break;
            }
            let mut inserted = Vec::new();
            while let Some((id, input)) = turn.steers.pop_front() {
                let position = u32::try_from(turn.inputs.len()).unwrap_or(u32::MAX);
                inserted.extend(self.inject(&mut turn, &id, input, true)?);
                self.out.emit(&Output::SteerAccepted { id, turn_id: turn.id.clone(), position })?;
            }
            // A steer's actions run next, ahead of what the turn still had to do.
            for action in inserted.into_iter().rev() {
                turn.actions.push_front(action);
            }
            let Some((action, input_index)) = turn.actions.pop_front() else {
                break;
            };
            self.act(&mut turn, action, input_index, rx).await?;
        }

        // Steers still waiting were never seen by the turn; the host must deliver them anew.
        while let Some((id, _)) = turn.steers.pop_front() {
            self.out.emit(&Output::SteerRejected { id, reason: "the turn was interrupted".to_owned() })?;
        }
        if let (Some(line), Some(state)) = (self.pending_start.take(), &self.state)
            && turn.stop.is_none()
        {
            remember_start(state, line);
        }
        let status = if turn.stop.is_some() { "interrupted" } else { "completed" };
        if !turn.usage_said {
            // No model ran: the turn costs nothing, and says so, so the daemon's estimate for
            // turns that never report gives way to zero.
            emit_usage(&mut self.out, &turn.id, &ScriptUsage { cost_usd: Some(0.0), ..ScriptUsage::default() })?;
        }
        self.out.record(json!({ "kind": "turn_ended", "turn_id": turn.id, "status": status }))?;
        self.out.emit(&Output::TurnEnded { turn_id: turn.id.clone(), status: status.to_owned() })?;
        Ok(turn.stop == Some(Stop::Shutdown) || turn.input_closed)
    }

    /// Records an input into the turn and returns the actions of the rule it matches.
    fn inject(
        &mut self,
        turn: &mut Turn,
        id: &str,
        input: TurnInput,
        steer: bool,
    ) -> Result<Vec<(Action, usize)>, RunError> {
        let position = turn.inputs.len();
        self.out.record(json!({
            "kind": "input",
            "id": id,
            "turn_id": turn.id,
            "position": position,
            "steer": steer,
            "text": input.text,
            "meta": input.meta,
        }))?;
        let start = input.meta.kind.as_deref() == Some("start");
        let actions = match self.script.find_rule(&input.text, &input.meta, steer) {
            // A rule that matches every input is no start rule: it runs whenever it matches.
            Some(rule) if start && rule.matcher.kind.as_deref() != Some("start") => {
                rule.actions.iter().map(|action| (action.clone(), position)).collect()
            }
            // A start rule runs once per agent, not at every restart, unless it says otherwise.
            Some(rule)
                if start
                    && !rule.every_start
                    && self.state.as_deref().is_some_and(|s| started(s).contains(&rule.line)) =>
            {
                self.out.record(json!({ "kind": "start_rule_skipped", "line": rule.line, "reason": "it ran in an earlier session" }))?;
                Vec::new()
            }
            Some(rule) => {
                // Remembered once the turn's actions have run (a crash mid-rule runs it again;
                // its calls' keys make the repeat harmless).
                if start && self.state.is_some() {
                    self.pending_start = Some(rule.line);
                }
                // Each call carries a key derived from the agent, the rule, the action and the
                // input, so the same call made again (after a restart) returns the first result.
                // A rule that runs at every start makes new calls at each: its key names the session.
                let input_key = match input.meta.seq {
                    Some(seq) => seq.to_string(),
                    None if rule.every_start => format!("start{}", self.env.incarnation),
                    None => "start".to_owned(),
                };
                rule.actions
                    .iter()
                    .enumerate()
                    .map(|(i, action)| {
                        let key = format!("scripted-{}-r{}-a{i}-{input_key}", self.env.agent, rule.line);
                        (with_key(action, &key), position)
                    })
                    .collect()
            }
            None => Vec::new(),
        };
        turn.inputs.push(input);
        Ok(actions)
    }

    async fn act(
        &mut self,
        turn: &mut Turn,
        action: Action,
        input_index: usize,
        rx: &mut mpsc::Receiver<Event>,
    ) -> Result<(), RunError> {
        let Harness { env, out, mcp, calls, .. } = self;
        let placeholders = match turn.inputs.get(input_index) {
            Some(input) => Placeholders {
                agent: &env.agent,
                home: &env.home,
                text: &input.text,
                sender: input.meta.sender.as_deref().unwrap_or_default(),
                channel: input.meta.channel.as_deref().unwrap_or_default(),
                topic: input.meta.topic.as_deref().unwrap_or_default(),
            },
            None => Placeholders { agent: &env.agent, home: &env.home, ..Placeholders::default() },
        };
        match action {
            Action::Say { text } => {
                let text = placeholders.substitute(&text);
                out.record(json!({ "kind": "text", "turn_id": turn.id, "text": text }))?;
                out.emit(&Output::Text { turn_id: turn.id.clone(), text })?;
            }
            Action::Call { tool, args } => {
                let args = placeholders.substitute_value(&args);
                *calls += 1;
                let call_id = format!("c{calls}");
                start_tool(out, turn, &call_id, &tool, &args)?;
                // A real call runs to its end: an abort takes effect at the next boundary.
                let work = call_tool(mcp, env, &tool, args);
                if let Some((is_error, output)) = during(out, turn, rx, work, false).await? {
                    finish_tool(out, turn, &call_id, &tool, is_error, output)?;
                }
            }
            Action::Sleep { duration, text } => {
                *calls += 1;
                let call_id = format!("c{calls}");
                start_tool(out, turn, &call_id, "sleep", &json!({ "duration": text }))?;
                // A pretend tool is cut off by an abort, as a real harness cuts off its tools.
                if during(out, turn, rx, tokio::time::sleep(duration), true).await?.is_none() {
                    return aborted(out, turn, &call_id, "sleep");
                }
                let slept_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
                finish_tool(out, turn, &call_id, "sleep", false, json!({ "slept_ms": slept_ms }))?;
            }
            Action::Compact => {
                out.record(json!({ "kind": "compaction", "turn_id": turn.id }))?;
                out.emit(&Output::Compaction { phase: "start".to_owned() })?;
                out.emit(&Output::Compaction { phase: "end".to_owned() })?;
            }
            Action::Usage(usage) => {
                turn.usage_said = true;
                if let Some(usage) = usage {
                    emit_usage(out, &turn.id, &usage)?;
                }
            }
            Action::FakeTool { tool, output } => {
                *calls += 1;
                let call_id = format!("c{calls}");
                let output = placeholders.substitute(&output);
                start_tool(out, turn, &call_id, &tool, &json!({}))?;
                finish_tool(out, turn, &call_id, &tool, false, json!({ "output": output }))?;
            }
            Action::Shell { command, expect } => {
                *calls += 1;
                let call_id = format!("c{calls}");
                let command = placeholders.substitute(&command);
                start_tool(out, turn, &call_id, "shell", &json!({ "command": command }))?;
                // Cut off by an abort, as a real harness cuts off its shell tool.
                let Some(ran) = during(out, turn, rx, run_shell(&command), true).await? else {
                    return aborted(out, turn, &call_id, "shell");
                };
                let failed = ran.code != Some(0);
                let met = expect.map(|e| (e == ShellExpect::Fail) == failed);
                out.record(json!({
                    "kind": "shell",
                    "turn_id": turn.id,
                    "command": command,
                    "code": ran.code,
                    "output": ran.output,
                    "expect": expect.map(ShellExpect::as_str),
                    "met": met,
                }))?;
                let result = json!({ "exit_code": ran.code, "output": ran.output, "expect": expect.map(ShellExpect::as_str), "met": met });
                finish_tool(out, turn, &call_id, "shell", failed, result)?;
            }
            Action::EndTurn => turn.actions.clear(),
            Action::Crash => {
                // Every line is already flushed; exiting here skips `turn_ended` on purpose. A
                // flush that fails cannot be reported by a process that is crashing anyway.
                let _ = io::stdout().flush();
                std::process::exit(CRASH_EXIT_CODE);
            }
        }
        Ok(())
    }
}

/// Records and reports a pretend tool cut off by an abort.
fn aborted(out: &mut Emitter, turn: &Turn, call_id: &str, name: &str) -> Result<(), RunError> {
    out.record(json!({ "kind": "tool_aborted", "turn_id": turn.id, "call_id": call_id }))?;
    out.emit(&Output::ToolAborted { turn_id: turn.id.clone(), call_id: call_id.to_owned(), name: name.to_owned() })
}

/// What a `shell` action's command did.
struct ShellRun {
    /// The exit code; `None` when it was killed by a signal or could not run.
    code: Option<i32>,
    /// Its stdout and stderr, interleaved as they ended up (the first 4 KiB).
    output: String,
}

/// Longest a `shell` command may run before it is killed.
const SHELL_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `command` with `sh -c` in this process's working directory and sandbox.
async fn run_shell(command: &str) -> ShellRun {
    let mut child = tokio::process::Command::new("sh");
    child.arg("-c").arg(format!("exec 2>&1; {command}")).stdin(std::process::Stdio::null()).kill_on_drop(true);
    let ran = tokio::time::timeout(SHELL_TIMEOUT, child.output()).await;
    let (code, bytes) = match ran {
        Ok(Ok(out)) => (out.status.code(), out.stdout),
        Ok(Err(e)) => (None, format!("could not run sh: {e}").into_bytes()),
        Err(_) => (None, format!("killed after {SHELL_TIMEOUT:?}").into_bytes()),
    };
    let mut output = String::from_utf8_lossy(&bytes).into_owned();
    if output.len() > 4096 {
        let mut cut = 4096;
        while !output.is_char_boundary(cut) {
            cut -= 1;
        }
        output.truncate(cut);
    }
    ShellRun { code, output }
}

/// `action` with `idempotency_key` set to `key`, for a call to a tool that takes one and a
/// script that did not set its own.
fn with_key(action: &Action, key: &str) -> Action {
    match action {
        Action::Call { tool, args } if IDEMPOTENT_TOOLS.contains(&tool.as_str()) => {
            let mut args = args.clone();
            if let Value::Object(map) = &mut args
                && !map.contains_key("idempotency_key")
            {
                map.insert("idempotency_key".into(), Value::String(key.chars().take(128).collect()));
            }
            Action::Call { tool: tool.clone(), args }
        }
        other => other.clone(),
    }
}

/// Records and reports one model call's usage in `turn_id`.
fn emit_usage(out: &mut Emitter, turn_id: &str, usage: &ScriptUsage) -> Result<(), RunError> {
    out.record(json!({ "kind": "usage", "turn_id": turn_id, "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens, "cost_usd": usage.cost_usd }))?;
    out.emit(&Output::Usage {
        turn_id: turn_id.to_owned(),
        input_tokens: usage.input_tokens,
        output_tokens: usage.output_tokens,
        cache_read_tokens: usage.cache_read_tokens,
        cache_write_tokens: usage.cache_write_tokens,
        cost_usd: usage.cost_usd,
    })
}

fn start_tool(out: &mut Emitter, turn: &Turn, call_id: &str, name: &str, args: &Value) -> Result<(), RunError> {
    out.record(json!({ "kind": "tool_call", "turn_id": turn.id, "call_id": call_id, "name": name, "args": args }))?;
    out.emit(&Output::ToolStarted {
        turn_id: turn.id.clone(),
        call_id: call_id.to_owned(),
        name: name.to_owned(),
        args: args.clone(),
    })
}

fn finish_tool(
    out: &mut Emitter,
    turn: &Turn,
    call_id: &str,
    name: &str,
    is_error: bool,
    output: Value,
) -> Result<(), RunError> {
    out.record(json!({
        "kind": "tool_result",
        "turn_id": turn.id,
        "call_id": call_id,
        "name": name,
        "is_error": is_error,
        "output": output,
    }))?;
    out.emit(&Output::ToolFinished {
        turn_id: turn.id.clone(),
        call_id: call_id.to_owned(),
        name: name.to_owned(),
        is_error,
        output,
    })
}

/// Drives `work` to completion while answering inputs as they arrive, so a rejected steer or
/// prompt is answered at once rather than after a long action. Steers take effect at the next
/// boundary. An abort does too, unless `abortable`: then the work is dropped at once and the
/// answer is `None` (a pretend tool cut off mid-run, as a real harness cuts off its tools).
async fn during<T>(
    out: &mut Emitter,
    turn: &mut Turn,
    rx: &mut mpsc::Receiver<Event>,
    work: impl Future<Output = T>,
    abortable: bool,
) -> Result<Option<T>, RunError> {
    tokio::pin!(work);
    loop {
        tokio::select! {
            biased;
            result = &mut work => return Ok(Some(result)),
            event = rx.recv(), if !turn.input_closed => {
                handle_mid_turn(out, turn, event.unwrap_or(Event::Eof))?;
                if abortable && turn.stop == Some(Stop::Abort) {
                    return Ok(None);
                }
            }
        }
    }
}

/// Handles an input that arrives while a turn runs.
fn handle_mid_turn(out: &mut Emitter, turn: &mut Turn, event: Event) -> Result<(), RunError> {
    match event {
        Event::Input(Input::Prompt { id, .. }) => {
            out.emit(&Output::PromptRejected { id, reason: "a turn is running".to_owned() })
        }
        Event::Input(Input::Steer { id, text, turn_id, meta }) => {
            if turn_id == turn.id && turn.stop.is_none() {
                out.emit(&Output::SteerQueued { id: id.clone(), turn_id: turn_id.clone() })?;
                turn.steers.push_back((id, TurnInput { text, meta }));
                Ok(())
            } else if turn_id == turn.id {
                out.emit(&Output::SteerRejected { id, reason: "the turn is being interrupted".to_owned() })
            } else {
                let reason = format!("turn {turn_id} is not running (turn {} is)", turn.id);
                out.emit(&Output::SteerRejected { id, reason })
            }
        }
        Event::Input(Input::Abort) => {
            turn.stop.get_or_insert(Stop::Abort);
            Ok(())
        }
        Event::Input(Input::Shutdown) => {
            turn.stop = Some(Stop::Shutdown);
            Ok(())
        }
        Event::Malformed(message) => out.emit(&Output::Error { message }),
        Event::Eof => {
            turn.input_closed = true;
            Ok(())
        }
    }
}

/// Calls a tool, turning every failure into an error result the way a harness shows it to
/// the model: the turn goes on.
async fn call_tool(mcp: &mut Option<McpClient>, env: &HarnessEnv, tool: &str, args: Value) -> (bool, Value) {
    if mcp.is_none() {
        match env.mcp_client() {
            Ok(client) => *mcp = Some(client),
            Err(message) => return (true, json!({ "error": message })),
        }
    }
    let Some(client) = mcp.as_mut() else {
        return (true, json!({ "error": "no mcp client" }));
    };
    match client.call_tool(tool, args).await {
        Ok(outcome) => (outcome.is_error, outcome.output),
        Err(e) => (true, json!({ "error": e.to_string() })),
    }
}

/// The whole program: parse `args` (without the program name), load the script, run.
/// Returns the exit code; the caller exits with it (the stdin reader thread may be blocked
/// in a read that nothing else ends). `canopy harness-scripted` and `canopy-scripted` both
/// call this.
pub fn main(args: impl IntoIterator<Item = OsString>) -> i32 {
    match parse_args(args) {
        Err(e) => {
            eprintln!("canopy-scripted: {e}\n{USAGE}");
            2
        }
        Ok(Command::Help) => {
            println!("{USAGE}");
            0
        }
        Ok(Command::Run(options)) => match crate::script::load(&options.script) {
            Err(e) => {
                eprintln!("canopy-scripted: {e}");
                2
            }
            Ok(script) => match run_stdio(script, &options, HarnessEnv::from_env()) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("canopy-scripted: {e}");
                    e.exit_code()
                }
            },
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on purpose")]

    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn arguments_parse_in_both_forms() {
        let command =
            parse_args(args(&["--script", "s.toml", "--transcript=t.jsonl", "--system-prompt-file", "p.md"])).unwrap();
        assert_eq!(
            command,
            Command::Run(Options {
                script: "s.toml".into(),
                system_prompt_file: Some("p.md".into()),
                transcript: Some("t.jsonl".into()),
                state: None,
            })
        );
        assert_eq!(parse_args(args(&["--help"])).unwrap(), Command::Help);
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(matches!(parse_args(args(&[])), Err(ArgsError::NoScript)));
        assert!(matches!(parse_args(args(&["--script"])), Err(ArgsError::MissingValue("--script"))));
        assert!(matches!(parse_args(args(&["--script="])), Err(ArgsError::MissingValue("--script"))));
        assert!(matches!(parse_args(args(&["--script", "a", "--script", "b"])), Err(ArgsError::Repeated(_))));
        assert!(matches!(parse_args(args(&["--script", "a", "--model", "x"])), Err(ArgsError::Unknown(_))));
        assert!(matches!(parse_args(args(&["s.toml"])), Err(ArgsError::Unknown(_))));
    }

    #[test]
    fn lines_are_read_with_a_bound() {
        let mut reader = io::Cursor::new(b"short\nthis line is too long\n\nlast".to_vec());
        let mut line = Vec::new();
        assert_eq!(read_line_bounded(&mut reader, &mut line, 8).unwrap(), LineRead::Line);
        assert_eq!(line, b"short");
        assert_eq!(read_line_bounded(&mut reader, &mut line, 8).unwrap(), LineRead::TooLong);
        assert_eq!(read_line_bounded(&mut reader, &mut line, 8).unwrap(), LineRead::Line);
        assert!(line.is_empty());
        assert_eq!(read_line_bounded(&mut reader, &mut line, 8).unwrap(), LineRead::Line);
        assert_eq!(line, b"last");
        assert_eq!(read_line_bounded(&mut reader, &mut line, 8).unwrap(), LineRead::Eof);
    }
}
