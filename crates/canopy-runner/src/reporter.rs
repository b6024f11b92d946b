//! Batches session reports and sends them to the daemon with `sessions.report`.
//!
//! Reports queue in a bounded channel (a full queue makes sessions wait, so nothing is
//! dropped there). A batch that cannot be delivered is retried with backoff; after a
//! minute of failures it is dropped with a warning naming how many reports were lost,
//! because a daemon that has been away that long resyncs presence from the next sync.

use std::time::Duration;

use canopy_bus::{ApiClient, CallError};
use canopy_core::RunnerId;
use canopy_proto::api::{SessionReport, SessionsReportRequest};
use canopy_proto::method;
use tokio::sync::mpsc;

use crate::options::RunnerToken;

/// Most reports sent in one request.
const BATCH: usize = 200;

pub(crate) fn spawn(
    api: ApiClient,
    token: RunnerToken,
    runner_id: RunnerId,
    capacity: usize,
) -> (mpsc::Sender<SessionReport>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<SessionReport>(capacity.max(16));
    let task = tokio::spawn(async move {
        let mut batch = Vec::with_capacity(BATCH);
        while let Some(first) = rx.recv().await {
            batch.push(first);
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(report) => batch.push(report),
                    Err(_) => break,
                }
            }
            match token.get() {
                Ok(token) => send(&api, &token, &runner_id, &mut batch).await,
                Err(e) => {
                    tracing::error!(error = %e, lost = batch.len(), "dropping session reports");
                    batch.clear();
                }
            }
        }
    });
    (tx, task)
}

async fn send(api: &ApiClient, token: &str, runner_id: &RunnerId, batch: &mut Vec<SessionReport>) {
    let request = SessionsReportRequest { runner_id: runner_id.clone(), reports: std::mem::take(batch) };
    let mut delay = Duration::from_millis(100);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match api.send::<method::SessionsReport>(token, &request).await {
            Ok(response) => {
                if response.ignored > 0 {
                    tracing::debug!(ignored = response.ignored, "the daemon ignored reports of stale sessions");
                }
                return;
            }
            Err(CallError::Refused(e)) => {
                tracing::warn!(error = %e, count = request.reports.len(), "the daemon refused session reports");
                return;
            }
            Err(CallError::Unreachable(reason)) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(%reason, "session reports not delivered; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(CallError::Unreachable(reason)) => {
                tracing::warn!(%reason, lost = request.reports.len(), "dropping session reports after a minute of retries");
                return;
            }
        }
    }
}
