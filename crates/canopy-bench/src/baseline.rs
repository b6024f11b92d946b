//! The raw baselines: what each figure is measured beside, on the same nats-server and the
//! same store writer with nothing of Canopy around them. A NATS echo's round trips, NATS
//! requests that each commit one row (or run one post's writer job) and reply, and a plain
//! NATS publish burst.
//!
//! Each responder here replies only once its work is done; a reply it cannot publish (or a
//! commit that fails) leaves its request to time out, which fails the figure with that
//! request's error instead of measuring work that did not happen.

use std::time::{Duration, Instant};

use bytes::Bytes;
use canopy_bus::Bus;
use futures_util::StreamExt;

use crate::setup::Bench;

/// Payload for the raw baselines: `n` bytes (300 is the size of a typical post).
pub(crate) fn payload(n: usize) -> Bytes {
    Bytes::from(vec![b'x'; n])
}

/// What poster `i` of a post burst says, every time.
pub fn poster_body(i: usize) -> String {
    format!("a message from poster {i}: {}", "x".repeat(200))
}

impl Bench {
    /// Sequential NATS request round trips to an echo responder.
    pub async fn raw_round_trips(&self, samples: usize) -> Result<Vec<Duration>, String> {
        let bus = self.api.bus.clone();
        let mut echo = bus.serve("bench.echo", "bench").await.map_err(|e| e.to_string())?;
        let responder = bus.clone();
        let server = tokio::spawn(async move {
            while let Some(request) = echo.next().await {
                if let Some(reply) = request.reply {
                    // Unpublished, the request times out and the figure fails (see above).
                    let _ = responder.publish(&reply, request.payload).await;
                }
            }
        });
        bus.flush().await.map_err(|e| e.to_string())?;
        let mut times = Vec::with_capacity(samples);
        for _ in 0..samples {
            let started = Instant::now();
            bus.request("bench.echo", None, payload(300), Duration::from_secs(5)).await.map_err(|e| e.to_string())?;
            times.push(started.elapsed());
        }
        server.abort();
        times.sort();
        Ok(times)
    }

    /// NATS requests that each commit one row through the store's writer, then reply.
    pub async fn raw_commit_throughput(&self, concurrency: usize, total: usize) -> Result<f64, String> {
        let bus = self.api.bus.clone();
        let mut requests = bus.serve("bench.commit", "bench").await.map_err(|e| e.to_string())?;
        let (responder, store) = (bus.clone(), self.raw.clone());
        let server = tokio::spawn(async move {
            while let Some(request) = requests.next().await {
                let (responder, store) = (responder.clone(), store.clone());
                tokio::spawn(async move {
                    if canopy_store::bench::insert(&store, request.payload.to_vec()).await.is_ok()
                        && let Some(reply) = request.reply
                    {
                        // Unpublished, the request times out and the figure fails (see above).
                        let _ = responder.publish(&reply, Bytes::from_static(b"{}")).await;
                    }
                });
            }
        });
        let rate = request_rate(&bus, "bench.commit", concurrency, total, |_| payload(300)).await;
        server.abort();
        rate
    }

    /// NATS requests that each run the writer job of one post (`ops::post_and_reach`, on
    /// the raw store made a workspace with `concurrency` agents), then reply: the post's
    /// commit without the daemon's handling around it, one channel per caller.
    pub async fn post_job_throughput(&self, concurrency: usize, total: usize) -> Result<f64, String> {
        let (caller, channels) = self
            .raw_posts
            .get_or_try_init(|| canopy_store::bench::prepare_posts(&self.raw, concurrency))
            .await
            .map_err(|e| e.to_string())?;
        let specs: std::sync::Arc<Vec<canopy_store::PostSpec>> = std::sync::Arc::new(
            channels
                .iter()
                .enumerate()
                .map(|(i, channel)| {
                    Ok(canopy_store::PostSpec {
                        channel: channel.clone(),
                        topic: canopy_core::TopicName::parse("bench").map_err(|e| e.to_string())?,
                        body: poster_body(i),
                        create_topic: true,
                        idempotency_key: None,
                        ack_only: false,
                        wake: false,
                    })
                })
                .collect::<Result<_, String>>()?,
        );
        let bus = self.api.bus.clone();
        let mut requests = bus.serve("bench.post-job", "bench").await.map_err(|e| e.to_string())?;
        let (responder, store, caller) = (bus.clone(), self.raw.clone(), caller.clone());
        let server = tokio::spawn(async move {
            while let Some(request) = requests.next().await {
                let (responder, store, caller, specs) =
                    (responder.clone(), store.clone(), caller.clone(), specs.clone());
                tokio::spawn(async move {
                    let channel = std::str::from_utf8(&request.payload).ok().and_then(|s| s.parse::<usize>().ok());
                    let Some(spec) = channel.and_then(|i| specs.get(i)).cloned() else { return };
                    if canopy_store::bench::post(&store, caller, spec).await.is_ok()
                        && let Some(reply) = request.reply
                    {
                        // Unpublished, the request times out and the figure fails (see above).
                        let _ = responder.publish(&reply, Bytes::from_static(b"{}")).await;
                    }
                });
            }
        });
        let rate = request_rate(&bus, "bench.post-job", concurrency, total, |i| Bytes::from(i.to_string())).await;
        server.abort();
        rate
    }

    /// Publishes `count` messages and waits until a subscriber has all of them. A burst the
    /// server cut short (core NATS drops for a consumer it finds slow, and the benchmark's
    /// subscriber shares two cores with everything else) is measured again, at most thrice.
    pub async fn raw_publish_burst(&self, count: usize) -> Result<Duration, String> {
        let mut lost = String::new();
        for _ in 0..3 {
            match self.raw_publish_burst_once(count).await {
                Ok(took) => return Ok(took),
                Err(e) => lost = e,
            }
        }
        Err(lost)
    }

    async fn raw_publish_burst_once(&self, count: usize) -> Result<Duration, String> {
        let bus = self.api.bus.clone();
        let mut sub = bus.subscribe("bench.burst").await.map_err(|e| e.to_string())?;
        bus.flush().await.map_err(|e| e.to_string())?;
        let started = Instant::now();
        for _ in 0..count {
            bus.publish("bench.burst", payload(64)).await.map_err(|e| e.to_string())?;
        }
        bus.flush().await.map_err(|e| e.to_string())?;
        let mut received = 0;
        while received < count {
            match tokio::time::timeout(Duration::from_secs(2), sub.next()).await {
                Ok(Some(_)) => received += 1,
                _ => return Err(format!("the raw burst lost messages ({received} of {count})")),
            }
        }
        Ok(started.elapsed())
    }
}

/// `concurrency` clients sending `total` requests in all to `subject` (client `i` sends
/// `payload(i)` each time), each waiting for its reply; requests per second.
async fn request_rate(
    bus: &Bus,
    subject: &'static str,
    concurrency: usize,
    total: usize,
    payload: impl Fn(usize) -> Bytes,
) -> Result<f64, String> {
    bus.flush().await.map_err(|e| e.to_string())?;
    let started = Instant::now();
    let clients: Vec<_> = (0..concurrency)
        .map(|i| {
            let (bus, payload) = (bus.clone(), payload(i));
            tokio::spawn(async move {
                for _ in 0..total / concurrency {
                    bus.request(subject, None, payload.clone(), Duration::from_secs(10))
                        .await
                        .map_err(|e| format!("{subject}: {e}"))?;
                }
                Ok::<_, String>(())
            })
        })
        .collect();
    for client in clients {
        client.await.map_err(|e| e.to_string())??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}
