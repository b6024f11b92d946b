//! The console's connections: plain TCP on loopback, or TLS. One task accepts; with TLS each
//! handshake runs in a task of its own (bounded by `HANDSHAKE`), so a slow or silent client
//! never holds up the next; a client that speaks plain HTTP to the TLS port is answered, in
//! plain HTTP, that the console speaks HTTPS, and nothing else. Every connection carries its
//! peer's address (`Peer`) for the login limiter. Does not route or authenticate.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The longest a TLS handshake may take.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// Handshakes under way at most; a connection past them is closed at once, so a peer that
/// opens connections and stalls cannot use up the daemon's file descriptors.
const HANDSHAKES: usize = 128;

/// A connection's byte stream, plain or TLS.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The peer of a connection, for handlers that ask (`ConnectInfo<Peer>`).
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

impl Connected<IncomingStream<'_, Listener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, Listener>) -> Peer {
        Peer(*stream.remote_addr())
    }
}

/// Connections accepted (and, with TLS, shaken hands with) by the accepting task.
pub struct Listener {
    local: SocketAddr,
    ready: mpsc::Receiver<(Box<dyn Io>, SocketAddr)>,
}

impl Listener {
    /// Starts accepting on `tcp` until `stop`; with `tls`, every connection is TLS.
    pub fn start(tcp: TcpListener, tls: Option<Arc<rustls::ServerConfig>>, stop: CancellationToken) -> Listener {
        let local = tcp.local_addr().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        let (tx, ready) = mpsc::channel::<(Box<dyn Io>, SocketAddr)>(64);
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        let slots = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = tcp.accept() => accepted,
                    () = stop.cancelled() => return,
                };
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of descriptors, say: wait a little rather than spin.
                        tracing::warn!(error = %e, "accepting a console connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!(error = %e, "TCP_NODELAY on a console connection");
                }
                match &acceptor {
                    None => {
                        if tx.send((Box::new(stream), peer)).await.is_err() {
                            return;
                        }
                    }
                    Some(acceptor) => {
                        let Ok(slot) = slots.clone().try_acquire_owned() else {
                            tracing::debug!(%peer, "too many TLS handshakes under way; closing a connection");
                            continue;
                        };
                        let (acceptor, tx) = (acceptor.clone(), tx.clone());
                        tokio::spawn(async move {
                            let shaken = handshake(acceptor, stream, peer).await;
                            drop(slot);
                            if let Some(tls) = shaken {
                                // The server has stopped when nobody receives; the connection ends.
                                let _ = tx.send((tls, peer)).await;
                            }
                        });
                    }
                }
            }
        });
        Listener { local, ready }
    }
}

/// A TLS connection, or `None` after answering a plain-HTTP client or a failed handshake.
async fn handshake(
    acceptor: tokio_rustls::TlsAcceptor,
    mut stream: tokio::net::TcpStream,
    peer: SocketAddr,
) -> Option<Box<dyn Io>> {
    // A TLS client opens with a handshake record (0x16); anything else is not TLS.
    let mut first = [0u8; 1];
    match tokio::time::timeout(HANDSHAKE, stream.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] == 0x16 => {}
        Ok(Ok(1)) => {
            let body = "This console speaks HTTPS only: use https:// with the same address.\n";
            let answer = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            if let Err(e) = stream.write_all(answer.as_bytes()).await {
                tracing::debug!(error = %e, %peer, "answering plain HTTP on the TLS port");
            }
            // Close our side, then read what the client sent (briefly), so the answer is not
            // lost to a reset for unread data.
            if stream.shutdown().await.is_ok() {
                let mut sink = [0u8; 4096];
                let drain = async { while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {} };
                let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
            }
            return None;
        }
        _ => return None,
    }
    match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => Some(Box::new(tls)),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, %peer, "a TLS handshake with the console failed");
            None
        }
        Err(_) => None,
    }
}

impl axum::serve::Listener for Listener {
    type Io = Box<dyn Io>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accepting task ended (the console stops): no connection comes again.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
