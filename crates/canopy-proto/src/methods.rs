//! The method table: every API method declared once, with its subject name, request and
//! response types, who may call it, the daemon's area and handler, and its native tool (name and
//! description) if it is one.
//!
//! Everything per-method elsewhere is derived from this table through `api_methods!`: the
//! `Method` enum and its list, names and callers (`subject`), the typed markers a client call
//! is checked against (`ApiMethod`), the JSON Schemas (`schema`), the daemon's dispatch and
//! the tool catalog (`canopy-tools`). Adding a method is one line here plus its handler.
//! Does not decide anything about a request beyond who may send it.

/// Which credential may call a method: checked by the daemon's dispatch before the handler
/// runs. Finer rules (a channel's post policy, a role's tools, whose descendant) are the
/// handler's and the per-role tool check's, made with the caller's resolved account; the
/// table's `who` text says them, and the authorization matrix (`access`) proves them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Any account's token: an operator's, or a live session's.
    Anyone,
    /// Only an operator's token.
    Operators,
    /// Only a runner's credential.
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
    const METHOD: Method;
}

/// Calls `$apply! { (Variant, area.handler, "subject.name", Request => Response, Access, "who may
/// call it", "what it does", tool), .. }` with the whole table. The tool methods come first,
/// in the order sessions see the tools. `proto/SUBJECTS.md`'s API table is printed from it.
#[macro_export]
macro_rules! api_methods {
    ($apply:path) => {
        $apply! {
            (MessagesPost, messages.messages_post, "messages.post", PostRequest => PostResponse, Anyone,
                "any account, by the channel's post policy",
                "commit a message; idempotent by `(sender, idempotency_key)`",
                Some(("comms_post_message", "Post a message to a channel and topic (both required; there is no default channel). Returns the stored message and its sequence number."))),
            (MessagesRead, messages.messages_read, "messages.read", ReadRequest => ReadResponse, Anyone,
                "operators; agents on channels they subscribe to",
                "a page of a channel after a sequence, grouped by topic",
                Some(("comms_list_messages", "Read a channel's messages after a sequence number, grouped by topic; with unread, only those past your own cursor (what has not reached you yet)."))),
            (ChannelsList, messages.channels_list, "channels.list", ChannelsListRequest => ChannelsListResponse, Anyone,
                "any account",
                "every channel with kind, policies, owner, posters, subscriber count",
                Some(("comms_list_channels", "List the channels with their kind, post policy and subscription policy."))),
            (TopicsList, messages.topics_list, "topics.list", TopicsListRequest => TopicsListResponse, Anyone,
                "any account",
                "a channel's topics, most recent activity first",
                Some(("comms_list_topics", "List a channel's topics, most recent activity first."))),
            (AgentsSetActivity, agents.agents_set_activity, "agents.set_activity", SetActivityRequest => canopy_core::RosterEntry, Anyone,
                "agents",
                "set the caller's roster activity line",
                Some(("comms_set_activity", "Set the one-line activity the roster shows for you (empty clears it)."))),
            (ChannelsSubscribe, messages.channels_subscribe, "channels.subscribe", ChannelRequest => canopy_core::Channel, Anyone,
                "agents",
                "join an optional (general) channel",
                Some(("comms_subscribe", "Join an optional channel; its messages then reach you at your turn starts."))),
            (ChannelsUnsubscribe, messages.channels_unsubscribe, "channels.unsubscribe", ChannelRequest => canopy_core::Channel, Anyone,
                "agents",
                "leave an optional channel; mandatory ones are refused",
                Some(("comms_unsubscribe", "Leave an optional channel (home, broadcast, coordination and direct channels cannot be left)."))),
            (ChannelsOpenDirect, messages.channels_open_direct, "channels.open_direct", OpenDirectRequest => canopy_core::Channel, Anyone,
                "agents",
                "the two-party channel with a peer, the parent or a report",
                Some(("comms_open_direct", "Open (or find) the two-party channel between you and a peer, your parent or one of your reports."))),
            (Tree, agents.tree, "tree", TreeRequest => TreeResponse, Anyone,
                "any account",
                "the agent tree from the Supervisor down",
                Some(("tree_show", "Show the agent tree around you, read fresh: your parent, your peers, and your own subtree (depth levels down; default 2, at most 5). Counts stand in for what is left out."))),
            (Roster, agents.roster, "roster", RosterRequest => RosterResponse, Anyone,
                "any account",
                "every agent's presence, reason, activity line, incarnation, runner, last seen",
                Some(("roster_list", "List agents with their presence, activity line and last-seen time, by handle: optionally only one presence or named handles; at most 200 per call, with more counting the rest (pass the last handle as after)."))),
            (BoardPin, messages.board_pin, "board.pin", BoardPinRequest => BoardResponse, Anyone,
                "operators; agents on channels they read",
                "pin a message of the channel to its board",
                Some(("board_pin", "Pin a message to its channel's board (a pointer to the message, by sequence number)."))),
            (BoardList, messages.board_list, "board.list", BoardListRequest => BoardResponse, Anyone,
                "operators; agents on channels they read",
                "the channel's pinned messages",
                Some(("board_list", "List a channel's pinned messages."))),
            (BoardUnpin, messages.board_unpin, "board.unpin", BoardPinRequest => BoardResponse, Anyone,
                "operators; agents their own pins",
                "take a message off the channel's board",
                Some(("board_unpin", "Take a message off its channel's board (by sequence number): your own pins only."))),
            (SpawnRequest, gate.spawn_request, "spawn.request", SpawnRequestRequest => canopy_core::SpawnRequest, Anyone,
                "agents",
                "ask for a child Manager; returns the request, `pending`, at once (policy refusals are `limit_exceeded`)",
                Some(("agents_spawn_peer", "Ask the operator for a new child Manager. Returns at once with the request id and state pending; the operator's answer arrives as a message at a later turn."))),
            (SpawnCancel, gate.spawn_cancel, "spawn.cancel", SpawnCancelRequest => canopy_core::SpawnRequest, Anyone,
                "the requester",
                "withdraw its own pending request",
                Some(("agents_cancel_spawn", "Withdraw one of your own pending spawn requests (by its id, req-N)."))),
            (AgentsDespawn, gate.agents_despawn, "agents.despawn", AgentsDespawnRequest => AgentsDespawnResponse, Anyone,
                "operators (not the Supervisor); agents for their descendants",
                "despawn an agent and its subtree",
                Some(("agents_despawn_peer", "Despawn one of your descendants (and its subtree); its session stops and its history stays."))),
            (RunsStart, runs.runs_start, "runs.start", RunsStartRequest => RunsStartResponse, Anyone,
                "agents with `agents_run_subagent`",
                "start an ephemeral subagent run with a brief; capped per Manager",
                Some(("agents_run_subagent", "Brief an ephemeral implementer subagent (definition, e.g. implementer; brief: goal, context, constraints, done-means, report wanted). Optional issue: the issue it works on (yours or a report's); its usage counts there and its report names it. Returns at once; its report arrives as a message in your home channel at a later turn start. Needs no approval; runs per Manager are capped."))),
            (WorkspaceStatus, repos.workspace_status, "workspace.status", WorkspaceStatusRequest => WorkspaceStatusResponse, Anyone,
                "agents with a checkout",
                "the caller's checkout: branch, ahead/behind the base, dirty files, runs with unmerged branches",
                Some(("workspace_status", "Your checkout: the branch, commits ahead of and behind the repository's base, uncommitted files, and your finished runs whose branches you have not merged or discarded."))),
            (RunsMerge, repos.runs_merge, "runs.merge", RunsMergeRequest => RunsMergeResponse, Anyone,
                "the run's Manager",
                "merge a finished run's branch into the Manager's branch; a conflict changes nothing and names the files",
                Some(("runs_merge", "Merge a finished run's branch (by run_id) into your branch in your checkout: a fast-forward when possible, else a merge commit. A conflict changes nothing and lists the files. The run's checkout is removed once merged."))),
            (RunsDiscard, repos.runs_discard, "runs.discard", RunsDiscardRequest => RunsDiscardResponse, Anyone,
                "the run's Manager",
                "drop a finished run's branch and remove its checkout",
                Some(("runs_discard", "Drop a finished run's work (by run_id): its checkout is removed and its branch is not merged."))),
            (MergesRequest, merges.merges_request, "merges.request", MergesRequestRequest => canopy_core::MergeRequest, Anyone,
                "agents with a checkout",
                "ask the operator to merge the caller's branch into the repository's base; checked, then posted for a decision",
                Some(("merge_request", "Ask the operator to merge your branch, as committed now, into the repository's base branch (title, summary, optional depends_on: earlier requests it stacks on; optional issues: the issues it works on, whose owners are told when it lands). The check runs on the merged tree; the answer waits for it up to 10 s (state pending, with commits, diffstat and check), else answers checking and the result follows. The request is posted in your home channel under merge: <title>, and the decision arrives as a message there."))),
            (ChecksStatus, checks.checks_status, "checks.status", ChecksStatusRequest => ChecksStatusResponse, Anyone,
                "any account (an agent: its repository's)",
                "the newest checks of a branch, run or merge request: each check's state and outcome",
                Some(("checks_status", "The named checks of your branch (default), a run's branch (run-N) or one of your merge requests (merge-N) on the newest commit checked: each check running, passed, failed or timed_out, with its outcome and duration. A failing check's notice (topic checks: <branch>) quotes the last 60 lines of its log."))),
            (ReviewsRequest, merges.reviews_request, "reviews.request", ReviewsRequestRequest => ReviewsRequestResponse, Anyone,
                "the request's requester",
                "start a reviewer run on an undecided merge request's merged tree",
                Some(("review_request", "Start a reviewer run on one of your undecided merge requests (merge_request: merge-N; optional focus). It reads the merged tree read-only with the diff, your summary and the linked issues, and submits approve or changes_requested with comments on files and lines; the verdict arrives in the request's topic. A review counts for the head it read: new commits need a new review."))),
            (ReviewsSubmit, merges.reviews_submit, "reviews.submit", ReviewsSubmitRequest => canopy_core::review::Review, Anyone,
                "a reviewer run, once",
                "record a reviewer run's verdict on the request it reviews",
                Some(("review_submit", "Submit your verdict on the merge request you were started to review, once: verdict approve or changes_requested, a summary, and comments [{file, line, body}] on lines of the merged tree. Then end your turn."))),
            (IssuesList, issues.issues_list, "issues.list", IssuesListRequest => IssuesListResponse, Anyone,
                "any account",
                "a page of issues by state, owner (me, reports, subtree, nobody, a handle), subtree and label",
                Some(("issues_list", "List issues, lowest number first: by default your own that are not closed. Filters: state, owner (me, reports, subtree, nobody or a handle), subtree (a handle: it and its descendants), label; at most 200 per call (pass next_after as after)."))),
            (IssuesShow, issues.issues_show, "issues.show", IssuesShowRequest => IssueDetail, Anyone,
                "any account",
                "an issue with its events, sub-issues, runs, merges and spend",
                Some(("issues_show", "Show an issue by number: body, state, owner, blocker, its history of events, sub-issues, linked runs and merge requests, and its spend."))),
            (IssuesCreate, issues.issues_create, "issues.create", IssuesCreateRequest => canopy_core::issues::Issue, Anyone,
                "operators; agents for themselves, for a descendant as a sub-issue of one they own, or to their parent",
                "file an issue (state `open`); filed to the parent it is a request up the tree",
                Some(("issues_create", "File an issue (title, body, optional labels and depends_on). Without owner it is yours; owner a report of yours makes it a sub-issue of one you own (parent required); owner your parent sends it up the tree as a request."))),
            (IssuesAssign, issues.issues_assign, "issues.assign", IssuesAssignRequest => canopy_core::issues::Issue, Anyone,
                "operators; agents to themselves or their descendants",
                "give an issue an owner; its topic moves to the new owner's home channel, and both owners are told",
                Some(("issues_assign", "Give an issue to yourself or one of your descendants (by handle, with an optional note). Its topic moves to the new owner's home channel with its history, and the previous owner is told."))),
            (IssuesUpdate, issues.issues_update, "issues.update", IssuesUpdateRequest => canopy_core::issues::Issue, Anyone,
                "operators; agents their own issues (state, labels, depends_on, body)",
                "move an issue (with a note; `blocked` names its blocker, a close its resolution) or edit it",
                Some(("issues_update", "Change one of your issues: state with a note (blocked names blocked_by issues or a question for the operator; done and wontdo take a one-line resolution; done waits for every sub-issue), labels, depends_on, body or title."))),
            (IssuesComment, issues.issues_comment, "issues.comment", IssuesCommentRequest => canopy_core::issues::Issue, Anyone,
                "any account",
                "add a comment to an issue's history; it reaches an agent owner in the issue's topic",
                Some(("issues_comment", "Comment on an issue: the comment joins its history and reaches its owner in the issue's topic; an @mention steers as in any post."))),
            (PromptsSkill, prompts.prompts_skill, "prompts.skill", PromptsReadRequest => PromptsReadResponse, Anyone,
                "agents whose prompt lists the skill; operators",
                "a skill's body (tool `skill_read`)",
                Some(("skill_read", "Read the body of a skill your prompt lists by name."))),
            (PromptsRule, prompts.prompts_rule, "prompts.rule", PromptsReadRequest => PromptsReadResponse, Anyone,
                "agents whose prompt lists the rule; operators",
                "a rule's body (tool `rule_read`)",
                Some(("rule_read", "Read the body of a rule your prompt lists by name."))),
            (HistorySearch, history.history_search, "history.search", HistorySearchRequest => HistorySearchResponse, Anyone,
                "agents (their own history only)",
                "earlier messages the caller sent or received and, when asked, its tool events: redacted, bounded excerpts, newest first, with a cursor",
                Some(("history_search", "Search your own earlier sessions (every restart and compaction): messages you sent or received, and with include_tool_events your tool calls (name, status, short preview). Optional query text; newest first; limit defaults to 10, at most 50; pass next_before as before for older results. Call it before asking anyone to repeat context."))),
            (Whoami, agents.whoami, "whoami", WhoamiRequest => WhoamiResponse, Anyone,
                "any account",
                "the caller's account, the workspace, the daemon version",
                None),
            (AgentsCreate, agents.agents_create, "agents.create", AgentsCreateRequest => canopy_core::Account, Operators,
                "operators",
                "create a standing agent, its home channel and its subscriptions",
                None),
            (AgentsList, agents.agents_list, "agents.list", AgentsListRequest => AgentsListResponse, Operators,
                "operators",
                "every agent, by handle",
                None),
            (AgentsShow, agents.agents_show, "agents.show", AgentsShowRequest => AgentsShowResponse, Operators,
                "operators",
                "one account, its children and its subscriptions with cursors",
                None),
            (AgentsReparent, agents.agents_reparent, "agents.reparent", AgentsReparentRequest => canopy_core::Account, Operators,
                "operators",
                "move an agent; refuses cycles (`conflict`) and the Supervisor (`forbidden`)",
                None),
            (ChannelsCreate, messages.channels_create, "channels.create", ChannelsCreateRequest => canopy_core::Channel, Operators,
                "operators",
                "a `general` or `broadcast` channel",
                None),
            (MessagesSync, messages.messages_sync, "messages.sync", SyncRequest => SyncResponse, Operators,
                "operators",
                "a flat page after a sequence, for followers catching up",
                None),
            (AgentsStart, sessions.agents_start, "agents.start", AgentsStartStopRequest => canopy_core::RosterEntry, Operators,
                "operators",
                "let an agent's session run (clears a crash loop)",
                None),
            (AgentsStop, sessions.agents_stop, "agents.stop", AgentsStartStopRequest => canopy_core::RosterEntry, Operators,
                "operators",
                "stop an agent's session and keep it stopped",
                None),
            (ActivityRead, agents.activity_read, "activity.read", ActivityReadRequest => ActivityReadResponse, Operators,
                "operators",
                "an agent's stored session activity after an id, or its newest items",
                None),
            (TopicsRename, messages.topics_rename, "topics.rename", TopicsRenameRequest => Done, Operators,
                "operators",
                "rename a topic",
                None),
            (TopicsResolve, messages.topics_resolve, "topics.resolve", TopicsResolveRequest => Done, Operators,
                "operators",
                "mark a topic resolved, or open it again",
                None),
            (SpawnDecide, gate.spawn_decide, "spawn.decide", SpawnDecideRequest => canopy_core::SpawnRequest, Anyone,
                "operators (an agent's attempt is refused and audited)",
                "approve or deny a pending request",
                None),
            (MergesDecide, merges.merges_decide, "merges.decide", MergesDecideRequest => canopy_core::MergeRequest, Anyone,
                "operators (an agent's attempt is refused and audited)",
                "approve (the daemon merges into the canonical repository) or deny a pending merge request",
                None),
            (MergesList, merges.merges_list, "merges.list", MergesListRequest => MergesListResponse, Operators,
                "operators",
                "merge requests, newest first",
                None),
            (MergesShow, merges.merges_show, "merges.show", MergesShowRequest => MergeDetail, Operators,
                "operators",
                "one merge request with its checks, reviews, conflicts and place in the queue",
                None),
            (MergesQueue, merges.merges_queue, "merges.queue", MergesQueueRequest => MergesQueueResponse, Operators,
                "operators",
                "each repository's merge queue in order",
                None),
            (ChecksList, checks.checks_list, "checks.list", ChecksListRequest => ChecksListResponse, Operators,
                "operators",
                "check runs, newest first, by repository or branch",
                None),
            (ChecksLog, checks.checks_log, "checks.log", ChecksLogRequest => ChecksLogResponse, Operators,
                "operators",
                "a check's output (its last MiB), a page at a time",
                None),
            (IssuesBudget, issues.issues_budget, "issues.budget", IssuesBudgetRequest => canopy_core::issues::Issue, Operators,
                "operators",
                "set or clear an issue's dollar budget; runs for a spent issue are held",
                None),
            (IssuesImport, issues.issues_import, "issues.import", IssuesImportRequest => IssuesImportResponse, Operators,
                "operators",
                "file issues from another tracker (gh's JSON), idempotent by source and number",
                None),
            (IssuesExport, issues.issues_export, "issues.export", IssuesExportRequest => IssuesExportResponse, Operators,
                "operators",
                "whole issues, a page at a time",
                None),
            (ReposAdd, repos.repos_add, "repos.add", ReposAddRequest => canopy_core::Repo, Operators,
                "operators",
                "register a repository and make Canopy's mirror of it",
                None),
            (ReposList, repos.repos_list, "repos.list", ReposListRequest => ReposListResponse, Operators,
                "operators",
                "the repositories and every checkout",
                None),
            (ReposGc, repos.repos_gc, "repos.gc", ReposGcRequest => ReposGcResponse, Operators,
                "operators",
                "report (and remove) checkout directories nothing owns",
                None),
            (SpawnList, gate.spawn_list, "spawn.list", SpawnListRequest => SpawnListResponse, Operators,
                "operators",
                "spawn requests, newest first",
                None),
            (AuditList, gate.audit_list, "audit.list", AuditListRequest => AuditListResponse, Operators,
                "operators",
                "the audit log",
                None),
            (PromptsRender, prompts.prompts_render, "prompts.render", PromptsRenderRequest => PromptsRenderResponse, Operators,
                "operators",
                "the exact prompt a session of an agent (or a role) receives, its sections, tools and hash",
                None),
            (RunsList, runs.runs_list, "runs.list", RunsListRequest => RunsListResponse, Operators,
                "operators",
                "subagent runs, newest first",
                None),
            (Usage, history.usage, "usage", UsageRequest => UsageResponse, Operators,
                "operators",
                "tokens and cost reported by sessions: per agent, and for one agent per session and per recent turn; every budget with its spend in the current window",
                None),
            (UsageSeries, history.usage_series, "usage.series", UsageSeriesRequest => UsageSeriesResponse, Operators,
                "operators",
                "spend over time: 24 hourly or 30 daily points for the workspace, an agent, its subtree or an issue, with the budgets covering it",
                None),
            (AgentsBudget, budgets.agents_budget, "agents.budget", AgentsBudgetRequest => AgentsBudgetResponse, Operators,
                "operators",
                "set, clear or show an agent's own or subtree budget (US dollars and/or tokens, per period or lifetime); raising one delivers what it held. Audited as `agents.budget`",
                None),
            (AgentsInterrupt, sessions.agents_interrupt, "agents.interrupt", AgentsInterruptRequest => AgentsInterruptResponse, Operators,
                "operators (an agent's session token is refused, `forbidden`)",
                "stop the agent's running turn through its runner; the session stays up (same incarnation), pending messages stay pending. `interrupted: false` with a reason when no turn runs; `not_found` naming `handle` for an unknown agent, `conflict` naming `handle` without a live session, `unavailable` when its runner does not answer. Audited as `agents.interrupt`",
                None),
            (OperatorsAdd, credentials.operators_add, "operators.add", OperatorsAddRequest => OperatorsAddResponse, Operators,
                "operators",
                "another operator with a token of its own, returned once (only its hash is stored); audited",
                None),
            (OperatorsList, credentials.operators_list, "operators.list", OperatorsListRequest => OperatorsListResponse, Operators,
                "operators",
                "every operator with its state (`active` or `revoked`)",
                None),
            (OperatorsRevoke, credentials.operators_revoke, "operators.revoke", OperatorsRevokeRequest => canopy_core::Account, Operators,
                "operators",
                "revoke an operator: its token is refused from the next request on, cached or not; the last active operator cannot be revoked; audited",
                None),
            (RunnersAdd, credentials.runners_add, "runners.add", RunnersAddRequest => RunnersAddResponse, Operators,
                "operators",
                "a credential for a new runner (NATS login and API token), written 0600 under `credentials/runners/`; the managed server accepts it at once",
                None),
            (RunnersRemove, credentials.runners_remove, "runners.remove", RunnersRemoveRequest => CredentialsChangedResponse, Operators,
                "operators",
                "revoke a runner's credential: its NATS connection is closed and its token refused",
                None),
            (RunnersList, sessions.runners_list, "runners.list", RunnersListRequest => RunnersListResponse, Operators,
                "operators",
                "every runner the daemon has seen: labels, live sessions, capacity, last sync, version, whether it is live and draining",
                None),
            (RunnersDrain, sessions.runners_drain, "runners.drain", RunnersDrainRequest => RunnerInfo, Operators,
                "operators",
                "drain a runner (no new sessions there; each of its sessions ends at its next turn boundary and starts on another runner) or, with `drain: false`, take it back; audited",
                None),
            (CredentialsRotate, credentials.credentials_rotate, "credentials.rotate", CredentialsRotateRequest => CredentialsChangedResponse, Operators,
                "operators",
                "new NATS passwords and runner tokens for every party; connections under the old ones are closed, and clients on this machine log in again with the new ones",
                None),
            (RunnersSync, sessions.runners_sync, "runners.sync", RunnersSyncRequest => RunnersSyncResponse, Runner,
                "runners (its own id)",
                "heartbeat; the reply lists the sessions the runner should host, with tokens",
                None),
            (SessionsReport, sessions.sessions_report, "sessions.report", SessionsReportRequest => SessionsReportResponse, Runner,
                "runners (its own id)",
                "a batch of session events: presence, activity, ends, crash loops",
                None),
            (DeliveriesPull, sessions.deliveries_pull, "deliveries.pull", DeliveriesPullRequest => DeliveriesPullResponse, Runner,
                "the runner hosting the session",
                "a live session's pending messages, oldest first, and whether they may wake it",
                None),
            (DeliveriesAck, sessions.deliveries_ack, "deliveries.ack", DeliveriesAckRequest => DeliveriesAckResponse, Runner,
                "the runner hosting the session",
                "the harness accepted these messages at a turn start: cursors advance",
                None),
            (RunsFinish, runs.runs_finish, "runs.finish", RunsFinishRequest => RunsFinishResponse, Runner,
                "the runner hosting the run",
                "a run's final report (or failure); posted to its Manager once",
                None),
            (SessionsContinuity, history.sessions_continuity, "sessions.continuity", SessionsContinuityRequest => SessionsContinuityResponse, Runner,
                "the runner hosting the session",
                "the continuity block (at most 1,500 characters) for the head of a live session's first input after a start or a compaction",
                None),
        }
    };
}

/// The per-method items of this crate, from the table.
macro_rules! define_methods {
    ($(($variant:ident, $area:ident . $handler:ident, $name:literal, $req:ty => $resp:ty, $access:ident, $who:literal, $what:literal, $tool:expr)),* $(,)?) => {
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

            /// Which credential may call it.
            pub fn access(self) -> $crate::methods::Access {
                match self {
                    $(Method::$variant => $crate::methods::Access::$access,)*
                }
            }

            /// Who may call it, in words (the handler's finer rules included).
            pub fn who(self) -> &'static str {
                match self {
                    $(Method::$variant => $who,)*
                }
            }

            /// What it does, in words.
            pub fn what(self) -> &'static str {
                match self {
                    $(Method::$variant => $what,)*
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

crate::api_methods!(define_methods);

impl Method {
    /// Parses a subject suffix.
    pub fn parse(suffix: &str) -> Option<Method> {
        Method::ALL.iter().copied().find(|m| m.as_str() == suffix)
    }

    /// Whether only runners (authenticated by the runner token) may call the method.
    pub fn is_runner_method(self) -> bool {
        self.access() == Access::Runner
    }

    /// `proto/SUBJECTS.md`'s API table, printed from the method table.
    pub fn table() -> String {
        let mut out = String::from(
            "| subject | access | who may call | what it does | tool |\n| --- | --- | --- | --- | --- |\n",
        );
        for m in Method::ALL {
            let access = match m.access() {
                Access::Anyone => "any account",
                Access::Operators => "operators",
                Access::Runner => "runner",
            };
            let tool = m.tool().map(|t| format!("`{}`", t.name)).unwrap_or_default();
            out.push_str(&format!(
                "| `canopy.<ws>.api.{}` | {access} | {} | {} | {tool} |\n",
                m.as_str(),
                m.who(),
                m.what()
            ));
        }
        out
    }

    /// The native tools, in the order sessions see them.
    pub fn tools() -> impl Iterator<Item = (Method, crate::methods::Tool)> {
        Method::ALL.iter().filter_map(|m| m.tool().map(|t| (*m, t)))
    }
}
