//! The subject map: the one place NATS subjects are spelled.
//!
//! Every subject starts with `canopy.<workspace id>.` so several workspaces can share one
//! NATS cluster. `proto/SUBJECTS.md` documents the same map for humans; a test keeps the
//! method list there in step with `Method::ALL`.

/// NATS header that carries the caller's bearer token on API requests.
pub const TOKEN_HEADER: &str = "Canopy-Token";

/// An API method, served as request/reply on `canopy.<ws>.api.<method>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Whoami,
    AgentsCreate,
    AgentsList,
    AgentsShow,
    AgentsReparent,
    Tree,
    ChannelsList,
    ChannelsCreate,
    TopicsList,
    MessagesPost,
    MessagesRead,
    MessagesSync,
    AgentsStart,
    AgentsStop,
    AgentsSetActivity,
    Roster,
    ActivityRead,
    RunnersSync,
    SessionsReport,
    DeliveriesPull,
    DeliveriesAck,
    ChannelsSubscribe,
    ChannelsUnsubscribe,
    ChannelsOpenDirect,
    TopicsRename,
    TopicsResolve,
    BoardPin,
    BoardList,
    SpawnRequest,
    SpawnDecide,
    SpawnCancel,
    SpawnList,
    AgentsDespawn,
    AuditList,
    PromptsRender,
    PromptsSkill,
    PromptsRule,
    RunsStart,
    RunsList,
    RunsFinish,
    HistorySearch,
    SessionsContinuity,
    Usage,
    AgentsInterrupt,
}

impl Method {
    /// Every method, in the order `proto/SUBJECTS.md` lists them.
    pub const ALL: &'static [Method] = &[
        Method::Whoami,
        Method::AgentsCreate,
        Method::AgentsList,
        Method::AgentsShow,
        Method::AgentsReparent,
        Method::Tree,
        Method::ChannelsList,
        Method::ChannelsCreate,
        Method::TopicsList,
        Method::MessagesPost,
        Method::MessagesRead,
        Method::MessagesSync,
        Method::AgentsStart,
        Method::AgentsStop,
        Method::AgentsSetActivity,
        Method::Roster,
        Method::ActivityRead,
        Method::RunnersSync,
        Method::SessionsReport,
        Method::DeliveriesPull,
        Method::DeliveriesAck,
        Method::ChannelsSubscribe,
        Method::ChannelsUnsubscribe,
        Method::ChannelsOpenDirect,
        Method::TopicsRename,
        Method::TopicsResolve,
        Method::BoardPin,
        Method::BoardList,
        Method::SpawnRequest,
        Method::SpawnDecide,
        Method::SpawnCancel,
        Method::SpawnList,
        Method::AgentsDespawn,
        Method::AuditList,
        Method::PromptsRender,
        Method::PromptsSkill,
        Method::PromptsRule,
        Method::RunsStart,
        Method::RunsList,
        Method::RunsFinish,
        Method::HistorySearch,
        Method::SessionsContinuity,
        Method::Usage,
        Method::AgentsInterrupt,
    ];

    /// The subject suffix after `api.`.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Whoami => "whoami",
            Method::AgentsCreate => "agents.create",
            Method::AgentsList => "agents.list",
            Method::AgentsShow => "agents.show",
            Method::AgentsReparent => "agents.reparent",
            Method::Tree => "tree",
            Method::ChannelsList => "channels.list",
            Method::ChannelsCreate => "channels.create",
            Method::TopicsList => "topics.list",
            Method::MessagesPost => "messages.post",
            Method::MessagesRead => "messages.read",
            Method::MessagesSync => "messages.sync",
            Method::AgentsStart => "agents.start",
            Method::AgentsStop => "agents.stop",
            Method::AgentsSetActivity => "agents.set_activity",
            Method::Roster => "roster",
            Method::ActivityRead => "activity.read",
            Method::RunnersSync => "runners.sync",
            Method::SessionsReport => "sessions.report",
            Method::DeliveriesPull => "deliveries.pull",
            Method::DeliveriesAck => "deliveries.ack",
            Method::ChannelsSubscribe => "channels.subscribe",
            Method::ChannelsUnsubscribe => "channels.unsubscribe",
            Method::ChannelsOpenDirect => "channels.open_direct",
            Method::TopicsRename => "topics.rename",
            Method::TopicsResolve => "topics.resolve",
            Method::BoardPin => "board.pin",
            Method::BoardList => "board.list",
            Method::SpawnRequest => "spawn.request",
            Method::SpawnDecide => "spawn.decide",
            Method::SpawnCancel => "spawn.cancel",
            Method::SpawnList => "spawn.list",
            Method::AgentsDespawn => "agents.despawn",
            Method::AuditList => "audit.list",
            Method::PromptsRender => "prompts.render",
            Method::PromptsSkill => "prompts.skill",
            Method::PromptsRule => "prompts.rule",
            Method::RunsStart => "runs.start",
            Method::RunsList => "runs.list",
            Method::RunsFinish => "runs.finish",
            Method::HistorySearch => "history.search",
            Method::SessionsContinuity => "sessions.continuity",
            Method::Usage => "usage",
            Method::AgentsInterrupt => "agents.interrupt",
        }
    }

    /// Parses a subject suffix.
    pub fn parse(suffix: &str) -> Option<Method> {
        Method::ALL.iter().copied().find(|m| m.as_str() == suffix)
    }

    /// Whether only runners (authenticated by the runner token) may call the method.
    pub fn is_runner_method(self) -> bool {
        matches!(
            self,
            Method::RunnersSync
                | Method::SessionsReport
                | Method::DeliveriesPull
                | Method::DeliveriesAck
                | Method::RunsFinish
                | Method::SessionsContinuity
        )
    }
}

/// Builds the subjects of one workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subjects {
    prefix: String,
}

impl Subjects {
    /// Subjects for the workspace with this id. The id is generated by `init` from
    /// `[a-z0-9-]`, so it is a single subject token.
    pub fn new(workspace_id: &str) -> Subjects {
        Subjects { prefix: format!("canopy.{workspace_id}") }
    }

    /// `canopy.<ws>.api.<method>`
    pub fn api(&self, method: Method) -> String {
        format!("{}.api.{}", self.prefix, method.as_str())
    }

    /// `canopy.<ws>.api.>`: what the daemon subscribes to.
    pub fn api_wildcard(&self) -> String {
        format!("{}.api.>", self.prefix)
    }

    /// Splits a received API subject into its method suffix (`agents.create`).
    pub fn api_suffix<'a>(&self, subject: &'a str) -> Option<&'a str> {
        subject.strip_prefix(self.prefix.as_str())?.strip_prefix(".api.")
    }

    /// `canopy.<ws>.evt.message.<channel>`: published after each committed message.
    pub fn message_event(&self, channel: &str) -> String {
        format!("{}.evt.message.{channel}", self.prefix)
    }

    /// `canopy.<ws>.evt.activity.<agent>`: published after each stored activity item.
    pub fn activity_event(&self, agent: &str) -> String {
        format!("{}.evt.activity.{agent}", self.prefix)
    }

    /// `canopy.<ws>.runner.<id>.deliver`: a doorbell naming agents with new messages.
    pub fn runner_deliver(&self, runner_id: &str) -> String {
        format!("{}.runner.{runner_id}.deliver", self.prefix)
    }

    /// `canopy.<ws>.runner.<id>.steer`: request/reply, inject a message into a running turn.
    pub fn runner_steer(&self, runner_id: &str) -> String {
        format!("{}.runner.{runner_id}.steer", self.prefix)
    }

    /// `canopy.<ws>.runner.<id>.interrupt`: request/reply, stop the agent's running turn.
    pub fn runner_interrupt(&self, runner_id: &str) -> String {
        format!("{}.runner.{runner_id}.interrupt", self.prefix)
    }

    /// `canopy.<ws>.runner.poke`: a doorbell telling runners to sync now.
    pub fn runner_poke(&self) -> String {
        format!("{}.runner.poke", self.prefix)
    }

    /// `canopy.<ws>.evt.message.>`: every committed message in the workspace.
    pub fn message_events_all(&self) -> String {
        format!("{}.evt.message.>", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_round_trip_through_subjects() {
        let s = Subjects::new("ws-1a2b");
        for m in Method::ALL {
            let subject = s.api(*m);
            assert_eq!(s.api_suffix(&subject).and_then(Method::parse), Some(*m), "{subject}");
        }
        assert_eq!(s.api_suffix("canopy.other.api.tree"), None);
    }

    #[test]
    fn subjects_md_lists_every_method() {
        let doc = include_str!("../../../proto/SUBJECTS.md");
        for m in Method::ALL {
            assert!(doc.contains(&format!("api.{}`", m.as_str())), "proto/SUBJECTS.md misses {}", m.as_str());
        }
    }
}
