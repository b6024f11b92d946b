//! `Delivery`: a committed message carried to its recipients. Each recipient's route comes
//! from the pure planner (`canopy_core::delivery::plan`); this service carries it out: steers,
//! doorbells, held wakes, loop notices, and the events followers catch up from. It is the one
//! path of Canopy's own notices too (`deliver_notices`), so they ring like any post.
//!
//! A post is committed first; only then is anyone told. An @mentioned recipient in the middle
//! of a turn is steered through its runner (request/reply with a deadline): the outcome is
//! `steered` once the harness took it for that turn, and the runner records the injection
//! when the harness reports it; a steer it cannot take falls back to turn-start delivery and
//! says so. Everyone else gets a doorbell on its runner's subject: idle recipients are woken
//! (after the runner's quiet window), busy ones get the message at their next turn start,
//! offline ones at their next session start. Doorbells are hints: runners pull what is
//! pending (`sessions`). Nothing here recurses: a delivery that raises a notice (the loop
//! guard's) returns it, and `deliver_notices` works through a queue.
//!
//! Uses the store only through `DeliveryStore` and NATS only through `Wire`, so its tests run
//! with doubles of both. Does not post, pull or acknowledge (`messages`, `sessions`).

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use canopy_config::Config;
use canopy_core::acl::Caller;
use canopy_core::delivery::{LoopGuard, LoopLimits, PlanRecipient, RecipientFacts, plan};
use canopy_core::{ChannelName, Error, Handle, Message, RunnerId, Seq};
use canopy_proto::Subjects;
use canopy_proto::api::*;
use canopy_store::{Reach, Recipient, Store, ops};
use futures_util::future::BoxFuture;

use crate::edge::encode;
use crate::holds::BudgetGate;
use crate::wire::Wire;

/// Most notices one call to `deliver_notices` carries beyond those handed in (a notice's
/// delivery can raise another, the loop guard's; this bounds the chain even if a rule ever let
/// one raise itself).
const MAX_NOTICE_CHAIN: usize = 10_000;

/// What delivery reads and writes in the store.
pub trait DeliveryStore: Send + Sync + 'static {
    /// Whom a notice in `channel` reaches (Canopy's system account is the sender), marking
    /// `mentions` as mentioned.
    fn notice_reach(&self, channel: ChannelName, mentions: Vec<Handle>) -> BoxFuture<'_, Result<Reach, Error>>;
    /// Records that these agents' wakes for message `seq` were held (the loop guard, a budget).
    fn record_held(&self, agents: Vec<i64>, seq: Seq) -> BoxFuture<'_, Result<(), Error>>;
    /// Commits the loop guard's notice to both agents of a pair; returns the notices.
    fn loop_notices(&self, from: String, to: i64, body: String) -> BoxFuture<'_, Result<Vec<Message>, Error>>;
}

impl DeliveryStore for Store {
    fn notice_reach(&self, channel: ChannelName, mentions: Vec<Handle>) -> BoxFuture<'_, Result<Reach, Error>> {
        Box::pin(self.read(move |conn| {
            let (channel_id, sender) = ops::channel_and_system(conn, &channel)?;
            ops::reach(conn, channel_id, sender, &mentions)
        }))
    }

    fn record_held(&self, agents: Vec<i64>, seq: Seq) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(self.write(move |conn| agents.iter().try_for_each(|agent| ops::record_held(conn, *agent, seq))))
    }

    fn loop_notices(&self, from: String, to: i64, body: String) -> BoxFuture<'_, Result<Vec<Message>, Error>> {
        Box::pin(self.write(move |conn| {
            let from_id = ops::agent_id(conn, &from)?;
            Ok(vec![ops::notice(conn, from_id, &body)?, ops::notice(conn, to, &body)?])
        }))
    }
}

/// Canopy's own account as a caller: the sender of its notices.
pub fn canopy() -> Caller {
    Caller { handle: Handle::from_trusted("canopy".into()), kind: canopy_core::AccountKind::System }
}

/// Carries committed messages to their recipients. Cheap to clone.
#[derive(Clone)]
pub struct Delivery {
    store: Arc<dyn DeliveryStore>,
    wire: Arc<dyn Wire>,
    subjects: Subjects,
    config: Arc<Config>,
    /// Wakes between pairs of agents (in memory: a restart forgets recent loops).
    loops: Arc<LoopGuard>,
    holds: Arc<BudgetGate>,
}

/// One committed post to carry out.
#[derive(Debug, Clone, Copy)]
pub struct Post<'a> {
    pub sender: &'a Caller,
    pub message: &'a Message,
    pub reach: &'a Reach,
    pub ack_only: bool,
    /// The channel's quiet window, if it has one (a wake waits it out).
    pub quiet: Option<&'a str>,
    pub committed_us: u64,
}

impl Delivery {
    pub fn new(
        store: Arc<dyn DeliveryStore>,
        wire: Arc<dyn Wire>,
        subjects: Subjects,
        config: Arc<Config>,
        holds: Arc<BudgetGate>,
    ) -> Self {
        Delivery { store, wire, subjects, config, loops: Arc::default(), holds }
    }

    /// Delivers a committed post (`plan`, then steers, held wakes, loop notices, doorbells),
    /// then the notices it raised.
    pub async fn deliver(&self, post: Post<'_>) -> (Vec<RecipientOutcome>, OutcomeCounts) {
        let (outcomes, counts, raised) = self.carry_out(post).await;
        self.deliver_notices(raised).await;
        (outcomes, counts)
    }

    /// The one path for Canopy's own notices (gate, loop guard, mailbox, stall, crash, run
    /// reports): each is already committed; its event is published and its recipients are
    /// reached and rung like any post's. A notice raised on the way joins the queue.
    pub async fn deliver_notices(&self, notices: Vec<Message>) {
        self.carry_notices(notices, None).await
    }

    /// `deliver_notices` for notices that carry `author`'s words (an issue comment): planned as
    /// `author`'s post, so its `@mentions` steer a busy agent and the loop guard counts the
    /// pair, as in any post; `author` is not delivered its own words.
    pub async fn deliver_words(&self, notices: Vec<Message>, author: &Caller) {
        self.carry_notices(notices, Some(author)).await
    }

    async fn carry_notices(&self, notices: Vec<Message>, author: Option<&Caller>) {
        let system = canopy();
        let sender = author.unwrap_or(&system);
        // Every notice handed in is carried; only those raised on the way count against the bound.
        let bound = notices.len().saturating_add(MAX_NOTICE_CHAIN);
        let mut queue: VecDeque<Message> = notices.into();
        let mut carried = 0;
        while let Some(message) = queue.pop_front() {
            carried += 1;
            if carried > bound {
                tracing::error!(
                    left = queue.len() + 1,
                    "a chain of notices passed its bound; the rest wait for a turn"
                );
                return;
            }
            self.publish_messages(std::slice::from_ref(&message)).await;
            let mentions = if author.is_some() { message.mentions.clone() } else { Vec::new() };
            let mut reach = match self.store.notice_reach(message.channel.clone(), mentions).await {
                Ok(reach) => reach,
                Err(e) => {
                    tracing::warn!(error = %e, seq = %message.seq, "reading a notice's recipients failed; they read it at their next turn");
                    continue;
                }
            };
            reach.recipients.retain(|r| r.handle != sender.handle);
            let post = Post {
                sender,
                message: &message,
                reach: &reach,
                ack_only: false,
                quiet: None,
                committed_us: canopy_sys::unix_us(),
            };
            let (_, _, raised) = self.carry_out(post).await;
            queue.extend(raised);
        }
    }

    /// Publishes the events of committed messages (followers' doorbells). This alone reaches
    /// no agent. A failed publish is logged: followers catch up from their cursors.
    pub async fn publish_messages(&self, messages: &[Message]) {
        for message in messages {
            let subject = self.subjects.message_event(message.channel.as_str());
            if let Err(e) = self.wire.publish(&subject, encode(&MessageEvent { message: message.clone() })).await {
                tracing::warn!(error = %e, seq = %message.seq, "publishing a message event failed");
            }
        }
    }

    /// Rings each runner for its agents: they pull what is pending. A hint: a doorbell that
    /// is not sent is made up by the runner's resync timer.
    pub async fn ring(&self, doorbells: BTreeMap<RunnerId, Vec<String>>) {
        for (runner, agents) in doorbells {
            let subject = self.subjects.runner_deliver(&runner);
            if let Err(e) = self.wire.publish(&subject, encode(&DeliverDoorbell { agents })).await {
                tracing::debug!(error = %e, "a delivery doorbell was not sent; the runner resyncs on its timer");
            }
        }
    }

    /// Rings the runners' doorbell so they sync now rather than at their next tick.
    pub async fn poke_runners(&self) {
        if let Err(e) = self.wire.publish(&self.subjects.runner_poke(), bytes::Bytes::new()).await {
            tracing::debug!(error = %e, "poking runners failed; they sync on their timer");
        }
    }

    /// Plans and carries out one post; returns the outcomes and the notices it raised.
    async fn carry_out(&self, post: Post<'_>) -> (Vec<RecipientOutcome>, OutcomeCounts, Vec<Message>) {
        let Post { sender, message, reach, ack_only, quiet, committed_us } = post;
        let holds = self.holds.snapshot();
        let recipients: Vec<PlanRecipient<'_>> = reach
            .recipients
            .iter()
            .map(|r| PlanRecipient {
                handle: r.handle.as_str(),
                facts: RecipientFacts {
                    state: r.state,
                    presence: r.presence,
                    runner: r.runner.as_ref(),
                    mentioned: r.mentioned,
                    budget: match holds.held.is_empty() {
                        true => None,
                        false => holds.held.get(r.handle.as_str()).map(String::as_str),
                    },
                },
            })
            .collect();
        let delivery = &self.config.delivery;
        let limits = LoopLimits { wakes: delivery.loop_wakes, window: delivery.loop_window };
        let from = (sender.handle.as_str(), sender.kind);
        let mut plan = plan(from, &recipients, ack_only, quiet, &self.loops, limits, Instant::now());
        for handle in &reach.unreachable_mentions {
            plan.refuse(handle, format!("not subscribed to #{}", message.channel));
        }

        let steers = std::mem::take(&mut plan.steers);
        let steered = futures_util::future::join_all(steers.into_iter().map(|(index, runner)| async move {
            let recipient = &reach.recipients[index];
            let result = self.steer(recipient, &runner, message).await;
            (recipient, runner, result)
        }))
        .await;
        for (recipient, runner, result) in steered {
            match result {
                Ok((turn_id, written_at_us)) => {
                    let latency = written_at_us.map(|w| w.saturating_sub(committed_us));
                    plan.steered(recipient.handle.as_str(), &turn_id, latency);
                }
                Err(reason) => plan.steer_failed(recipient.handle.as_str(), runner, &reason),
            }
        }

        if !plan.held.is_empty() {
            let held: Vec<i64> = plan.held.iter().map(|i| reach.recipients[*i].agent_id).collect();
            if let Err(e) = self.store.record_held(held, message.seq).await {
                tracing::warn!(error = %e, seq = %message.seq, "recording held wakes failed");
            }
        }
        let mut raised = Vec::new();
        for index in std::mem::take(&mut plan.loop_notices) {
            raised.extend(self.loop_notice(sender.handle.as_str(), &reach.recipients[index]).await);
        }
        self.ring(std::mem::take(&mut plan.doorbells)).await;
        let mentioned: HashSet<&str> =
            reach.recipients.iter().filter(|r| r.mentioned).map(|r| r.handle.as_str()).collect();
        let (outcomes, counts) = plan.finish(&mentioned);
        (outcomes, counts, raised)
    }

    /// Asks the recipient's runner to inject the message into its running turn.
    async fn steer(
        &self,
        recipient: &Recipient,
        runner: &RunnerId,
        message: &Message,
    ) -> Result<(String, Option<u64>), String> {
        let timeout = self.config.delivery.steer_timeout;
        let request = SteerRequest {
            agent: recipient.handle.to_string(),
            incarnation: recipient.incarnation,
            message: message.clone(),
            not_after_ms: canopy_sys::unix_us() / 1000 + timeout.as_millis() as u64,
        };
        let subject = self.subjects.runner_steer(runner);
        let reply = self
            .wire
            .request(&subject, encode(&request), timeout)
            .await
            .map_err(|e| format!("its runner did not answer ({e})"))?;
        let reply: SteerReply =
            serde_json::from_slice(&reply).map_err(|e| format!("its runner's answer did not parse ({e})"))?;
        if !reply.steered {
            return Err(reply.reason.unwrap_or_else(|| "the harness did not take it".into()));
        }
        // The runner acknowledges the injection itself once the harness reports it.
        Ok((reply.turn_id.unwrap_or_default(), reply.written_at_us))
    }

    /// The loop guard's notice to both agents of a pair, committed; delivered by the caller.
    async fn loop_notice(&self, from: &str, to: &Recipient) -> Vec<Message> {
        let body = format!(
            "Loop guard: @{from} and @{} keep waking each other without an operator in between. \
             Further wakes between them are held; their messages wait for a turn that starts for another \
             reason. Post to either of them to reset the guard.",
            to.handle
        );
        match self.store.loop_notices(from.to_owned(), to.agent_id, body).await {
            Ok(messages) => messages,
            Err(e) => {
                tracing::warn!(error = %e, "telling the operator about a loop failed");
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests;
