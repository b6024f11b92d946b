//! Bearer tokens: generation, hashing, and the private files that hold them.
//!
//! The store keeps only a SHA-256 of each token; the token itself lives in a 0600 file
//! (the operator's) or is handed to a session at start (later issues).

use std::path::Path;

use sha2::{Digest, Sha256};

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
