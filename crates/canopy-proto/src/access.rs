//! What each NATS login may publish and subscribe to: the daemon, the operators' clients, and
//! each runner, derived from the subject map and the method table.
//!
//! Below the API's tokens there is NATS itself: whoever may subscribe to `api.>` could answer
//! requests as if it were the daemon, and whoever may subscribe to a runner's subjects could
//! read its steers. So each party gets its own login, limited to what it does: only the daemon
//! serves the API and rings runners; a runner requests the runner methods and the tool methods
//! (its sessions' tool calls), hears its own subjects and the poke, and answers the daemon's
//! requests to it; an operator client requests any method and reads the events. Every party
//! takes its replies on its own inbox prefix, so no one reads another's replies. Does not
//! render a server configuration (`canopy_bus::server`) or hold a secret.

use canopy_core::RunnerId;

use crate::{Access, Method, Subjects};

/// Who a NATS login belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Party<'a> {
    Daemon,
    Operator,
    Runner(&'a RunnerId),
}

/// A login's permissions, in `nats-server`'s terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    /// Subjects it may publish to (requests included).
    pub publish: Vec<String>,
    /// Subjects it may subscribe to (queue groups included).
    pub subscribe: Vec<String>,
    /// Whether it may answer a request it received (once, to that request's reply subject).
    pub allow_responses: bool,
}

impl Subjects {
    /// The workspace id these subjects are for.
    fn workspace(&self) -> &str {
        self.prefix().strip_prefix("canopy.").unwrap_or(self.prefix())
    }

    /// The inbox prefix `party`'s client takes replies on: `_INBOX.<ws>.d` (the daemon),
    /// `_INBOX.<ws>.op` (operators), `_INBOX.<ws>.r.<id>` (a runner).
    pub fn inbox(&self, party: Party<'_>) -> String {
        let ws = self.workspace();
        match party {
            Party::Daemon => format!("_INBOX.{ws}.d"),
            Party::Operator => format!("_INBOX.{ws}.op"),
            Party::Runner(id) => format!("_INBOX.{ws}.r.{id}"),
        }
    }

    /// What `party`'s login may do.
    pub fn permissions(&self, party: Party<'_>) -> Permissions {
        let prefix = self.prefix();
        let inbox = format!("{}.>", self.inbox(party));
        match party {
            Party::Daemon => Permissions {
                publish: vec![format!("{prefix}.>"), format!("_INBOX.{}.>", self.workspace())],
                subscribe: vec![format!("{prefix}.>"), inbox],
                allow_responses: false,
            },
            Party::Operator => Permissions {
                publish: vec![self.api_wildcard()],
                subscribe: vec![format!("{prefix}.evt.>"), inbox],
                allow_responses: false,
            },
            Party::Runner(id) => Permissions {
                publish: Method::ALL
                    .iter()
                    // Its own methods, its sessions' tool calls, and `whoami`, with which the
                    // tool server asks which tools a session's role has.
                    .filter(|m| m.access() == Access::Runner || m.tool().is_some() || **m == Method::Whoami)
                    .map(|m| self.api(*m))
                    .collect(),
                subscribe: vec![self.runner_poke(), format!("{prefix}.runner.{id}.>"), inbox],
                allow_responses: true,
            },
        }
    }
}

/// The caller kinds of the authorization matrix, in column order: an operator; the
/// Supervisor; a Manager (`lead`, whose resources each request targets); its report (a child
/// Manager); an unrelated Manager; an implementer run of `lead`'s; a runner's credential (not
/// the one hosting `lead`); a session token whose session ended; no token; a malformed one.
pub const CALLERS: [&str; 10] =
    ["operator", "supervisor", "manager", "report", "unrelated", "run", "runner", "ended", "none", "malformed"];

/// Operators only.
const OPERATORS: &str = "ok no no no no no no no no no";
/// The runner methods, by a runner not hosting the session named: it is refused as a conflict.
const OTHER_RUNNERS: &str = "no no no no no no conflict no no no";
/// The runner methods that name no session.
const RUNNERS: &str = "no no no no no no ok no no no";
/// Any live account; a run only where its definition has the tool.
const SESSIONS_BUT_RUNS: &str = "ok ok ok ok ok no no no no no";

/// What each caller kind gets from `method`, called on `lead`'s resources (its home channel,
/// its descendants, its runs, its sessions), in `CALLERS` order: `ok` (the handler's answer),
/// `no` (`forbidden`), or the code of a typed refusal that comes after authorization passed
/// (`invalid_argument`, `conflict`). Every method has a row: a new one does not compile until
/// it has, and the end-to-end matrix test checks each against a live daemon.
pub fn matrix(method: Method) -> Vec<&'static str> {
    let row = match method {
        Method::MessagesPost => "ok no ok no no no no no no no",
        Method::MessagesRead => "ok no ok no no no no no no no",
        Method::ChannelsList => SESSIONS_BUT_RUNS,
        Method::TopicsList => "ok no ok no no no no no no no",
        Method::AgentsSetActivity => "invalid_argument ok ok ok ok no no no no no",
        Method::ChannelsSubscribe => SESSIONS_BUT_RUNS,
        Method::ChannelsUnsubscribe => SESSIONS_BUT_RUNS,
        // Self (lead) and operators have no direct channel with lead; its parent, report, peer do.
        Method::ChannelsOpenDirect => "invalid_argument ok invalid_argument ok ok no no no no no",
        Method::Tree => SESSIONS_BUT_RUNS,
        Method::Roster => SESSIONS_BUT_RUNS,
        Method::BoardPin => "ok no ok no no no no no no no",
        Method::BoardList => "ok no ok no no no no no no no",
        Method::SpawnRequest => "invalid_argument ok ok ok ok no no no no no",
        Method::SpawnCancel => "no no ok no no no no no no no",
        Method::AgentsDespawn => "ok ok ok no no no no no no no",
        Method::RunsStart => "no ok ok ok ok no no no no no",
        Method::PromptsSkill => SESSIONS_BUT_RUNS,
        Method::PromptsRule => SESSIONS_BUT_RUNS,
        Method::HistorySearch => "invalid_argument ok ok ok ok ok no no no no",
        Method::BoardUnpin => OPERATORS,
        // `lead` has no checkout in the matrix's workspace; a run's role lacks the tools.
        Method::WorkspaceStatus | Method::MergesRequest => {
            "invalid_argument invalid_argument invalid_argument invalid_argument invalid_argument no no no no no"
        }
        // Lead has no checkout, so no branch to check and no request to review; an operator
        // names no ref. A run's role lacks both tools.
        Method::ChecksStatus | Method::ReviewsRequest => {
            "invalid_argument invalid_argument invalid_argument invalid_argument invalid_argument no no no no no"
        }
        // Only a reviewer run started for a request submits, and none is running here.
        Method::ReviewsSubmit => "no no no no no no no no no no",
        // No such request or check: the operator is told so.
        Method::MergesShow | Method::ChecksLog => "invalid_argument no no no no no no no no no",
        // On a run of lead's without a checkout: only its Manager gets past authorization.
        Method::RunsMerge | Method::RunsDiscard => "no no invalid_argument no no no no no no no",
        // No such request: an operator is told so; anyone else is refused first.
        Method::MergesDecide => "invalid_argument no no no no no no no no no",
        // A source that is not a repository.
        Method::ReposAdd => "invalid_argument no no no no no no no no no",
        Method::Whoami => "ok ok ok ok ok ok no no no no",
        // On an issue lead owns: anyone reads and comments; a run has no issue tools.
        Method::IssuesList | Method::IssuesShow | Method::IssuesComment => SESSIONS_BUT_RUNS,
        // Filed for lead: lead itself, its ancestor only as a sub-issue of its own (none
        // named here), its report as a request up the tree.
        Method::IssuesCreate => "ok no ok ok no no no no no no",
        // Lead's issue given to lead's report: lead, an ancestor of both, or an operator.
        Method::IssuesAssign => "ok ok ok no no no no no no no",
        // Lead's issue edited: its owner or an operator.
        Method::IssuesUpdate => "ok no ok no no no no no no no",
        Method::AgentsCreate
        | Method::AgentsList
        | Method::AgentsShow
        | Method::AgentsReparent
        | Method::ChannelsCreate
        | Method::MessagesSync
        | Method::AgentsStart
        | Method::AgentsStop
        | Method::ActivityRead
        | Method::TopicsRename
        | Method::TopicsResolve
        | Method::SpawnDecide
        | Method::SpawnList
        | Method::AuditList
        | Method::PromptsRender
        | Method::RunsList
        | Method::Usage
        | Method::UsageSeries
        | Method::AgentsBudget
        | Method::AgentsInterrupt
        | Method::OperatorsAdd
        | Method::OperatorsList
        | Method::OperatorsRevoke
        | Method::RunnersAdd
        | Method::RunnersRemove
        | Method::RunnersList
        | Method::RunnersDrain
        | Method::CredentialsRotate
        | Method::MergesList
        | Method::MergesQueue
        | Method::ChecksList
        | Method::IssuesBudget
        | Method::IssuesImport
        | Method::IssuesExport
        | Method::ReposList
        | Method::ReposGc => OPERATORS,
        Method::RunnersSync | Method::SessionsReport => RUNNERS,
        Method::DeliveriesPull | Method::DeliveriesAck | Method::RunsFinish | Method::SessionsContinuity => {
            OTHER_RUNNERS
        }
    };
    row.split_whitespace().map(|answer| if answer == "no" { "forbidden" } else { answer }).collect()
}

/// `proto/SUBJECTS.md`'s table of NATS logins and what each may do.
pub fn permissions_table() -> String {
    let subjects = Subjects::new("<ws>");
    let id = RunnerId::from_trusted("<id>".into());
    let mut out =
        String::from("| login | may publish | may subscribe | answers requests |\n| --- | --- | --- | --- |\n");
    for (who, party) in
        [("daemon", Party::Daemon), ("operator clients", Party::Operator), ("runner `<id>`", Party::Runner(&id))]
    {
        let p = subjects.permissions(party);
        let list = |l: &[String]| l.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ");
        let answers = if p.allow_responses { "yes (once each)" } else { "no" };
        out.push_str(&format!("| {who} | {} | {} | {answers} |\n", list(&p.publish), list(&p.subscribe)));
    }
    out
}

/// `proto/SUBJECTS.md`'s authorization matrix, printed from `matrix`.
pub fn matrix_table() -> String {
    let mut out = format!("| method | {} |\n|{}\n", CALLERS.join(" | "), " --- |".repeat(CALLERS.len() + 1));
    for m in Method::ALL {
        let cells: Vec<&str> = matrix(*m)
            .into_iter()
            .map(|a| match a {
                "ok" => "ok",
                "forbidden" => "-",
                "invalid_argument" => "invalid",
                other => other,
            })
            .collect();
        out.push_str(&format!("| `{}` | {} |\n", m.as_str(), cells.join(" | ")));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    fn covers(patterns: &[String], subject: &str) -> bool {
        patterns.iter().any(|p| {
            let (mut p, mut s) = (p.split('.'), subject.split('.'));
            loop {
                match (p.next(), s.next()) {
                    (Some(">"), Some(_)) => return true,
                    (Some("*"), Some(_)) => {}
                    (Some(a), Some(b)) if a == b => {}
                    (None, None) => return true,
                    _ => return false,
                }
            }
        })
    }

    /// The matrix agrees with the table's access: an operator method answers only operators,
    /// a runner method only runners, and nobody without a live token gets anything.
    #[test]
    fn the_matrix_agrees_with_each_methods_access() {
        for m in Method::ALL {
            let row = matrix(*m);
            assert_eq!(row.len(), CALLERS.len(), "{}", m.as_str());
            for (caller, answer) in CALLERS.iter().zip(&row) {
                let allowed = *answer != "forbidden";
                let may = match (m.access(), *caller) {
                    (_, "ended" | "none" | "malformed") => false,
                    (Access::Runner, c) => c == "runner",
                    (_, "runner") => false,
                    (Access::Operators, c) => c == "operator",
                    (Access::Anyone, _) => true,
                };
                assert!(may || !allowed, "{} lets {caller} in against its access", m.as_str());
            }
        }
    }

    /// A session's token acts only through its tools (and `whoami`, with which the tool
    /// server lists them): any other method is an operator's or a runner's.
    #[test]
    fn every_method_a_session_may_call_is_one_of_its_tools() {
        for m in Method::ALL {
            // `spawn.decide` and `merges.decide` let an agent's token through to the gate,
            // which refuses and audits the attempt; nothing else is open to sessions without
            // being a tool.
            if m.access() == Access::Anyone && *m != Method::SpawnDecide && *m != Method::MergesDecide {
                assert!(
                    m.tool().is_some() || *m == Method::Whoami,
                    "{} is open to sessions but is no tool",
                    m.as_str()
                );
            }
        }
    }

    #[test]
    fn only_the_daemon_serves_the_api_and_rings_runners() {
        let s = Subjects::new("ws-1");
        let (r1, r2) = (RunnerId::parse("r1").unwrap(), RunnerId::parse("r2").unwrap());
        let daemon = s.permissions(Party::Daemon);
        let operator = s.permissions(Party::Operator);
        let runner = s.permissions(Party::Runner(&r1));
        let api = s.api(Method::MessagesPost);
        assert!(covers(&daemon.subscribe, &api));
        assert!(!covers(&operator.subscribe, &api) && !covers(&runner.subscribe, &api));
        assert!(covers(&runner.publish, &api), "a runner forwards its sessions' tool calls");
        assert!(covers(&runner.publish, &s.api(Method::RunnersSync)));
        assert!(!covers(&runner.publish, &s.api(Method::AgentsCreate)), "not an operator method");
        assert!(covers(&operator.publish, &s.api(Method::AgentsCreate)));
        for party in [&operator, &runner] {
            assert!(!covers(&party.publish, &s.runner_deliver(&r1)), "only the daemon rings");
            assert!(!covers(&party.publish, &s.message_event("general")), "only the daemon publishes events");
        }
        assert!(covers(&runner.subscribe, &s.runner_steer(&r1)));
        assert!(!covers(&runner.subscribe, &s.runner_steer(&r2)), "another runner's steers");
        assert!(!covers(&runner.subscribe, &format!("{}.x", s.inbox(Party::Operator))));
        assert!(!covers(&operator.subscribe, &format!("{}.x", s.inbox(Party::Runner(&r1)))));
        assert!(runner.allow_responses && !operator.allow_responses);
        let other = Subjects::new("ws-2");
        assert!(!covers(&daemon.subscribe, &other.api(Method::MessagesPost)), "one workspace's daemon only");
    }

    /// `proto/SUBJECTS.md`'s API table is the method table printed, and its matrix and logins
    /// this module's tables; `CANOPY_BLESS=1` rewrites it. Here rather than in `subject`, which
    /// this module imports.
    #[test]
    fn subjects_md_prints_the_method_table() {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto/SUBJECTS.md");
        let doc = std::fs::read_to_string(&path).unwrap_or_default();
        // Each generated part sits between its two marker lines.
        let splice = |doc: &str, start: &str, end: &str, content: String| -> String {
            let (Some(a), Some(b)) = (doc.find(start), doc.find(end)) else {
                panic!("proto/SUBJECTS.md lost its markers {start:?} .. {end:?}");
            };
            format!("{}{content}{}", &doc[..a + start.len()], &doc[b..])
        };
        let fresh = splice(
            &doc,
            "(crates/canopy-proto/src/methods.rs): CANOPY_BLESS=1 cargo test -p canopy-proto -->\n",
            "<!-- end of generated table -->",
            Method::table(),
        );
        let fresh = splice(
            &fresh,
            "<!-- the authorization matrix, printed from crate::access::matrix -->\n",
            "<!-- end of the matrix -->",
            matrix_table(),
        );
        let fresh = splice(
            &fresh,
            "<!-- the NATS logins, printed from crate::access::Subjects::permissions -->\n",
            "<!-- end of the logins -->",
            permissions_table(),
        );
        if std::env::var_os("CANOPY_BLESS").is_some() {
            std::fs::write(&path, &fresh).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        } else {
            assert!(
                doc == fresh,
                "proto/SUBJECTS.md's API table drifted from the method table; rerun with CANOPY_BLESS=1 cargo test -p canopy-proto"
            );
        }
    }
}
