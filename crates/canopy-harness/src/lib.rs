//! The harness layer: how Canopy launches a coding-agent process, reads what it does as one
//! normalised event stream, and gives it input at the start of a turn or as a steer.
//!
//! Every harness Canopy drives speaks JSON lines over stdio, so one `Session` owns the
//! process, the framing and the bookkeeping, and each adapter is a `Codec`: how to build
//! the command line and files, how to encode an input, how to decode an output line. This
//! is the only crate that builds a harness's command line. It knows nothing of NATS, the
//! store, or who the agent is beyond what `LaunchSpec` says.

pub mod claude;
pub mod codex;
mod event;
pub mod sandbox;
pub mod scripted;
mod session;
mod settings;

/// What an adapter keeps per agent, across incarnations (a resumable conversation), as names
/// inside the agent's session directory. Retention removes them once the agent has had no live
/// session for the transcripts period; the agent's `work/` directory is never among them.
pub const CONVERSATION_STATE: &[&str] =
    &[claude::CONFIG_DIR, claude::CONVERSATION_FILE, codex::CODEX_HOME_DIR, codex::THREAD_FILE];

pub use event::{Capabilities, HarnessEvent, SendMode, SendOutcome, TurnStatus, Usage};
pub use sandbox::{Capability, SandboxMode, SandboxSettings, Unconfinable};
pub use session::{InputContext, LaunchError, LaunchSpec, PromptMode, Session, SessionError};
pub use settings::{HarnessSettings, ProviderSettings, find_program};

/// The harnesses Canopy can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HarnessKind {
    /// The scripted test harness (`canopy harness-scripted`): a stand-in for the LLM.
    Scripted,
    /// Claude Code in stream-json mode (`claude -p --input-format stream-json`).
    Claude,
    /// OpenAI Codex's app-server (`codex app-server`).
    Codex,
}

impl HarnessKind {
    pub const ALL: &'static [HarnessKind] = &[HarnessKind::Scripted, HarnessKind::Claude, HarnessKind::Codex];

    pub fn as_str(self) -> &'static str {
        match self {
            HarnessKind::Scripted => "scripted",
            HarnessKind::Claude => "claude",
            HarnessKind::Codex => "codex",
        }
    }

    pub fn parse(name: &str) -> Option<HarnessKind> {
        HarnessKind::ALL.iter().copied().find(|k| k.as_str() == name)
    }

    /// The names accepted, for error messages.
    pub fn expected() -> String {
        HarnessKind::ALL.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
    }

    pub fn capabilities(self) -> Capabilities {
        match self {
            HarnessKind::Scripted => scripted::CAPABILITIES,
            HarnessKind::Claude => claude::CAPABILITIES,
            HarnessKind::Codex => codex::CAPABILITIES,
        }
    }

    /// The executable looked up on `PATH` when `[harness.<name>] bin` is not set; `None` for
    /// the scripted harness, which is Canopy's own binary.
    pub fn default_program(self) -> Option<&'static str> {
        match self {
            HarnessKind::Scripted => None,
            HarnessKind::Claude => Some("claude"),
            HarnessKind::Codex => Some("codex"),
        }
    }
}
