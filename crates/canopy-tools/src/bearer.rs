//! The bearer token of an HTTP request, read the one way the endpoint (`http`) and the tool
//! calls (`server`) both read it.
//!
//! Below both, so neither imports the other. Does not decide whether a token is known:
//! the endpoint's `TokenCheck` does, and the daemon decides who it is.

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}
