//! `Wire`: what the daemon's services send over NATS (events, doorbells, steers, interrupts),
//! as a trait, so a service names the wire it uses and a unit test gives it a recording one
//! instead of a server. The real wire is `canopy_bus::Bus`. Does not build subjects (the
//! services do, with `canopy_proto::Subjects`) or receive anything (the API is served by
//! `serve`).

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;

/// Sends on NATS: a publish, or a request awaiting one reply within `timeout`. Errors are the
/// bus's, in words (every caller only logs or forwards them).
pub trait Wire: Send + Sync + 'static {
    fn publish<'a>(&'a self, subject: &'a str, payload: Bytes) -> BoxFuture<'a, Result<(), String>>;
    fn request<'a>(
        &'a self,
        subject: &'a str,
        payload: Bytes,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Bytes, String>>;
}

impl Wire for canopy_bus::Bus {
    fn publish<'a>(&'a self, subject: &'a str, payload: Bytes) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move { canopy_bus::Bus::publish(self, subject, payload).await.map_err(|e| e.to_string()) })
    }

    fn request<'a>(
        &'a self,
        subject: &'a str,
        payload: Bytes,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Bytes, String>> {
        Box::pin(async move {
            canopy_bus::Bus::request(self, subject, None, payload, timeout).await.map_err(|e| e.to_string())
        })
    }
}

#[cfg(test)]
pub(crate) mod recording {
    //! A wire that records what was sent and answers requests with a function of the subject.

    use std::sync::Mutex;

    use super::*;

    type Answer = Box<dyn Fn(&str, &[u8]) -> Result<Bytes, String> + Send + Sync>;

    /// Records every publish and request; answers requests with `answer`.
    pub(crate) struct Recording {
        pub(crate) sent: Mutex<Vec<(String, Bytes)>>,
        answer: Answer,
    }

    impl Recording {
        pub(crate) fn new(answer: impl Fn(&str, &[u8]) -> Result<Bytes, String> + Send + Sync + 'static) -> Self {
            Recording { sent: Mutex::new(Vec::new()), answer: Box::new(answer) }
        }

        /// A wire on which every request goes unanswered.
        pub(crate) fn silent() -> Self {
            Recording::new(|subject, _| Err(format!("no responder on {subject}")))
        }

        /// The subjects sent on so far, in order.
        pub(crate) fn subjects(&self) -> Vec<String> {
            self.sent.lock().map(|s| s.iter().map(|(subject, _)| subject.clone()).collect()).unwrap_or_default()
        }
    }

    impl Wire for Recording {
        fn publish<'a>(&'a self, subject: &'a str, payload: Bytes) -> BoxFuture<'a, Result<(), String>> {
            if let Ok(mut sent) = self.sent.lock() {
                sent.push((subject.to_owned(), payload));
            }
            Box::pin(async { Ok(()) })
        }

        fn request<'a>(
            &'a self,
            subject: &'a str,
            payload: Bytes,
            _timeout: Duration,
        ) -> BoxFuture<'a, Result<Bytes, String>> {
            let answer = (self.answer)(subject, &payload);
            if let Ok(mut sent) = self.sent.lock() {
                sent.push((subject.to_owned(), payload));
            }
            Box::pin(async move { answer })
        }
    }
}
