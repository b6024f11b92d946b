//! The egress proxy: the one general way out of a session's network namespace (`network`
//! relays its MCP and model endpoints). It speaks HTTP `CONNECT` (for TLS) and plain HTTP forwarding, resolves names itself, and
//! connects only to hosts on the session's allow-list; every refusal is answered `403` with the
//! reason and counted, and reported to its caller with the host.
//!
//! A name on the list that resolves to a loopback, unspecified or link-local address is refused
//! unless the entry itself names such an address or `localhost`: a public name pointed at
//! `127.0.0.1` must not reach the daemon's NATS port. Owns the allow-list rule and the proxy
//! loop; does not decide a session's list (`network` derives it from the harness's settings and
//! `[sandbox] allow_hosts`) nor bind anything into a sandbox.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Longest request head the proxy reads, in bytes.
const MAX_HEAD: usize = 16 * 1024;
/// How long a client has to send its request head, and the proxy to connect onwards.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One allowed destination: a host (lowercase; `*.example.com` for its subdomains) and a port
/// (any when `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    pub host: String,
    pub port: Option<u16>,
}

/// A session's allow-list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Allowed>,
}

impl AllowList {
    /// Parses `host`, `host:port`, `*.domain` or `[v6]:port` entries; an entry that is not one
    /// is refused naming it.
    pub fn parse(entries: &[String]) -> Result<AllowList, String> {
        let mut out = Vec::with_capacity(entries.len());
        for raw in entries {
            let entry = raw.trim().to_ascii_lowercase();
            let (host, port) = split_host_port(&entry).ok_or_else(|| format!("{raw:?} is not host or host:port"))?;
            let name = host.strip_prefix("*.").unwrap_or(host);
            let valid = host.parse::<IpAddr>().is_ok()
                || (!name.is_empty()
                    && name.len() <= 253
                    && name.split('.').all(|l| {
                        !l.is_empty()
                            && l.len() <= 63
                            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                            && !l.starts_with('-')
                    }));
            if !valid {
                return Err(format!("{raw:?} is not a host name or address"));
            }
            out.push(Allowed { host: host.to_owned(), port });
        }
        Ok(AllowList { entries: out })
    }

    /// The entry that allows `host:port`, if one does.
    fn entry(&self, host: &str, port: u16) -> Option<&Allowed> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.entries.iter().find(|e| {
            let host_ok = match e.host.strip_prefix("*.") {
                Some(domain) => host.len() > domain.len() + 1 && host.ends_with(&format!(".{domain}")),
                None => e.host == host,
            };
            host_ok && e.port.is_none_or(|p| p == port)
        })
    }

    /// Whether `host:port` may be reached (the name rule; addresses are checked on connect).
    pub fn allows(&self, host: &str, port: u16) -> bool {
        self.entry(host, port).is_some()
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port` (a bare v6 address has no port).
fn split_host_port(entry: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = entry.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after.strip_prefix(':') {
            Some(port) => Some((host, Some(port.parse().ok()?))),
            None if after.is_empty() => Some((host, None)),
            None => None,
        };
    }
    if entry.matches(':').count() > 1 {
        return entry.parse::<IpAddr>().ok().map(|_| (entry, None));
    }
    match entry.rsplit_once(':') {
        Some((host, port)) => Some((host, Some(port.parse().ok()?))),
        None => Some((entry, None)),
    }
}

/// An address only a named entry for it may reach: loopback, unspecified, link-local (an
/// IPv4 address mapped into IPv6, `::ffff:127.0.0.1`, is judged as the IPv4 address).
fn is_local(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_unspecified() || v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unspecified() || (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// A refused connection: where to, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub host: String,
    pub port: u16,
    pub reason: String,
}

/// The proxy's counters, shared with whoever reports them (the roster's `egress refused: N`).
#[derive(Debug, Default)]
pub struct Counters {
    pub allowed: AtomicU64,
    pub refused: AtomicU64,
}

/// Serves the proxy on `listener` for one session's `allow` list until the task is dropped
/// (which ends its connections too); each refusal is counted and sent on `refusals` (dropped
/// when the receiver lags). `slots` bounds the session's open connections.
pub async fn serve(
    listener: TcpListener,
    allow: Arc<AllowList>,
    counters: Arc<Counters>,
    refusals: tokio::sync::mpsc::Sender<Refusal>,
    slots: Arc<tokio::sync::Semaphore>,
) {
    accept_each(listener, slots, move |client| {
        let (allow, counters, refusals) = (allow.clone(), counters.clone(), refusals.clone());
        async move {
            if let Err(refusal) = handle(client, &allow, &counters).await {
                counters.refused.fetch_add(1, Ordering::Relaxed);
                tracing::info!(host = %refusal.host, port = refusal.port, reason = %refusal.reason, "egress refused");
                let _ = refusals.try_send(refusal);
            }
        }
    })
    .await
}

/// Most connections one session holds open through its relays and proxy together; more wait.
pub const MAX_CONNECTIONS: usize = 256;

/// Accepts on `listener` and runs `each` on every connection, at most as many at once as
/// `slots` allows, in tasks owned by this loop (dropping it ends them). An accept error (out
/// of descriptors) backs off instead of spinning.
pub(crate) async fn accept_each<F, Fut>(listener: TcpListener, slots: Arc<tokio::sync::Semaphore>, each: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(e) => {
                tracing::debug!(error = %e, "accepting a session's connection failed; backing off");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let work = each(client);
        connections.spawn(async move {
            work.await;
            drop(slot);
        });
    }
}

/// A host as a session named it, made safe to log and to quote in a notice: hostname
/// characters only, at most 253 of them.
fn shown(host: &str) -> String {
    match host.len() <= 253 && host.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b)) {
        true => host.to_owned(),
        false => "<not a host name>".to_owned(),
    }
}

/// One client connection: its request head, the allow-list, the onward connection, then bytes
/// both ways. A refusal is answered before it is returned; a client that sends nothing and
/// goes is neither allowed nor refused.
async fn handle(mut client: TcpStream, allow: &AllowList, counters: &Counters) -> Result<(), Refusal> {
    let refuse = |host: &str, port: u16, reason: &str| Refusal { host: shown(host), port, reason: reason.into() };
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
        Ok(Ok(head)) => head,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof && e.to_string() == "nothing sent" => return Ok(()),
        _ => return Err(refuse("", 0, "no complete request head")),
    };
    let request = match parse_head(&head) {
        Ok(request) => request,
        Err(why) => {
            answer(&mut client, 400, &why).await;
            return Err(refuse("", 0, "not an HTTP proxy request"));
        }
    };
    let Some(entry) = allow.entry(&request.host, request.port) else {
        let why = format!("egress to {}:{} is not allowed for this session", shown(&request.host), request.port);
        answer(&mut client, 403, &why).await;
        return Err(refuse(&request.host, request.port, "not on the allow-list"));
    };
    let mut upstream = match connect(entry, &request.host, request.port).await {
        Ok(upstream) => upstream,
        Err(why) => {
            answer(&mut client, 403, &why).await;
            return Err(refuse(&request.host, request.port, &why));
        }
    };
    counters.allowed.fetch_add(1, Ordering::Relaxed);
    let mut sent = Ok(());
    if request.connect {
        sent = client.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n").await;
    }
    if sent.is_ok() && !request.forward.is_empty() {
        sent = upstream.write_all(&request.forward).await;
    }
    if sent.is_ok() {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    }
    Ok(())
}

/// Resolves the host and connects to the first of its addresses the entry allows that answers.
pub(crate) async fn connect(entry: &Allowed, host: &str, port: u16) -> Result<TcpStream, String> {
    let addrs: Vec<SocketAddr> =
        tokio::net::lookup_host((host, port)).await.map_err(|e| format!("{host} does not resolve: {e}"))?.collect();
    let named_local = entry.host == "localhost" || entry.host.parse::<IpAddr>().is_ok_and(is_local);
    let allowed: Vec<SocketAddr> = addrs.into_iter().filter(|a| named_local || !is_local(a.ip())).collect();
    if allowed.is_empty() {
        return Err(format!("{host} resolves only to local addresses, which its entry does not name"));
    }
    let mut failed = String::new();
    for addr in allowed {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => failed = format!("connecting to {host}:{port} failed: {e}"),
            Err(_) => failed = format!("connecting to {host}:{port} timed out"),
        }
    }
    Err(failed)
}

/// Reads up to the end of the request head (`\r\n\r\n`), at most `MAX_HEAD` bytes; what
/// follows the head in the same read is kept (it belongs to the body).
async fn read_head(client: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    loop {
        let n = client.read(&mut buf).await?;
        if n == 0 && head.is_empty() {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "nothing sent"));
        }
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&buf[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(head);
        }
        if head.len() > MAX_HEAD {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
    }
}

/// What a request asks: where to, whether it is a tunnel (`CONNECT`), and the bytes to send
/// on: for plain HTTP the request made origin-form, its `Host` the URL's, the proxy headers
/// dropped and `Connection: close` (one request per connection, so a later request on it cannot
/// name another host); for a tunnel whatever the client sent after its head.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    host: String,
    port: u16,
    connect: bool,
    forward: Vec<u8>,
}

fn parse_head(head: &[u8]) -> Result<Request, String> {
    let end = head.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no end of the request head")?;
    let (text, rest) = (&head[..end], &head[end + 4..]);
    let text = std::str::from_utf8(text).map_err(|_| "the request head is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut parts = first.split(' ');
    let (method, target, version) =
        (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return Err(format!("{first:?} is not an HTTP/1 request line"));
    }
    if method == "CONNECT" {
        let (host, port) = split_host_port(target).and_then(|(h, p)| Some((h, p?))).ok_or("CONNECT needs host:port")?;
        return Ok(Request { host: host.to_owned(), port, connect: true, forward: rest.to_vec() });
    }
    let rest_of_url = target.strip_prefix("http://").ok_or("only CONNECT and http:// URLs go through the proxy")?;
    let (authority, path) = match rest_of_url.find('/') {
        Some(i) => (&rest_of_url[..i], &rest_of_url[i..]),
        None => (rest_of_url, "/"),
    };
    let (host, port) = split_host_port(authority).ok_or("a URL without a host")?;
    let mut forward = format!("{method} {path} {version}\r\nHost: {authority}\r\nConnection: close\r\n");
    for line in lines {
        let name = line.split(':').next().unwrap_or_default().trim().to_ascii_lowercase();
        if line.contains('\n')
            || matches!(name.as_str(), "host" | "connection" | "keep-alive")
            || name.starts_with("proxy-")
        {
            continue;
        }
        forward.push_str(line);
        forward.push_str("\r\n");
    }
    forward.push_str("\r\n");
    let mut bytes = forward.into_bytes();
    bytes.extend_from_slice(rest);
    Ok(Request { host: host.to_owned(), port: port.unwrap_or(80), connect: false, forward: bytes })
}

async fn answer(client: &mut TcpStream, status: u16, why: &str) {
    let reason = if status == 403 { "Forbidden" } else { "Bad Request" };
    let body = format!("canopy: {why}\n");
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // The client may have gone: a refusal is recorded either way.
    let _ = client.write_all(response.as_bytes()).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn the_allow_list_matches_hosts_ports_and_subdomains() {
        let allow = list(&["api.anthropic.com:443", "*.npmjs.org", "127.0.0.1:8080", "[::1]:9"]);
        assert!(allow.allows("api.anthropic.com", 443) && allow.allows("API.Anthropic.com.", 443));
        assert!(!allow.allows("api.anthropic.com", 80) && !allow.allows("evil.com", 443));
        assert!(allow.allows("registry.npmjs.org", 443) && !allow.allows("npmjs.org", 443));
        assert!(!allow.allows("evilnpmjs.org", 443));
        assert!(allow.allows("127.0.0.1", 8080) && !allow.allows("127.0.0.2", 8080) && allow.allows("::1", 9));
        for bad in ["", "a b", "host:port", "-x.com", "x..com"] {
            assert!(AllowList::parse(&[bad.to_owned()]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_request_head_is_read_as_connect_or_a_forwarded_url() {
        let connect = parse_head(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: x\r\n\r\nhello").unwrap();
        assert_eq!((connect.host.as_str(), connect.port, connect.connect), ("api.example.com", 443, true));
        assert_eq!(connect.forward, b"hello".to_vec(), "what the client sent early goes on");
        let get = parse_head(
            b"GET http://h.example:8080/a?b HTTP/1.1\r\nHost: evil.example\r\nProxy-Authorization: x\r\n\
              Connection: keep-alive\r\nAccept: */*\r\n\r\nbody",
        )
        .unwrap();
        assert_eq!((get.host.as_str(), get.port, get.connect), ("h.example", 8080, false));
        let forwarded = String::from_utf8(get.forward).unwrap();
        assert_eq!(
            forwarded, "GET /a?b HTTP/1.1\r\nHost: h.example:8080\r\nConnection: close\r\nAccept: */*\r\n\r\nbody",
            "the Host is the URL's, one request per connection"
        );
        assert_eq!(shown("a.example:1"), "a.example:1");
        assert_eq!(shown("evil\n@ops"), "<not a host name>");
        assert!(is_local("::ffff:127.0.0.1".parse().unwrap()) && is_local("::ffff:169.254.169.254".parse().unwrap()));
        for bad in [&b"GET /local HTTP/1.1\r\n\r\n"[..], b"CONNECT host HTTP/1.1\r\n\r\n", b"garbage\r\n\r\n"] {
            assert!(parse_head(bad).is_err());
        }
    }

    async fn proxy(entries: &[&str]) -> (SocketAddr, Arc<Counters>, tokio::sync::mpsc::Receiver<Refusal>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counters = Arc::new(Counters::default());
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        tokio::spawn(serve(listener, Arc::new(list(entries)), counters.clone(), tx, slots));
        (addr, counters, rx)
    }

    /// A server on 127.0.0.1 that answers one line with "pong".
    async fn pong() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = s.read(&mut buf).await;
                    let _ = s.write_all(b"pong").await;
                });
            }
        });
        port
    }

    async fn ask(proxy: SocketAddr, head: String) -> String {
        let mut s = TcpStream::connect(proxy).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        if head.starts_with("CONNECT") {
            let mut buf = vec![0u8; 39];
            let n = s.read(&mut buf).await.unwrap();
            if !buf[..n].starts_with(b"HTTP/1.1 200") {
                let mut rest = String::from_utf8_lossy(&buf[..n]).into_owned();
                let _ = s.read_to_string(&mut rest).await;
                return rest;
            }
            s.write_all(b"ping\n").await.unwrap();
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out
    }

    #[tokio::test]
    async fn only_allowed_hosts_are_reached_and_each_refusal_is_counted_with_its_host() {
        let port = pong().await;
        let (addr, counters, mut refusals) = proxy(&[&format!("127.0.0.1:{port}")]).await;
        assert_eq!(ask(addr, format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")).await, "pong");
        let forwarded = ask(addr, format!("GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: a\r\n\r\n")).await;
        assert_eq!(forwarded, "pong");
        // Another loopback address on the same port is not on the list.
        let refused = ask(addr, format!("CONNECT 127.0.0.2:{port} HTTP/1.1\r\n\r\n")).await;
        assert!(refused.starts_with("HTTP/1.1 403") && refused.contains("not allowed"), "{refused}");
        let refusal = refusals.recv().await.unwrap();
        assert_eq!((refusal.host.as_str(), refusal.port), ("127.0.0.2", port));
        assert_eq!((counters.allowed.load(Ordering::Relaxed), counters.refused.load(Ordering::Relaxed)), (2, 1));
    }

    #[tokio::test]
    async fn a_name_on_the_list_that_resolves_to_loopback_is_refused() {
        let port = pong().await;
        // `localhost` named is allowed; a wildcard that happens to match a loopback name is not.
        let (addr, _, _) = proxy(&[&format!("localhost:{port}"), "*.localhost"]).await;
        assert_eq!(ask(addr, format!("CONNECT localhost:{port} HTTP/1.1\r\n\r\n")).await, "pong");
        let (addr, _, mut refusals) = proxy(&["*.localhost"]).await;
        let refused = ask(addr, format!("CONNECT a.localhost:{port} HTTP/1.1\r\n\r\n")).await;
        assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
        let reason = refusals.recv().await.unwrap().reason;
        assert!(reason.contains("local addresses") || reason.contains("does not resolve"), "{reason}");
    }
}
