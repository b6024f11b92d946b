//! Delivery at post time, carried out: each recipient's route (decided by the pure planner,
//! `canopy_core::delivery`), steers, doorbells, held wakes and loop notices, and the
//! runner-facing pull and acknowledgement.
//!
//! A post is committed first; only then is anyone told. An @mentioned recipient in the
//! middle of a turn is steered through its runner (request/reply with a deadline): the
//! outcome is `steered` once the harness took it for that turn, and the runner records the
//! injection when the harness reports it at the next step boundary; a steer it cannot take
//! falls back to turn-start delivery and says so. Everyone else gets a doorbell on its runner's subject:
//! idle recipients are woken (after the runner's quiet window), busy ones get the message
//! at their next turn start, offline ones at their next session start. Doorbells are hints:
//! runners pull pending messages from the store and acknowledge what the harness accepted.
//! Canopy's own notices take the same path (`deliver_notices`), so they ring like any post.

use std::collections::HashSet;
use std::time::Instant;

use canopy_core::Error;
use canopy_core::acl::Caller;
use canopy_core::delivery::{LoopLimits, PlanRecipient, RecipientFacts, plan};
use canopy_proto::api::*;
use canopy_store::{Reach, Recipient, ops};

use crate::context::{Api, encode};

pub use canopy_core::delivery::LoopGuard;

impl Api {
    /// The one path for Canopy's own notices (gate, loop guard, mailbox, stall, crash, run
    /// reports): each is already committed; its event is published and its recipients are
    /// reached and rung like any post's.
    pub(crate) async fn deliver_notices(&self, notices: Vec<canopy_core::Message>) {
        for message in notices {
            self.publish_messages(vec![message.clone()]).await;
            let channel = message.channel.clone();
            let reach = self
                .store
                .read(move |conn| {
                    let (channel_id, sender) = ops::channel_and_system(conn, &channel)?;
                    ops::reach(conn, channel_id, sender, &[])
                })
                .await;
            if let Ok(reach) = reach {
                let system = Caller {
                    handle: canopy_core::Handle::from_trusted("canopy".into()),
                    kind: canopy_core::AccountKind::System,
                };
                let now = canopy_sys::unix_us();
                // Boxed: a delivery can itself post a notice (the loop guard's), which comes back here.
                Box::pin(self.deliver(&system, &message, &reach, false, None, now)).await;
            }
        }
    }

    /// Plans (`canopy_core::delivery::plan`) and carries out every recipient's delivery for
    /// a committed post: steers concurrently, each bounded by the steer timeout; then held
    /// wakes, loop notices and doorbells.
    pub(crate) async fn deliver(
        &self,
        caller: &Caller,
        message: &canopy_core::Message,
        reach: &Reach,
        ack_only: bool,
        quiet: Option<&str>,
        committed_us: u64,
    ) -> (Vec<RecipientOutcome>, OutcomeCounts) {
        let holds = self.budgets.snapshot();
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
        let sender = (caller.handle.as_str(), caller.kind);
        let mut plan = plan(sender, &recipients, ack_only, quiet, &self.loops, limits, Instant::now());
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
            let seq = message.seq;
            if let Err(e) = self
                .store
                .write(move |conn| held.iter().try_for_each(|agent| ops::record_held(conn, *agent, seq)))
                .await
            {
                tracing::warn!(error = %e, "recording held wakes failed");
            }
        }
        for index in std::mem::take(&mut plan.loop_notices) {
            self.tell_loop(caller.handle.as_str(), &reach.recipients[index]).await;
        }
        self.ring(std::mem::take(&mut plan.doorbells)).await;
        let mentioned: HashSet<&str> =
            reach.recipients.iter().filter(|r| r.mentioned).map(|r| r.handle.as_str()).collect();
        plan.finish(&mentioned)
    }

    /// Rings each runner for its agents: they pull what is pending. A hint: a doorbell that
    /// is not sent is made up by the runner's resync timer.
    pub(crate) async fn ring(&self, doorbells: std::collections::BTreeMap<canopy_core::RunnerId, Vec<String>>) {
        for (runner, agents) in doorbells {
            let subject = self.subjects.runner_deliver(&runner);
            if let Err(e) = self.bus.publish(&subject, encode(&DeliverDoorbell { agents })).await {
                tracing::debug!(error = %e, "a delivery doorbell was not sent; the runner resyncs on its timer");
            }
        }
    }

    /// Asks the recipient's runner to inject the message into its running turn.
    async fn steer(
        &self,
        recipient: &Recipient,
        runner: &canopy_core::RunnerId,
        message: &canopy_core::Message,
    ) -> Result<(String, Option<u64>), String> {
        let request = SteerRequest {
            agent: recipient.handle.to_string(),
            incarnation: recipient.incarnation,
            message: message.clone(),
            not_after_ms: canopy_sys::unix_us() / 1000 + self.config.delivery.steer_timeout.as_millis() as u64,
        };
        let subject = self.subjects.runner_steer(runner);
        let reply = self
            .bus
            .request(&subject, None, encode(&request), self.config.delivery.steer_timeout)
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

    async fn tell_loop(&self, from: &str, to: &Recipient) {
        let body = format!(
            "Loop guard: @{from} and @{} keep waking each other without an operator in between. \
             Further wakes between them are held; their messages wait for a turn that starts for another \
             reason. Post to either of them to reset the guard.",
            to.handle
        );
        let (from, to_id) = (from.to_owned(), to.agent_id);
        let result = self
            .store
            .write(move |conn| {
                let from_id = ops::agent_id(conn, &from)?;
                Ok(vec![ops::notice(conn, from_id, &body)?, ops::notice(conn, to_id, &body)?])
            })
            .await;
        match result {
            Ok(messages) => self.deliver_notices(messages).await,
            Err(e) => tracing::warn!(error = %e, "telling the operator about a loop failed"),
        }
    }

    pub(crate) async fn deliveries_pull(
        &self,
        runner: canopy_core::RunnerId,
        req: DeliveriesPullRequest,
    ) -> Result<DeliveriesPullResponse, Error> {
        crate::context::as_runner(&runner, &req.runner_id)?;
        let limit = req.limit.unwrap_or(self.config.delivery.batch).clamp(1, MAX_READ_LIMIT);
        // Under a spent budget nothing is handed over, so no turn starts; it stays pending.
        if self.budgets.hold(&req.agent).is_some() {
            return Ok(DeliveriesPullResponse { messages: Vec::new(), wake: false, total: 0, redelivered: Vec::new() });
        }
        let incarnation = req.incarnation;
        let (agent, pending) = self
            .store
            .read(move |conn| {
                let agent = ops::live_agent(conn, &req.agent, req.incarnation, &req.runner_id)?;
                Ok((agent, ops::pending(conn, agent, limit)?))
            })
            .await?;
        // What is handed out is recorded (a write only when there is something), so a later
        // session knows what an earlier one may have seen (`redelivered`).
        let seqs: Vec<canopy_core::Seq> = pending.messages.iter().map(|m| m.seq).collect();
        let redelivered = match seqs.is_empty() {
            true => Vec::new(),
            false => self.store.write(move |conn| ops::offer(conn, agent, incarnation, &seqs)).await?,
        };
        Ok(DeliveriesPullResponse { messages: pending.messages, wake: pending.wake, total: pending.total, redelivered })
    }

    pub(crate) async fn deliveries_ack(
        &self,
        runner: canopy_core::RunnerId,
        req: DeliveriesAckRequest,
    ) -> Result<DeliveriesAckResponse, Error> {
        crate::context::as_runner(&runner, &req.runner_id)?;
        if req.seqs.len() > MAX_READ_LIMIT as usize {
            return Err(Error::invalid("seqs", format!("at most {MAX_READ_LIMIT} per acknowledgement")));
        }
        let moved = self
            .store
            .write(move |conn| {
                let agent = ops::live_agent(conn, &req.agent, req.incarnation, &req.runner_id)?;
                if req.steered {
                    req.seqs.iter().try_for_each(|seq| ops::record_injected(conn, agent, *seq))?;
                    return Ok(0);
                }
                ops::acknowledge(conn, agent, &req.seqs)
            })
            .await?;
        Ok(DeliveriesAckResponse { moved })
    }

    /// Tells the operator about agents whose pending messages passed the cap.
    pub async fn check_mailboxes(&self) {
        let cap = self.config.delivery.max_pending;
        let batch = self.config.delivery.batch;
        let retention = self.config.delivery.retention;
        let result = self
            .store
            .write(move |conn| {
                let mut notices = Vec::new();
                let cutoff = conn.now_ms() - retention.as_millis() as i64;
                for (agent_id, handle, missed) in ops::expire(conn, cutoff)? {
                    let body = format!(
                        "@{handle} never received {missed} messages older than the retention period ({}); \
                         they expired undelivered. They are still in their channels' history.",
                        humantime::format_duration(retention)
                    );
                    notices.push(ops::notice(conn, agent_id, &body)?);
                }
                for (agent_id, handle, pending) in ops::overflowing(conn, cap)? {
                    let body = format!(
                        "@{handle} has {pending} messages waiting, more than the cap of {cap}. Nothing is dropped; \
                         its next turns take them {batch} at a time. `canopy roster` shows the count."
                    );
                    notices.push(ops::notice(conn, agent_id, &body)?);
                }
                Ok(notices)
            })
            .await;
        match result {
            Ok(notices) => self.deliver_notices(notices).await,
            Err(e) => tracing::warn!(error = %e, "checking mailboxes failed"),
        }
    }
}
