//! Name grammars for handles, roles, channels and topics, parsed once at the edge.
//!
//! Owns the grammar (documented in `proto/SUBJECTS.md` and the README) and the reserved
//! words. Does not know whether a name exists: that is the store's question.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::Error;
/// Defined beside the domain error that wraps it (`Error::InvalidName`), so `error` need not
/// import this module; kept reachable here, where the grammars that raise it live.
pub use crate::error::NameError;

/// Longest handle or role name, in bytes.
pub const MAX_HANDLE_LEN: usize = 32;
/// Longest channel name, in bytes.
pub const MAX_CHANNEL_LEN: usize = 64;
/// Longest topic name, in characters.
pub const MAX_TOPIC_CHARS: usize = 80;

/// Handles that would be ambiguous in an `@mention` or that name Canopy itself.
pub const RESERVED_HANDLES: &[&str] = &[
    "all",
    "everyone",
    "channel",
    "topic",
    "here",
    "canopy",
    "system",
    "operator",
    "operators",
    "daemon",
    "runner",
    "nobody",
];

/// Channel name prefixes that only the daemon may use, for the channels it creates itself.
/// Handle prefixes Canopy gives its own accounts (subagent runs are `run-<id>`).
pub const RESERVED_HANDLE_PREFIXES: &[&str] = &["run-"];

pub const RESERVED_CHANNEL_PREFIXES: &[&str] = &["home-", "coord-", "dm-"];

const HANDLE_GRAMMAR: &str =
    "a lowercase letter, then lowercase letters, digits or single hyphens, not ending in a hyphen, at most 32 bytes";
const CHANNEL_GRAMMAR: &str = "a lowercase letter or digit, then lowercase letters, digits or single hyphens, not ending in a hyphen, at most 64 bytes";

/// Checks the shared slug shape: `[a-z0-9]` runs joined by single hyphens.
fn check_slug(value: &str, max: usize, first_may_be_digit: bool, grammar: &'static str) -> Result<(), NameError> {
    if value.is_empty() {
        return Err(NameError::Empty);
    }
    if value.len() > max {
        return Err(NameError::TooLong { len: value.len(), max });
    }
    let bytes = value.as_bytes();
    let first_ok = bytes[0].is_ascii_lowercase() || (first_may_be_digit && bytes[0].is_ascii_digit());
    let chars_ok = bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    let hyphens_ok = !value.ends_with('-') && !value.contains("--");
    if first_ok && chars_ok && hyphens_ok {
        Ok(())
    } else {
        Err(NameError::Grammar { value: value.to_owned(), grammar })
    }
}

macro_rules! string_newtype {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

string_newtype!(
    /// An account handle: `ci-manager`. Used in `@mentions`; unique across operators and agents.
    Handle
);
string_newtype!(
    /// A role id: `supervisor`, `manager`, or a role the bundle defines.
    RoleName
);
string_newtype!(
    /// A channel name: `announcements`, `home-ci-manager`. Safe as a NATS subject token.
    ChannelName
);
string_newtype!(
    /// A topic name: free text on one line, trimmed, at most 80 characters.
    TopicName
);

impl Handle {
    /// Parses a handle, refusing reserved words.
    pub fn parse(value: &str) -> Result<Handle, NameError> {
        check_slug(value, MAX_HANDLE_LEN, false, HANDLE_GRAMMAR)?;
        if RESERVED_HANDLES.contains(&value) || RESERVED_HANDLE_PREFIXES.iter().any(|p| value.starts_with(p)) {
            return Err(NameError::Reserved { value: value.to_owned() });
        }
        Ok(Handle(value.to_owned()))
    }

    /// Wraps a handle read back from the store, which only ever holds parsed handles.
    pub fn from_trusted(value: String) -> Handle {
        Handle(value)
    }
}

impl Handle {
    /// Refuses a handle with a word of `forbidden` as one of its hyphen-separated parts: a
    /// Manager is named by its function (`ci-manager`), not by the tool or vendor it uses
    /// (`aws-manager`, `claude-bot`), because tools change and lanes stay.
    pub fn check_function_name(&self, field: &'static str, forbidden: &[String]) -> Result<(), Error> {
        match self.0.split('-').find(|part| forbidden.iter().any(|w| w == part)) {
            None => Ok(()),
            Some(word) => Err(Error::invalid(
                field,
                format!(
                    "{self} names a tool or vendor ({word}); name the lane by its function instead \
                     (what it owns: ci-manager, release-manager, docs-manager)"
                ),
            )),
        }
    }
}

impl RoleName {
    /// The root agent's role; exactly one account has it.
    pub const SUPERVISOR: &'static str = "supervisor";
    /// The default role of a standing agent.
    pub const MANAGER: &'static str = "manager";

    /// Parses a role id (same grammar as a handle, no reserved words).
    pub fn parse(value: &str) -> Result<RoleName, NameError> {
        check_slug(value, MAX_HANDLE_LEN, false, HANDLE_GRAMMAR)?;
        Ok(RoleName(value.to_owned()))
    }

    /// Wraps a role read back from the store.
    pub fn from_trusted(value: String) -> RoleName {
        RoleName(value)
    }

    /// Whether this is the Supervisor's role.
    pub fn is_supervisor(&self) -> bool {
        self.0 == Self::SUPERVISOR
    }
}

impl ChannelName {
    /// Parses a channel name an operator chose: the grammar, minus the daemon's prefixes.
    pub fn parse_user(value: &str) -> Result<ChannelName, NameError> {
        let name = Self::parse(value)?;
        if RESERVED_CHANNEL_PREFIXES.iter().any(|p| value.starts_with(p)) {
            return Err(NameError::Reserved { value: value.to_owned() });
        }
        Ok(name)
    }

    /// Parses any channel name, including the daemon's own (`home-ci-manager`).
    pub fn parse(value: &str) -> Result<ChannelName, NameError> {
        let value = value.strip_prefix('#').unwrap_or(value);
        check_slug(value, MAX_CHANNEL_LEN, true, CHANNEL_GRAMMAR)?;
        Ok(ChannelName(value.to_owned()))
    }

    /// The home channel of an agent or operator.
    pub fn home_of(handle: &Handle) -> ChannelName {
        ChannelName(format!("home-{handle}"))
    }

    /// Wraps a channel name read back from the store.
    pub fn from_trusted(value: String) -> ChannelName {
        ChannelName(value)
    }
}

impl TopicName {
    /// Parses a topic name: one line of printable text, no surrounding whitespace.
    pub fn parse(value: &str) -> Result<TopicName, NameError> {
        if value.trim().is_empty() {
            return Err(NameError::Empty);
        }
        let chars = value.chars().count();
        if chars > MAX_TOPIC_CHARS {
            return Err(NameError::TooLong { len: chars, max: MAX_TOPIC_CHARS });
        }
        if value.trim() != value || value.chars().any(char::is_control) {
            return Err(NameError::Grammar {
                value: value.to_owned(),
                grammar: "one line of text without control characters or surrounding whitespace, at most 80 characters",
            });
        }
        Ok(TopicName(value.to_owned()))
    }

    /// Wraps a topic name read back from the store.
    pub fn from_trusted(value: String) -> TopicName {
        TopicName(value)
    }
}

/// The name among `names` nearest to `wanted` (a typo of it): at most two edits away (one
/// for names of four letters or fewer), or one `wanted` starts; `None` when nothing is close.
pub fn nearest<'a>(wanted: &str, names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let limit = if wanted.len() <= 4 { 1 } else { 2 };
    let mut best: Option<(usize, &str)> = None;
    for name in names {
        let distance = if name.starts_with(wanted) && !wanted.is_empty() { 1 } else { edits(wanted, name) };
        if distance <= limit && best.is_none_or(|(d, n)| distance < d || (distance == d && name < n)) {
            best = Some((distance, name));
        }
    }
    best.map(|(_, name)| name)
}

/// Levenshtein distance, bounded work: names are at most 64 bytes.
fn edits(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().take(64).collect(), b.chars().take(64).collect());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1).min(row[j] + 1).min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// A short name (a repository's, a check's): 1 to 40 of `a-z`, `0-9`, `-`, `_`, starting with a
/// letter or digit.
pub fn is_short_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 40
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name.as_bytes()[0].is_ascii_alphanumeric()
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_nearest_name_is_a_typo_or_a_prefix_away() {
        let names = ["announcements", "incidents", "home-ci-lead", "ci"];
        assert_eq!(nearest("anouncements", names.iter().copied()), Some("announcements"));
        assert_eq!(nearest("home-ci", names.iter().copied()), Some("home-ci-lead"), "a prefix");
        assert_eq!(nearest("cj", names.iter().copied()), Some("ci"));
        assert_eq!(nearest("zzzz", names.iter().copied()), None, "nothing close");
    }

    use super::*;

    #[test]
    fn a_handle_names_a_function_not_a_tool() {
        let words: Vec<String> = ["aws", "claude", "bot"].iter().map(|w| (*w).to_owned()).collect();
        for bad in ["aws-manager", "claude-bot", "bot", "infra-aws"] {
            let err = Handle::parse(bad).unwrap_or_else(|e| panic!("{e}")).check_function_name("handle", &words);
            let message = err.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(message.contains("name the lane by its function"), "{bad}: {message}");
        }
        for good in ["ci-manager", "claudette", "robotics", "bots-manager"] {
            let handle = Handle::parse(good).unwrap_or_else(|e| panic!("{e}"));
            assert!(handle.check_function_name("handle", &words).is_ok(), "{good}");
        }
    }

    #[test]
    fn handles_follow_the_grammar() {
        for good in ["a", "ci-manager", "payments2", "a-b-c"] {
            assert!(Handle::parse(good).is_ok(), "{good}");
        }
        for bad in ["", "-a", "a-", "a--b", "A", "1abc", "ci_manager", "ci.manager", "all", &"a".repeat(33)] {
            assert!(Handle::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn channel_names_are_subject_tokens() {
        assert_eq!(ChannelName::parse("#announcements").map(|c| c.0), Ok("announcements".to_owned()));
        assert!(ChannelName::parse("2026-plans").is_ok());
        for bad in ["a.b", "a b", "a*", "a>", "", "x-"] {
            assert!(ChannelName::parse(bad).is_err(), "{bad}");
        }
        assert!(matches!(ChannelName::parse_user("home-x"), Err(NameError::Reserved { .. })));
    }

    #[test]
    fn topics_are_one_trimmed_line() {
        assert!(TopicName::parse("spawn: payments-manager").is_ok());
        assert!(TopicName::parse("Ünïcode is fine").is_ok());
        for bad in ["", "  ", " lead", "trail ", "two\nlines", &"x".repeat(81)] {
            assert!(TopicName::parse(bad).is_err(), "{bad:?}");
        }
    }
}
