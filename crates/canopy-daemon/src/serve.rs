//! The request loop: API requests over NATS, each in its own tracked task under one bound on
//! requests in flight, and the same handler called in process for clients in the daemon's own
//! process (the embedded runner, the console). Does not decide anything about a request
//! (`api::Api::handle`) or own the lifecycle (`daemon`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::StreamExt;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::Api;
use crate::edge::refusal;
use crate::wire::Wire;

/// The handler for clients in the daemon's process: each call runs under the same bound and
/// tracker as a request over NATS, polled by its caller (no task of its own: a spawn wakes
/// the other worker, which cost more than a short call). A call whose caller stops waiting
/// once it holds its permit is not dropped with it: the rest runs in a task
/// (`FinishOnDrop`), so it finishes, and shutdown waits for it, as for a request over NATS;
/// one dropped while still queued for a permit never runs. A panic in the handler is a
/// refusal, as it was when each call had a task.
pub(crate) struct InProcess {
    pub(crate) api: Arc<Api>,
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) tracker: TaskTracker,
}

impl canopy_bus::api::LocalApi for InProcess {
    fn handle(
        &self,
        subject: String,
        token: String,
        payload: bytes::Bytes,
    ) -> Pin<Box<dyn Future<Output = bytes::Bytes> + Send>> {
        let (api, permits) = (self.api.clone(), self.permits.clone());
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let running = started.clone();
        let call = self.tracker.track_future(async move {
            let Ok(permit) = permits.acquire_owned().await else {
                return refusal(&canopy_core::Error::Unavailable("the daemon is stopping".into()));
            };
            running.store(true, std::sync::atomic::Ordering::Relaxed);
            let answer = std::panic::AssertUnwindSafe(api.handle(&subject, Some(&token), &payload));
            let answer = futures_util::FutureExt::catch_unwind(answer).await;
            drop(permit);
            answer.unwrap_or_else(|_| refusal(&canopy_core::Error::Internal("a request's handler panicked".into())))
        });
        Box::pin(FinishOnDrop { call: Some(Box::pin(call)), started })
    }
}

/// A call polled in its caller's task; dropped unfinished after it started, it hands the
/// rest to a task of its own on the current runtime.
struct FinishOnDrop {
    call: Option<Pin<Box<dyn Future<Output = bytes::Bytes> + Send>>>,
    started: Arc<std::sync::atomic::AtomicBool>,
}

impl Future for FinishOnDrop {
    type Output = bytes::Bytes;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<bytes::Bytes> {
        let Some(call) = self.call.as_mut() else {
            return std::task::Poll::Ready(refusal(&canopy_core::Error::Internal(
                "an in-process call was polled after it finished".into(),
            )));
        };
        let answer = std::task::ready!(call.as_mut().poll(cx));
        self.call = None;
        std::task::Poll::Ready(answer)
    }
}

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else { return };
        if !self.started.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(call)),
            Err(_) => tracing::warn!("an in-process call was dropped unfinished outside the runtime"),
        }
    }
}

/// Answers API requests until `stop`, each in its own task, at most `permits` at once.
pub(crate) async fn serve(
    wire: Arc<dyn Wire>,
    api: Arc<Api>,
    permits: Arc<Semaphore>,
    mut requests: impl futures_util::Stream<Item = canopy_bus::Incoming> + Unpin,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let inboxes = format!("_INBOX.{}.", api.workspace_id);
    loop {
        let incoming = tokio::select! {
            () = stop.cancelled() => return,
            incoming = requests.next() => incoming,
        };
        let Some(incoming) = incoming else {
            tracing::error!("the API subscription ended");
            return;
        };
        let Some(reply) = incoming.reply.clone() else {
            tracing::debug!(subject = %incoming.subject, "ignoring an API message without a reply subject");
            continue;
        };
        // The daemon may publish anywhere in the workspace: it answers only on an inbox, never
        // on a subject a caller chose (a runner's doorbell, an event).
        if !reply.starts_with(&inboxes) {
            tracing::debug!(%reply, "ignoring an API request whose reply subject is no inbox");
            continue;
        }
        // Waiting here leaves further requests in NATS, bounded by its buffers.
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        let (api, wire) = (api.clone(), wire.clone());
        tracker.spawn(async move {
            let answer = api.handle(&incoming.subject, incoming.token.as_deref(), &incoming.payload).await;
            if let Err(e) = wire.publish(&reply, answer).await {
                tracing::warn!(error = %e, "sending a reply failed");
            }
            drop(permit);
        });
    }
}
