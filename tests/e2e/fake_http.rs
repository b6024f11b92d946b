//! The skeleton the fake model APIs (`fake_anthropic`, `fake_openai`) share: an HTTP/1.1
//! listener on a free loopback port, one thread per connection, the scripted replies and the
//! recorded request bodies behind a mutex and condition variable, and a stop flag that
//! dropping the server sets.
//!
//! Owns the accept loop, reading one request (request line, `Content-Length` body), the reply
//! queue and the request log. Does not know any API's paths, request or reply shapes: each
//! fake passes a `serve` function that answers a request it was handed, and decides itself
//! whether a request takes a scripted reply. It is not a general HTTP server (one request per
//! connection, no chunked bodies, `connection: close`).
//!
//! A test binary that includes a fake includes this file beside it, at its crate root (the
//! fakes name it `crate::fake_http`): the harness tests with `#[path]`. It needs only `std`
//! and `serde_json`.

#![allow(dead_code, reason = "each fake uses a different part of it")]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The head of a streamed (SSE) answer.
pub const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";

/// One request as read off a connection.
pub struct HttpRequest {
    pub method: String,
    /// The request target as sent, query string included.
    pub target: String,
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// The target without its query string.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

/// Answers an empty `404 Not Found`.
pub fn not_found(stream: &mut TcpStream) {
    let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
}

struct State<R> {
    script: VecDeque<R>,
    requests: Vec<Value>,
    served: u64,
}

/// The script and the request log, shared by the server handle and its connection threads.
pub struct Exchange<R> {
    state: Mutex<State<R>>,
    arrived: Condvar,
}

impl<R> Exchange<R> {
    /// Records a request body, wakes `wait_requests`, and (when `take_reply`) takes the next
    /// scripted reply. Returns that reply, if any, and the request's number, counting from 1.
    pub fn record(&self, request: Value, take_reply: bool) -> (Option<R>, u64) {
        let mut state = self.lock();
        state.requests.push(request);
        state.served += 1;
        self.arrived.notify_all();
        let reply = if take_reply { state.script.pop_front() } else { None };
        (reply, state.served)
    }

    fn lock(&self) -> MutexGuard<'_, State<R>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Answers one request; runs on the connection's own thread.
pub type Serve<R> = fn(TcpStream, HttpRequest, &Exchange<R>);

/// The running server; dropping it stops accepting connections.
pub struct FakeServer<R> {
    port: u16,
    exchange: Arc<Exchange<R>>,
    stop: Arc<AtomicBool>,
}

impl<R: Send + 'static> FakeServer<R> {
    /// Listens on a free loopback port and hands every request to `serve`; `what` names the
    /// fake in the panic if the port cannot be bound.
    pub fn start(what: &str, script: Vec<R>, serve: Serve<R>) -> FakeServer<R> {
        let listener =
            TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("binding a loopback port for {what}: {e:?}"));
        let port = listener.local_addr().expect("the fake's address").port();
        let exchange = Arc::new(Exchange {
            state: Mutex::new(State { script: script.into(), requests: Vec::new(), served: 0 }),
            arrived: Condvar::new(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let (exchange_for_thread, stop_for_thread) = (exchange.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop_for_thread.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let exchange = exchange_for_thread.clone();
                std::thread::spawn(move || {
                    if let Some((stream, request)) = read_request(stream) {
                        serve(stream, request, &exchange);
                    }
                });
            }
        });
        FakeServer { port, exchange, stop }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Adds replies to the end of the script.
    pub fn push(&self, reply: R) {
        self.exchange.lock().script.push_back(reply);
    }

    /// Every request body so far, in arrival order.
    pub fn requests(&self) -> Vec<Value> {
        self.exchange.lock().requests.clone()
    }

    /// Waits until at least `count` requests arrived: `Ok` with all of them, or, once
    /// `patience` has passed, `Err` with those that did (each fake words its own panic).
    pub fn wait_requests(&self, count: usize, patience: Duration) -> Result<Vec<Value>, Vec<Value>> {
        let deadline = Instant::now() + patience;
        let mut state = self.exchange.lock();
        while state.requests.len() < count {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(state.requests.clone());
            }
            state = self.exchange.arrived.wait_timeout(state, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        Ok(state.requests.clone())
    }
}

impl<R> Drop for FakeServer<R> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Reads the request line, the headers (only `Content-Length` matters) and the body; `None`
/// when the connection fails before the whole request arrived.
fn read_request(stream: TcpStream) -> Option<(TcpStream, HttpRequest)> {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).ok()?;
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.trim().eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).ok()?;
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default().to_owned();
    Some((stream, HttpRequest { method, target, body }))
}
