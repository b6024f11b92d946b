//! The harness layer: how Canopy launches a coding-agent process, reads what it does as one
//! normalised event stream, and gives it input at the start of a turn or as a steer.
//!
//! Every harness Canopy drives speaks JSON lines over stdio, so one `Session` owns the
//! process, the framing and the bookkeeping, and each adapter is a `Codec`: how to build
//! the command line and files, how to encode an input, how to decode an output line. This
//! is the only crate that builds a harness's command line. It knows nothing of NATS, the
//! store, or who the agent is beyond what `LaunchSpec` says.
//!
//! Layers, lowest first: `launch` and `codec` (the vocabulary every adapter and the session
//! share), the adapters (`claude`, `codex`, `omp`, `pi`, `scripted`), `kinds` (which adapter
//! prepares each `HarnessKind`), then `session` (the running process), which names no adapter.

pub mod cgroup;
pub mod claude;
mod codec;
pub mod codex;
mod confine;
pub mod egress;
mod event;
mod kinds;
mod launch;
pub mod limits;
pub mod network;
pub mod omp;
pub mod pi;
pub mod sandbox;
pub mod scripted;
mod session;
mod settings;

pub use canopy_core::harness::{CONVERSATION_STATE, Capabilities, HarnessKind, PromptMode};
pub use event::{HarnessEvent, SendMode, SendOutcome, TurnStatus, Usage};
pub use launch::{InputContext, LaunchError, LaunchSpec, Prompt, Subagent};
pub use limits::Limits;
pub use sandbox::{Capability, Network, SandboxMode, SandboxSettings, Unconfinable};
pub use session::{Session, SessionError};
pub use settings::{HarnessSettings, ProviderSettings, find_program};

#[cfg(test)]
mod tests {
    /// The state names retention removes are the adapters' own file names.
    #[test]
    fn conversation_state_names_the_adapters_files() {
        let adapters = [
            crate::claude::CONFIG_DIR,
            crate::claude::CONVERSATION_FILE,
            crate::codex::CODEX_HOME_DIR,
            crate::codex::THREAD_FILE,
            crate::omp::AGENT_DIR,
            crate::omp::CONVERSATION_FILE,
            crate::pi::AGENT_DIR,
            crate::pi::CONVERSATION_FILE,
        ];
        assert_eq!(crate::CONVERSATION_STATE, adapters.as_slice());
    }
}
