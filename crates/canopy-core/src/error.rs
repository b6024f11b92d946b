//! The domain error: every refusal Canopy can give, with its stable wire code and field.
//!
//! Owns the mapping from a refusal to `ErrorCode` and to the request field at fault, so
//! the store, the daemon and the CLI agree on it, and `NameError`, why a name was refused
//! (raised by `names`, wrapped here as `Error::InvalidName`). Does not format wire replies;
//! the proto crate wraps these values.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Why a name was refused. The caller adds which field it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    #[error("must not be empty")]
    Empty,
    #[error("is {len} long; the limit is {max}")]
    TooLong { len: usize, max: usize },
    #[error("{value:?} does not match the grammar: {grammar}")]
    Grammar { value: String, grammar: &'static str },
    #[error("{value:?} is reserved")]
    Reserved { value: String },
}

/// The stable error codes on the wire. Scripts branch on these; never rename one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    NotFound,
    Forbidden,
    InvalidArgument,
    Conflict,
    LimitExceeded,
    Unavailable,
    /// A fault inside Canopy (a storage error); the request may be retried.
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "not_found",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::Conflict => "conflict",
            ErrorCode::LimitExceeded => "limit_exceeded",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every refusal, carrying the names a human needs to act on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{field} {source}")]
    InvalidName { field: &'static str, source: NameError },
    #[error("{field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error("malformed request: {reason}")]
    Malformed { field: Option<String>, reason: String },
    #[error("{field} is {len} bytes; the limit is {max}")]
    TooLarge { field: &'static str, len: usize, max: usize },
    #[error("agent {handle} not found{}", did_you_mean(.nearest, ""))]
    AgentNotFound { field: &'static str, handle: String, nearest: Option<String> },
    #[error("channel #{channel} not found{}", did_you_mean(.nearest, "#"))]
    ChannelNotFound { field: &'static str, channel: String, nearest: Option<String> },
    #[error("topic {topic:?} not found in #{channel}; pass create_topic (`--create-topic` on the command line) to start it (existing topics: {})", existing_list(.existing))]
    TopicNotFound { channel: String, topic: String, existing: Vec<String> },
    #[error("unknown method {method:?}")]
    UnknownMethod { method: String },
    /// Something else that does not exist (a pin, say), named.
    #[error("{what} not found")]
    NotFound { field: &'static str, what: String },
    #[error("{action}: {reason}")]
    Forbidden { action: String, reason: String },
    #[error("{what} already exists")]
    AlreadyExists { field: &'static str, what: String },
    #[error("{0}")]
    Conflict(String),
    #[error("{field}: {reason}")]
    ConflictOn { field: &'static str, reason: String },
    #[error("{0}")]
    LimitExceeded(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
    #[error("authentication failed: {0}")]
    Unauthenticated(String),
}

fn did_you_mean(nearest: &Option<String>, sigil: &str) -> String {
    nearest.as_ref().map(|n| format!("; did you mean {sigil}{n}?")).unwrap_or_default()
}

fn existing_list(existing: &[String]) -> String {
    if existing.is_empty() {
        "none".to_owned()
    } else {
        existing.iter().map(|t| format!("{t:?}")).collect::<Vec<_>>().join(", ")
    }
}

impl Error {
    /// The stable code scripts branch on.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::InvalidName { .. } | Error::InvalidArgument { .. } | Error::Malformed { .. } => {
                ErrorCode::InvalidArgument
            }
            Error::TooLarge { .. } => ErrorCode::LimitExceeded,
            Error::AgentNotFound { .. }
            | Error::ChannelNotFound { .. }
            | Error::TopicNotFound { .. }
            | Error::UnknownMethod { .. }
            | Error::NotFound { .. } => ErrorCode::NotFound,
            Error::Forbidden { .. } | Error::Unauthenticated(_) => ErrorCode::Forbidden,
            Error::AlreadyExists { .. } | Error::Conflict(_) | Error::ConflictOn { .. } => ErrorCode::Conflict,
            Error::LimitExceeded(_) => ErrorCode::LimitExceeded,
            Error::Unavailable(_) => ErrorCode::Unavailable,
            Error::Internal(_) => ErrorCode::Internal,
        }
    }

    /// The request field at fault, when one is.
    pub fn field(&self) -> Option<&str> {
        match self {
            Error::InvalidName { field, .. }
            | Error::InvalidArgument { field, .. }
            | Error::TooLarge { field, .. }
            | Error::AgentNotFound { field, .. }
            | Error::ChannelNotFound { field, .. }
            | Error::NotFound { field, .. }
            | Error::AlreadyExists { field, .. }
            | Error::ConflictOn { field, .. } => Some(field),
            Error::TopicNotFound { .. } => Some("topic"),
            Error::Malformed { field, .. } => field.as_deref(),
            _ => None,
        }
    }

    /// Shorthand for a name that failed its grammar.
    pub fn name(field: &'static str, source: NameError) -> Error {
        Error::InvalidName { field, source }
    }

    /// Shorthand for an argument that is wrong for a reason other than its grammar.
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidArgument { field, reason: reason.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_not_found_lists_existing_topics() {
        let err = Error::TopicNotFound {
            channel: "ops".into(),
            topic: "new".into(),
            existing: vec!["a".into(), "b c".into()],
        };
        assert_eq!(err.code(), ErrorCode::NotFound);
        assert_eq!(err.field(), Some("topic"));
        assert!(err.to_string().contains("\"a\", \"b c\""), "{err}");
    }
}
