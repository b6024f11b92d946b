//! The prompt bundle over the wire: `prompts.render` (an agent's block 0) and
//! `prompts.skill`/`prompts.rule` (a listed skill's or rule's body).
//!
//! Rendering itself is `canopy-prompt`'s; these are only the shapes.

use canopy_core::Incarnation;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `prompts.render` (operators): exactly what a session of an agent (or a role) receives.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptsRenderRequest {
    /// An agent's handle; or
    #[serde(default)]
    pub agent: Option<String>,
    /// a role id (rendered with placeholder identity facts).
    #[serde(default)]
    pub role: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptsRenderResponse {
    pub text: String,
    /// SHA-256 of `text`, hex.
    pub hash: String,
    pub role: String,
    /// `replace` or `delta`.
    pub mode: String,
    /// How the text reaches the harness: `replace` (the whole system prompt) or `append`.
    pub delivery: String,
    pub definition: Option<String>,
    pub sections: Vec<String>,
    /// The native tools the session has.
    pub tools: Vec<String>,
    pub harness: String,
    /// Where the bundle came from (a directory, or `embedded`).
    pub bundle: String,
    /// For an agent: the hash recorded on its latest session, with the incarnation.
    pub session: Option<SessionPrompt>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionPrompt {
    pub incarnation: Incarnation,
    pub hash: String,
}

/// `prompts.skill` / `prompts.rule`: the body of a skill or rule the caller's prompt lists.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptsReadRequest {
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptsReadResponse {
    pub name: String,
    pub description: String,
    /// With lines naming tools the caller does not have left out.
    pub body: String,
}
