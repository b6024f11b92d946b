//! Typed ids for the values that cross the wire: a message's `Seq`, a session's
//! `Incarnation` and a runner's `RunnerId`. An agent's id on the wire is its `Handle`
//! (`names`); the store's numeric row ids never leave the store.
//!
//! Each is transparent on the wire (a number or a string, exactly as before), so the types
//! rename nothing in the JSON; what they buy is that a sequence cannot be passed where an
//! incarnation is meant, and that a runner id is parsed once, at the edge, into a token that
//! is safe inside a NATS subject. Does not know whether an id exists.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::names::NameError;

macro_rules! number_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
            schemars::JsonSchema,
        )]
        #[serde(transparent)]
        pub struct $name(pub u64);

        impl $name {
            /// The number itself.
            pub const fn get(self) -> u64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl From<u64> for $name {
            fn from(value: u64) -> Self {
                $name(value)
            }
        }

        impl FromStr for $name {
            type Err = std::num::ParseIntError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                s.parse().map($name)
            }
        }
    };
}

number_id!(
    /// A message's sequence number: global, dense in commit order, never reused. 0 means
    /// "before the first message".
    Seq
);
number_id!(
    /// Which session of an agent this is: 1 for the first, one more for each restart. 0
    /// means "no session yet".
    Incarnation
);

impl Incarnation {
    /// The incarnation after this one.
    pub const fn next(self) -> Incarnation {
        Incarnation(self.0 + 1)
    }
}

/// Longest runner id, in bytes.
pub const MAX_RUNNER_ID_LEN: usize = 64;

const RUNNER_ID_GRAMMAR: &str = "lowercase letters, digits and hyphens, at most 64 bytes";

/// A runner's id: `runner-4242-9f3a`. One NATS subject token, so it never holds `.`, `*`
/// or `>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(try_from = "String", into = "String")]
#[schemars(extend("pattern" = "^[a-z0-9-]{1,64}$"))]
pub struct RunnerId(String);

impl RunnerId {
    /// Parses a runner id.
    pub fn parse(value: &str) -> Result<RunnerId, NameError> {
        if value.is_empty() {
            return Err(NameError::Empty);
        }
        if value.len() > MAX_RUNNER_ID_LEN {
            return Err(NameError::TooLong { len: value.len(), max: MAX_RUNNER_ID_LEN });
        }
        if !value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
            return Err(NameError::Grammar { value: value.to_owned(), grammar: RUNNER_ID_GRAMMAR });
        }
        Ok(RunnerId(value.to_owned()))
    }

    /// Wraps a runner id read back from the store, which only ever holds parsed ids.
    pub fn from_trusted(value: String) -> RunnerId {
        RunnerId(value)
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RunnerId {
    type Error = NameError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        RunnerId::parse(&value)
    }
}

impl From<RunnerId> for String {
    fn from(value: RunnerId) -> String {
        value.0
    }
}

impl fmt::Display for RunnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

impl AsRef<str> for RunnerId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for RunnerId {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RunnerId::parse(s)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    #[test]
    fn ids_are_transparent_on_the_wire() {
        assert_eq!(serde_json::to_string(&Seq(7)).unwrap(), "7");
        assert_eq!(serde_json::from_str::<Incarnation>("3").unwrap(), Incarnation(3));
        let id = RunnerId::parse("runner-42-9f").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"runner-42-9f\"");
        assert_eq!(serde_json::from_str::<RunnerId>("\"runner-42-9f\"").unwrap(), id);
    }

    #[test]
    fn a_runner_id_is_one_subject_token() {
        for bad in ["", "a.b", "a*", ">", "Runner", "a b", &"x".repeat(65)] {
            assert!(RunnerId::parse(bad).is_err(), "{bad:?} was accepted");
            assert!(serde_json::from_str::<RunnerId>(&format!("{bad:?}")).is_err(), "{bad:?} decoded");
        }
        assert!(RunnerId::parse("r1").is_ok());
    }
}
