//! The daemon's API called in process (`ApiClient::in_process`, the embedded runner's and the
//! console's way in) against a real daemon on a real `nats-server` and SQLite file: it is
//! refused and answered exactly as over NATS, and a call whose caller stopped waiting still
//! finishes. Does not measure anything (that is `canopy-bench`).

use std::time::Duration;

use canopy_bench::Bench;
use canopy_bus::{ApiClient, CallError};
use canopy_core::ErrorCode;
use canopy_proto::api::*;
use canopy_proto::method;

fn refusal<T: std::fmt::Debug>(result: Result<T, CallError>) -> (ErrorCode, String) {
    match result {
        Err(CallError::Refused(e)) => (e.code, e.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_calls_are_answered_and_refused_as_over_nats() {
    let bench = Bench::start().await.unwrap_or_else(|e| panic!("starting the sandbox: {e}"));
    assert!(bench.in_process.is_in_process() && !bench.api.is_in_process());
    let (local, nats): (&ApiClient, &ApiClient) = (&bench.in_process, &bench.api);

    let me = local.send::<method::Whoami>(&bench.operator, &WhoamiRequest {}).await;
    let same = nats.send::<method::Whoami>(&bench.operator, &WhoamiRequest {}).await;
    assert_eq!(format!("{me:?}"), format!("{same:?}"));
    assert!(me.is_ok(), "{me:?}");

    // A token the workspace does not know, and a runner method with an operator's token.
    let unknown = refusal(local.send::<method::Whoami>("cnp_not-a-token", &WhoamiRequest {}).await);
    assert_eq!(unknown, refusal(nats.send::<method::Whoami>("cnp_not-a-token", &WhoamiRequest {}).await));
    assert_eq!(unknown.0, ErrorCode::Forbidden);
    let pull: DeliveriesPullRequest = serde_json::from_value(serde_json::json!({
        "runner_id": "nobody", "agent": "nobody", "incarnation": 1
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    let runner_only = refusal(local.send::<method::DeliveriesPull>(&bench.operator, &pull).await);
    assert_eq!(runner_only, refusal(nats.send::<method::DeliveriesPull>(&bench.operator, &pull).await));
    assert_eq!(runner_only.0, ErrorCode::Forbidden);

    // Invalid arguments are refused by the same checks.
    let empty = PostRequest {
        channel: "general".into(),
        topic: "t".into(),
        body: "  ".into(),
        create_topic: true,
        idempotency_key: None,
        ack_only: false,
        wake: false,
    };
    let refused = refusal(local.send::<method::MessagesPost>(&bench.operator, &empty).await);
    assert_eq!(refused, refusal(nats.send::<method::MessagesPost>(&bench.operator, &empty).await));
    assert_eq!(refused.0, ErrorCode::InvalidArgument);
    bench.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_process_call_whose_caller_stopped_waiting_still_finishes() {
    let bench = Bench::start().await.unwrap_or_else(|e| panic!("starting the sandbox: {e}"));
    let homes = bench.create_agents("in-process", 1, true).await.unwrap_or_else(|e| panic!("{e}"));
    let post = |attempt: usize| PostRequest {
        channel: homes[0].clone(),
        topic: "abandoned".into(),
        body: format!("posted by a caller that stopped waiting ({attempt})"),
        create_topic: true,
        idempotency_key: Some(format!("abandoned-{attempt}")),
        ack_only: false,
        wake: false,
    };
    // What a post does after its commit (the event, the deliveries, the reply) is the
    // handler's, not the caller's: the event still goes out.
    let subject = bench.api.subjects.message_event(&homes[0]);
    let mut events = bench.api.bus.subscribe(&subject).await.unwrap_or_else(|e| panic!("{e}"));
    bench.api.bus.flush().await.unwrap_or_else(|e| panic!("{e}"));
    // The caller gives up at once: its call is polled once (the handler starts, in the
    // caller's task, and hands the post to the writer thread) and dropped. The writer may
    // have committed before that poll looked for its answer, and then the call finished in
    // it: such a post is not abandoned, and the next attempt is made.
    let abandoned = (0..200)
        .map(post)
        .find(|post| {
            let call = bench.in_process.send::<method::MessagesPost>(&bench.operator, post);
            futures_util::FutureExt::now_or_never(call).is_none()
        })
        .unwrap_or_else(|| panic!("every post answered at its first poll"));

    let event = loop {
        let event = tokio::time::timeout(Duration::from_secs(10), futures_util::StreamExt::next(&mut events)).await;
        let event = event.ok().flatten().unwrap_or_else(|| panic!("the abandoned post's event never came"));
        if String::from_utf8_lossy(&event.payload).contains(&abandoned.body) {
            break event;
        }
    };
    assert!(String::from_utf8_lossy(&event.payload).contains(&abandoned.body));

    // The event goes out only after the commit, so the post is stored: it reads back, and a
    // retry with its key finds it.
    let read: ReadRequest = serde_json::from_value(serde_json::json!({ "channel": homes[0], "topic": "abandoned" }))
        .unwrap_or_else(|e| panic!("{e}"));
    let found = bench.api.send::<method::MessagesRead>(&bench.operator, &read).await;
    assert!(
        found.as_ref().is_ok_and(|page| page.groups.iter().flat_map(|g| &g.messages).any(|m| m.body == abandoned.body)),
        "the abandoned post never committed: {found:?}"
    );
    let retry = bench.in_process.send::<method::MessagesPost>(&bench.operator, &abandoned).await;
    assert!(retry.as_ref().is_ok_and(|r| r.duplicate), "{retry:?}");
    bench.stop().await;
}
