//! The scripted harness adapter: `canopy harness-scripted` over its JSON-lines protocol.
//!
//! Writes the system prompt, the script and the transcript path into the session
//! directory, passes the MCP endpoint and token in the environment (as a real harness's
//! MCP config would), and maps `canopy_scripted::protocol` onto the normalised events.

use canopy_scripted::protocol::{Input, InputMeta, Output};
use tokio::process::Command;

use crate::HarnessKind;
use crate::codec::{Codec, Decoded};
use crate::event::{Capabilities, HarnessEvent, SendMode, SendOutcome, TurnStatus, Usage};
use crate::launch::{InputContext, LaunchError, LaunchSpec};

pub const CAPABILITIES: Capabilities = HarnessKind::Scripted.capabilities();

/// Checks a script the way the scripted harness will read it (the daemon's script check:
/// roles at start, an agent's own `--script`).
pub fn check_script(path_for_messages: &std::path::Path, text: &str) -> Result<(), String> {
    canopy_scripted::script::parse(path_for_messages, text).map(|_| ()).map_err(|e| e.to_string())
}

/// File names inside the session directory.
pub const PROMPT_FILE: &str = "system-prompt.md";
/// The scripted harness's memory across an agent's sessions (the start rules that ran).
pub const STATE_FILE: &str = "scripted-state.json";
pub const TRANSCRIPT_FILE: &str = "transcript.jsonl";

/// Adds the scripted harness's arguments, files and environment to `command`.
pub(crate) fn prepare(spec: &LaunchSpec, command: &mut Command) -> Result<Box<dyn Codec>, LaunchError> {
    let (script_name, script_text) =
        spec.script.as_ref().ok_or_else(|| LaunchError::Invalid("the scripted harness needs a script".into()))?;
    let file_name = std::path::Path::new(script_name)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "script.toml".into());
    let write = |name: &str, text: &str| {
        let path = spec.session_dir.join(name);
        std::fs::write(&path, text).map_err(LaunchError::files(path))
    };
    write(PROMPT_FILE, spec.prompt.text())?;
    write(&file_name, script_text)?;
    command
        .arg("--script")
        .arg(spec.session_dir.join(&file_name))
        .arg("--system-prompt-file")
        .arg(spec.session_dir.join(PROMPT_FILE))
        .arg("--transcript")
        .arg(spec.session_dir.join(TRANSCRIPT_FILE))
        // Outlives the session: which start rules already ran for this agent.
        .arg("--state")
        .arg(spec.agent_dir.as_ref().unwrap_or(&spec.session_dir).join(STATE_FILE))
        .env("CANOPY_MCP_URL", &spec.mcp_url)
        .env("CANOPY_MCP_TOKEN", &spec.mcp_token);
    Ok(Box::new(ScriptedCodec))
}

struct ScriptedCodec;

fn line(input: &Input) -> Vec<u8> {
    serde_json::to_vec(input).unwrap_or_default()
}

impl Codec for ScriptedCodec {
    fn encode_send(&mut self, input_id: &str, text: &str, context: &InputContext, mode: &SendMode) -> Vec<u8> {
        let meta = InputMeta {
            sender: context.sender.clone(),
            channel: context.channel.clone(),
            topic: context.topic.clone(),
            kind: Some(context.kind.clone()),
            seq: context.seq,
            redelivered: context.redelivered,
        };
        match mode {
            SendMode::NextTurn => line(&Input::Prompt { id: input_id.to_owned(), text: text.to_owned(), meta }),
            SendMode::Steer { turn_id } => {
                line(&Input::Steer { id: input_id.to_owned(), text: text.to_owned(), turn_id: turn_id.clone(), meta })
            }
        }
    }

    fn encode_interrupt(&mut self) -> Vec<u8> {
        line(&Input::Abort)
    }

    fn encode_shutdown(&mut self) -> Vec<u8> {
        line(&Input::Shutdown)
    }

    fn decode(&mut self, bytes: &[u8]) -> Vec<Decoded> {
        let output: Output = match serde_json::from_slice(bytes) {
            Ok(output) => output,
            Err(e) => return vec![Decoded::Event(HarnessEvent::Malformed { reason: e.to_string() })],
        };
        let event = |e| vec![Decoded::Event(e)];
        match output {
            Output::Ready { .. } => event(HarnessEvent::Ready),
            Output::TurnStarted { turn_id, input_id } => vec![
                Decoded::Ack { input_id, outcome: SendOutcome::Started { turn_id: turn_id.clone() } },
                Decoded::Event(HarnessEvent::TurnStarted { turn_id }),
            ],
            Output::Text { turn_id, text } => event(HarnessEvent::Text { turn_id: Some(turn_id), text }),
            Output::ToolStarted { turn_id, call_id, name, args } => {
                event(HarnessEvent::ToolRunning { turn_id: Some(turn_id), call_id, name, args })
            }
            Output::ToolFinished { turn_id, call_id, name, is_error: false, output } => {
                event(HarnessEvent::ToolResult { turn_id: Some(turn_id), call_id, name, output })
            }
            Output::ToolFinished { turn_id, call_id, name, is_error: true, output } => {
                event(HarnessEvent::ToolFailed { turn_id: Some(turn_id), call_id, name, output })
            }
            Output::ToolAborted { turn_id, call_id, name } => {
                event(HarnessEvent::ToolAborted { turn_id: Some(turn_id), call_id, name })
            }
            Output::TurnEnded { turn_id, status } => {
                let status = match status.as_str() {
                    "completed" => TurnStatus::Completed,
                    "interrupted" => TurnStatus::Interrupted,
                    _ => TurnStatus::Failed,
                };
                event(HarnessEvent::TurnEnded { turn_id, status })
            }
            Output::SteerQueued { id, turn_id } => {
                vec![Decoded::Ack { input_id: id, outcome: SendOutcome::Steered { turn_id } }]
            }
            Output::SteerAccepted { id, turn_id, position } => {
                event(HarnessEvent::SteerInjected { input_id: id, turn_id, position })
            }
            // Before it was queued this answers the send; after, it tells the session the
            // steer never reached the model.
            Output::SteerRejected { id, reason } => vec![
                Decoded::Ack { input_id: id.clone(), outcome: SendOutcome::FellBack { reason: reason.clone() } },
                Decoded::Event(HarnessEvent::SteerDropped { input_id: id, reason }),
            ],
            Output::PromptRejected { id, reason } => {
                vec![Decoded::Ack { input_id: id, outcome: SendOutcome::Refused { reason } }]
            }
            Output::Compaction { phase } if phase == "start" => event(HarnessEvent::CompactionStarted),
            Output::Compaction { .. } => event(HarnessEvent::CompactionEnded),
            Output::Usage { turn_id, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd } => {
                event(HarnessEvent::Usage {
                    turn_id: Some(turn_id),
                    usage: Usage { input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd },
                })
            }
            Output::Status { text } => event(HarnessEvent::Status { text }),
            Output::Error { message } => event(HarnessEvent::Status { text: format!("harness error: {message}") }),
        }
    }
}
