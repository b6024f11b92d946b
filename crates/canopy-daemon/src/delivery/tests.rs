//! Delivery's unit tests: plans carried out (doorbells, steers, a steer's fallback, budget
//! holds), notices, and the loop guard, with an in-memory store double (`Facts`) and a
//! recording wire; no NATS, no SQLite.

use std::sync::Mutex;

use canopy_core::delivery::Outcome;
use canopy_core::{AccountKind, AccountState, Handle, Incarnation, Presence, Sender, TopicName};

use super::*;
use crate::wire::recording::Recording;

const RUNNER: &str = "runner-1";

/// The store as delivery sees it, in memory: a fixed reach for notices, and what was written.
#[derive(Default)]
struct Facts {
    reach: Reach,
    held: Mutex<Vec<(Vec<i64>, Seq)>>,
    notices: Mutex<Vec<Message>>,
}

impl DeliveryStore for Facts {
    fn notice_reach(&self, _channel: ChannelName, _mentions: Vec<Handle>) -> BoxFuture<'_, Result<Reach, Error>> {
        let reach = self.reach.clone();
        Box::pin(async move { Ok(reach) })
    }

    fn record_held(&self, agents: Vec<i64>, seq: Seq) -> BoxFuture<'_, Result<(), Error>> {
        self.held.lock().map(|mut h| h.push((agents, seq))).ok();
        Box::pin(async { Ok(()) })
    }

    fn loop_notices(&self, from: String, to: i64, body: String) -> BoxFuture<'_, Result<Vec<Message>, Error>> {
        let made = vec![message(900, &format!("home-{from}"), &body), message(901, &format!("home-{to}"), &body)];
        self.notices.lock().map(|mut n| n.extend(made.clone())).ok();
        Box::pin(async move { Ok(made) })
    }
}

fn message(seq: u64, channel: &str, body: &str) -> Message {
    Message {
        seq: Seq(seq),
        channel: ChannelName::from_trusted(channel.to_owned()),
        topic: TopicName::from_trusted("general".to_owned()),
        sender: Sender { handle: Handle::from_trusted("someone".into()), kind: AccountKind::Agent, role: None },
        body: body.to_owned(),
        mentions: Vec::new(),
        created_at: String::new(),
    }
}

fn recipient(id: i64, handle: &str, presence: Presence, mentioned: bool) -> Recipient {
    Recipient {
        agent_id: id,
        handle: Handle::from_trusted(handle.to_owned()),
        state: AccountState::Active,
        presence,
        runner: Some(RunnerId::from_trusted(RUNNER.to_owned())),
        incarnation: Incarnation(1),
        mentioned,
    }
}

fn caller(handle: &str, kind: AccountKind) -> Caller {
    Caller { handle: Handle::from_trusted(handle.to_owned()), kind }
}

fn subjects() -> Subjects {
    Subjects::new("ws-test")
}

fn delivery(facts: Arc<Facts>, wire: Arc<Recording>, holds: Arc<BudgetGate>) -> Delivery {
    let mut config = Config::default();
    config.delivery.loop_wakes = 2;
    Delivery::new(facts, wire, subjects(), Arc::new(config), holds)
}

fn post<'a>(sender: &'a Caller, message: &'a Message, reach: &'a Reach) -> Post<'a> {
    Post { sender, message, reach, ack_only: false, quiet: None, committed_us: 0 }
}

fn outcome_of(outcomes: &[RecipientOutcome], handle: &str) -> Outcome {
    outcomes.iter().find(|o| o.recipient == handle).map(|o| o.outcome).unwrap_or(Outcome::Refused)
}

/// The doorbells rung, as (runner subject, agents).
fn doorbells(wire: &Recording) -> Vec<(String, Vec<String>)> {
    let sent = wire.sent.lock().map(|s| s.clone()).unwrap_or_default();
    sent.into_iter()
        .filter(|(subject, _)| subject.contains(".deliver"))
        .filter_map(|(subject, payload)| {
            serde_json::from_slice::<DeliverDoorbell>(&payload).ok().map(|d| (subject, d.agents))
        })
        .collect()
}

#[tokio::test]
async fn an_idle_recipient_is_woken_and_a_busy_one_queued_each_by_a_doorbell_on_its_runner() {
    let wire = Arc::new(Recording::silent());
    let delivery = delivery(Arc::default(), wire.clone(), Arc::default());
    let reach = Reach {
        recipients: vec![recipient(1, "idle", Presence::Idle, false), recipient(2, "busy", Presence::Working, false)],
        ..Reach::default()
    };
    let (sender, message) = (caller("op", AccountKind::Operator), message(1, "general", "hello"));
    let (outcomes, counts) = delivery.deliver(post(&sender, &message, &reach)).await;
    assert_eq!(outcome_of(&outcomes, "idle"), Outcome::Woke);
    assert_eq!(outcome_of(&outcomes, "busy"), Outcome::Queued);
    assert_eq!((counts.woke, counts.queued), (1, 1));
    let rung = doorbells(&wire);
    assert_eq!(rung.len(), 1, "one doorbell per runner: {rung:?}");
    assert_eq!(rung[0].0, subjects().runner_deliver(&RunnerId::from_trusted(RUNNER.to_owned())));
    assert_eq!(rung[0].1, vec!["idle".to_owned(), "busy".to_owned()]);
}

#[tokio::test]
async fn a_mentioned_busy_recipient_is_steered_through_its_runner() {
    let steer = subjects().runner_steer(&RunnerId::from_trusted(RUNNER.to_owned()));
    let wire = Arc::new(Recording::new(move |subject, _| match subject == steer {
        true => {
            Ok(encode(&SteerReply { steered: true, turn_id: Some("t7".into()), reason: None, written_at_us: Some(40) }))
        }
        false => Err("no responder".into()),
    }));
    let delivery = delivery(Arc::default(), wire.clone(), Arc::default());
    let reach = Reach { recipients: vec![recipient(1, "busy", Presence::Working, true)], ..Reach::default() };
    let (sender, message) = (caller("op", AccountKind::Operator), message(1, "general", "@busy stop"));
    let (outcomes, counts) = delivery.deliver(Post { committed_us: 10, ..post(&sender, &message, &reach) }).await;
    assert_eq!(counts.steered, 1);
    let steered = &outcomes[0];
    assert_eq!(steered.outcome, Outcome::Steered);
    assert_eq!(steered.steer_latency_us, Some(30));
    assert!(doorbells(&wire).is_empty(), "a steered recipient needs no doorbell");
}

#[tokio::test]
async fn a_steer_the_runner_does_not_take_falls_back_to_turn_start_and_says_why() {
    let wire = Arc::new(Recording::new(|subject, _| match subject.contains(".steer") {
        true => Ok(encode(&SteerReply {
            steered: false,
            turn_id: None,
            reason: Some("the turn ended".into()),
            written_at_us: None,
        })),
        false => Err("no responder".into()),
    }));
    let delivery = delivery(Arc::default(), wire.clone(), Arc::default());
    let reach = Reach { recipients: vec![recipient(1, "busy", Presence::Working, true)], ..Reach::default() };
    let (sender, message) = (caller("op", AccountKind::Operator), message(1, "general", "@busy look"));
    let (outcomes, _) = delivery.deliver(post(&sender, &message, &reach)).await;
    assert_eq!(outcomes[0].outcome, Outcome::Queued);
    assert!(outcomes[0].reason.as_deref().unwrap_or_default().contains("the turn ended"), "{outcomes:?}");
    assert_eq!(doorbells(&wire).len(), 1, "the fallback rings the runner");
}

#[tokio::test]
async fn a_recipient_a_spent_budget_holds_is_neither_woken_nor_rung() {
    let wire = Arc::new(Recording::silent());
    let holds = Arc::new(BudgetGate::default());
    let mut spent = canopy_store::Holds::default();
    spent.held.insert("idle".into(), "its budget is spent".into());
    holds.replace(spent);
    let delivery = delivery(Arc::default(), wire.clone(), holds);
    let reach = Reach { recipients: vec![recipient(1, "idle", Presence::Idle, false)], ..Reach::default() };
    let (sender, message) = (caller("op", AccountKind::Operator), message(1, "general", "hello"));
    let (outcomes, counts) = delivery.deliver(post(&sender, &message, &reach)).await;
    assert_eq!((outcomes[0].outcome, counts.held), (Outcome::Held, 1));
    assert!(doorbells(&wire).is_empty());
}

#[tokio::test]
async fn agents_waking_each_other_past_the_guard_are_held_and_told_once() {
    let wire = Arc::new(Recording::silent());
    let facts = Arc::new(Facts {
        reach: Reach { recipients: vec![recipient(2, "b", Presence::Idle, false)], ..Reach::default() },
        ..Facts::default()
    });
    let delivery = delivery(facts.clone(), wire.clone(), Arc::default());
    let reach = Reach { recipients: vec![recipient(2, "b", Presence::Idle, false)], ..Reach::default() };
    let a = caller("a", AccountKind::Agent);
    let mut outcomes = Vec::new();
    for seq in 1..=4 {
        let message = message(seq, "pair", "ping");
        outcomes.push(delivery.deliver(post(&a, &message, &reach)).await.0[0].outcome);
    }
    assert_eq!(outcomes, vec![Outcome::Woke, Outcome::Woke, Outcome::Held, Outcome::Held]);
    let held = facts.held.lock().map(|h| h.clone()).unwrap_or_default();
    assert_eq!(held, vec![(vec![2], Seq(3)), (vec![2], Seq(4))]);
    let notices = facts.notices.lock().map(|n| n.len()).unwrap_or_default();
    assert_eq!(notices, 2, "one notice to each agent of the pair, the first time only");
    // The notices were delivered like posts: their events published, their recipients rung.
    let events = wire.subjects().iter().filter(|s| s.contains(".evt.message.")).count();
    assert_eq!(events, 2, "{:?}", wire.subjects());
}

#[tokio::test]
async fn an_operator_post_resets_the_guard() {
    let wire = Arc::new(Recording::silent());
    let delivery = delivery(Arc::default(), wire, Arc::default());
    let reach = Reach { recipients: vec![recipient(2, "b", Presence::Idle, false)], ..Reach::default() };
    let (a, op) = (caller("a", AccountKind::Agent), caller("op", AccountKind::Operator));
    for seq in 1..=2 {
        delivery.deliver(post(&a, &message(seq, "pair", "ping"), &reach)).await;
    }
    delivery.deliver(post(&op, &message(3, "pair", "carry on"), &reach)).await;
    let (outcomes, _) = delivery.deliver(post(&a, &message(4, "pair", "ping"), &reach)).await;
    assert_eq!(outcomes[0].outcome, Outcome::Woke);
}

#[tokio::test]
async fn a_notice_is_published_and_reaches_its_channel_like_a_post() {
    let wire = Arc::new(Recording::silent());
    let facts = Arc::new(Facts {
        reach: Reach { recipients: vec![recipient(3, "m", Presence::Idle, false)], ..Reach::default() },
        ..Facts::default()
    });
    let delivery = delivery(facts, wire.clone(), Arc::default());
    delivery.deliver_notices(vec![message(5, "home-m", "your run ended")]).await;
    let subjects_sent = wire.subjects();
    assert_eq!(subjects_sent[0], subjects().message_event("home-m"));
    assert_eq!(doorbells(&wire), vec![(subjects_sent[1].clone(), vec!["m".to_owned()])]);
}

#[tokio::test]
async fn an_unreachable_mention_is_refused_and_a_poke_is_one_publish() {
    let wire = Arc::new(Recording::silent());
    let delivery = delivery(Arc::default(), wire.clone(), Arc::default());
    let reach = Reach { unreachable_mentions: vec!["outsider".into()], ..Reach::default() };
    let (sender, message) = (caller("op", AccountKind::Operator), message(1, "general", "@outsider hi"));
    let (outcomes, counts) = delivery.deliver(post(&sender, &message, &reach)).await;
    assert_eq!((outcomes[0].outcome, counts.refused), (Outcome::Refused, 1));
    delivery.poke_runners().await;
    assert_eq!(wire.subjects(), vec![subjects().runner_poke()]);
}
