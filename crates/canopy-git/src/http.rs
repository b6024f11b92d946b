//! The smart HTTP endpoint runners on other machines fetch from and push to: the real `git
//! http-backend` run as a CGI program per request over the mirrors in one directory, behind
//! a login (HTTP Basic: a runner's id and its token) and a question to the caller for every
//! request (`Authorize`): may this login fetch this repository, or make these ref updates?
//!
//! The same listener hands paths under `/api/` to a handler the caller gives (the daemon's
//! tool calls from runners), and only routes them.
//!
//! Owns the protocol's edges: which paths exist (`info/refs`, `git-upload-pack`,
//! `git-receive-pack`; the dumb protocol is refused), reading a push's ref updates from the
//! head of its body before any of it reaches git (so a refused push writes nothing), and
//! turning the backend's CGI answer into an HTTP response. Does not decide who may do what:
//! the daemon's `Authorize` does, and audits what it refuses.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::process::{ChildStdin, ChildStdout, Command};

/// A push's ref updates are read before git sees the push; a command list longer than this
/// is refused (a push names a handful of refs).
const MAX_COMMANDS_BYTES: usize = 64 * 1024;

/// At most this many backends run at once; more requests wait for one to end.
const MAX_BACKENDS: usize = 32;

/// One ref a push would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefUpdate {
    pub old: String,
    pub new: String,
    /// The full ref name (`refs/canopy/agents/alice`).
    pub name: String,
}

impl RefUpdate {
    /// The push deletes the ref.
    pub fn deletes(&self) -> bool {
        self.new.bytes().all(|b| b == b'0')
    }
}

/// What a request would do to a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Read it (`git fetch`, `git clone`, and a push's ref listing).
    Fetch,
    /// Change these refs (the body of `git push`).
    Push(Vec<RefUpdate>),
}

/// One request, as the endpoint asks about it.
#[derive(Debug, Clone)]
pub struct Asked {
    /// The Basic login (user, password), when the request carried one.
    pub login: Option<(String, String)>,
    /// The repository's name, without `.git`.
    pub repo: String,
    pub access: Access,
    /// The peer's address, for the audit log.
    pub peer: SocketAddr,
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No login, or one nobody has: answered 401, so git asks for credentials.
    Unauthenticated,
    /// A known login that may not do this: answered 403 with the reason.
    Forbidden(String),
}

/// Decides one request: the login's name (passed to git as `REMOTE_USER`), or a refusal.
pub type Authorize = Arc<dyn Fn(Asked) -> Pin<Box<dyn Future<Output = Result<String, Refusal>> + Send>> + Send + Sync>;

/// What the same listener serves under `/api/` (the daemon's tool calls from runners); the
/// endpoint only routes to it.
pub type Other = Arc<
    dyn Fn(http::Request<Incoming>, SocketAddr) -> Pin<Box<dyn Future<Output = http::Response<Body>> + Send>>
        + Send
        + Sync,
>;

/// The prefix of the paths `Other` answers.
pub const OTHER_PREFIX: &str = "/api/";

/// The running endpoint; dropping it (or `stop`) stops accepting.
#[derive(Debug)]
pub struct GitHttp {
    pub addr: SocketAddr,
    accept: tokio::task::JoinHandle<()>,
}

impl GitHttp {
    /// Stops accepting connections (requests under way finish).
    pub fn stop(&self) {
        self.accept.abort();
    }
}

impl Drop for GitHttp {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// How the endpoint runs git.
#[derive(Clone)]
struct Backend {
    program: PathBuf,
    /// The directory holding the mirrors (`<name>.git`).
    root: PathBuf,
    authorize: Authorize,
    other: Option<Other>,
    slots: Arc<tokio::sync::Semaphore>,
}

/// Serves the mirrors in `root` on `listener` with git `program`, asking `authorize` about
/// every request, and hands paths under `OTHER_PREFIX` to `other` when there is one.
pub fn serve(
    listener: TcpListener,
    program: PathBuf,
    root: PathBuf,
    authorize: Authorize,
    other: Option<Other>,
) -> std::io::Result<GitHttp> {
    let addr = listener.local_addr()?;
    let backend =
        Backend { program, root, authorize, other, slots: Arc::new(tokio::sync::Semaphore::new(MAX_BACKENDS)) };
    let accept = tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a git connection");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let backend = backend.clone();
            // A tool call's answer is a small write after its head: sent at once, not after
            // the peer's delayed acknowledgement.
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY on a git connection");
            }
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
                    let backend = backend.clone();
                    async move { Ok::<_, Infallible>(backend.answer(request, peer).await) }
                });
                let connection =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "git connection ended");
                }
            });
        }
    });
    Ok(GitHttp { addr, accept })
}

/// A response body: the backend's output streamed, or a whole text.
pub type Body = BoxBody<Bytes, std::io::Error>;

/// A plain-text response with `status`.
pub fn text(status: http::StatusCode, message: &str) -> http::Response<Body> {
    let mut response =
        http::Response::new(Full::new(Bytes::from(format!("{message}\n"))).map_err(|never| match never {}).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain"));
    response
}

fn unauthorized() -> http::Response<Body> {
    let mut response = text(http::StatusCode::UNAUTHORIZED, "a runner's login is required");
    response
        .headers_mut()
        .insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Basic realm=\"canopy\""));
    response
}

/// The git service a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    Upload,
    Receive,
}

/// A request's repository, service and whether it is the ref listing (`info/refs`); `None`
/// for any path or method the smart protocol does not use.
fn route(method: &http::Method, path: &str, query: &str) -> Option<(String, Service, bool)> {
    let rest = path.strip_prefix('/')?;
    let (repo, tail) = rest.split_once(".git/")?;
    let valid = !repo.is_empty()
        && !repo.starts_with('.')
        && repo.len() <= 100
        && repo.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if !valid {
        return None;
    }
    let service = |name: &str| match name {
        "git-upload-pack" => Some(Service::Upload),
        "git-receive-pack" => Some(Service::Receive),
        _ => None,
    };
    match (method, tail) {
        (&http::Method::GET, "info/refs") => {
            let name = query.split('&').find_map(|pair| pair.strip_prefix("service="))?;
            Some((repo.to_owned(), service(name)?, true))
        }
        (&http::Method::POST, name) => Some((repo.to_owned(), service(name)?, false)),
        _ => None,
    }
}

/// The Basic login of `headers`, if it has a well-formed one.
pub fn basic_login(headers: &http::HeaderMap) -> Option<(String, String)> {
    use base64::Engine;
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ").or_else(|| value.strip_prefix("basic "))?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// The `Authorization` header value for `user` and `password` (what a runner sends).
pub fn basic_header(user: &str, password: &str) -> String {
    use base64::Engine;
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

/// The ref updates at the head of a receive-pack request body (pkt-lines up to the first
/// flush packet), or why they cannot be read.
pub fn parse_commands(head: &[u8]) -> Result<Option<(Vec<RefUpdate>, usize)>, String> {
    let mut at = 0;
    let mut updates = Vec::new();
    loop {
        let Some(len) = head.get(at..at + 4) else { return Ok(None) };
        let len = std::str::from_utf8(len)
            .ok()
            .and_then(|l| usize::from_str_radix(l, 16).ok())
            .ok_or_else(|| "a pkt-line length is not hexadecimal".to_owned())?;
        if len == 0 {
            return Ok(Some((updates, at + 4)));
        }
        if len < 4 {
            return Err(format!("pkt-line length {len} is not allowed in a push's commands"));
        }
        let Some(payload) = head.get(at + 4..at + len) else { return Ok(None) };
        at += len;
        let line = payload.split(|b| *b == 0).next().unwrap_or_default();
        // Git strips one trailing newline and nothing else: so does this, and a name must be
        // printable ASCII, so the name checked is the name git writes.
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        if !line.iter().all(|b| (0x20..0x7f).contains(b)) {
            return Err("a ref update names a ref that is not printable ASCII".to_owned());
        }
        let line = std::str::from_utf8(line).map_err(|_| "a ref update is not UTF-8".to_owned())?;
        if line.starts_with("shallow ") || line.starts_with("push-cert") {
            return Err("shallow and signed pushes are not accepted".to_owned());
        }
        let mut parts = line.splitn(3, ' ');
        let (Some(old), Some(new), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("a ref update reads {line:?}"));
        };
        let hex = |s: &str| (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex(old) || !hex(new) || !name.starts_with("refs/") || name.contains(' ') {
            return Err(format!("a ref update reads {line:?}"));
        }
        updates.push(RefUpdate { old: old.to_owned(), new: new.to_owned(), name: name.to_owned() });
    }
}

impl Backend {
    async fn answer(&self, request: http::Request<Incoming>, peer: SocketAddr) -> http::Response<Body> {
        if let Some(other) = &self.other
            && request.uri().path().starts_with(OTHER_PREFIX)
        {
            return other(request, peer).await;
        }
        let (parts, body) = request.into_parts();
        let Some((repo, service, listing)) =
            route(&parts.method, parts.uri.path(), parts.uri.query().unwrap_or_default())
        else {
            return text(http::StatusCode::NOT_FOUND, "not a smart git path");
        };
        let login = basic_login(&parts.headers);
        if login.is_none() {
            return unauthorized();
        }
        let mut body = BodyReader { body, buffered: Vec::new(), done: false };
        let access = match (service, listing) {
            (Service::Receive, false) => {
                if parts.headers.contains_key(http::header::CONTENT_ENCODING) {
                    return text(http::StatusCode::BAD_REQUEST, "a push's body must not be compressed");
                }
                match body.commands().await {
                    Ok(updates) => Access::Push(updates),
                    Err(why) => return text(http::StatusCode::BAD_REQUEST, &why),
                }
            }
            _ => Access::Fetch,
        };
        let asked = Asked { login, repo: repo.clone(), access, peer };
        let user = match (self.authorize)(asked).await {
            Ok(user) => user,
            Err(Refusal::Unauthenticated) => return unauthorized(),
            Err(Refusal::Forbidden(why)) => return text(http::StatusCode::FORBIDDEN, &why),
        };
        if !self.root.join(format!("{repo}.git")).is_dir() {
            return text(http::StatusCode::NOT_FOUND, &format!("no repository {repo}"));
        }
        match self.run(&parts, &user, peer, body).await {
            Ok(response) => response,
            Err(e) => {
                tracing::warn!(%repo, error = %e, "git http-backend failed");
                text(http::StatusCode::INTERNAL_SERVER_ERROR, "the git backend failed")
            }
        }
    }

    /// Runs `git http-backend` for the request and streams its answer back.
    async fn run(
        &self,
        parts: &http::request::Parts,
        user: &str,
        peer: SocketAddr,
        body: BodyReader,
    ) -> std::io::Result<http::Response<Body>> {
        let permit = self.slots.clone().acquire_owned().await.map_err(std::io::Error::other)?;
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        let mut command = Command::new(&self.program);
        command.arg("http-backend").env_clear();
        let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
        command.env("PATH", path).env("HOME", "/tmp").env("GIT_CONFIG_NOSYSTEM", "1");
        command.env("GIT_CONFIG_GLOBAL", "/dev/null");
        // Hooks never run in a mirror; pushes never delete (the check above refuses them too).
        let config = [
            ("core.hooksPath", "/dev/null"),
            ("receive.denyDeletes", "true"),
            ("http.receivepack", "true"),
            // A runner's objects are checked as they arrive, and one push is bounded.
            ("receive.fsckObjects", "true"),
            ("receive.maxInputSize", "2g"),
        ];
        command.env("GIT_CONFIG_COUNT", config.len().to_string());
        for (i, (key, value)) in config.iter().enumerate() {
            command.env(format!("GIT_CONFIG_KEY_{i}"), key).env(format!("GIT_CONFIG_VALUE_{i}"), value);
        }
        command.env("GIT_PROJECT_ROOT", &self.root).env("GIT_HTTP_EXPORT_ALL", "1");
        command.env("REQUEST_METHOD", parts.method.as_str()).env("PATH_INFO", parts.uri.path());
        command.env("QUERY_STRING", parts.uri.query().unwrap_or_default());
        command.env("CONTENT_TYPE", header("content-type")).env("REMOTE_USER", user);
        command.env("REMOTE_ADDR", peer.ip().to_string());
        let protocol = header("git-protocol");
        if !protocol.is_empty() {
            command.env("GIT_PROTOCOL", protocol);
        }
        let encoding = header("content-encoding");
        if !encoding.is_empty() {
            command.env("HTTP_CONTENT_ENCODING", encoding);
        }
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).kill_on_drop(true);
        let mut child = command.spawn()?;
        let stdin = child.stdin.take().ok_or_else(|| std::io::Error::other("no stdin pipe"))?;
        let mut stdout = child.stdout.take().ok_or_else(|| std::io::Error::other("no stdout pipe"))?;
        tokio::spawn(body.copy_to(stdin));
        let (status, headers, rest) = cgi_head(&mut stdout).await?;
        let mut response = http::Response::new(stream_body(rest, stdout, child, permit));
        *response.status_mut() = status;
        for (name, value) in headers {
            if let (Ok(name), Ok(value)) = (http::HeaderName::try_from(name), http::HeaderValue::try_from(value)) {
                response.headers_mut().append(name, value);
            }
        }
        Ok(response)
    }
}

/// A request body read in frames: first up to a push's flush packet, then copied on.
struct BodyReader {
    body: Incoming,
    buffered: Vec<u8>,
    done: bool,
}

impl BodyReader {
    async fn next(&mut self) -> Option<Bytes> {
        while !self.done {
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Some(data);
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "reading a git request body");
                    self.done = true;
                }
                None => self.done = true,
            }
        }
        None
    }

    /// The push's ref updates, read into `buffered`.
    async fn commands(&mut self) -> Result<Vec<RefUpdate>, String> {
        loop {
            if let Some((updates, _)) = parse_commands(&self.buffered)? {
                if updates.is_empty() {
                    return Err("the push names no ref".into());
                }
                return Ok(updates);
            }
            if self.buffered.len() > MAX_COMMANDS_BYTES {
                return Err("the push names too many refs".into());
            }
            match self.next().await {
                Some(data) => self.buffered.extend_from_slice(&data),
                None => return Err("the push's body ended before its ref updates did".into()),
            }
        }
    }

    /// Writes what was read and the rest of the body to git.
    async fn copy_to(mut self, mut stdin: ChildStdin) {
        let buffered = std::mem::take(&mut self.buffered);
        if stdin.write_all(&buffered).await.is_err() {
            return;
        }
        while let Some(data) = self.next().await {
            if stdin.write_all(&data).await.is_err() {
                return;
            }
        }
    }
}

/// Reads the CGI head: the status, the headers, and whatever of the body came with them.
async fn cgi_head(stdout: &mut ChildStdout) -> std::io::Result<(http::StatusCode, Vec<(String, String)>, Vec<u8>)> {
    let mut head = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(end) = find_blank_line(&head) {
            break end;
        }
        if head.len() > 64 * 1024 {
            return Err(std::io::Error::other("the backend's headers are too long"));
        }
        let n = stdout.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::other("the backend ended before its headers"));
        }
        head.extend_from_slice(&chunk[..n]);
    };
    let (lines, rest) = (String::from_utf8_lossy(&head[..end.0]).into_owned(), head[end.1..].to_vec());
    let mut status = http::StatusCode::OK;
    let mut headers = Vec::new();
    for line in lines.lines() {
        let Some((name, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next().and_then(|c| c.parse::<u16>().ok());
            status = code.and_then(|c| http::StatusCode::from_u16(c).ok()).unwrap_or(http::StatusCode::BAD_GATEWAY);
        } else {
            headers.push((name.trim().to_owned(), value.to_owned()));
        }
    }
    Ok((status, headers, rest))
}

/// Where the CGI head ends: the end of the header lines and the start of the body.
fn find_blank_line(head: &[u8]) -> Option<(usize, usize)> {
    let crlf = head.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, i + 4));
    let lf = head.windows(2).position(|w| w == b"\n\n").map(|i| (i, i + 2));
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(if a.0 < b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// The backend's body after its head, streamed; the child and the backend's slot live as
/// long as the stream.
fn stream_body(
    first: Vec<u8>,
    stdout: ChildStdout,
    child: tokio::process::Child,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Body {
    let state = (Some(first), stdout, child, permit);
    let stream = futures_util::stream::unfold(state, |(first, mut stdout, child, permit)| async move {
        if let Some(first) = first.filter(|f| !f.is_empty()) {
            return Some((Ok(Frame::data(Bytes::from(first))), (None, stdout, child, permit)));
        }
        let mut chunk = vec![0u8; 64 * 1024];
        match stdout.read(&mut chunk).await {
            Ok(0) => None,
            Ok(n) => {
                chunk.truncate(n);
                Some((Ok(Frame::data(Bytes::from(chunk))), (None, stdout, child, permit)))
            }
            Err(e) => Some((Err(e), (None, stdout, child, permit))),
        }
    });
    StreamBody::new(stream).boxed()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    fn pkt(line: &str) -> String {
        format!("{:04x}{line}", line.len() + 4)
    }

    #[test]
    fn a_push_names_its_ref_updates_before_its_pack() {
        let (old, new) = ("0".repeat(40), "a".repeat(40));
        let body = format!(
            "{}{}0000PACK...",
            pkt(&format!("{old} {new} refs/canopy/agents/alice\0report-status side-band-64k\n")),
            pkt(&format!("{new} {old} refs/heads/main\n")),
        );
        let (updates, end) = parse_commands(body.as_bytes()).unwrap().unwrap();
        assert_eq!(updates.len(), 2);
        assert_eq!(updates[0].name, "refs/canopy/agents/alice");
        assert!(!updates[0].deletes());
        assert!(updates[1].deletes());
        assert_eq!(&body[end..], "PACK...");
        assert_eq!(parse_commands(&body.as_bytes()[..10]).unwrap(), None, "an incomplete head waits for more");
        assert!(parse_commands(b"zzzz").is_err());
        assert!(parse_commands(pkt("shallow abc").as_bytes()).is_err());
        assert!(parse_commands(pkt("not an update").as_bytes()).is_err());
        let sneaky = format!("{old} {new} refs/canopy/agents/alice\u{a0}\n");
        assert!(parse_commands(pkt(&sneaky).as_bytes()).is_err(), "a name git would write differently");
        assert!(parse_commands(pkt(&format!("{old} {new} HEAD\n")).as_bytes()).is_err());
    }

    #[test]
    fn only_the_smart_protocol_paths_are_served() {
        let get = http::Method::GET;
        let post = http::Method::POST;
        assert_eq!(
            route(&get, "/r.git/info/refs", "service=git-upload-pack"),
            Some(("r".into(), Service::Upload, true))
        );
        assert_eq!(route(&post, "/r.git/git-receive-pack", ""), Some(("r".into(), Service::Receive, false)));
        assert_eq!(route(&get, "/r.git/info/refs", ""), None, "the dumb protocol");
        assert_eq!(route(&get, "/r.git/HEAD", ""), None);
        assert_eq!(route(&get, "/../x.git/info/refs", "service=git-upload-pack"), None);
        assert_eq!(route(&post, "/a/b.git/git-upload-pack", ""), None);
        assert_eq!(route(&get, "/r.git/git-upload-pack", ""), None);
    }

    #[test]
    fn a_basic_login_reads_back() {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::AUTHORIZATION, basic_header("box1", "cnr_x:y").parse().unwrap());
        assert_eq!(basic_login(&headers), Some(("box1".into(), "cnr_x:y".into())));
        headers.insert(http::header::AUTHORIZATION, "Bearer x".parse().unwrap());
        assert_eq!(basic_login(&headers), None);
    }
}
