//! The harnesses Canopy drives, as facts every layer may need without the harness layer
//! itself: their names, what each can do, how a prompt relates to a harness's own (`PromptMode`), and the names of the per-agent conversation state
//! a harness keeps (which retention may remove).
//!
//! Owns the closed list of harness kinds. Does not launch anything or know a protocol: that
//! is `canopy-harness`, whose adapters read these facts (and a test there keeps the state
//! names equal to the adapters' own file names).

use serde::Serialize;

/// The harnesses Canopy can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HarnessKind {
    /// The scripted test harness (`canopy harness-scripted`): a stand-in for the LLM.
    Scripted,
    /// Claude Code in stream-json mode (`claude -p --input-format stream-json`).
    Claude,
    /// OpenAI Codex's app-server (`codex app-server`).
    Codex,
    /// oh-my-pi in RPC mode (`omp --mode rpc`), on Bun.
    Omp,
    /// pi in RPC mode (`pi --mode rpc`), on Node; Canopy's tools through its extension.
    Pi,
}

/// How a session's system prompt relates to its harness's own default prompt: the one
/// prompt-mode type, from the renderer through the wire to the harness's launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PromptMode {
    /// The prompt is the whole system prompt (Managers, and any role on a harness whose
    /// default Canopy owns).
    Replace,
    /// The prompt is a delta for the harness's append mechanism (implementers on a harness
    /// with its own default prompt).
    Append,
}

impl PromptMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PromptMode::Replace => "replace",
            PromptMode::Append => "append",
        }
    }
}

/// What a harness can do, so callers pick a delivery path without knowing which it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    /// Mid-turn input at a step boundary, bound to a turn id.
    pub steer: bool,
    /// The system prompt can be replaced entirely (Manager block-0).
    pub replace_prompt: bool,
    /// The harness's default prompt can be kept with text appended (implementer delta).
    pub append_prompt: bool,
    /// The harness has a default system prompt of its own (Claude Code, Codex). Canopy
    /// then sends an implementer only its delta, through the append mechanism; for a
    /// harness without one, Canopy renders its own default block-0 around the delta.
    pub owns_default_prompt: bool,
}

/// What an adapter keeps per agent, across incarnations (a resumable conversation), as names
/// inside the agent's session directory: Claude Code's config directory and session file,
/// Codex's home and thread file. Retention removes them once the agent has had no live
/// session for the transcripts period; the agent's `work/` directory is never among them.
pub const CONVERSATION_STATE: &[&str] = &[
    "claude-config",
    "claude-session",
    "codex-home",
    "codex-thread",
    "omp-agent",
    "omp-session",
    "pi-agent",
    "pi-session",
];

impl HarnessKind {
    pub const ALL: &'static [HarnessKind] =
        &[HarnessKind::Scripted, HarnessKind::Claude, HarnessKind::Codex, HarnessKind::Omp, HarnessKind::Pi];

    pub fn as_str(self) -> &'static str {
        match self {
            HarnessKind::Scripted => "scripted",
            HarnessKind::Claude => "claude",
            HarnessKind::Codex => "codex",
            HarnessKind::Omp => "omp",
            HarnessKind::Pi => "pi",
        }
    }

    pub fn parse(name: &str) -> Option<HarnessKind> {
        HarnessKind::ALL.iter().copied().find(|k| k.as_str() == name)
    }

    /// The names accepted, for error messages.
    pub fn expected() -> String {
        HarnessKind::ALL.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
    }

    pub const fn capabilities(self) -> Capabilities {
        match self {
            // Steers, both prompt modes, and no default prompt of its own.
            HarnessKind::Scripted => {
                Capabilities { steer: true, replace_prompt: true, append_prompt: true, owns_default_prompt: false }
            }
            // Claude Code: user lines mid-turn; `--system-prompt-file` / `--append-system-prompt-file`.
            // Codex: `turn/steer`; `baseInstructions` / `developerInstructions`.
            // omp: the `steer` command (taken at the next step boundary); `--system-prompt` /
            // `--append-system-prompt`.
            // pi: the same `steer` command, taken after the running tool.
            HarnessKind::Claude | HarnessKind::Codex | HarnessKind::Omp | HarnessKind::Pi => {
                Capabilities { steer: true, replace_prompt: true, append_prompt: true, owns_default_prompt: true }
            }
        }
    }

    /// Whether the harness runs subagents of its own, in process, from definitions (omp's
    /// `task` tool, which splices a definition into its default prompt; Claude Code's `Agent`,
    /// whose definition is the subagent's whole prompt), so a role may delegate to them.
    pub const fn native_subagents(self) -> bool {
        matches!(self, HarnessKind::Omp | HarnessKind::Claude)
    }

    /// The executable looked up on `PATH` when `[harness.<name>] bin` is not set; `None` for
    /// the scripted harness, which is Canopy's own binary.
    pub fn default_program(self) -> Option<&'static str> {
        match self {
            HarnessKind::Scripted => None,
            HarnessKind::Claude => Some("claude"),
            HarnessKind::Codex => Some("codex"),
            HarnessKind::Omp => Some("omp"),
            HarnessKind::Pi => Some("pi"),
        }
    }
}
