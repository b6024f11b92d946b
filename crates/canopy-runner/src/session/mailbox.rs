//! One session's calls to the daemon about its input: pull what is pending, fetch the
//! continuity block, acknowledge what the harness took, and hand over a run's final report.
//!
//! Owns how each call fails: a pull or a continuity block that cannot be had is `None` (the
//! caller goes on without it), an acknowledgement or a run's end is retried briefly and then
//! given up (logged). Does not decide when to call: the session loop does.

use std::time::Duration;

use canopy_bus::ApiClient;
use canopy_core::{Incarnation, RunnerId, Seq};
use canopy_proto::api::{
    ContinuityWhen, DeliveriesAckRequest, DeliveriesPullRequest, DeliveriesPullResponse, RunsFinishRequest,
    SessionsContinuityRequest,
};
use canopy_proto::method;

use crate::options::RunnerToken;

/// Talks to the daemon about this session's deliveries.
#[derive(Clone)]
pub(crate) struct Mailbox {
    pub api: ApiClient,
    pub token: RunnerToken,
    pub runner_id: RunnerId,
    pub agent: String,
    pub incarnation: Incarnation,
    /// Most messages pulled for one turn start.
    pub batch: u32,
}

impl Mailbox {
    /// The runner's token for the call `what`; `None`, logged as an error, when it cannot be
    /// read (the call is then not made: the daemon would refuse it anyway).
    fn token(&self, what: &str) -> Option<String> {
        match self.token.get() {
            Ok(token) => Some(token),
            Err(e) => {
                tracing::error!(error = %e, "{what} skipped");
                None
            }
        }
    }

    pub async fn pull(&self) -> Option<DeliveriesPullResponse> {
        let request = DeliveriesPullRequest {
            runner_id: self.runner_id.clone(),
            agent: self.agent.clone(),
            incarnation: self.incarnation,
            limit: Some(self.batch),
        };
        let token = self.token("pulling pending messages")?;
        match self.api.send::<method::DeliveriesPull>(&token, &request).await {
            Ok(pending) => Some(pending),
            Err(e) => {
                tracing::debug!(error = %e, "pulling pending messages failed; retrying later");
                None
            }
        }
    }

    /// Hands a run's final report (or failure) to the daemon, retrying briefly.
    pub async fn finish_run(self, done: bool, report: String) {
        let report = match report.trim().is_empty() {
            true => "The run ended without a final message.".to_owned(),
            false => report,
        };
        let request = RunsFinishRequest {
            agent: self.agent.clone(),
            incarnation: self.incarnation,
            status: if done { "done" } else { "failed" }.to_owned(),
            report,
        };
        let Some(token) = self.token("reporting a run's end") else { return };
        retrying("reporting a run's end failed", || self.api.send::<method::RunsFinish>(&token, &request)).await;
    }

    /// The continuity block the daemon builds for this session, or `None` if it cannot be
    /// had now (the input goes without it rather than waiting).
    pub async fn continuity(&self, when: ContinuityWhen) -> Option<String> {
        let request = SessionsContinuityRequest {
            runner_id: self.runner_id.clone(),
            agent: self.agent.clone(),
            incarnation: self.incarnation,
            when,
        };
        let token = self.token("fetching the continuity block")?;
        match self.api.send::<method::SessionsContinuity>(&token, &request).await {
            Ok(response) if !response.block.is_empty() => Some(response.block),
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(error = %e, "fetching the continuity block failed; the input goes without it");
                None
            }
        }
    }

    /// Acknowledges injected messages, retrying briefly: an acknowledgement that never
    /// arrives only means the messages come again and are dropped as duplicates.
    pub async fn ack(&self, seqs: Vec<Seq>) {
        self.acknowledge(seqs, false).await;
    }

    /// Acknowledges messages steered into a running turn.
    pub async fn ack_steered(&self, seq: Seq) {
        self.acknowledge(vec![seq], true).await;
    }

    /// Acknowledges `seqs`: as injected without moving the cursor (`steered`), or as a
    /// turn start that wrote every message up to them.
    pub async fn acknowledge(&self, seqs: Vec<Seq>, steered: bool) {
        if seqs.is_empty() {
            return;
        }
        let request = DeliveriesAckRequest {
            runner_id: self.runner_id.clone(),
            agent: self.agent.clone(),
            incarnation: self.incarnation,
            seqs,
            steered,
        };
        let Some(token) = self.token("acknowledging a delivery") else { return };
        retrying("acknowledging a delivery failed", || self.api.send::<method::DeliveriesAck>(&token, &request)).await;
    }
}

/// Makes a daemon call up to five times, waiting 200 ms, doubling, after each failure and
/// logging it at debug as `failure`, then gives up with a warning: it serves only calls
/// whose loss the caller accepts (`Mailbox::acknowledge`, `Mailbox::finish_run`).
async fn retrying<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(failure: &str, call: impl FnMut() -> F) {
    retrying_after(failure, FIRST_WAIT, call).await;
}

/// How many times `retrying` makes a call, and how long it waits after the first failure.
const ATTEMPTS: u32 = 5;
const FIRST_WAIT: Duration = Duration::from_millis(200);

/// `retrying`, waiting `first_wait` (doubling) after each failure.
async fn retrying_after<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
    failure: &str,
    first_wait: Duration,
    mut call: impl FnMut() -> F,
) {
    for attempt in 0..ATTEMPTS {
        match call().await {
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(error = %e, attempt, "{failure}");
                tokio::time::sleep(first_wait * (1 << attempt)).await;
            }
        }
    }
    tracing::warn!(attempts = ATTEMPTS, "{failure}; giving up");
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    const WAIT: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn a_call_is_retried_until_it_succeeds() {
        let calls = AtomicU32::new(0);
        retrying_after("x", WAIT, || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err("not yet"),
                _ => Ok(()),
            }
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_call_that_keeps_failing_is_given_up_after_five_attempts() {
        let calls = AtomicU32::new(0);
        retrying_after("x", WAIT, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>("down")
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), ATTEMPTS);
    }
}
