//! What every area checks and answers at the edge: the limits on free text, the page limit,
//! display names, the runner's own-identity check, and the reply encoders (`ok`, `refusal`,
//! `encode`). Holds no state and calls no service.

use bytes::Bytes;
use canopy_core::Error;
use canopy_proto::Reply;
use canopy_proto::api::*;
use serde::Serialize;

/// Longest display name, in bytes.
pub const MAX_DISPLAY_NAME: usize = 128;
/// Longest charter, in bytes.
pub const MAX_CHARTER: usize = 8192;
/// Longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 128;

/// A runner acts only as itself: the runner id a request names must be its token's.
pub fn as_runner(runner: &canopy_core::RunnerId, claimed: &canopy_core::RunnerId) -> Result<(), Error> {
    if runner == claimed {
        Ok(())
    } else {
        Err(Error::Forbidden {
            action: format!("act as runner {claimed}"),
            reason: format!("the request's token is runner {runner}'s"),
        })
    }
}

pub(crate) fn page_limit(limit: Option<u32>) -> Result<u32, Error> {
    match limit.unwrap_or(DEFAULT_READ_LIMIT) {
        0 => Err(Error::invalid("limit", "must be at least 1")),
        n if n > MAX_READ_LIMIT => {
            Err(Error::invalid("limit", format!("{n} is above the maximum of {MAX_READ_LIMIT}")))
        }
        n => Ok(n),
    }
}

pub(crate) fn display_name(name: &str) -> Result<String, Error> {
    if name.trim().is_empty() || name.trim() != name || name.chars().any(char::is_control) {
        return Err(Error::invalid("name", "a display name is one line of text without surrounding whitespace"));
    }
    bounded_text("name", name.to_owned(), MAX_DISPLAY_NAME)
}

pub(crate) fn bounded_text(field: &'static str, text: String, max: usize) -> Result<String, Error> {
    if text.len() > max {
        return Err(Error::TooLarge { field, len: text.len(), max });
    }
    Ok(text)
}

pub(crate) fn ok<T: Serialize>(value: T) -> Result<Bytes, Error> {
    Ok(encode(&Reply::Ok(value)))
}

/// The reply payload refusing a request with `error`.
pub(crate) fn refusal(error: &Error) -> Bytes {
    encode(&Reply::<()>::Error(canopy_proto::WireError::from(error)))
}

/// Serialises a value the daemon built. These types always serialise; the fallback
/// keeps the daemon answering even if one day one does not.
pub(crate) fn encode<T: Serialize>(value: &T) -> Bytes {
    match serde_json::to_vec(value) {
        Ok(bytes) => Bytes::from(bytes),
        Err(e) => Bytes::from(format!(
            r#"{{"error":{{"code":"internal","message":"encoding the reply failed: {}"}}}}"#,
            e.to_string().replace(['"', '\\'], "'")
        )),
    }
}

/// Checks an idempotency key: 1 to `MAX_IDEMPOTENCY_KEY` printable ASCII characters.
pub(crate) fn idempotency_key(key: Option<&str>) -> Result<(), Error> {
    match key {
        Some(key)
            if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY || !key.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            Err(Error::invalid(
                "idempotency_key",
                format!("must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters without spaces"),
            ))
        }
        _ => Ok(()),
    }
}
