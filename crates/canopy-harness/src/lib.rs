//! The harness layer: how Canopy launches a coding-agent process, reads what it does as one
//! normalised event stream, and gives it input at the start of a turn or as a steer.
//!
//! Every harness Canopy drives speaks JSON lines over stdio, so one `Session` owns the
//! process, the framing and the bookkeeping, and each adapter is a `Codec`: how to build
//! the command line and files, how to encode an input, how to decode an output line. This
//! is the only crate that builds a harness's command line. It knows nothing of NATS, the
//! store, or who the agent is beyond what `LaunchSpec` says.

mod event;
pub mod scripted;
mod session;

pub use event::{Capabilities, HarnessEvent, SendMode, SendOutcome, TurnStatus, Usage};
pub use session::{InputContext, LaunchError, LaunchSpec, PromptMode, Session, SessionError};

/// The harnesses Canopy can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HarnessKind {
    /// The scripted test harness (`canopy harness-scripted`): a stand-in for the LLM.
    Scripted,
}

impl HarnessKind {
    pub const ALL: &'static [HarnessKind] = &[HarnessKind::Scripted];

    pub fn as_str(self) -> &'static str {
        match self {
            HarnessKind::Scripted => "scripted",
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
        }
    }
}
