//! The spawn gate's reply grammar: what a post in a `spawn: <handle>` topic says about its
//! request.
//!
//! A reply decides only when it is exactly `approve`, or `deny` followed by a reason (the
//! word in any case, surrounding whitespace ignored). A reply that reads like an answer but
//! is neither (`Approve.`, `approved`, `yes`, `ok`, `lgtm`, `approve req-3`, a bare `deny`)
//! is `Unclear`, so the caller can answer with the grammar instead of guessing what was
//! meant; anything else is conversation. Pure text: who posted, where, and what becomes of
//! the request are the store's facts and the caller's decision.

/// Words that make a reply read as a decision when it opens with one, whatever follows.
const DECISION_WORDS: &str = "approve approved approves approving approval accept accepted allow allowed grant \
     granted confirm confirmed deny denied denies denying reject rejected decline declined refuse refused veto";

/// Words that read as a decision when a short reply opens with one.
const ASSENT_WORDS: &str = "yes y yep yeah yup ok okay k sure lgtm go ship agreed fine no n nope nah +1 -1 👍 👎";

/// How many words a reply may have and still read as a decision by an `ASSENT_WORDS` opening
/// or a `DECISION_WORDS` word anywhere.
const SHORT_REPLY_WORDS: usize = 3;

/// What a post in a request's topic reads as, when it reads as an answer at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Exactly `approve`.
    Approve,
    /// `deny <reason>`; the reason is trimmed and never empty.
    Deny { reason: String },
    /// Reads like an answer to the request but is not one Canopy acts on.
    Unclear,
}

impl Reply {
    /// Reads a post's body; `None` when it is conversation, not an answer.
    pub fn parse(body: &str) -> Option<Reply> {
        let body = body.trim();
        let (first, rest) = match body.split_once(char::is_whitespace) {
            Some((first, rest)) => (first, rest.trim()),
            None => (body, ""),
        };
        if first.eq_ignore_ascii_case("approve") && rest.is_empty() {
            return Some(Reply::Approve);
        }
        if first.eq_ignore_ascii_case("deny") && !rest.is_empty() {
            return Some(Reply::Deny { reason: rest.to_owned() });
        }
        let short = body.split_whitespace().count() <= SHORT_REPLY_WORDS;
        let opening = normalized(first);
        let decision_word = |word: &str| listed(DECISION_WORDS, &normalized(word));
        let reads_as_answer = decision_word(first)
            || (short && (listed(ASSENT_WORDS, &opening) || listed(ASSENT_WORDS, first)))
            || (short && body.split_whitespace().any(decision_word));
        reads_as_answer.then_some(Reply::Unclear)
    }
}

/// Whether `word` is one of the space-separated `words`.
fn listed(words: &str, word: &str) -> bool {
    words.split_whitespace().any(|w| w == word)
}

/// A word in lower case without the punctuation around it (`Approve.` is `approve`).
fn normalized(word: &str) -> String {
    word.trim_matches(|c: char| c.is_ascii_punctuation()).to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_grammar_decides_and_look_alikes_are_unclear() {
        let deny = |reason: &str| Some(Reply::Deny { reason: reason.to_owned() });
        let cases: &[(&str, Option<Reply>)] = &[
            ("approve", Some(Reply::Approve)),
            ("  Approve \n", Some(Reply::Approve)),
            ("APPROVE", Some(Reply::Approve)),
            ("deny not this quarter", deny("not this quarter")),
            ("Deny\tno budget ", deny("no budget")),
            ("Approve.", Some(Reply::Unclear)),
            ("approved", Some(Reply::Unclear)),
            ("approve req-3", Some(Reply::Unclear)),
            ("approve, but keep the charter small and report weekly", Some(Reply::Unclear)),
            ("deny", Some(Reply::Unclear)),
            ("Deny.", Some(Reply::Unclear)),
            ("Deny: too many managers already", Some(Reply::Unclear)),
            ("denied", Some(Reply::Unclear)),
            ("yes", Some(Reply::Unclear)),
            ("Yes!", Some(Reply::Unclear)),
            ("ok", Some(Reply::Unclear)),
            ("OK go ahead", Some(Reply::Unclear)),
            ("lgtm", Some(Reply::Unclear)),
            ("+1", Some(Reply::Unclear)),
            ("👍", Some(Reply::Unclear)),
            ("I approve", Some(Reply::Unclear)),
            ("no", Some(Reply::Unclear)),
            ("why do you need a second manager for this?", None),
            ("ok so what would the charter cover beyond the flaky suite", None),
            ("", None),
            ("noted", None),
            ("approvers are listed in the charter", None),
        ];
        for (body, expected) in cases {
            assert_eq!(&Reply::parse(body), expected, "{body:?}");
        }
    }
}
