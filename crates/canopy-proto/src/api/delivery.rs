//! Messages on their way to a live session: `deliveries.pull` and `deliveries.ack` (runner
//! calls) and the doorbell the daemon rings on a runner when a session has news.
//!
//! The message shapes themselves are `messages`; steering a running turn is `sessions`.

use canopy_core::{Incarnation, Message, RunnerId, Seq};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `deliveries.pull` (runners): an agent's pending messages, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesPullRequest {
    pub runner_id: RunnerId,
    pub agent: String,
    pub incarnation: Incarnation,
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesPullResponse {
    pub messages: Vec<Message>,
    /// Whether any of them may start a turn (not held by the loop guard, not acks only).
    pub wake: bool,
    /// All pending messages (the page may hold fewer).
    pub total: u64,
    /// Of `messages`, those an earlier session of the agent was handed and never confirmed:
    /// it may have seen them before it ended (the at-least-once window).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redelivered: Vec<Seq>,
}

/// `deliveries.ack` (runners): the harness accepted these messages at a turn start.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesAckRequest {
    pub runner_id: RunnerId,
    pub agent: String,
    pub incarnation: Incarnation,
    pub seqs: Vec<Seq>,
    /// These were steered into a running turn (ahead of the cursor), not delivered at a
    /// turn start: they are recorded one by one and the cursors stay.
    #[serde(default)]
    pub steered: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesAckResponse {
    /// Cursors that moved (0 for a repeated acknowledgement).
    pub moved: u32,
}

/// On `canopy.<ws>.runner.<id>.deliver`: these agents have new messages.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliverDoorbell {
    pub agents: Vec<String>,
}
