//! JSON Schemas for every request, response and event, as checked in under `proto/schemas/`.
//!
//! Owns the list of (file name, schema) pairs. The drift test compares it with the files;
//! `CANOPY_BLESS=1 cargo test -p canopy-proto` rewrites them.

use schemars::{JsonSchema, schema_for};
use serde_json::Value;

use crate::api::*;
use crate::reply::{Reply, WireError};
use crate::subject::Method;

fn pair<Req: JsonSchema, Resp: JsonSchema>(method: Method) -> [(String, Value); 2] {
    [
        (format!("{}.request.json", method.as_str()), schema_for!(Req).to_value()),
        (format!("{}.reply.json", method.as_str()), schema_for!(Reply<Resp>).to_value()),
    ]
}

/// Every schema, keyed by its file name under `proto/schemas/`.
pub fn all() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for method in Method::ALL {
        let schemas = match method {
            Method::Whoami => pair::<WhoamiRequest, WhoamiResponse>(*method),
            Method::AgentsCreate => pair::<AgentsCreateRequest, canopy_core::Account>(*method),
            Method::AgentsList => pair::<AgentsListRequest, AgentsListResponse>(*method),
            Method::AgentsShow => pair::<AgentsShowRequest, AgentsShowResponse>(*method),
            Method::AgentsReparent => pair::<AgentsReparentRequest, canopy_core::Account>(*method),
            Method::Tree => pair::<TreeRequest, TreeResponse>(*method),
            Method::ChannelsList => pair::<ChannelsListRequest, ChannelsListResponse>(*method),
            Method::ChannelsCreate => pair::<ChannelsCreateRequest, canopy_core::Channel>(*method),
            Method::TopicsList => pair::<TopicsListRequest, TopicsListResponse>(*method),
            Method::MessagesPost => pair::<PostRequest, PostResponse>(*method),
            Method::MessagesRead => pair::<ReadRequest, ReadResponse>(*method),
            Method::MessagesSync => pair::<SyncRequest, SyncResponse>(*method),
            Method::AgentsStart | Method::AgentsStop => {
                pair::<AgentsStartStopRequest, canopy_core::RosterEntry>(*method)
            }
            Method::AgentsSetActivity => pair::<SetActivityRequest, canopy_core::RosterEntry>(*method),
            Method::Roster => pair::<RosterRequest, RosterResponse>(*method),
            Method::ActivityRead => pair::<ActivityReadRequest, ActivityReadResponse>(*method),
            Method::RunnersSync => pair::<RunnersSyncRequest, RunnersSyncResponse>(*method),
            Method::SessionsReport => pair::<SessionsReportRequest, SessionsReportResponse>(*method),
            Method::DeliveriesPull => pair::<DeliveriesPullRequest, DeliveriesPullResponse>(*method),
            Method::DeliveriesAck => pair::<DeliveriesAckRequest, DeliveriesAckResponse>(*method),
            Method::ChannelsSubscribe | Method::ChannelsUnsubscribe => {
                pair::<ChannelRequest, canopy_core::Channel>(*method)
            }
            Method::ChannelsOpenDirect => pair::<OpenDirectRequest, canopy_core::Channel>(*method),
            Method::TopicsRename => pair::<TopicsRenameRequest, Done>(*method),
            Method::TopicsResolve => pair::<TopicsResolveRequest, Done>(*method),
            Method::BoardPin => pair::<BoardPinRequest, BoardResponse>(*method),
            Method::BoardList => pair::<BoardListRequest, BoardResponse>(*method),
            Method::SpawnRequest => pair::<SpawnRequestRequest, canopy_core::SpawnRequest>(*method),
            Method::SpawnDecide => pair::<SpawnDecideRequest, canopy_core::SpawnRequest>(*method),
            Method::SpawnCancel => pair::<SpawnCancelRequest, canopy_core::SpawnRequest>(*method),
            Method::SpawnList => pair::<SpawnListRequest, SpawnListResponse>(*method),
            Method::AgentsDespawn => pair::<AgentsDespawnRequest, AgentsDespawnResponse>(*method),
            Method::AuditList => pair::<AuditListRequest, AuditListResponse>(*method),
            Method::PromptsRender => pair::<PromptsRenderRequest, PromptsRenderResponse>(*method),
            Method::PromptsSkill => pair::<PromptsReadRequest, PromptsReadResponse>(*method),
            Method::PromptsRule => pair::<PromptsReadRequest, PromptsReadResponse>(*method),
            Method::RunsStart => pair::<RunsStartRequest, RunsStartResponse>(*method),
            Method::RunsList => pair::<RunsListRequest, RunsListResponse>(*method),
            Method::RunsFinish => pair::<RunsFinishRequest, RunsFinishResponse>(*method),
            Method::HistorySearch => pair::<HistorySearchRequest, HistorySearchResponse>(*method),
            Method::SessionsContinuity => pair::<SessionsContinuityRequest, SessionsContinuityResponse>(*method),
            Method::Usage => pair::<UsageRequest, UsageResponse>(*method),
            Method::AgentsInterrupt => pair::<AgentsInterruptRequest, AgentsInterruptResponse>(*method),
        };
        out.extend(schemas);
    }
    out.push(("event.message.json".to_owned(), schema_for!(MessageEvent).to_value()));
    out.push(("event.activity.json".to_owned(), schema_for!(ActivityEvent).to_value()));
    out.push(("runner.deliver.json".to_owned(), schema_for!(DeliverDoorbell).to_value()));
    out.push(("runner.steer.request.json".to_owned(), schema_for!(SteerRequest).to_value()));
    out.push(("runner.steer.reply.json".to_owned(), schema_for!(SteerReply).to_value()));
    out.push(("runner.interrupt.request.json".to_owned(), schema_for!(InterruptRequest).to_value()));
    out.push(("runner.interrupt.reply.json".to_owned(), schema_for!(InterruptReply).to_value()));
    out.push(("error.json".to_owned(), schema_for!(WireError).to_value()));
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    #[test]
    fn checked_in_schemas_match_the_code() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto/schemas");
        let bless = std::env::var_os("CANOPY_BLESS").is_some();
        let schemas = super::all();
        let mut stale = Vec::new();
        for (name, schema) in &schemas {
            let text = serde_json::to_string_pretty(schema).unwrap_or_default() + "\n";
            let path = dir.join(name);
            if bless {
                std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
                std::fs::write(&path, &text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            } else if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                stale.push(name.clone());
            }
        }
        let on_disk: Vec<String> = std::fs::read_dir(&dir)
            .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let extra: Vec<&String> = on_disk.iter().filter(|f| !schemas.iter().any(|(n, _)| n == *f)).collect();
        assert!(
            stale.is_empty() && (bless || extra.is_empty()),
            "proto/schemas drifted from the code (stale: {stale:?}, not generated: {extra:?}); \
             rerun with CANOPY_BLESS=1 cargo test -p canopy-proto and commit the result"
        );
    }
}
