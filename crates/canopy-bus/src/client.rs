//! The NATS client wrapper: connect, request, serve, publish, subscribe.
//!
//! Every subscription is bounded (async-nats' `subscription_capacity`); a slow consumer
//! loses notifications, never data, because the data is in SQLite. Connection changes are
//! broadcast as `ConnectionEvent`s so followers know when to resync.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::sync::broadcast;

use canopy_proto::TOKEN_HEADER;

/// Why a NATS operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BusError {
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("no responder on {subject}: is the daemon running?")]
    NoResponders { subject: String },
    #[error("request on {subject} timed out after {timeout:?}")]
    TimedOut { subject: String, timeout: Duration },
    #[error("NATS {op} on {subject} failed: {reason}")]
    Io { op: &'static str, subject: String, reason: String },
    #[error("{0}")]
    Server(String),
}

/// Whether a connect failed because the server refused the login itself.
pub fn refused_login(error: &BusError) -> bool {
    matches!(error, BusError::Connect { reason, .. } if reason.to_ascii_lowercase().contains("authorization"))
}

/// A change in the connection to NATS, or the server refusing something on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionEvent {
    Connected,
    Disconnected,
    /// The server said no (a permissions violation names the subject); the connection stays.
    Refused(String),
}

/// Reads a login's user and password, at every (re)connect.
pub type ReadLogin = std::sync::Arc<dyn Fn() -> std::io::Result<(String, String)> + Send + Sync>;

/// How a client logs in to NATS.
#[derive(Clone, Default)]
pub struct Login {
    /// The user and password, read again at every reconnect so a rotated credential is picked
    /// up without a restart; `None` connects without credentials (an open server).
    pub read: Option<ReadLogin>,
    /// The prefix of this client's reply inboxes (its login may subscribe only there).
    pub inbox: Option<String>,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login").field("user", &self.read.is_some()).field("inbox", &self.inbox).finish()
    }
}

impl Login {
    /// No credentials.
    pub fn open() -> Login {
        Login::default()
    }

    /// The user and password `read` returns at each connect (a credential file, say).
    pub fn reading(
        read: impl Fn() -> std::io::Result<(String, String)> + Send + Sync + 'static,
        inbox: Option<String>,
    ) -> Login {
        Login { read: Some(std::sync::Arc::new(read)), inbox }
    }

    /// A fixed user and password.
    pub fn fixed(user: &str, password: &str, inbox: Option<String>) -> Login {
        let (user, password) = (user.to_owned(), password.to_owned());
        Login { read: Some(std::sync::Arc::new(move || Ok((user.clone(), password.clone())))), inbox }
    }
}

/// A connected NATS client. Cheap to clone.
#[derive(Clone)]
pub struct Bus {
    client: async_nats::Client,
    events: broadcast::Sender<ConnectionEvent>,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bus").field("state", &self.client.connection_state()).finish()
    }
}

/// A request received on a served subject.
#[derive(Debug, Clone)]
pub struct Incoming {
    pub subject: String,
    pub payload: Bytes,
    /// The caller's bearer token, from the request header.
    pub token: Option<String>,
    pub reply: Option<String>,
}

/// A message received on a subscription.
#[derive(Debug, Clone)]
pub struct Received {
    pub subject: String,
    pub payload: Bytes,
}

impl Bus {
    /// Connects to `url` with `login`.
    ///
    /// With `wait` the first connection is retried until it succeeds (the daemon uses this
    /// against its own server); without it a server that is down is an error at once.
    pub async fn connect(url: &str, login: &Login, name: &str, wait: bool) -> Result<Bus, BusError> {
        let (events, _) = broadcast::channel(64);
        let events_tx = events.clone();
        let mut options = match login.read.clone() {
            Some(read) => async_nats::ConnectOptions::with_auth_callback(move |_nonce| {
                let read = read.clone();
                async move {
                    let (user, password) =
                        read().map_err(|e| async_nats::AuthError::new(format!("reading the NATS login: {e}")))?;
                    let mut auth = async_nats::Auth::new();
                    auth.username = Some(user);
                    auth.password = Some(password);
                    Ok(auth)
                }
            }),
            None => async_nats::ConnectOptions::new(),
        };
        if let Some(inbox) = &login.inbox {
            options = options.custom_inbox_prefix(inbox);
        }
        let mut options = options
            .name(name)
            .connection_timeout(Duration::from_secs(5))
            .subscription_capacity(8192)
            .reconnect_delay_callback(|attempt| Duration::from_millis((50u64 << attempt.min(6)).min(2000)))
            .event_callback(move |event| {
                let events_tx = events_tx.clone();
                async move {
                    let mapped = match event {
                        async_nats::Event::Connected => Some(ConnectionEvent::Connected),
                        async_nats::Event::Disconnected => Some(ConnectionEvent::Disconnected),
                        async_nats::Event::ServerError(e) => {
                            tracing::warn!(error = %e, "the NATS server refused a request of this client");
                            Some(ConnectionEvent::Refused(e.to_string()))
                        }
                        other => {
                            tracing::debug!(event = %other, "nats event");
                            None
                        }
                    };
                    if let Some(mapped) = mapped {
                        tracing::debug!(?mapped, "nats connection changed");
                        // A broadcast send fails only when no one subscribes to connection
                        // changes right now; a later subscriber starts from its own state.
                        let _ = events_tx.send(mapped);
                    }
                }
            });
        if wait {
            options = options.retry_on_initial_connect();
        }
        let client =
            options.connect(url).await.map_err(|e| BusError::Connect { url: url.to_owned(), reason: e.to_string() })?;
        Ok(Bus { client, events })
    }

    /// Connects like `connect` (no `wait`), but when the server refuses the login itself
    /// (`authorization violation`: a credential added a moment ago and not yet applied) tries
    /// again every 200 ms for up to `patience`; the last refusal is the error.
    pub async fn connect_patiently(url: &str, login: &Login, name: &str, patience: Duration) -> Result<Bus, BusError> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            match Bus::connect(url, login, name, false).await {
                Err(e) if refused_login(&e) && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => return other,
            }
        }
    }

    /// Waits up to `patience` until the server at `url` accepts `user`'s login (`accepted`),
    /// or refuses it: how a credential change proves it was applied. Each look is one
    /// connection, closed at once.
    pub async fn await_login(
        url: &str,
        user: &str,
        password: &str,
        accepted: bool,
        patience: Duration,
    ) -> Result<(), BusError> {
        let deadline = tokio::time::Instant::now() + patience;
        let login = Login::fixed(user, password, None);
        loop {
            let now = match Bus::connect(url, &login, "canopy-login-check", false).await {
                Ok(bus) => {
                    // Closed at once; a failed drain leaves it to the server's ping timeout.
                    let _ = bus.client.drain().await;
                    true
                }
                Err(e) if refused_login(&e) => false,
                Err(e) => return Err(e),
            };
            if now == accepted {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                let state = if accepted { "accept" } else { "refuse" };
                return Err(BusError::Server(format!(
                    "the NATS server at {url} did not {state} the login {user} within {patience:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Connection changes from now on.
    pub fn connection_events(&self) -> broadcast::Receiver<ConnectionEvent> {
        self.events.subscribe()
    }

    /// Sends a request with an optional caller token and waits for one reply.
    pub async fn request(
        &self,
        subject: &str,
        token: Option<&str>,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, BusError> {
        let mut request = async_nats::Request::new().payload(payload).timeout(Some(timeout));
        if let Some(token) = token {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(TOKEN_HEADER, token);
            request = request.headers(headers);
        }
        match self.client.send_request(subject.to_owned(), request).await {
            Ok(message) => Ok(message.payload),
            Err(e) => Err(match e.kind() {
                async_nats::RequestErrorKind::NoResponders => BusError::NoResponders { subject: subject.to_owned() },
                async_nats::RequestErrorKind::TimedOut => BusError::TimedOut { subject: subject.to_owned(), timeout },
                _ => BusError::Io { op: "request", subject: subject.to_owned(), reason: e.to_string() },
            }),
        }
    }

    /// Serves requests on `subject` (wildcards allowed) in a queue group.
    pub async fn serve(
        &self,
        subject: &str,
        queue: &str,
    ) -> Result<impl Stream<Item = Incoming> + Unpin + use<>, BusError> {
        let subscriber = self
            .client
            .queue_subscribe(subject.to_owned(), queue.to_owned())
            .await
            .map_err(|e| BusError::Io { op: "subscribe", subject: subject.to_owned(), reason: e.to_string() })?;
        Ok(subscriber.map(|m| Incoming {
            token: m.headers.as_ref().and_then(|h| h.get(TOKEN_HEADER)).map(|v| v.as_str().to_owned()),
            subject: m.subject.to_string(),
            payload: m.payload,
            reply: m.reply.map(|r| r.to_string()),
        }))
    }

    /// Subscribes to `subject` (wildcards allowed).
    pub async fn subscribe(&self, subject: &str) -> Result<impl Stream<Item = Received> + Unpin + use<>, BusError> {
        let subscriber = self.client.subscribe(subject.to_owned()).await.map_err(|e| BusError::Io {
            op: "subscribe",
            subject: subject.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(subscriber.map(|m| Received { subject: m.subject.to_string(), payload: m.payload }))
    }

    /// Publishes one message. `Ok` means handed to the client, not delivered.
    pub async fn publish(&self, subject: &str, payload: Bytes) -> Result<(), BusError> {
        self.client.publish(subject.to_owned(), payload).await.map_err(|e| BusError::Io {
            op: "publish",
            subject: subject.to_owned(),
            reason: e.to_string(),
        })
    }

    /// Pushes buffered publishes to the socket.
    pub async fn flush(&self) -> Result<(), BusError> {
        self.client.flush().await.map_err(|e| BusError::Io {
            op: "flush",
            subject: String::new(),
            reason: e.to_string(),
        })
    }

    /// Closes the connection after flushing what is buffered.
    pub async fn drain(&self) {
        if let Err(e) = self.client.drain().await {
            tracing::debug!(error = %e, "draining the NATS connection");
        }
    }
}
