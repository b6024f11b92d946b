//! Who is calling: `Auth` resolves a request's bearer token to its caller (an operator's, a
//! live session's, cached until a credential changes) or to its runner; and tokens themselves:
//! generation, hashing, the private files that hold them.
//!
//! The store keeps only a SHA-256 of each token; the token itself lives in a 0600 file (the
//! operator's) or is derived for a session at its start. Does not decide what a caller may do
//! (the method table's access, the per-role tool check in `prompts`, the store's rules).

use std::path::Path;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use canopy_core::acl::Caller;
use canopy_core::{Error, RunnerId};
use canopy_store::{Store, ops};
use dashmap::DashMap;
use sha2::{Digest, Sha256};

/// Most session tokens kept resolved at once (a workspace runs far fewer live sessions).
const SESSION_TOKENS_CACHED: usize = 100_000;

/// The daemon's credentials for runners and sessions.
pub struct Secrets {
    /// Runner token hash -> the runner it belongs to (replaced when credentials change).
    pub runners: RwLock<HashMap<String, RunnerId>>,
    /// Secret from which session tokens are derived.
    pub session_secret: String,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secrets { .. }")
    }
}

/// Resolves tokens to callers. Cheap to clone.
#[derive(Clone)]
pub struct Auth {
    store: Store,
    pub(crate) secrets: Arc<Secrets>,
    /// Operator token hash -> caller. Operator tokens never change while the daemon runs,
    /// so they are resolved once.
    operators: Arc<OperatorTokens>,
    /// Session token hash -> (caller, the store's credential epoch it was resolved in). A
    /// session token dies with its session, so an entry holds only while no commit since has
    /// changed a session or an account (`Store::credential_epoch`).
    session_tokens: Arc<DashMap<String, (Caller, u64)>>,
    /// Moves at every revocation: a lookup that began before one does not fill the cache.
    revocations: Arc<AtomicU64>,
}

impl Auth {
    pub fn new(store: Store, secrets: Arc<Secrets>) -> Self {
        Auth { store, secrets, operators: Arc::default(), session_tokens: Arc::default(), revocations: Arc::default() }
    }

    /// The caller a request's token belongs to.
    pub async fn authenticate(&self, token: Option<&str>) -> Result<Caller, Error> {
        let token = token.ok_or_else(|| Error::Unauthenticated("the request has no Canopy-Token header".into()))?;
        let hash = token_hash(token);
        if let Some(caller) = self.operators.find(&hash) {
            return Ok(caller);
        }
        let credentials = self.store.credential_epoch();
        if let Some(hit) = self.session_tokens.get(&hash)
            && hit.1 == credentials
        {
            return Ok(hit.0.clone());
        }
        let key = hash.clone();
        let epoch = self.revocations.load(Ordering::SeqCst);
        let resolved = self.store.read(move |conn| ops::resolve_token(conn, &key)).await?;
        let Some(caller) = resolved else {
            self.session_tokens.remove(&hash);
            return Err(Error::Unauthenticated("the token is not known to this workspace".into()));
        };
        if caller.kind == canopy_core::AccountKind::Agent {
            // Kept only if no session or account changed while it was read.
            if self.store.credential_epoch() == credentials {
                if self.session_tokens.len() >= SESSION_TOKENS_CACHED {
                    self.session_tokens.clear();
                }
                self.session_tokens.insert(hash, (caller.clone(), credentials));
            }
            return Ok(caller);
        }
        if caller.is_operator() {
            self.operators.insert(hash.clone(), caller.clone());
            // A revocation that landed meanwhile may have read the cache before this entry.
            if self.revocations.load(Ordering::SeqCst) != epoch {
                self.operators.remove(&hash);
            }
        }
        Ok(caller)
    }

    /// The runner a runner token belongs to.
    pub fn authenticate_runner(&self, token: Option<&str>) -> Result<RunnerId, Error> {
        let Some(token) = token else {
            return Err(Error::Unauthenticated("the request has no Canopy-Token header".into()));
        };
        let hash = token_hash(token);
        let runners = self.secrets.runners.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        runners.get(&hash).cloned().ok_or_else(|| Error::Unauthenticated("this method needs a runner's token".into()))
    }

    /// Forgets a revoked operator, so its very next request fails.
    pub fn revoke_operator(&self, handle: &canopy_core::Handle) {
        self.revocations.fetch_add(1, Ordering::SeqCst);
        self.operators.forget(handle);
    }

    /// The token a session of `agent` in `incarnation` is given.
    pub fn session_token(&self, agent: &str, incarnation: canopy_core::Incarnation) -> String {
        session_token(&self.secrets.session_secret, agent, incarnation)
    }
}

/// The operators' resolved tokens (digest and caller). A handful, so they are kept in one
/// list and compared one by one in constant time, without a hash lookup whose timing
/// depends on the digest; every request that carries a token reads it.
#[derive(Default)]
pub struct OperatorTokens(std::sync::RwLock<Vec<(String, canopy_core::acl::Caller)>>);

impl std::fmt::Debug for OperatorTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.0.read().map(|t| t.len()).unwrap_or_default();
        f.debug_struct("OperatorTokens").field("count", &count).finish_non_exhaustive()
    }
}

impl OperatorTokens {
    /// The operator whose token has this digest.
    pub fn find(&self, digest: &str) -> Option<canopy_core::acl::Caller> {
        let tokens = self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut found = None;
        for (known, caller) in tokens.iter() {
            if same_digest(known, digest) {
                found = Some(caller.clone());
            }
        }
        found
    }

    pub fn insert(&self, digest: String, caller: canopy_core::acl::Caller) {
        let mut tokens = self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        tokens.retain(|(known, _)| *known != digest);
        tokens.push((digest, caller));
    }

    pub fn remove(&self, digest: &str) {
        self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|(known, _)| known != digest);
    }

    /// Forgets every token of the operator `handle`.
    pub fn forget(&self, handle: &canopy_core::Handle) {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|(_, caller)| caller.handle != *handle);
    }
}

/// A fresh random token: `cnp_` and 64 hex digits (256 bits).
pub fn new_token() -> std::io::Result<String> {
    Ok(format!("cnp_{}", random_hex(32)?))
}

/// `n` random bytes as lowercase hex.
pub fn random_hex(n: usize) -> std::io::Result<String> {
    canopy_sys::random_hex(n)
}

/// The hash the store keeps for a token.
pub fn token_hash(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

/// Whether two token digests are equal, in time that does not depend on where they differ.
pub fn same_digest(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// Reads a secret file, creating it (mode 0600, 256 random bits) when it does not exist.
pub fn load_or_create(path: &Path, prefix: &str) -> std::io::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) if !text.trim().is_empty() => return Ok(text.trim().to_owned()),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let secret = format!("{prefix}{}", random_hex(32)?);
    write_private(path, &format!("{secret}\n"))?;
    Ok(secret)
}

/// The bearer token of one session: derived from the daemon's secret, so it can be handed
/// to a runner again after a lost reply without storing it; only its hash is stored.
pub fn session_token(secret: &str, agent: &str, incarnation: canopy_core::Incarnation) -> String {
    format!("cns_{}", hex(&Sha256::digest(format!("{secret}:{agent}:{incarnation}").as_bytes())))
}

/// Writes `text` to `path` atomically, readable by its owner only.
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    canopy_sys::write_private(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_hashes_stable() {
        let a = new_token().unwrap_or_default();
        let b = new_token().unwrap_or_default();
        assert_ne!(a, b);
        assert_eq!(a.len(), 4 + 64);
        assert_eq!(token_hash("x"), token_hash("x"));
        assert_eq!(token_hash("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
