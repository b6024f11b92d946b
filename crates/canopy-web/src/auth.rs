//! Who is logged in to the console: one-time login links and browser sessions.
//!
//! `canopy web` presents an operator token to `POST /link`; the console asks the API who the
//! token belongs to (`whoami`) and, for an operator only, mints a link secret good once for
//! `[web] link_ttl`. Opening the link exchanges the secret for a session: a random id in an
//! HttpOnly, SameSite=Strict cookie, with a CSRF token for the page. The server keeps the
//! operator's token beside the session (in memory and in `web/sessions.json`, 0600, keyed by
//! the SHA-256 of the session id, so a daemon restart does not log the browser out); it is
//! never put in a URL or a page. This module decides nothing about what an operator may do.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A logged-in browser: the operator's token (presented on every API call) and its page's
/// CSRF token.
#[derive(Clone, Serialize, Deserialize)]
pub struct Session {
    pub token: String,
    pub csrf: String,
    pub operator: String,
    pub expires_ms: i64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("operator", &self.operator).field("expires_ms", &self.expires_ms).finish()
    }
}

/// A link not yet opened.
struct Link {
    token: String,
    operator: String,
    expires_ms: i64,
}

/// Links and sessions, behind one lock (the console is an operator's, not a crowd's).
pub struct Auth {
    file: PathBuf,
    session_ttl_ms: i64,
    link_ttl_ms: i64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    links: HashMap<String, Link>,
    sessions: HashMap<String, Session>,
}

/// SHA-256 of `secret`, in hex.
pub(crate) fn digest(secret: &str) -> String {
    let hash = Sha256::digest(secret.as_bytes());
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// Equal strings, in time that does not depend on where they differ.
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Auth {
    /// Loads the sessions `file` holds, dropping expired ones.
    pub fn load(file: PathBuf, session_ttl_ms: i64, link_ttl_ms: i64) -> Auth {
        let now = canopy_sys::unix_ms();
        let sessions: HashMap<String, Session> =
            std::fs::read_to_string(&file).ok().and_then(|text| serde_json::from_str(&text).ok()).unwrap_or_default();
        let sessions = sessions.into_iter().filter(|(_, s)| s.expires_ms > now).collect();
        Auth { file, session_ttl_ms, link_ttl_ms, state: Mutex::new(State { links: HashMap::new(), sessions }) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new link secret for an operator the API has vouched for.
    pub fn mint_link(&self, token: &str, operator: &str) -> std::io::Result<String> {
        let secret = canopy_sys::random_hex(24)?;
        let now = canopy_sys::unix_ms();
        let mut state = self.state();
        state.links.retain(|_, l| l.expires_ms > now);
        let link = Link {
            token: token.to_owned(),
            operator: operator.to_owned(),
            expires_ms: now.saturating_add(self.link_ttl_ms),
        };
        state.links.insert(digest(&secret), link);
        Ok(secret)
    }

    /// Exchanges a link secret (once) for a session id.
    pub fn open_link(&self, secret: &str) -> Option<std::io::Result<String>> {
        let now = canopy_sys::unix_ms();
        let link = {
            let mut state = self.state();
            state.links.remove(&digest(secret)).filter(|l| l.expires_ms > now)?
        };
        Some(self.new_session(link.token, link.operator))
    }

    fn new_session(&self, token: String, operator: String) -> std::io::Result<String> {
        let id = canopy_sys::random_hex(32)?;
        let csrf = canopy_sys::random_hex(24)?;
        let expires_ms = canopy_sys::unix_ms().saturating_add(self.session_ttl_ms);
        let session = Session { token, csrf, operator, expires_ms };
        let mut state = self.state();
        state.sessions.insert(digest(&id), session);
        // A session the file does not hold is not handed out (no cookie without it on disk).
        if let Err(e) = self.persist(&state) {
            state.sessions.remove(&digest(&id));
            return Err(e);
        }
        Ok(id)
    }

    /// The live session a cookie's id names.
    pub fn session(&self, id: &str) -> Option<Session> {
        let now = canopy_sys::unix_ms();
        let state = self.state();
        state.sessions.get(&digest(id)).filter(|s| s.expires_ms > now).cloned()
    }

    /// Ends every session that holds `token` (its operator was revoked).
    pub fn end_token(&self, token: &str) {
        let mut state = self.state();
        let before = state.sessions.len();
        state.sessions.retain(|_, s| !same(&s.token, token));
        state.links.retain(|_, l| !same(&l.token, token));
        if state.sessions.len() != before
            && let Err(e) = self.persist(&state)
        {
            tracing::warn!(error = %e, file = %self.file.display(), "saving the console's sessions");
        }
    }

    /// Ends a session (logout).
    pub fn end(&self, id: &str) {
        let mut state = self.state();
        if state.sessions.remove(&digest(id)).is_some()
            && let Err(e) = self.persist(&state)
        {
            tracing::warn!(error = %e, file = %self.file.display(), "saving the console's sessions");
        }
    }

    fn persist(&self, state: &State) -> std::io::Result<()> {
        let now = canopy_sys::unix_ms();
        let live: HashMap<&String, &Session> = state.sessions.iter().filter(|(_, s)| s.expires_ms > now).collect();
        let text = serde_json::to_string(&live).map_err(std::io::Error::other)?;
        write_private(&self.file, &text)
    }
}

/// Failed logins an address may make in `LOGIN_WINDOW_MS` before every login from it is refused
/// until the window passes.
pub const LOGIN_FAILURES: u32 = 5;
/// The window failed logins are counted in.
pub const LOGIN_WINDOW_MS: i64 = 60_000;
/// Addresses tracked at most; the oldest windows are forgotten first.
const TRACKED: usize = 4096;

/// Failed logins per peer address (a link secret that opens nothing, a token `POST /link`
/// refused). A link secret has 192 random bits, so this guards the log and the API from a
/// flood more than the secret from a guess.
#[derive(Default)]
pub struct Limiter {
    state: Mutex<HashMap<std::net::IpAddr, Window>>,
}

#[derive(Clone, Copy)]
struct Window {
    start_ms: i64,
    failures: u32,
    /// The refusal of this window was audited already.
    told: bool,
}

/// What the limiter says of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Go ahead.
    Allowed,
    /// Refused; the first refusal of the window (audit it).
    Limited { first: bool },
}

impl Limiter {
    fn state(&self) -> std::sync::MutexGuard<'_, HashMap<std::net::IpAddr, Window>> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `ip` may try to log in now. An allowed attempt counts as a failure from the
    /// start (so attempts made at once cannot all pass before the first fails) until
    /// `succeeded` forgives it.
    pub fn attempt(&self, ip: std::net::IpAddr) -> Attempt {
        let ip = block(ip);
        let now = canopy_sys::unix_ms();
        {
            let mut state = self.state();
            if let Some(w) = state.get_mut(&ip)
                && now - w.start_ms < LOGIN_WINDOW_MS
                && w.failures >= LOGIN_FAILURES
            {
                let first = !w.told;
                w.told = true;
                return Attempt::Limited { first };
            }
        }
        self.count(ip, now);
        Attempt::Allowed
    }

    /// An allowed attempt that logged in: it is not a failure after all.
    pub fn succeeded(&self, ip: std::net::IpAddr) {
        if let Some(w) = self.state().get_mut(&block(ip)) {
            w.failures = w.failures.saturating_sub(1);
        }
    }

    fn count(&self, ip: std::net::IpAddr, now: i64) {
        let mut state = self.state();
        if state.len() >= TRACKED && !state.contains_key(&ip) {
            state.retain(|_, w| now - w.start_ms < LOGIN_WINDOW_MS);
            if state.len() >= TRACKED
                && let Some(oldest) = state.iter().min_by_key(|(_, w)| w.start_ms).map(|(ip, _)| *ip)
            {
                state.remove(&oldest);
            }
        }
        let window = state.entry(ip).or_insert(Window { start_ms: now, failures: 0, told: false });
        if now - window.start_ms >= LOGIN_WINDOW_MS {
            *window = Window { start_ms: now, failures: 0, told: false };
        }
        window.failures += 1;
    }
}

/// The address failures are counted against: an IPv4 address, or an IPv6 address's /64 (one
/// host holds a whole /64, so its addresses are one peer).
fn block(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            std::net::IpAddr::V6(bits.into())
        }
        std::net::IpAddr::V6(v6) => {
            std::net::IpAddr::V4(v6.to_ipv4_mapped().unwrap_or(std::net::Ipv4Addr::UNSPECIFIED))
        }
        v4 => v4,
    }
}

/// Writes `text` to `path` (0600, atomically) in a directory made when missing.
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    canopy_sys::write_private(path, text.as_bytes())
}

/// The value of cookie `name` in a `Cookie` header.
pub fn cookie<'a>(headers: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    headers.get_all(http::header::COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(|line| {
        line.split(';').filter_map(|pair| pair.trim().split_once('=')).find(|(k, _)| *k == name).map(|(_, v)| v)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    #[test]
    fn a_link_opens_once_and_its_session_survives_a_reload_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sessions.json");
        let auth = Auth::load(file.clone(), 60_000, 60_000);
        let secret = auth.mint_link("tok", "admin").unwrap();
        let id = auth.open_link(&secret).unwrap().unwrap();
        assert!(auth.open_link(&secret).is_none(), "a link is good once");
        assert_eq!(auth.session(&id).unwrap().token, "tok");
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains(&id), "the file keys sessions by digest, not by id");
        let again = Auth::load(file.clone(), 60_000, 60_000);
        assert_eq!(again.session(&id).unwrap().operator, "admin");
        again.end(&id);
        assert!(Auth::load(file, 60_000, 60_000).session(&id).is_none(), "logout is durable");
    }

    #[test]
    fn expired_links_and_sessions_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let auth = Auth::load(dir.path().join("s.json"), -1, -1);
        let secret = auth.mint_link("tok", "admin").unwrap();
        assert!(auth.open_link(&secret).is_none());
        let live = Auth::load(dir.path().join("t.json"), -1, 60_000);
        let id = live.open_link(&live.mint_link("tok", "admin").unwrap()).unwrap().unwrap();
        assert!(live.session(&id).is_none());
    }

    #[test]
    fn an_address_is_refused_after_its_failed_logins_until_the_window_passes() {
        let limiter = Limiter::default();
        let (a, b) = ("127.0.0.2".parse().unwrap(), "127.0.0.3".parse().unwrap());
        // A good login is forgiven; five attempts that fail, made at once, use up the window.
        assert_eq!(limiter.attempt(a), Attempt::Allowed);
        limiter.succeeded(a);
        for _ in 0..LOGIN_FAILURES {
            assert_eq!(limiter.attempt(a), Attempt::Allowed);
        }
        assert_eq!(limiter.attempt(a), Attempt::Limited { first: true });
        assert_eq!(limiter.attempt(a), Attempt::Limited { first: false });
        assert_eq!(limiter.attempt(b), Attempt::Allowed, "another address is not held");
        // One host's IPv6 addresses are one peer.
        let v6 = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
        for _ in 0..LOGIN_FAILURES {
            limiter.attempt(v6("2001:db8::1"));
        }
        assert_eq!(limiter.attempt(v6("2001:db8::ffff")), Attempt::Limited { first: true });
        assert_eq!(limiter.attempt(v6("2001:db8:0:1::1")), Attempt::Allowed, "another /64 is another peer");
        // The window passed: allowed again.
        limiter.state().get_mut(&a).unwrap().start_ms -= LOGIN_WINDOW_MS;
        assert_eq!(limiter.attempt(a), Attempt::Allowed);
    }

    #[test]
    fn a_revoked_tokens_sessions_all_end() {
        let dir = tempfile::tempdir().unwrap();
        let auth = Auth::load(dir.path().join("s.json"), 60_000, 60_000);
        let one = auth.open_link(&auth.mint_link("tok", "admin").unwrap()).unwrap().unwrap();
        let two = auth.open_link(&auth.mint_link("tok", "admin").unwrap()).unwrap().unwrap();
        let other = auth.open_link(&auth.mint_link("other", "ops").unwrap()).unwrap().unwrap();
        auth.end_token("tok");
        assert!(auth.session(&one).is_none() && auth.session(&two).is_none());
        assert!(auth.session(&other).is_some());
    }

    #[test]
    fn cookies_are_found_by_name() {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::COOKIE, "a=1; canopy_session=abc; b=2".parse().unwrap());
        assert_eq!(cookie(&headers, "canopy_session"), Some("abc"));
        assert_eq!(cookie(&headers, "c"), None);
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }
}
