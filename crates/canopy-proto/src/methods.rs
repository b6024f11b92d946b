//! The method table: every API method declared once, with its subject name, request and
//! response types, who may call it, the daemon's handler, and its native tool (name and
//! description) if it is one.
//!
//! Everything per-method elsewhere is derived from this table through `api_methods!`: the
//! `Method` enum and its list, names and callers (`subject`), the typed markers a client call
//! is checked against (`ApiMethod`), the JSON Schemas (`schema`), the daemon's dispatch and
//! the tool catalog (`canopy-tools`). Adding a method is one line here plus its handler.
//! Does not decide anything about a request beyond who may send it.

/// Who may call a method. Finer rules (operators only, a role's tools) are the handler's and
/// the per-role tool check's, made with the caller's resolved account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Callers {
    /// Any account's token: an operator, or an agent's session token.
    Account,
    /// Only the workspace's runner token.
    Runner,
}

/// A native tool: how a session sees a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tool {
    pub name: &'static str,
    pub description: &'static str,
}

/// A method as a type, so a typed call cannot pair it with the wrong request or response.
pub trait ApiMethod {
    type Request: serde::Serialize + serde::de::DeserializeOwned + schemars::JsonSchema + Send + Sync;
    type Response: serde::Serialize + serde::de::DeserializeOwned + schemars::JsonSchema + Send;
    const METHOD: crate::Method;
}

/// Calls `$apply! { (Variant, handler, "subject.name", Request => Response, Callers, tool), .. }`
/// with the whole table. The tool methods come first, in the order sessions see the tools.
#[macro_export]
macro_rules! api_methods {
    ($apply:path) => {
        $apply! {
            (MessagesPost, messages_post, "messages.post", PostRequest => PostResponse, Account,
                Some(("comms_post_message", "Post a message to a channel and topic (both required; there is no default channel). Returns the stored message and its sequence number."))),
            (MessagesRead, messages_read, "messages.read", ReadRequest => ReadResponse, Account,
                Some(("comms_list_messages", "Read a channel's messages after a sequence number, grouped by topic."))),
            (ChannelsList, channels_list, "channels.list", ChannelsListRequest => ChannelsListResponse, Account,
                Some(("comms_list_channels", "List the channels with their kind, post policy and subscription policy."))),
            (TopicsList, topics_list, "topics.list", TopicsListRequest => TopicsListResponse, Account,
                Some(("comms_list_topics", "List a channel's topics, most recent activity first."))),
            (AgentsSetActivity, agents_set_activity, "agents.set_activity", SetActivityRequest => canopy_core::RosterEntry, Account,
                Some(("comms_set_activity", "Set the one-line activity the roster shows for you (empty clears it)."))),
            (ChannelsSubscribe, channels_subscribe, "channels.subscribe", ChannelRequest => canopy_core::Channel, Account,
                Some(("comms_subscribe", "Join an optional channel; its messages then reach you at your turn starts."))),
            (ChannelsUnsubscribe, channels_unsubscribe, "channels.unsubscribe", ChannelRequest => canopy_core::Channel, Account,
                Some(("comms_unsubscribe", "Leave an optional channel (home, broadcast, coordination and direct channels cannot be left)."))),
            (ChannelsOpenDirect, channels_open_direct, "channels.open_direct", OpenDirectRequest => canopy_core::Channel, Account,
                Some(("comms_open_direct", "Open (or find) the two-party channel between you and a peer, your parent or one of your reports."))),
            (Tree, tree, "tree", TreeRequest => TreeResponse, Account,
                Some(("tree_show", "Show the agent tree, read fresh: who is above, beside and below you."))),
            (Roster, roster, "roster", RosterRequest => RosterResponse, Account,
                Some(("roster_list", "List every agent with its presence, activity line and last-seen time."))),
            (BoardPin, board_pin, "board.pin", BoardPinRequest => BoardResponse, Account,
                Some(("board_pin", "Pin a message to its channel's board (a pointer to the message, by sequence number)."))),
            (BoardList, board_list, "board.list", BoardListRequest => BoardResponse, Account,
                Some(("board_list", "List a channel's pinned messages."))),
            (SpawnRequest, spawn_request, "spawn.request", SpawnRequestRequest => canopy_core::SpawnRequest, Account,
                Some(("agents_spawn_peer", "Ask the operator for a new child Manager. Returns at once with the request id and state pending; the operator's answer arrives as a message at a later turn."))),
            (SpawnCancel, spawn_cancel, "spawn.cancel", SpawnCancelRequest => canopy_core::SpawnRequest, Account,
                Some(("agents_cancel_spawn", "Withdraw one of your own pending spawn requests (by its id, req-N)."))),
            (AgentsDespawn, agents_despawn, "agents.despawn", AgentsDespawnRequest => AgentsDespawnResponse, Account,
                Some(("agents_despawn_peer", "Despawn one of your descendants (and its subtree); its session stops and its history stays."))),
            (RunsStart, runs_start, "runs.start", RunsStartRequest => RunsStartResponse, Account,
                Some(("agents_run_subagent", "Brief an ephemeral implementer subagent (definition, e.g. implementer; brief: goal, context, constraints, done-means, report wanted). Returns at once; its report arrives as a message in your home channel at a later turn start. Needs no approval; runs per Manager are capped."))),
            (PromptsSkill, prompts_skill, "prompts.skill", PromptsReadRequest => PromptsReadResponse, Account,
                Some(("skill_read", "Read the body of a skill your prompt lists by name."))),
            (PromptsRule, prompts_rule, "prompts.rule", PromptsReadRequest => PromptsReadResponse, Account,
                Some(("rule_read", "Read the body of a rule your prompt lists by name."))),
            (HistorySearch, history_search, "history.search", HistorySearchRequest => HistorySearchResponse, Account,
                Some(("history_search", "Search your own earlier sessions (every restart and compaction): messages you sent or received, and with include_tool_events your tool calls (name, status, short preview). Optional query text; newest first; limit defaults to 10, at most 50; pass next_before as before for older results. Call it before asking anyone to repeat context."))),
            (BoardUnpin, board_unpin, "board.unpin", BoardPinRequest => BoardResponse, Account, None),
            (Whoami, whoami, "whoami", WhoamiRequest => WhoamiResponse, Account, None),
            (AgentsCreate, agents_create, "agents.create", AgentsCreateRequest => canopy_core::Account, Account, None),
            (AgentsList, agents_list, "agents.list", AgentsListRequest => AgentsListResponse, Account, None),
            (AgentsShow, agents_show, "agents.show", AgentsShowRequest => AgentsShowResponse, Account, None),
            (AgentsReparent, agents_reparent, "agents.reparent", AgentsReparentRequest => canopy_core::Account, Account, None),
            (ChannelsCreate, channels_create, "channels.create", ChannelsCreateRequest => canopy_core::Channel, Account, None),
            (MessagesSync, messages_sync, "messages.sync", SyncRequest => SyncResponse, Account, None),
            (AgentsStart, agents_start, "agents.start", AgentsStartStopRequest => canopy_core::RosterEntry, Account, None),
            (AgentsStop, agents_stop, "agents.stop", AgentsStartStopRequest => canopy_core::RosterEntry, Account, None),
            (ActivityRead, activity_read, "activity.read", ActivityReadRequest => ActivityReadResponse, Account, None),
            (TopicsRename, topics_rename, "topics.rename", TopicsRenameRequest => Done, Account, None),
            (TopicsResolve, topics_resolve, "topics.resolve", TopicsResolveRequest => Done, Account, None),
            (SpawnDecide, spawn_decide, "spawn.decide", SpawnDecideRequest => canopy_core::SpawnRequest, Account, None),
            (SpawnList, spawn_list, "spawn.list", SpawnListRequest => SpawnListResponse, Account, None),
            (AuditList, audit_list, "audit.list", AuditListRequest => AuditListResponse, Account, None),
            (PromptsRender, prompts_render, "prompts.render", PromptsRenderRequest => PromptsRenderResponse, Account, None),
            (RunsList, runs_list, "runs.list", RunsListRequest => RunsListResponse, Account, None),
            (Usage, usage, "usage", UsageRequest => UsageResponse, Account, None),
            (AgentsInterrupt, agents_interrupt, "agents.interrupt", AgentsInterruptRequest => AgentsInterruptResponse, Account, None),
            (RunnersSync, runners_sync, "runners.sync", RunnersSyncRequest => RunnersSyncResponse, Runner, None),
            (SessionsReport, sessions_report, "sessions.report", SessionsReportRequest => SessionsReportResponse, Runner, None),
            (DeliveriesPull, deliveries_pull, "deliveries.pull", DeliveriesPullRequest => DeliveriesPullResponse, Runner, None),
            (DeliveriesAck, deliveries_ack, "deliveries.ack", DeliveriesAckRequest => DeliveriesAckResponse, Runner, None),
            (RunsFinish, runs_finish, "runs.finish", RunsFinishRequest => RunsFinishResponse, Runner, None),
            (SessionsContinuity, sessions_continuity, "sessions.continuity", SessionsContinuityRequest => SessionsContinuityResponse, Runner, None),
        }
    };
}

/// The per-method items of this crate, from the table.
macro_rules! define_methods {
    ($(($variant:ident, $handler:ident, $name:literal, $req:ty => $resp:ty, $callers:ident, $tool:expr)),* $(,)?) => {
        /// An API method, served as request/reply on `canopy.<ws>.api.<method>`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Method {
            $($variant,)*
        }

        impl Method {
            /// Every method, in table order (the tools first).
            pub const ALL: &'static [Method] = &[$(Method::$variant,)*];

            /// The subject suffix after `api.`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Method::$variant => $name,)*
                }
            }

            /// Who may call it.
            pub fn callers(self) -> $crate::methods::Callers {
                match self {
                    $(Method::$variant => $crate::methods::Callers::$callers,)*
                }
            }

            /// The native tool it is, if it is one.
            pub fn tool(self) -> Option<$crate::methods::Tool> {
                let tool: Option<(&'static str, &'static str)> = match self {
                    $(Method::$variant => $tool,)*
                };
                tool.map(|(name, description)| $crate::methods::Tool { name, description })
            }
        }

        /// One type per method (named like its `Method` variant), for typed calls.
        pub mod method {
            #[allow(unused_imports, reason = "the table names types from both")]
            use crate::api::*;
            $(
                #[doc = concat!("`", $name, "`")]
                #[derive(Debug, Clone, Copy)]
                pub struct $variant;
                impl $crate::methods::ApiMethod for $variant {
                    type Request = $req;
                    type Response = $resp;
                    const METHOD: $crate::Method = $crate::Method::$variant;
                }
            )*
        }
    };
}

pub(crate) use define_methods;
