//! The reply envelope, the wire error, and strict request decoding.
//!
//! A reply is `{"ok": <response>}` or `{"error": {"code", "message", "field"}}`. Owns how a
//! domain `Error` becomes a `WireError` and how a malformed payload becomes an
//! `invalid_argument` naming the field serde complained about.

use canopy_core::{Error, ErrorCode};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A refusal on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
    /// The request field at fault, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl From<&Error> for WireError {
    fn from(err: &Error) -> WireError {
        WireError { code: err.code(), message: err.to_string(), field: err.field().map(str::to_owned) }
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for WireError {}

/// Every reply the daemon sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply<T> {
    Ok(T),
    Error(WireError),
}

impl<T> Reply<T> {
    pub fn into_result(self) -> Result<T, WireError> {
        match self {
            Reply::Ok(value) => Ok(value),
            Reply::Error(err) => Err(err),
        }
    }
}

/// Decodes a request payload strictly: a JSON object without unknown fields. An empty
/// payload is read as `{}`.
pub fn decode_request<T: DeserializeOwned>(payload: &[u8]) -> Result<T, Error> {
    let payload: &[u8] = if payload.iter().all(u8::is_ascii_whitespace) { b"{}" } else { payload };
    // serde would also read a struct from a JSON array; the contract says object.
    if payload.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(Error::Malformed { field: None, reason: "the payload must be a JSON object".into() });
    }
    serde_json::from_slice(payload).map_err(|err| {
        let reason = err.to_string();
        Error::Malformed { field: quoted_field(&reason), reason }
    })
}

/// serde_json names the field in backquotes for unknown, missing and duplicate fields.
fn quoted_field(text: &str) -> Option<String> {
    if !text.contains(" field `") {
        return None;
    }
    let start = text.find('`')? + 1;
    let len = text[start..].find('`')?;
    Some(text[start..start + len].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PostRequest, WhoamiRequest};

    #[test]
    fn malformed_payloads_are_invalid_arguments() {
        for bad in [
            &b"not json"[..],
            b"[]",
            b"{\"channel\":1}",
            b"\xff\xfe",
            b"{\"channel\":\"a\",\"topic\":\"t\",\"body\":\"b\",\"extra\":1}",
        ] {
            let err = decode_request::<PostRequest>(bad).err().map(|e| e.code());
            assert_eq!(err, Some(ErrorCode::InvalidArgument), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(decode_request::<WhoamiRequest>(b"[]").is_err(), "arrays are not objects");
        assert!(decode_request::<WhoamiRequest>(b"").is_ok(), "an empty payload reads as {{}}");
        let err = decode_request::<PostRequest>(b"{\"topic\":\"t\",\"body\":\"b\"}").err();
        assert_eq!(err.as_ref().and_then(Error::field), Some("channel"));
        let err =
            decode_request::<PostRequest>(b"{\"channel\":\"a\",\"topic\":\"t\",\"body\":\"b\",\"extra\":1}").err();
        assert_eq!(err.as_ref().and_then(Error::field), Some("extra"));
    }

    #[test]
    fn replies_are_externally_tagged() {
        let ok: Reply<u32> = Reply::Ok(7);
        assert_eq!(serde_json::to_string(&ok).ok().as_deref(), Some(r#"{"ok":7}"#));
    }
}
