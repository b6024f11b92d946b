//! `RunEnds`: a subagent run's end, recorded once and told to its Manager. Every area that can
//! end a run uses it: `runs` (the runner's report, the deadline), `repos` (a checkout that
//! could not be made), `prompts` (a run whose session was lost before it started). Does not
//! summarise a run's branch or run its check (`repos`), or start runs (`runs`).

use std::sync::Arc;

use canopy_config::Config;
use canopy_core::Error;
use canopy_store::{RunStatus, Store, ops};

use crate::delivery::Delivery;

/// Ends runs. Cheap to clone.
#[derive(Clone)]
pub struct RunEnds {
    store: Store,
    delivery: Delivery,
    config: Arc<Config>,
}

impl RunEnds {
    pub fn new(store: Store, delivery: Delivery, config: Arc<Config>) -> Self {
        RunEnds { store, delivery, config }
    }

    /// Ends a run once and tells its Manager; false when it had already ended.
    pub async fn finish(
        &self,
        id: i64,
        status: RunStatus,
        report: String,
        check: Option<String>,
    ) -> Result<bool, Error> {
        // The report is a message body: keep it within the body limit.
        let report = canopy_core::redact::cut(&report, self.config.limits.max_body_bytes.saturating_sub(512) / 4);
        let done = self.store.write(move |conn| ops::finish_run(conn, id, status, &report, check.as_deref())).await?;
        let Some((_, message)) = done else { return Ok(false) };
        self.delivery.deliver_notices(vec![message]).await;
        self.abandon_review(id, status.as_str()).await;
        self.delivery.poke_runners().await;
        Ok(true)
    }

    /// A reviewer run that ended without a verdict no longer holds its review.
    async fn abandon_review(&self, id: i64, why: &str) {
        let why = format!("the run ended {why}");
        match self.store.write(move |conn| ops::end_review_of_run(conn, id, &why)).await {
            Ok(Some(notice)) => self.delivery.deliver_notices(vec![notice]).await,
            Ok(None) => {}
            Err(e) => tracing::warn!(run = id, error = %e, "ending a run's review failed"),
        }
    }

    /// Stops runs past their deadline (the daemon's periodic checks).
    pub async fn expire(&self) -> Result<(), Error> {
        let ended = self.store.write(ops::expire_runs).await?;
        if !ended.is_empty() {
            let ids: Vec<i64> = ended.iter().map(|(run, _)| run.id).collect();
            self.delivery.deliver_notices(ended.into_iter().map(|(_, m)| m).collect()).await;
            for id in ids {
                self.abandon_review(id, "timed_out").await;
            }
            self.delivery.poke_runners().await;
        }
        Ok(())
    }
}
