//! Store tests against real SQLite files: the writer's transaction semantics, the rules
//! that only an agent caller can reach (agents get credentials with sessions, later), and
//! the spawn gate's answers to replies in a request's topic.

#![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

use canopy_core::acl::Caller;
use canopy_core::{
    AccountKind, ChannelName, ErrorCode, Handle, Incarnation, PostPolicy, RoleName, RunnerId, Seq, SpawnState,
    TopicName,
};

use crate::{AgentSpec, ChannelSpec, Estimate, InitSpec, OperatorSpec, PostSpec, Store, ops};

fn h(s: &str) -> Handle {
    Handle::parse(s).unwrap()
}

fn operator() -> Caller {
    Caller { handle: h("ops"), kind: AccountKind::Operator }
}

fn agent(handle: &str) -> Caller {
    Caller { handle: h(handle), kind: AccountKind::Agent }
}

fn post_spec(channel: &str, topic: &str, body: &str) -> PostSpec {
    PostSpec {
        channel: ChannelName::parse(channel).unwrap(),
        topic: TopicName::parse(topic).unwrap(),
        body: body.into(),
        create_topic: true,
        idempotency_key: None,
        ack_only: false,
        wake: false,
    }
}

async fn workspace() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    // Time moves only when a test says: deadlines are tested without waiting for them.
    let clock = canopy_sys::Clock::manual(1_800_000_000_000);
    let store = Store::open_with_clock(&dir.path().join("canopy.db"), 64, clock).unwrap();
    store
        .write(|conn| {
            ops::init(
                conn,
                &InitSpec {
                    workspace_id: "ws-test".into(),
                    name: "test".into(),
                    mission: "m".into(),
                    operator: OperatorSpec { handle: h("ops"), display_name: "ops".into(), token_hash: "hash".into() },
                    supervisor_harness: String::new(),
                    supervisor_script: None,
                },
            )
        })
        .await
        .unwrap();
    for handle in ["ci-manager", "docs-manager"] {
        let spec = AgentSpec {
            handle: h(handle),
            display_name: handle.into(),
            role: RoleName::parse("manager").unwrap(),
            parent: None,
            charter: String::new(),
            harness: String::new(),
            script: None,
            persona: None,
            repo: None,
            needs: Vec::new(),
        };
        store.write(move |conn| ops::create_agent(conn, &operator(), &spec)).await.unwrap();
    }
    (dir, store)
}

#[tokio::test]
async fn a_failed_write_rolls_back_only_itself() {
    let (_dir, store) = workspace().await;
    // Queue a good post, a refused one, and another good one, concurrently: they share a batch.
    let good = |body: &'static str| {
        let store = store.clone();
        async move { store.write(move |c| ops::post(c, &operator(), &post_spec("announcements", "t", body))).await }
    };
    let bad = {
        let store = store.clone();
        async move { store.write(move |c| ops::post(c, &operator(), &post_spec("nowhere", "t", "x"))).await }
    };
    let (a, b, c) = tokio::join!(good("a"), bad, good("c"));
    assert!(a.is_ok() && c.is_ok());
    assert_eq!(b.err().map(|e| e.code()), Some(ErrorCode::NotFound));
    let page = store
        .read(|c| {
            ops::read_channel(c, &operator(), &ChannelName::parse("announcements").unwrap(), None, Seq(0), 100, false)
        })
        .await
        .unwrap();
    let bodies: Vec<&str> = page.messages.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(bodies.len(), 2);
    assert!(bodies.contains(&"a") && bodies.contains(&"c"));
}

#[tokio::test]
async fn restricted_channels_refuse_agents_not_on_the_poster_list() {
    let (_dir, store) = workspace().await;
    let refused = store.write(|c| ops::post(c, &agent("ci-manager"), &post_spec("announcements", "t", "x"))).await;
    assert_eq!(refused.err().map(|e| e.code()), Some(ErrorCode::Forbidden));
    let allowed = store.write(|c| ops::post(c, &agent("supervisor"), &post_spec("announcements", "t", "x"))).await;
    assert!(allowed.is_ok(), "{allowed:?}");
    let owner_only = ChannelSpec {
        name: ChannelName::parse("ops-log").unwrap(),
        kind: canopy_core::ChannelKind::General,
        post_policy: PostPolicy::OwnerOnly,
        posters: vec![],
        wake: None,
    };
    store.write(move |c| ops::create_channel(c, Some(&operator()), &owner_only)).await.unwrap();
    let refused = store.write(|c| ops::post(c, &agent("ci-manager"), &post_spec("ops-log", "t", "x"))).await;
    assert_eq!(refused.err().map(|e| e.code()), Some(ErrorCode::Forbidden));
}

#[tokio::test]
async fn agents_post_in_their_home_but_not_in_another_agents_home() {
    let (_dir, store) = workspace().await;
    let own = store.write(|c| ops::post(c, &agent("ci-manager"), &post_spec("home-ci-manager", "t", "x"))).await;
    assert!(own.is_ok(), "{own:?}");
    let other = store.write(|c| ops::post(c, &agent("ci-manager"), &post_spec("home-docs-manager", "t", "x"))).await;
    assert_eq!(other.err().map(|e| e.code()), Some(ErrorCode::Forbidden));
    let read = store
        .read(|c| {
            ops::read_channel(
                c,
                &agent("ci-manager"),
                &ChannelName::parse("home-docs-manager").unwrap(),
                None,
                Seq(0),
                10,
                false,
            )
        })
        .await;
    assert_eq!(read.err().map(|e| e.code()), Some(ErrorCode::Forbidden));
}

#[tokio::test]
async fn agents_sync_only_their_subscriptions() {
    let (_dir, store) = workspace().await;
    store.write(|c| ops::post(c, &operator(), &post_spec("home-docs-manager", "t", "private"))).await.unwrap();
    store.write(|c| ops::post(c, &operator(), &post_spec("announcements", "t", "public"))).await.unwrap();
    let page = store.read(|c| ops::sync(c, &agent("ci-manager"), None, Seq(0), 100)).await.unwrap();
    let bodies: Vec<&str> = page.messages.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(bodies, ["public"]);
    let page = store.read(|c| ops::sync(c, &operator(), None, Seq(0), 100)).await.unwrap();
    assert_eq!(page.messages.len(), 2);
}

#[tokio::test]
async fn idempotency_keys_are_scoped_to_their_sender() {
    let (_dir, store) = workspace().await;
    let keyed = |caller: Caller, channel: &'static str| {
        let store = store.clone();
        async move {
            let mut spec = post_spec(channel, "t", "same");
            spec.idempotency_key = Some("k".into());
            store.write(move |c| ops::post(c, &caller, &spec)).await
        }
    };
    let first = keyed(operator(), "announcements").await.unwrap();
    let again = keyed(operator(), "announcements").await.unwrap();
    assert!(!first.duplicate && again.duplicate);
    assert_eq!(first.message.seq, again.message.seq);
    let other = keyed(agent("supervisor"), "announcements").await.unwrap();
    assert!(!other.duplicate);
    assert_ne!(other.message.seq, first.message.seq, "another sender's key is its own");
}

#[tokio::test]
async fn new_subscriptions_start_at_the_channel_head() {
    let (_dir, store) = workspace().await;
    store.write(|c| ops::post(c, &operator(), &post_spec("announcements", "t", "before"))).await.unwrap();
    let spec = AgentSpec {
        handle: h("late"),
        display_name: "Late".into(),
        role: RoleName::parse("manager").unwrap(),
        parent: Some(h("ci-manager")),
        charter: String::new(),
        harness: String::new(),
        script: None,
        persona: None,
        repo: None,
        needs: Vec::new(),
    };
    store.write(move |c| ops::create_agent(c, &operator(), &spec)).await.unwrap();
    let subs = store.read(|c| ops::subscriptions(c, "late")).await.unwrap();
    let announcements = subs.iter().find(|s| s.channel.as_str() == "announcements").unwrap();
    assert_eq!(announcements.cursor, Seq(1), "a new agent is not owed the channel's history");
}

#[tokio::test]
async fn reopening_a_store_keeps_everything_and_migrations_are_idempotent() {
    let (dir, store) = workspace().await;
    store.write(|c| ops::post(c, &operator(), &post_spec("announcements", "t", "kept"))).await.unwrap();
    store.close().await;
    let store = Store::open(&dir.path().join("canopy.db"), 8).unwrap();
    let page = store.read(|c| ops::sync(c, &operator(), None, Seq(0), 10)).await.unwrap();
    assert_eq!(page.messages[0].body, "kept");
    let again = store
        .write(|c| {
            ops::init(
                c,
                &InitSpec {
                    workspace_id: "ws-other".into(),
                    name: "x".into(),
                    mission: String::new(),
                    operator: OperatorSpec { handle: h("ops2"), display_name: "x".into(), token_hash: "h2".into() },
                    supervisor_harness: String::new(),
                    supervisor_script: None,
                },
            )
        })
        .await;
    assert_eq!(again.err().map(|e| e.code()), Some(ErrorCode::Conflict));
}

#[tokio::test]
async fn a_broadcast_writes_one_row_and_reaches_every_agent_through_cursors() {
    let (_dir, store) = workspace().await;
    let posted =
        store.write(|c| ops::post(c, &agent("supervisor"), &post_spec("announcements", "t", "all"))).await.unwrap();
    let (channel_id, sender_id) = (posted.channel_id, posted.sender_id);
    let reach = store.read(move |c| ops::reach(c, channel_id, sender_id, &[])).await.unwrap();
    let reached: Vec<&str> = reach.recipients.iter().map(|r| r.handle.as_str()).collect();
    assert_eq!(reached, ["ci-manager", "docs-manager"], "every agent but the sender");
    for handle in ["ci-manager", "docs-manager"] {
        let pending = store
            .read(move |c| {
                let id = ops::agent_id(c, handle)?;
                ops::pending(c, id, 10)
            })
            .await
            .unwrap();
        assert_eq!(pending.messages.len(), 1, "{handle}");
        // #announcements wakes only the agents it mentions: pending, but no reason for a turn.
        assert!(!pending.wake, "{handle}");
    }
    assert!(posted.quiet.as_deref().is_some_and(|q| q.starts_with("no wake")), "{:?}", posted.quiet);
    // A mention of one of them is a reason to wake that one only.
    store
        .write(|c| ops::post(c, &agent("supervisor"), &post_spec("announcements", "t", "@ci-manager look")))
        .await
        .unwrap();
    let wakes = |handle: &'static str| {
        let store = store.clone();
        async move { store.read(move |c| ops::pending(c, ops::agent_id(c, handle)?, 10)).await.unwrap().wake }
    };
    assert!(wakes("ci-manager").await && !wakes("docs-manager").await);
    // Acknowledging moves the cursor; the message is no longer pending, and a repeat is a no-op.
    let seq = posted.message.seq;
    let moved = store
        .write(move |c| {
            let id = ops::agent_id(c, "ci-manager")?;
            Ok((ops::acknowledge(c, id, &[seq])?, ops::acknowledge(c, id, &[seq])?, ops::pending(c, id, 10)?))
        })
        .await
        .unwrap();
    // The mention, posted after it, still waits.
    assert_eq!((moved.0, moved.1, moved.2.messages.len()), (1, 0, 1));
}

#[tokio::test]
async fn steered_and_held_messages_are_tracked_one_by_one() {
    let (_dir, store) = workspace().await;
    let one = store.write(|c| ops::post(c, &operator(), &post_spec("home-ci-manager", "t", "one"))).await.unwrap();
    let two = store.write(|c| ops::post(c, &operator(), &post_spec("home-ci-manager", "t", "two"))).await.unwrap();
    let (s1, s2) = (one.message.seq, two.message.seq);
    let pending = store
        .write(move |c| {
            let id = ops::agent_id(c, "ci-manager")?;
            ops::record_injected(c, id, s2)?;
            ops::record_held(c, id, s1)?;
            ops::pending(c, id, 10)
        })
        .await
        .unwrap();
    let bodies: Vec<&str> = pending.messages.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(bodies, ["one"], "a steered message is not delivered again");
    assert!(!pending.wake, "a held message does not wake the agent");
}

#[tokio::test]
async fn mandatory_subscriptions_cannot_be_left_and_pins_stay_in_their_channel() {
    let (_dir, store) = workspace().await;
    let announcements = ChannelName::parse("announcements").unwrap();
    let left = store.write(move |c| ops::unsubscribe_self(c, &agent("ci-manager"), &announcements)).await;
    assert_eq!(left.err().map(|e| e.code()), Some(ErrorCode::Forbidden));
    let home = ChannelName::parse("home-docs-manager").unwrap();
    let joined = store.write(move |c| ops::subscribe_self(c, &agent("ci-manager"), &home)).await;
    assert_eq!(joined.err().map(|e| e.code()), Some(ErrorCode::Forbidden), "another agent's home is not optional");
    let elsewhere = store.write(|c| ops::post(c, &operator(), &post_spec("home-ci-manager", "t", "x"))).await.unwrap();
    let seq = elsewhere.message.seq;
    let announcements = ChannelName::parse("announcements").unwrap();
    let pinned = store.write(move |c| ops::pin(c, &operator(), &announcements, seq)).await;
    assert_eq!(pinned.err().map(|e| e.code()), Some(ErrorCode::InvalidArgument));
}

#[tokio::test]
async fn pending_messages_past_retention_expire_and_are_counted() {
    let (_dir, store) = workspace().await;
    store.write(|c| ops::post(c, &operator(), &post_spec("home-ci-manager", "t", "old"))).await.unwrap();
    store.clock().advance(std::time::Duration::from_secs(10));
    // A cutoff newer than the post expires it; one older than the post keeps it.
    let kept = store.clock().now_ms() - 20_000;
    assert!(store.write(move |c| ops::expire(c, kept)).await.unwrap().is_empty());
    let cutoff = store.clock().now_ms() - 5_000;
    let expired = store.write(move |c| ops::expire(c, cutoff)).await.unwrap();
    let missed: Vec<(&str, u64)> = expired.iter().map(|(_, h, n)| (h.as_str(), *n)).collect();
    assert_eq!(missed, [("ci-manager", 1)]);
    let pending = store
        .read(|c| {
            let id = ops::agent_id(c, "ci-manager")?;
            ops::pending(c, id, 10)
        })
        .await
        .unwrap();
    assert!(pending.messages.is_empty());
}

/// A heartbeat of runner `id` (boot `boot`) with room for 10 sessions, no labels.
fn beat_of(id: &str, boot: &str) -> crate::RunnerHeartbeat {
    crate::RunnerHeartbeat {
        runner_id: RunnerId::parse(id).unwrap(),
        boot: boot.into(),
        hosting: false,
        name: id.into(),
        mcp_url: "http://x".into(),
        capacity: 10,
        ttl_ms: 60_000,
        labels: Vec::new(),
        version: String::new(),
        role_needs: Default::default(),
    }
}

/// A workspace whose `ci-manager` and `docs-manager` both have a live session on runner `r1`.
async fn live_workspace() -> (tempfile::TempDir, Store) {
    let (dir, store) = workspace().await;
    store
        .write(|c| {
            c.execute("UPDATE accounts SET harness = 'scripted' WHERE kind = 'agent' AND handle != 'supervisor'", [])
                .unwrap();
            ops::sync_runner(c, &beat_of("r1", "b1"), &|agent, n| format!("hash-{agent}-{n}"))
        })
        .await
        .unwrap();
    (dir, store)
}

fn report(agent: &str, kind: &str, detail: serde_json::Value, usage: Option<crate::UsageReport>) -> crate::Report {
    crate::Report {
        agent: agent.into(),
        incarnation: Incarnation(1),
        presence: None,
        reason: None,
        activity: Some((kind.into(), Some("t1".into()), format!("{kind} {detail}"), detail)),
        ended: false,
        crash_loop: false,
        fatal: false,
        usage,
    }
}

fn query(
    text: Option<&str>,
    before: canopy_core::continuity::HistoryCursor,
    limit: u32,
    tools: bool,
) -> crate::HistoryQuery {
    crate::HistoryQuery { text: text.map(str::to_owned), before, limit, include_tool_events: tools }
}

#[tokio::test]
async fn history_search_finds_a_message_by_query_and_pages_back_with_its_cursor() {
    use canopy_core::continuity::{HistoryCursor, HistoryItem};
    let (_dir, store) = live_workspace().await;
    for i in 0..25 {
        let body = if i == 3 { "the deploy password rotation plan".to_owned() } else { format!("routine note {i}") };
        store
            .write(move |c| ops::post(c, &agent("ci-manager"), &post_spec("home-ci-manager", "notes", &body)))
            .await
            .unwrap();
    }
    let found = store
        .read(|c| {
            ops::history_search(c, &agent("ci-manager"), &query(Some("ROTATION"), HistoryCursor::NEWEST, 10, false))
        })
        .await
        .unwrap();
    assert_eq!(found.items.len(), 1, "{found:?}");
    assert!(
        matches!(&found.items[0], HistoryItem::Message { message, sent: true, .. } if message.body.contains("rotation"))
    );

    // Paging: 25 sent messages, 10 at a time, newest first, no repeats, then the end.
    let mut seen = Vec::new();
    let mut before = HistoryCursor::NEWEST;
    loop {
        let page = store
            .read(move |c| ops::history_search(c, &agent("ci-manager"), &query(None, before, 10, false)))
            .await
            .unwrap();
        for item in &page.items {
            if let HistoryItem::Message { message, .. } = item {
                seen.push(message.seq);
            }
        }
        match page.next_before {
            Some(next) => before = next,
            None => break,
        }
    }
    assert_eq!(seen.len(), 25);
    assert!(seen.windows(2).all(|w| w[0] > w[1]), "newest first: {seen:?}");

    // Another agent's history is not the caller's: docs-manager sees none of it.
    let other = store
        .read(|c| {
            ops::history_search(c, &agent("docs-manager"), &query(Some("rotation"), HistoryCursor::NEWEST, 50, true))
        })
        .await
        .unwrap();
    assert!(other.items.is_empty(), "{other:?}");
    // Operators have no sessions to search.
    let refused =
        store.read(|c| ops::history_search(c, &operator(), &query(None, HistoryCursor::NEWEST, 10, false))).await.err();
    assert_eq!(refused.map(|e| e.code()), Some(ErrorCode::InvalidArgument));
}

#[tokio::test]
async fn a_planted_secret_never_comes_out_of_activity_or_history() {
    use canopy_core::continuity::{HistoryCursor, HistoryItem};
    use canopy_core::redact::samples::{Rng, planted_secret};
    let (_dir, store) = live_workspace().await;
    let mut rng = Rng(0xDEAD_BEEF_1234_5678);
    let mut planted = Vec::new();
    for i in 0..120 {
        let (secret, core) = planted_secret(&mut rng);
        let output = format!("step {i} done\n{secret}\nexit 0");
        let detail =
            serde_json::json!({ "kind": "tool_result", "name": "bash", "call_id": format!("c{i}"), "output": output });
        let reports = vec![report("ci-manager", "tool_result", detail, None)];
        apply_with(&store, reports, Estimate::default(), Default::default()).await;
        // Message bodies are the operator's record and stay as posted; history excerpts are redacted.
        let body = format!("note {i}: {secret}");
        store
            .write(move |c| ops::post(c, &agent("ci-manager"), &post_spec("home-ci-manager", "n", &body)))
            .await
            .unwrap();
        planted.push(core[..core.len().min(16)].to_owned());
        store.clock().advance(std::time::Duration::from_millis(1));
    }
    let (activity, _) = store.read(|c| ops::read_activity(c, "ci-manager", 0, 1000, None)).await.unwrap();
    let stored = serde_json::to_string(&activity).unwrap();
    let mut history = String::new();
    let mut before = HistoryCursor::NEWEST;
    loop {
        let page = store
            .read(move |c| ops::history_search(c, &agent("ci-manager"), &query(None, before, 50, true)))
            .await
            .unwrap();
        assert!(page.items.iter().any(|i| matches!(i, HistoryItem::ToolEvent { .. })));
        history.push_str(&serde_json::to_string(&page.items).unwrap());
        match page.next_before {
            Some(next) => before = next,
            None => break,
        }
    }
    for piece in &planted {
        assert!(!stored.contains(piece.as_str()), "activity leaked {piece}");
        assert!(!history.contains(piece.as_str()), "history leaked {piece}");
    }
}

#[tokio::test]
async fn usage_is_summed_per_turn_session_and_agent_and_old_records_are_pruned() {
    let (_dir, store) = live_workspace().await;
    let usage = |turn: &str, input: u64, cost: Option<f64>| crate::UsageReport {
        turn_id: Some(turn.into()),
        input_tokens: input,
        output_tokens: 10,
        cache_read_tokens: 1,
        cache_write_tokens: 0,
        cost_usd: cost,
        cost_computed: false,
    };
    let reports = vec![
        report("ci-manager", "usage", serde_json::Value::Null, Some(usage("t1", 100, Some(0.5)))),
        report("ci-manager", "usage", serde_json::Value::Null, Some(usage("t1", 50, None))),
        report("ci-manager", "usage", serde_json::Value::Null, Some(usage("t2", 7, Some(0.25)))),
        report("docs-manager", "usage", serde_json::Value::Null, Some(usage("t1", 1, None))),
    ];
    apply_with(&store, reports, Estimate::default(), Default::default()).await;
    let all = store.read(|c| ops::usage(c, None, 0)).await.unwrap();
    assert_eq!(all.total.input_tokens, 158);
    assert_eq!(all.total.output_tokens, 40);
    assert_eq!(all.total.reports, 4);
    assert_eq!(all.total.reports_without_cost, 2);
    assert_eq!(all.total.cost_usd, Some(0.75));
    assert_eq!(all.agents.len(), 2);
    assert_eq!(all.agents[0].agent.as_str(), "ci-manager");
    let one = store.read(|c| ops::usage(c, Some(&h("ci-manager")), 0)).await.unwrap();
    assert_eq!(one.sessions.len(), 1);
    assert_eq!(one.turns.len(), 2);
    assert_eq!(one.turns[0].turn_id.as_deref(), Some("t2"));
    assert_eq!(one.turns[1].totals.input_tokens, 150);

    // Retention: everything is older than a cut-off in the future.
    let pruned = store.write(|c| ops::prune(c, i64::MAX, i64::MAX)).await.unwrap();
    assert_eq!(pruned.usage, 4);
    assert!(pruned.activity >= 4, "{pruned:?}");
    let after = store.read(|c| ops::usage(c, None, 0)).await.unwrap();
    assert_eq!(after.total.reports, 0);
}

#[tokio::test]
async fn continuity_facts_carry_checkpoints_requests_and_pins_and_the_block_stays_bounded() {
    use canopy_core::continuity::{ContinuityReason, MAX_CONTINUITY_CHARS, continuity_block};
    let (_dir, store) = live_workspace().await;
    for i in 0..200 {
        let body = format!("decision {i}: {}", "we keep the old runner ".repeat(20));
        let posted = store
            .write(move |c| ops::post(c, &operator(), &post_spec("home-ci-manager", "plan", &body)))
            .await
            .unwrap();
        let seq = posted.message.seq;
        store
            .write(move |c| ops::pin(c, &operator(), &ChannelName::parse("home-ci-manager").unwrap(), seq))
            .await
            .unwrap();
        let reports = vec![report("ci-manager", "compaction_ended", serde_json::Value::Null, None)];
        apply_with(&store, reports, Estimate::default(), Default::default()).await;
    }
    let facts = store.read(|c| ops::continuity_facts(c, "ci-manager", Incarnation(1), false)).await.unwrap();
    assert_eq!(facts.reason, ContinuityReason::Start { previous: None });
    assert_eq!(facts.checkpoints.len(), 3);
    assert!(!facts.pins.is_empty());
    assert!(facts.runs_out.is_empty());
    let block = continuity_block(&facts);
    assert!(block.chars().count() <= MAX_CONTINUITY_CHARS, "{}", block.chars().count());
    assert!(block.contains("Compaction checkpoints") && block.contains("history_search"), "{block}");
    let after = store.read(|c| ops::continuity_facts(c, "ci-manager", Incarnation(1), true)).await.unwrap();
    assert_eq!(after.reason, ContinuityReason::Compaction);
}

#[tokio::test]
async fn a_forbidden_post_is_audited_in_its_own_job_and_leaves_nothing_else() {
    let (_dir, store) = workspace().await;
    let refused = store
        .write(|c| ops::post_audited(c, &agent("ci-manager"), &post_spec("announcements", "new topic", "x")))
        .await
        .unwrap();
    assert_eq!(refused.err().map(|e| e.code()), Some(ErrorCode::Forbidden));
    let audit = store.read(|c| ops::audit_log(c, 0)).await.unwrap();
    let entry = audit.iter().find(|e| e.action == "messages.post.refused").unwrap();
    assert_eq!(entry.actor.as_ref().map(Handle::as_str), Some("ci-manager"));
    assert_eq!(entry.target, "#announcements");
    assert!(entry.detail.contains("new topic") && entry.detail.contains("restricted"), "{entry:?}");
    let topics = store.read(|c| ops::list_topics(c, &operator(), "announcements")).await.unwrap();
    assert!(topics.iter().all(|t| t.name.as_str() != "new topic"), "a refused post started its topic: {topics:?}");
    let page = store
        .read(|c| {
            ops::read_channel(c, &operator(), &ChannelName::parse("announcements").unwrap(), None, Seq(0), 100, false)
        })
        .await
        .unwrap();
    assert!(page.messages.is_empty(), "{page:?}");
    // Allowed posts go through unchanged and audit nothing.
    let posted = store
        .write(|c| ops::post_audited(c, &agent("ci-manager"), &post_spec("home-ci-manager", "t", "x")))
        .await
        .unwrap();
    assert!(posted.is_ok(), "{posted:?}");
    let audit = store.read(|c| ops::audit_log(c, 0)).await.unwrap();
    assert_eq!(audit.iter().filter(|e| e.action == "messages.post.refused").count(), 1);
}

fn spawn_policy() -> crate::SpawnPolicy {
    crate::SpawnPolicy {
        max_depth: 8,
        max_children: 8,
        max_agents: 100,
        max_pending_per_requester: 4,
        ttl_ms: 86_400_000,
    }
}

/// `ci-manager`'s request for a child Manager that hunts flaky tests.
fn flaky(handle: &str, budget: canopy_core::budget::Amount) -> crate::SpawnSpec {
    crate::SpawnSpec {
        handle: h(handle),
        display_name: "Flaky".into(),
        role: RoleName::parse("manager").unwrap(),
        charter: "Hunt flaky tests".into(),
        reason: "CI is red".into(),
        idempotency_key: None,
        repo: None,
        budget,
    }
}

/// A workspace where `ci-manager` has asked for a child `flaky`; returns the request's number.
async fn requested() -> (tempfile::TempDir, Store, i64) {
    let (dir, store) = workspace().await;
    let spec = flaky("flaky", canopy_core::budget::Amount::default());
    let (request, _) =
        store.write(move |c| ops::request_spawn(c, &agent("ci-manager"), &spec, &spawn_policy())).await.unwrap();
    let id = crate::parse_request_id(&request.id).unwrap();
    (dir, store, id)
}

/// What a reply `body` by `caller` in `channel`, topic `topic`, comes to.
async fn reply(store: &Store, caller: Caller, channel: &str, topic: &str, body: &str) -> crate::Answered {
    let reply = canopy_core::gate::Reply::parse(body).unwrap();
    let (channel, topic) = (ChannelName::parse(channel).unwrap(), TopicName::parse(topic).unwrap());
    store
        .write(move |c| {
            let session = |_: &RoleName| (String::new(), None::<(String, String)>);
            ops::answer_reply(c, &caller, &channel, &topic, &reply, &session)
        })
        .await
        .unwrap()
}

async fn request_state(store: &Store, id: i64) -> SpawnState {
    store.read(move |c| ops::spawn_request(c, id)).await.unwrap().state
}

async fn audited(store: &Store, action: &'static str) -> usize {
    store.read(|c| ops::audit_log(c, 0)).await.unwrap().iter().filter(|e| e.action == action).count()
}

#[tokio::test]
async fn a_reply_decides_only_in_its_requesters_home_and_its_own_topic() {
    let (_dir, store, id) = requested().await;
    // Another Manager's home, under the same topic name: nothing is decided, and the operator
    // is told where the request is, in the topic the reply was posted in.
    let elsewhere = reply(&store, operator(), "home-docs-manager", "spawn: flaky", "deny not now").await;
    assert!(!elsewhere.decided);
    assert_eq!(request_state(&store, id).await, SpawnState::Pending);
    assert_eq!(elsewhere.notices.len(), 1, "{:?}", elsewhere.notices);
    let notice = &elsewhere.notices[0];
    assert_eq!((notice.channel.as_str(), notice.topic.as_str()), ("home-docs-manager", "spawn: flaky"));
    assert_eq!(notice.sender.handle.as_str(), "canopy");
    assert!(
        notice.body.contains("Nothing was decided")
            && notice.body.contains("#home-ci-manager")
            && notice.body.contains(&format!("canopy approve req-{id}")),
        "{}",
        notice.body
    );
    // The requester's home, but another request's topic: there is no such request.
    let other = reply(&store, operator(), "home-ci-manager", "spawn: other", "approve").await;
    assert!(!other.decided);
    assert!(other.notices[0].body.contains("no spawn request for @other"), "{}", other.notices[0].body);
    // An agent's `approve` outside the request's topic is conversation: no answer, no record.
    let agent_elsewhere = reply(&store, agent("docs-manager"), "home-docs-manager", "spawn: flaky", "approve").await;
    assert!(agent_elsewhere.notices.is_empty() && !agent_elsewhere.decided);
    assert_eq!(audited(&store, "spawn.approve.refused").await, 0);
    // Not a spawn topic at all: nothing happens.
    let chat = reply(&store, operator(), "home-ci-manager", "plans", "approve").await;
    assert!(chat.notices.is_empty() && !chat.decided);
    assert_eq!(request_state(&store, id).await, SpawnState::Pending);
    // The request's own topic in its requester's home decides.
    let decided = reply(&store, operator(), "home-ci-manager", "spawn: flaky", "deny not this quarter").await;
    assert!(decided.decided);
    assert_eq!(request_state(&store, id).await, SpawnState::Denied);
    assert!(decided.notices[0].body.contains("Denied by ops: not this quarter"), "{}", decided.notices[0].body);
}

#[tokio::test]
async fn an_unclear_reply_is_answered_with_the_grammar_and_decides_nothing() {
    let (_dir, store, id) = requested().await;
    for body in ["Approve.", "approved", "yes", "ok", "lgtm", "deny", "approve req-1"] {
        let answered = reply(&store, operator(), "home-ci-manager", "spawn: flaky", body).await;
        assert!(!answered.decided, "{body}");
        assert_eq!(answered.notices.len(), 1, "{body}");
        let hint = &answered.notices[0];
        assert_eq!((hint.channel.as_str(), hint.topic.as_str()), ("home-ci-manager", "spawn: flaky"));
        for part in [
            "Nothing was decided".to_owned(),
            "`approve`".to_owned(),
            "`deny <reason>`".to_owned(),
            format!("canopy approve req-{id}"),
            format!("canopy deny req-{id} --reason"),
        ] {
            assert!(hint.body.contains(&part), "{body}: {part} missing from {}", hint.body);
        }
    }
    assert_eq!(request_state(&store, id).await, SpawnState::Pending);
    // An agent's look-alike is conversation: Canopy never answers an agent's chatter.
    let chatter = reply(&store, agent("ci-manager"), "home-ci-manager", "spawn: flaky", "ok").await;
    assert!(chatter.notices.is_empty() && !chatter.decided);
    assert_eq!(audited(&store, "spawn.approve.refused").await + audited(&store, "spawn.deny.refused").await, 0);
}

#[tokio::test]
async fn a_decision_on_a_decided_request_is_answered_with_its_state() {
    let (_dir, store, id) = requested().await;
    let first = reply(&store, operator(), "home-ci-manager", "spawn: flaky", "approve").await;
    assert!(first.decided);
    assert_eq!(request_state(&store, id).await, SpawnState::Spawned);
    for body in ["approve", "deny too late", "Approve."] {
        let again = reply(&store, operator(), "home-ci-manager", "spawn: flaky", body).await;
        assert!(!again.decided, "{body}");
        assert_eq!(again.notices.len(), 1, "{body}");
        let answer = &again.notices[0].body;
        assert!(
            answer.starts_with("Nothing changed")
                && answer.contains(&format!("req-{id} for @flaky is already approved by ops"))
                && answer.contains("spawned"),
            "{body}: {answer}"
        );
    }
    assert_eq!(request_state(&store, id).await, SpawnState::Spawned);
    let (agents, _) = store.read(|c| ops::list_agents(c, None, None)).await.unwrap();
    assert_eq!(agents.iter().filter(|a| a.handle.as_str() == "flaky").count(), 1);
    assert_eq!(audited(&store, "spawn.approve").await, 1);
}

#[tokio::test]
async fn a_reply_on_an_expired_request_marks_it_and_says_so() {
    let (_dir, store, id) = requested().await;
    store.clock().advance(std::time::Duration::from_millis(spawn_policy().ttl_ms as u64));
    let answered = reply(&store, operator(), "home-ci-manager", "spawn: flaky", "approve").await;
    assert!(!answered.decided);
    assert_eq!(request_state(&store, id).await, SpawnState::Expired);
    let bodies: Vec<&str> = answered.notices.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(bodies.len(), 2, "{bodies:?}");
    assert!(bodies[0].contains("expired without an answer"), "{bodies:?}");
    assert!(bodies[1].contains("is already expired"), "{bodies:?}");
    assert_eq!(audited(&store, "spawn.expire").await, 1);
    assert!(store.read(|c| ops::account(c, "handle", "flaky")).await.is_err(), "an expired request spawned");
}

#[tokio::test]
async fn an_agents_decision_reply_is_refused_audited_and_told_even_once_decided() {
    let (_dir, store, id) = requested().await;
    let attempt = reply(&store, agent("ci-manager"), "home-ci-manager", "spawn: flaky", "approve").await;
    assert!(!attempt.decided);
    assert_eq!(request_state(&store, id).await, SpawnState::Pending);
    assert!(attempt.notices[0].body.contains("@ci-manager tried to approve"), "{}", attempt.notices[0].body);
    assert_eq!(audited(&store, "spawn.approve.refused").await, 1);
    reply(&store, operator(), "home-ci-manager", "spawn: flaky", "approve").await;
    let late = reply(&store, agent("ci-manager"), "home-ci-manager", "spawn: flaky", "deny changed my mind").await;
    assert!(!late.decided);
    assert_eq!(audited(&store, "spawn.deny.refused").await, 1);
    assert_eq!(request_state(&store, id).await, SpawnState::Spawned);
}

#[tokio::test]
async fn a_request_expires_exactly_when_its_time_is_up() {
    let (_dir, store, id) = requested().await;
    let ttl = std::time::Duration::from_millis(spawn_policy().ttl_ms as u64);
    store.clock().advance(ttl - std::time::Duration::from_millis(1));
    assert!(store.write(ops::expire_spawns).await.unwrap().is_empty(), "expired a millisecond early");
    assert_eq!(request_state(&store, id).await, SpawnState::Pending);
    store.clock().advance(std::time::Duration::from_millis(1));
    let notices = store.write(ops::expire_spawns).await.unwrap();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(request_state(&store, id).await, SpawnState::Expired);
    assert_eq!(audited(&store, "spawn.expire").await, 1);
}

#[tokio::test]
async fn a_runner_that_starts_again_gets_fresh_sessions_at_once() {
    let (_dir, store) = live_workspace().await;
    let beat = |boot: &str| beat_of("r1", boot);
    let sync = |b: crate::RunnerHeartbeat| {
        let store = store.clone();
        async move {
            store
                .write(move |c| ops::sync_runner(c, &b, &|agent, n| format!("hash-{agent}-{n}")))
                .await
                .unwrap()
                .sessions
                .into_iter()
                .map(|s| (s.agent.to_string(), s.incarnation))
                .collect::<Vec<_>>()
        }
    };
    let same = sync(beat("b1")).await;
    assert!(same.iter().all(|(_, n)| *n == Incarnation(1)), "the same boot keeps its sessions: {same:?}");
    // While the earlier process is alive and hosting, a second one with the same id is refused.
    let mut hosting = beat("b9");
    hosting.hosting = true;
    let refused = store.write(move |c| ops::sync_runner(c, &hosting, &|a, n| format!("hash-{a}-{n}"))).await;
    assert_eq!(refused.err().map(|e| e.code()), Some(ErrorCode::Conflict));
    // No waiting for the runner's time-to-live: the earlier process's sessions ended with it.
    let again = sync(beat("b2")).await;
    assert_eq!(again.len(), same.len());
    assert!(again.iter().all(|(_, n)| *n == Incarnation(2)), "{again:?}");
}

/// The merge gate's facts: an agent's attempt is refused but on record, approving queues,
/// the queue takes a stack bottom-up and refuses a child of a denied parent, asking again
/// updates an undecided request, a required review needs a verdict or an override, and a
/// restart mid-merge keeps the entry at the head of its queue.
#[tokio::test]
async fn only_an_operator_decides_a_merge_and_the_queue_takes_stacks_bottom_up() {
    use crate::{CheckoutState, Landed, MergeCheck, MergeSpec, RepoRow};
    use canopy_core::MergeState;
    let (_dir, store) = workspace().await;
    let repo = RepoRow {
        id: 0,
        name: "app".into(),
        source: "/src/app".into(),
        base: "main".into(),
        checks: Vec::new(),
        review: canopy_core::review::ReviewPolicy::Operator,
        created_at: String::new(),
    };
    let repo = store.write(move |c| ops::add_repo(c, Some(&operator()), &repo, false)).await.unwrap();
    let duplicate = repo.clone();
    let again = store.write(move |c| ops::add_repo(c, Some(&operator()), &duplicate, false)).await;
    assert_eq!(again.err().map(|e| e.code()), Some(ErrorCode::Conflict));
    // An agent created on a repository is held until its checkout is made.
    let spec = AgentSpec {
        handle: h("web"),
        display_name: "Web".into(),
        role: RoleName::parse("manager").unwrap(),
        parent: None,
        charter: String::new(),
        harness: "scripted".into(),
        script: None,
        persona: None,
        repo: Some(repo.id),
        needs: Vec::new(),
    };
    store.write(move |c| ops::create_agent(c, &operator(), &spec)).await.unwrap();
    let held = store.read(|c| ops::checkout(c, "web")).await.unwrap().unwrap();
    assert_eq!((held.state, held.branch.as_str()), (CheckoutState::Preparing, "canopy/web"));
    let entry = store.read(|c| ops::roster_entry(c, "web")).await.unwrap();
    assert_eq!(entry.reason.as_deref(), Some("preparing its checkout"));
    store.write(|c| ops::set_checkout(c, "web", CheckoutState::Ready, Some("abc"), None)).await.unwrap();
    assert_eq!(store.read(|c| ops::checkout(c, "web")).await.unwrap().unwrap().base_commit, "abc");

    let repo_id = repo.id;
    let spec = move |title: &str, head: &str, depends_on: Vec<i64>| MergeSpec {
        repo_id,
        branch: "canopy/web".into(),
        head: head.into(),
        title: title.into(),
        summary: "s".into(),
        depends_on,
        issues: Vec::new(),
    };
    let request = |spec: MergeSpec| {
        let store = store.clone();
        async move {
            let head = spec.head.clone();
            let title = spec.title.clone();
            let made = store.write(move |c| ops::request_merge(c, &agent("web"), &spec)).await.unwrap();
            let id = ops::merge_number(&made);
            let check = MergeCheck {
                head,
                base_commit: "base".into(),
                commits: vec!["abc One".into()],
                diffstat: "a | 1 +".into(),
                check: "none configured".into(),
                passed: true,
            };
            let (checked, notice) = store.write(move |c| ops::merge_checked(c, id, &check)).await.unwrap().unwrap();
            assert_eq!(checked.state, MergeState::Pending);
            assert!(notice.body.contains("@ops web asks to merge canopy/web"), "{}", notice.body);
            assert_eq!(notice.topic.as_str(), format!("merge: {title}"));
            id
        }
    };
    let bottom = request(spec("Bottom", "h1", vec![])).await;
    let top = request(spec("Top", "h2", vec![bottom])).await;
    // Asking again under an open title takes the new head and checks it again; a check of
    // the old head that finishes late changes nothing.
    let update = spec("Top", "h3", vec![bottom]);
    let updated = store.write(move |c| ops::request_merge(c, &agent("web"), &update)).await.unwrap();
    assert_eq!((ops::merge_number(&updated), updated.state, updated.head.as_str()), (top, MergeState::Checking, "h3"));
    let stale = MergeCheck {
        head: "h2".into(),
        base_commit: "base".into(),
        commits: vec![],
        diffstat: String::new(),
        check: "passed".into(),
        passed: true,
    };
    assert!(store.write(move |c| ops::merge_checked(c, top, &stale)).await.unwrap().is_none());
    let top = request(spec("Top", "h3", vec![bottom])).await;

    // An agent's approval: refused, audited, told.
    let attempt = store.write(move |c| ops::decide_merge(c, &agent("web"), bottom, true, None, None)).await.unwrap();
    assert_eq!(attempt.refused.map(|e| e.code()), Some(ErrorCode::Forbidden));
    assert!(attempt.notices[0].body.contains("@web tried to approve"), "{}", attempt.notices[0].body);
    let audit = store.read(|c| ops::audit_log(c, 0)).await.unwrap();
    assert!(audit.iter().any(|e| e.action == "merges.approve.refused"));

    // Approving the top first queues it behind its parent, which the queue takes first.
    let queued = store.write(move |c| ops::decide_merge(c, &operator(), top, true, None, None)).await.unwrap();
    assert!(queued.queued && queued.request.state == MergeState::Queued);
    let step = store.write(move |c| ops::queue_next(c, repo.id)).await.unwrap();
    assert!(step.next.is_none() && step.refused.is_empty(), "the top waits for its parent: {step:?}");
    let approved = store.write(move |c| ops::decide_merge(c, &operator(), bottom, true, None, None)).await.unwrap();
    assert!(approved.notices[0].body.contains("in the queue behind 1"), "{}", approved.notices[0].body);
    let twice = store.write(move |c| ops::decide_merge(c, &operator(), bottom, true, None, None)).await;
    assert_eq!(twice.err().map(|e| e.code()), Some(ErrorCode::Conflict));
    let step = store.write(move |c| ops::queue_next(c, repo.id)).await.unwrap();
    assert_eq!(step.next.as_ref().map(ops::merge_number), Some(bottom));

    // A restart while merging keeps it at the head of the queue, and tells the requester.
    let recovered = store.write(ops::recover_merges).await.unwrap();
    assert_eq!(recovered.queues, vec![repo.id]);
    assert!(recovered.notices[0].body.contains("restarted while"), "{:?}", recovered.notices);
    let step = store.write(move |c| ops::queue_next(c, repo.id)).await.unwrap();
    assert_eq!(step.next.as_ref().map(ops::merge_number), Some(bottom), "the same entry, not the next");
    let landed = Landed::Merged { commit: "merged-sha".into(), fast_forward: true };
    let (merged, notice) = store.write(move |c| ops::finish_merge(c, bottom, &landed)).await.unwrap();
    assert_eq!(merged.state, MergeState::Merged);
    assert!(notice.body.contains("Approved by ops"), "{}", notice.body);
    let step = store.write(move |c| ops::queue_next(c, repo.id)).await.unwrap();
    assert_eq!(step.next.as_ref().map(ops::merge_number), Some(top));
    let refused = Landed::Refused("the check failed".into());
    let (top_request, _) = store.write(move |c| ops::finish_merge(c, top, &refused)).await.unwrap();
    assert_eq!((top_request.state, top_request.note.as_deref()), (MergeState::Refused, Some("the check failed")));

    // A child of a parent denied after the child was approved is refused by the queue.
    let parent = request(spec("Parent", "h4", vec![])).await;
    let child = request(spec("Child", "h5", vec![parent])).await;
    store.write(move |c| ops::decide_merge(c, &operator(), child, true, None, None)).await.unwrap();
    store.write(move |c| ops::decide_merge(c, &operator(), parent, false, Some("no".into()), None)).await.unwrap();
    let step = store.write(move |c| ops::queue_next(c, repo.id)).await.unwrap();
    assert_eq!(step.refused.iter().map(ops::merge_number).collect::<Vec<_>>(), vec![child]);
    assert!(step.notices[0].body.contains(&format!("merge-{parent}, which is denied")), "{}", step.notices[0].body);
    let late_spec = spec("Late", "h6", vec![parent]);
    let late = store.write(move |c| ops::request_merge(c, &agent("web"), &late_spec)).await;
    assert_eq!(late.err().map(|e| e.code()), Some(ErrorCode::Conflict));
}

fn turn(agent: &str, kind: &str, turn: &str, cost: Option<f64>) -> crate::Report {
    let usage = (kind == "usage").then(|| crate::UsageReport {
        turn_id: Some(turn.into()),
        input_tokens: 100,
        output_tokens: 10,
        cost_usd: cost,
        ..crate::UsageReport::default()
    });
    crate::Report {
        activity: Some((kind.into(), Some(turn.into()), kind.into(), serde_json::Value::Null)),
        ..report(agent, kind, serde_json::Value::Null, usage)
    }
}

async fn apply(store: &Store, reports: Vec<crate::Report>) -> crate::Applied {
    apply_with(store, reports, crate::Estimate { usd: 0.1, tokens: 1000 }, Default::default()).await
}

/// Applies `reports` from runner `r1` with `estimate` and the failover `rules`.
async fn apply_with(
    store: &Store,
    reports: Vec<crate::Report>,
    estimate: crate::Estimate,
    rules: crate::FailoverRules,
) -> crate::Applied {
    store
        .write(move |c| ops::apply_reports(c, &RunnerId::parse("r1").unwrap(), &reports, 1000, estimate, &rules))
        .await
        .unwrap()
}

async fn set(store: &Store, handle: &str, scope: canopy_core::budget::Scope, usd: Option<f64>) {
    let (handle, amount) = (h(handle), canopy_core::budget::Amount { usd, tokens: None });
    store.write(move |c| ops::set_budget(c, &operator(), &handle, scope, amount, Some(86_400_000))).await.unwrap();
}

#[tokio::test]
async fn a_budget_is_charged_an_estimate_at_turn_start_warns_once_at_80_and_100_and_renews() {
    use canopy_core::budget::Scope;
    let (_dir, store) = live_workspace().await;
    set(&store, "ci-manager", Scope::Agent, Some(1.0)).await;
    let started = apply(&store, vec![turn("ci-manager", "turn_started", "t1", None)]).await;
    assert!(started.notices.is_empty());
    let budgets = store.read(ops::budgets).await.unwrap();
    assert!((budgets[0].spent.usd - 0.1).abs() < 1e-9, "a turn is charged its estimate at its start: {budgets:?}");
    let near = apply(&store, vec![turn("ci-manager", "usage", "t1", Some(0.85))]).await;
    assert_eq!(near.notices.len(), 1, "one notice at 80%");
    assert!(near.notices[0].body.contains("at 80%") && near.notices[0].channel.as_str() == "home-ci-manager");
    assert!(near.budgets_changed, "the roster's mark moves at 80%");
    let usage = store.read(|c| ops::usage(c, None, 0)).await.unwrap();
    assert_eq!((usage.total.reports, usage.total.reports_estimated), (1, 0), "the estimate gave way to the report");
    apply(&store, vec![turn("ci-manager", "turn_started", "t2", None)]).await;
    let over = apply(&store, vec![turn("ci-manager", "usage", "t2", Some(0.2))]).await;
    assert_eq!(over.notices.len(), 1, "one notice at 100%");
    assert!(over.notices[0].body.contains("is spent"), "{}", over.notices[0].body);
    assert!(over.budgets_changed);
    let holds = store.read(ops::holds).await.unwrap();
    assert!(holds.held["ci-manager"].starts_with("budget: @ci-manager's budget is spent ($1.05 of $1.00"), "{holds:?}");
    assert!(!holds.held.contains_key("docs-manager"));
    let again = apply(&store, vec![turn("ci-manager", "turn_started", "t3", None)]).await;
    assert!(again.notices.is_empty(), "told once per window");
    // A turn whose usage never came stays at its estimate.
    assert_eq!(store.read(|c| ops::usage(c, None, 0)).await.unwrap().total.reports_estimated, 1);
    set(&store, "ci-manager", Scope::Agent, Some(2.0)).await;
    assert!(store.read(ops::holds).await.unwrap().held.is_empty(), "raised, it holds no one");
    set(&store, "ci-manager", Scope::Agent, Some(1.0)).await;
    assert!(store.read(ops::holds).await.unwrap().held.contains_key("ci-manager"));
    store.clock().advance(std::time::Duration::from_secs(86_400));
    assert!(store.read(ops::holds).await.unwrap().held.is_empty(), "a passed window holds no one before renewal");
    assert_eq!(store.write(ops::renew_budgets).await.unwrap(), 1);
    let renewed = store.read(ops::budgets).await.unwrap();
    assert_eq!((renewed[0].spent.usd, renewed[0].level), (0.0, canopy_core::budget::Level::Under));
    let after = apply(&store, vec![turn("ci-manager", "usage", "t4", Some(0.9))]).await;
    assert_eq!(after.notices.len(), 1, "a new window warns again");
}

#[tokio::test]
async fn a_subtree_budget_holds_everyone_below_and_a_proposal_must_fit_what_is_left() {
    use canopy_core::budget::{Amount, Scope};
    let (_dir, store) = live_workspace().await;
    set(&store, "ci-manager", Scope::Subtree, Some(1.0)).await;
    apply(&store, vec![turn("ci-manager", "usage", "t1", Some(0.2))]).await;
    let ask = |usd: f64, handle: &str| flaky(handle, Amount { usd: Some(usd), tokens: None });
    let too_much = ask(0.9, "flaky");
    let refused = store
        .write(move |c| ops::request_spawn(c, &agent("ci-manager"), &too_much, &spawn_policy()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::LimitExceeded);
    assert!(refused.to_string().contains("$0.80 left"), "{refused}");
    let fits = ask(0.5, "flaky");
    let (request, _) =
        store.write(move |c| ops::request_spawn(c, &agent("ci-manager"), &fits, &spawn_policy())).await.unwrap();
    assert_eq!(request.budget.and_then(|b| b.usd), Some(0.5));
    let id = crate::parse_request_id(&request.id).unwrap();
    let decided =
        store.write(move |c| ops::decide_spawn(c, &operator(), id, true, None, (String::new(), None))).await.unwrap();
    assert_eq!(decided.request.state, SpawnState::Spawned);
    let budgets = store.read(ops::budgets).await.unwrap();
    let lead = budgets.iter().find(|b| b.owner.as_str() == "ci-manager").unwrap();
    assert!((lead.left.usd.unwrap() - 0.3).abs() < 1e-9, "the child's allotment is carved: {lead:?}");
    let child = budgets.iter().find(|b| b.owner.as_str() == "flaky").unwrap();
    assert_eq!((child.source.as_str(), child.scope, child.period.as_deref()), ("spawn", Scope::Subtree, Some("1day")));
    // The parent's subtree spent: the child is held too, though its own budget is untouched.
    apply(&store, vec![turn("ci-manager", "usage", "t2", Some(0.85))]).await;
    let holds = store.read(ops::holds).await.unwrap();
    assert!(holds.held.contains_key("ci-manager") && holds.held.contains_key("flaky"), "{holds:?}");
    assert!(holds.held["flaky"].contains("@ci-manager's subtree"), "{holds:?}");
    assert!(!holds.held.contains_key("docs-manager"));
    assert_eq!(holds.marks["flaky"].percent, 105);
    // Bad amounts change nothing.
    let bad = store
        .write(|c| {
            ops::set_budget(
                c,
                &operator(),
                &h("docs-manager"),
                Scope::Agent,
                Amount { usd: Some(-1.0), tokens: None },
                None,
            )
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), ErrorCode::InvalidArgument);
    let by_agent = store
        .write(|c| {
            ops::set_budget(
                c,
                &agent("ci-manager"),
                &h("ci-manager"),
                Scope::Agent,
                Amount { usd: Some(9.0), tokens: None },
                None,
            )
        })
        .await
        .unwrap_err();
    assert_eq!(by_agent.code(), ErrorCode::Forbidden, "an agent cannot set its own budget");
}

#[tokio::test]
async fn a_message_handed_to_an_earlier_session_and_never_confirmed_is_a_redelivery() {
    let (_dir, store) = live_workspace().await;
    let posted =
        store.write(|c| ops::post(c, &operator(), &post_spec("home-ci-manager", "t", "do the thing"))).await.unwrap();
    let seq = posted.message.seq;
    let agent = store.read(|c| ops::agent_id(c, "ci-manager")).await.unwrap();
    let first = store.write(move |c| ops::offer(c, agent, Incarnation(1), &[seq])).await.unwrap();
    assert!(first.is_empty(), "a first offer is no redelivery");
    let same = store.write(move |c| ops::offer(c, agent, Incarnation(1), &[seq])).await.unwrap();
    assert!(same.is_empty(), "offered again to the same session: not a redelivery");
    let next = store.write(move |c| ops::offer(c, agent, Incarnation(2), &[seq])).await.unwrap();
    assert_eq!(next, [seq], "the session that ended may have seen it");
    store.write(move |c| ops::acknowledge(c, agent, &[seq])).await.unwrap();
    let after = store.write(move |c| ops::offer(c, agent, Incarnation(3), &[seq])).await.unwrap();
    assert!(after.is_empty(), "a confirmed message leaves no offer behind");
    // Its history keeps saying so after the confirmation.
    use canopy_core::continuity::{HistoryCursor, HistoryItem};
    let page = store
        .read(|c| ops::history_search(c, &self::agent("ci-manager"), &query(None, HistoryCursor::NEWEST, 10, false)))
        .await
        .unwrap();
    let marked: Vec<(u64, bool)> = page
        .items
        .iter()
        .filter_map(|item| match item {
            HistoryItem::Message { message, redelivered, .. } => Some((message.seq.get(), *redelivered)),
            HistoryItem::ToolEvent { .. } => None,
        })
        .collect();
    assert!(marked.contains(&(seq.get(), true)), "history_search marks the redelivery: {marked:?}");
}

#[tokio::test]
async fn cached_statements_are_not_re_prepared_for_each_new_binding() {
    // The recipient query is compared with `sessions_live`'s partial-index condition; without
    // the planner stability guarantee SQLite re-parses it whenever a new value is bound.
    let (_dir, store) = workspace().await;
    let reprepared = store
        .write(|conn| {
            let ids: Vec<i64> = conn
                .prepare("SELECT id FROM channels")
                .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
                .map_err(crate::sql("listing channels"))?;
            assert!(ids.len() >= 2, "{ids:?}");
            for (sender, channel) in ids.iter().enumerate() {
                ops::reach(conn, *channel, sender as i64, &[])?;
            }
            let statement = conn.prepare_cached(crate::delivery::REACH).map_err(crate::sql("preparing"))?;
            assert_eq!(statement.get_status(rusqlite::StatementStatus::Run), ids.len() as i32, "the memo answered");
            Ok(statement.get_status(rusqlite::StatementStatus::RePrepare))
        })
        .await
        .unwrap();
    assert_eq!(reprepared, 0, "the recipient query was re-prepared {reprepared} times");
}

#[tokio::test]
async fn committed_pages_reach_the_database_file_without_the_writer_checkpointing() {
    // 4 MiB in 1,000 commits, below the writer's own checkpoint threshold: only the
    // checkpointer copies them from the WAL into the database file.
    let (dir, store) = workspace().await;
    crate::bench::prepare(&store).await.unwrap();
    let db = dir.path().join("canopy.db");
    let before = std::fs::metadata(&db).unwrap().len();
    for _ in 0..1_000 {
        crate::bench::insert(&store, vec![7u8; 4096]).await.unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::metadata(&db).unwrap().len() < before + (4 << 20) {
        assert!(std::time::Instant::now() < deadline, "the database file was not checkpointed within 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    store.close().await;
}

#[tokio::test]
async fn the_writers_memo_follows_every_change_and_forgets_what_rolled_back() {
    let (_dir, store) = workspace().await;
    let spec = ChannelSpec {
        name: ChannelName::parse("lane").unwrap(),
        kind: canopy_core::ChannelKind::General,
        post_policy: PostPolicy::Open,
        posters: vec![],
        wake: None,
    };
    store.write(move |c| ops::create_channel(c, Some(&operator()), &spec)).await.unwrap();
    let lane = || ChannelName::parse("lane").unwrap();
    // Whom a post to #lane reaches, asked on the writer (where the memo answers).
    let reached = || {
        let store = store.clone();
        async move {
            store
                .write(|c| {
                    let id = c
                        .query_row("SELECT id FROM channels WHERE name = 'lane'", [], |r| r.get(0))
                        .map_err(crate::sql("finding #lane"))?;
                    let reach = ops::reach(c, id, -1, &[])?;
                    Ok(reach.recipients.iter().map(|r| r.handle.to_string()).collect::<Vec<_>>())
                })
                .await
                .unwrap()
        }
    };
    assert!(reached().await.is_empty());
    store.write(move |c| ops::subscribe_self(c, &agent("ci-manager"), &lane())).await.unwrap();
    assert_eq!(reached().await, ["ci-manager"]);
    store.write(move |c| ops::subscribe_self(c, &agent("docs-manager"), &lane())).await.unwrap();
    assert_eq!(reached().await, ["ci-manager", "docs-manager"]);
    store.write(move |c| ops::unsubscribe_self(c, &agent("ci-manager"), &lane())).await.unwrap();
    assert_eq!(reached().await, ["docs-manager"]);

    // A job that joins, reads whom #lane reaches (filling the memo), then fails: rolled back,
    // and so is what it remembered.
    let failed = store
        .write(move |c| {
            ops::subscribe_self(c, &agent("ci-manager"), &lane())?;
            let id = c
                .query_row("SELECT id FROM channels WHERE name = 'lane'", [], |r| r.get(0))
                .map_err(crate::sql("finding #lane"))?;
            assert_eq!(ops::reach(c, id, -1, &[])?.recipients.len(), 2);
            Err::<(), _>(canopy_core::Error::Internal("on purpose".into()))
        })
        .await;
    assert!(failed.is_err());
    assert_eq!(reached().await, ["docs-manager"]);

    // A post's sender and channel are remembered too: leaving the channel is seen at the
    // next post, which the post policy now refuses.
    let posted = store.write(|c| ops::post(c, &agent("docs-manager"), &post_spec("lane", "t", "x"))).await;
    assert!(posted.is_ok(), "{posted:?}");
    store.write(move |c| ops::unsubscribe_self(c, &agent("docs-manager"), &lane())).await.unwrap();
    let refused = store.write(|c| ops::post(c, &agent("docs-manager"), &post_spec("lane", "t", "x"))).await;
    assert_eq!(refused.err().map(|e| e.code()), Some(ErrorCode::Forbidden));
}

#[tokio::test]
async fn history_search_answers_the_same_from_the_text_index_and_from_the_history() {
    use canopy_core::continuity::{HistoryCursor, HistoryItem};
    let (_dir, store) = live_workspace().await;
    for i in 0..30 {
        let body = match i {
            3 | 25 => format!("the \"Rotation\" plan, part {i}"),
            _ => format!("routine note {i}"),
        };
        store
            .write(move |c| ops::post(c, &agent("ci-manager"), &post_spec("home-ci-manager", "notes", &body)))
            .await
            .unwrap();
    }
    // Not ci-manager's: must never be found by it, indexed or not.
    store
        .write(|c| ops::post(c, &agent("docs-manager"), &post_spec("home-docs-manager", "n", "rotation elsewhere")))
        .await
        .unwrap();
    // Every page of a search, newest first.
    let search = |text: &'static str, limit: u32| {
        let store = store.clone();
        async move {
            let mut seen = Vec::new();
            let mut before = HistoryCursor::NEWEST;
            loop {
                let page = store
                    .read(move |c| {
                        ops::history_search(c, &agent("ci-manager"), &query(Some(text), before, limit, false))
                    })
                    .await
                    .unwrap();
                for item in &page.items {
                    if let HistoryItem::Message { message, .. } = item {
                        seen.push((message.seq, message.body.clone()));
                    }
                }
                match page.next_before {
                    Some(next) => before = next,
                    None => return seen,
                }
            }
        }
    };
    let queries = [("rotation", 10), ("\"rotation\"", 10), ("note", 4), ("nothing matches this", 10), ("25", 10)];
    let mut unindexed = Vec::new();
    for (text, limit) in queries {
        unindexed.push(search(text, limit).await);
    }
    assert_eq!(unindexed[0].len(), 2, "{:?}", unindexed[0]);
    assert_eq!(unindexed[1].len(), 2, "a quoted query is text, not syntax: {:?}", unindexed[1]);
    assert_eq!(unindexed[2].len(), 28);
    assert!(unindexed[3].is_empty());
    assert_eq!(unindexed[4].len(), 1, "too short for the index: {:?}", unindexed[4]);

    // Index part of the history (the searches then span the index and what is newer), then
    // all of it: the answers do not change.
    let added = store.write(|c| ops::index_text(c, 20)).await.unwrap();
    assert_eq!(added, 20);
    for (i, (text, limit)) in queries.iter().enumerate() {
        assert_eq!(search(text, *limit).await, unindexed[i], "{text:?}, part indexed");
    }
    while store.write(|c| ops::index_text(c, 7)).await.unwrap() > 0 {}
    for (i, (text, limit)) in queries.iter().enumerate() {
        assert_eq!(search(text, *limit).await, unindexed[i], "{text:?}, all indexed");
    }

    // A text common elsewhere in the workspace (more than the index's candidates) walks the
    // caller's history instead, with the same answer.
    store
        .write(|c| {
            for _ in 0..2_001 {
                ops::post(c, &agent("docs-manager"), &post_spec("home-docs-manager", "n", "rotation elsewhere"))?;
            }
            Ok(())
        })
        .await
        .unwrap();
    while store.write(|c| ops::index_text(c, 1_000)).await.unwrap() > 0 {}
    assert_eq!(search("rotation", 10).await, unindexed[0], "a common text");
}

#[tokio::test]
async fn creating_an_agent_reads_no_table_whole() {
    // What `create_agent` looks up on every creation, planned: each must search an index, or
    // creating the 100,000th agent reads 100,000 rows of each table.
    let (_dir, store) = workspace().await;
    let plans = store
        .read(|c| {
            let lookups = [
                "SELECT id FROM accounts WHERE kind = 'operator'",
                "SELECT id FROM channels WHERE kind = 'broadcast'",
                "SELECT c.id FROM channel_posters a CROSS JOIN channel_posters b ON b.channel_id = a.channel_id \
                 JOIN channels c ON c.id = a.channel_id \
                 WHERE a.account_id = 1 AND b.account_id = 2 AND c.kind = 'direct' LIMIT 1",
            ];
            lookups
                .iter()
                .map(|q| {
                    c.prepare(&format!("EXPLAIN QUERY PLAN {q}"))
                        .and_then(|mut s| s.query_map([], |r| r.get::<_, String>(3))?.collect::<Result<Vec<_>, _>>())
                        .map(|steps| steps.join("; "))
                        .map_err(crate::sql("planning"))
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .unwrap();
    for plan in &plans {
        assert!(!plan.contains("SCAN"), "a lookup reads a whole table: {plan}");
    }
}

/// A short read runs once, on the calling task; a read past the inline budget is cut short
/// there and run again, whole, on the blocking pool, and its answer is the full one.
#[tokio::test(flavor = "current_thread")]
async fn reads_run_inline_until_the_budget_then_move_to_the_pool() {
    let (_dir, store) = workspace().await;
    let caller = std::thread::current().id();
    let runs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    // A read of one number that records the thread of every run.
    let recorded = |sql: &'static str| {
        let seen = runs.clone();
        move |conn: &crate::Db<'_>| {
            seen.lock().unwrap().push(std::thread::current().id());
            conn.query_row(sql, [], |r| r.get::<_, i64>(0)).map_err(crate::sql("reading a number"))
        }
    };
    // The first read opens the pool's first connection, on the blocking pool.
    store.read(recorded("SELECT 1")).await.unwrap();
    assert_ne!(*runs.lock().unwrap(), vec![caller], "a connection is opened on the pool");
    runs.lock().unwrap().clear();

    let short = store.read(recorded("SELECT COUNT(*) FROM accounts")).await.unwrap();
    assert!(short >= 1);
    assert_eq!(*runs.lock().unwrap(), vec![caller], "a short read runs once, here");

    runs.lock().unwrap().clear();
    // Millions of steps: far past the budget on any machine.
    let long = store
        .read(recorded(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000000) SELECT SUM(i) FROM n",
        ))
        .await
        .unwrap();
    assert_eq!(long, 3_000_000 * 3_000_001 / 2, "the long read's answer is whole");
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 2, "cut short here, then run again: {runs:?}");
    assert_eq!(runs[0], caller);
    assert_ne!(runs[1], caller, "the second run is on the blocking pool");

    // The connection the interrupted read used serves the next read normally.
    for _ in 0..crate::reads::ReadPool::MAX + 1 {
        let n =
            store.read(|conn| conn.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)).map_err(crate::sql("one"))).await;
        assert_eq!(n.unwrap(), 1);
    }
}

/// One usage report of `cost` dollars for `handle`, through the turn path's write; whether it
/// asks for the budget holds to be read again.
async fn spend(store: &Store, handle: &'static str, cost: f64) -> bool {
    store
        .write(move |c| {
            let id = crate::views::require_account(c, "agent", handle)?.id;
            let report = crate::UsageReport { input_tokens: 10, cost_usd: Some(cost), ..Default::default() };
            let mut charged = crate::Charged { notices: Vec::new(), changed: false };
            crate::usage::record_usage(c, id, Incarnation(1), &report, Estimate::default(), &mut charged, true)?;
            Ok(charged.changed)
        })
        .await
        .unwrap()
}

async fn issue_spend(store: &Store, number: u64) -> f64 {
    store.read(move |c| ops::issue_spend(c, number)).await.unwrap().usd
}

#[tokio::test]
async fn usage_counts_toward_a_runs_issue_or_the_one_issue_in_progress_and_else_none() {
    let (_dir, store) = workspace().await;
    let ci = agent("ci-manager");
    let file = |title: &'static str, parent: Option<u64>| {
        let ci = ci.clone();
        let store = store.clone();
        async move {
            let spec = crate::NewIssue { title: title.into(), parent, ..Default::default() };
            store.write(move |c| ops::file_issue(c, &ci, &spec)).await.unwrap().0.number
        }
    };
    let start = |number: u64| {
        let ci = ci.clone();
        let change = crate::IssueChange {
            state: Some(canopy_core::issues::IssueState::InProgress),
            note: Some("on it".into()),
            ..Default::default()
        };
        let store = store.clone();
        async move { store.write(move |c| ops::update_issue(c, &ci, number, &change)).await.unwrap() }
    };
    let (one, two) = (file("One", None).await, file("Two", None).await);
    spend(&store, "ci-manager", 0.5).await;
    assert_eq!(issue_spend(&store, one).await, 0.0, "an open issue is not being worked");
    start(one).await;
    spend(&store, "ci-manager", 0.25).await;
    assert_eq!(issue_spend(&store, one).await, 0.25, "the one issue in progress");
    start(two).await;
    spend(&store, "ci-manager", 1.0).await;
    assert_eq!((issue_spend(&store, one).await, issue_spend(&store, two).await), (0.25, 0.0), "two: unattributed");

    // A run for #2 counts toward #2 whatever its Manager is doing.
    let spec = crate::RunSpec {
        definition: "implementer".into(),
        brief: "b".into(),
        role: RoleName::parse("implementer").unwrap(),
        harness: String::new(),
        script: None,
        max_running: 4,
        timeout_ms: 60_000,
        checkout: None,
        issue: Some(two),
    };
    let manager = ci.clone();
    let run = store.write(move |c| ops::start_run(c, &manager, &spec)).await.unwrap();
    assert_eq!(run.issue, Some(two));
    assert!(!spend(&store, "run-1", 0.125).await, "no issue has a budget");
    assert_eq!(issue_spend(&store, two).await, 0.125);
    // An issue budget spent by a write asks for the holds at once (the memo saw the budget set).
    let op = operator();
    store.write(move |c| ops::set_issue_budget(c, &op, two, Some(0.2))).await.unwrap();
    assert!(!spend(&store, "run-1", 0.05).await, "$0.175 of $0.20");
    assert!(spend(&store, "run-1", 0.05).await, "$0.225 of $0.20: spent");
    let held = store.read(ops::holds).await.unwrap();
    assert!(held.held.get("run-1").is_some_and(|why| why.contains("#2")), "{:?}", held.held);
    // A sub-issue's spend adds to its parent's total.
    let part = file("Part", Some(two)).await;
    let review = |number: u64| {
        let ci = agent("ci-manager");
        let change = crate::IssueChange {
            state: Some(canopy_core::issues::IssueState::InReview),
            note: Some("in review".into()),
            ..Default::default()
        };
        let store = store.clone();
        async move { store.write(move |c| ops::update_issue(c, &ci, number, &change)).await.unwrap() }
    };
    review(one).await;
    review(two).await;
    start(part).await;
    spend(&store, "ci-manager", 0.5).await;
    let view = store.read(move |c| ops::issue_view(c, two)).await.unwrap();
    assert_eq!((view.subissues.len(), view.runs.clone()), (1, vec![1]));
    assert_eq!((view.spend.usd, view.spend.subissues_usd), (0.225, 0.5));
}

/// Placement by labels: an agent that needs `gpu` (its own need or its role's) goes only to a
/// runner with the label; with none live it is `unplaced (needs gpu)`, told once, and placed
/// as soon as such a runner syncs.
#[tokio::test]
async fn an_agent_needing_a_label_waits_unplaced_until_a_runner_has_it() {
    let (_dir, store) = workspace().await;
    store
        .write(|c| {
            c.execute("UPDATE accounts SET harness = 'scripted' WHERE kind = 'agent' AND handle != 'supervisor'", [])
                .unwrap();
            c.execute("UPDATE accounts SET needs = 'gpu' WHERE handle = 'ci-manager'", []).unwrap();
            Ok(())
        })
        .await
        .unwrap();
    let beat = |id: &str, labels: &[&str]| crate::RunnerHeartbeat {
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        version: "0.1.0".into(),
        role_needs: [("manager".to_owned(), vec!["linux".to_owned()])].into_iter().collect(),
        ..beat_of(id, &format!("boot-{id}"))
    };
    let sync = |b: crate::RunnerHeartbeat| {
        let store = store.clone();
        async move { store.write(move |c| ops::sync_runner(c, &b, &|agent, n| format!("hash-{agent}-{n}"))).await.unwrap() }
    };
    let plain = sync(beat("plain", &["linux"])).await;
    let placed: Vec<String> = plain.sessions.iter().map(|s| s.agent.to_string()).collect();
    assert!(!placed.contains(&"ci-manager".to_owned()), "{placed:?}");
    assert!(placed.contains(&"docs-manager".to_owned()), "a Manager that needs only its role's linux: {placed:?}");
    assert_eq!(plain.notices.len(), 1, "told once");
    assert!(plain.notices[0].body.contains("gpu") && plain.notices[0].body.contains("@ci-manager"));
    let entry = store.read(|c| ops::roster_entry(c, "ci-manager")).await.unwrap();
    assert_eq!(entry.reason.as_deref(), Some("unplaced (needs gpu, linux)"));
    assert!(sync(beat("plain", &["linux"])).await.notices.is_empty(), "not told again");
    // A runner without the role's label takes nothing that needs it.
    let bare = sync(beat("bare", &["gpu"])).await;
    assert!(bare.sessions.is_empty(), "{:?}", bare.sessions);
    let gpu = sync(beat("gpu-box", &["gpu", "linux"])).await;
    assert_eq!(gpu.sessions.iter().map(|s| s.agent.as_str()).collect::<Vec<_>>(), ["ci-manager"]);
}

/// A lane that keeps failing moves to the next harness of its role's chain after `after`
/// failures (not before), its session ending and its home told once; after `failback_after`
/// it goes back, and the sync asks the runner to end the session on the old harness at its
/// turn boundary.
#[tokio::test]
async fn a_failing_lane_moves_along_its_chain_and_back() {
    let (_dir, store) = live_workspace().await;
    store
        .write(|c| {
            c.execute("UPDATE accounts SET harness = 'claude' WHERE handle = 'ci-manager'", []).unwrap();
            c.execute("UPDATE sessions SET harness = 'claude'", []).unwrap();
            Ok(())
        })
        .await
        .unwrap();
    let rules = crate::FailoverRules {
        after: 3,
        window_ms: 60_000,
        chains: [("manager".to_owned(), vec!["claude".to_owned(), "codex".to_owned()])].into_iter().collect(),
    };
    let failing = || crate::Report {
        presence: Some(canopy_core::Presence::Failing),
        reason: Some("the model API call failed (HTTP 429, rate_limit_error); retry 1 of 10".into()),
        ..report("ci-manager", "model_error", serde_json::json!({ "fatal": false }), None)
    };
    let apply = |rules: crate::FailoverRules| apply_with(&store, vec![failing()], Estimate::default(), rules);
    for _ in 0..2 {
        assert!(apply(rules.clone()).await.notices.iter().all(|n| !n.body.contains("keeps failing")));
    }
    let entry = store.read(|c| ops::roster_entry(c, "ci-manager")).await.unwrap();
    assert_eq!((entry.harness.as_str(), entry.presence), ("claude", canopy_core::Presence::Failing));
    let moved = apply(rules.clone()).await;
    assert_eq!(moved.notices.iter().filter(|n| n.body.contains("keeps failing")).count(), 1);
    let entry = store.read(|c| ops::roster_entry(c, "ci-manager")).await.unwrap();
    assert_eq!(entry.harness, "codex");
    assert!(entry.failover.as_deref().is_some_and(|f| f.starts_with("claude failing: ")), "{entry:?}");
    // Its claude session is no longer listed for its runner, which stops it and reports the end.
    let beat = crate::RunnerHeartbeat { hosting: true, ..beat_of("r1", "b1") };
    let listed = store.write(move |c| ops::sync_runner(c, &beat, &|a, n| format!("hash-{a}-{n}"))).await.unwrap();
    assert!(listed.sessions.iter().all(|s| s.agent.as_str() != "ci-manager"), "{:?}", listed.sessions);
    // Not due before failback_after; due after, and back on claude.
    let due = |after: i64| store.read(move |c| ops::failback_due(c, c.now_ms(), after));
    assert!(due(60_000).await.unwrap().is_empty());
    store.clock().advance(std::time::Duration::from_secs(61));
    let back = due(60_000).await.unwrap();
    assert_eq!(back, vec![(h("ci-manager"), "claude".to_owned())]);
    let told = store.write(move |c| ops::fail_back(c, &back[0].0, &back[0].1)).await.unwrap();
    assert!(told.body.contains("goes back to claude"), "{}", told.body);
    let entry = store.read(|c| ops::roster_entry(c, "ci-manager")).await.unwrap();
    assert_eq!((entry.harness.as_str(), entry.failover), ("claude", None));
    // A lane without a chain does not move, however often it fails.
    let none = crate::FailoverRules { chains: Default::default(), ..rules };
    for _ in 0..4 {
        assert!(apply(none.clone()).await.notices.iter().all(|n| !n.body.contains("keeps failing")));
    }
}

#[tokio::test]
async fn a_spend_series_has_every_hour_and_sums_each_one_for_its_scope() {
    let (_dir, store) = workspace().await;
    // The clock starts at 08:00:00 UTC: two reports then, one half an hour later.
    spend(&store, "ci-manager", 0.25).await;
    spend(&store, "docs-manager", 1.0).await;
    store.clock().advance(std::time::Duration::from_secs(1800));
    spend(&store, "ci-manager", 0.5).await;
    let series = |scope: &'static str, width: i64, n: usize| {
        let store = store.clone();
        async move {
            store
                .read(move |c| {
                    let handle = (!scope.is_empty()).then(|| h(scope.trim_start_matches('^')));
                    let scope = match &handle {
                        None => crate::SeriesScope::Workspace,
                        Some(handle) if scope.starts_with('^') => crate::SeriesScope::Subtree(handle),
                        Some(handle) => crate::SeriesScope::Agent(handle),
                    };
                    ops::usage_series(c, scope, width, n)
                })
                .await
                .unwrap()
        }
    };
    let hourly = series("", 3_600_000, 24).await;
    assert_eq!(hourly.len(), 24);
    assert_eq!(hourly[23].0, "2027-01-15T08:00:00.000Z", "the last bucket is the hour now running");
    assert_eq!(hourly[0].0, "2027-01-14T09:00:00.000Z");
    assert!((hourly[23].1 - 1.75).abs() < 1e-9, "{hourly:?}");
    assert_eq!(hourly[23].3, 3);
    assert!(hourly[..23].iter().all(|p| p.1 == 0.0 && p.3 == 0), "empty hours are present at zero");
    let ci = series("ci-manager", 3_600_000, 24).await;
    assert!((ci[23].1 - 0.75).abs() < 1e-9 && ci[23].2 == 20, "{ci:?}");
    // The Supervisor's subtree holds both Managers.
    let tree = series("^supervisor", 86_400_000, 30).await;
    assert_eq!(tree.len(), 30);
    assert!((tree[29].1 - 1.75).abs() < 1e-9, "{tree:?}");
    assert_eq!(tree[29].0, "2027-01-15T00:00:00.000Z");
    // An hour later the spend has moved back one bucket.
    store.clock().advance(std::time::Duration::from_secs(3600));
    let later = series("", 3_600_000, 24).await;
    assert!((later[22].1 - 1.75).abs() < 1e-9 && later[23].1 == 0.0, "{later:?}");
}
