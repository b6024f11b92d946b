//! The `@mention` grammar.
//!
//! A mention is `@` followed by a well-formed handle, where the `@` starts the body or
//! follows a character that cannot be part of a word or an address (so `a@b.c` is not a
//! mention), and the handle ends at the first character outside the handle alphabet. A
//! trailing hyphen is punctuation, not part of the handle. Does not check that handles exist.

use crate::names::Handle;

/// Extracts the distinct well-formed handles mentioned in `body`, in first-seen order.
pub fn parse_mentions(body: &str) -> Vec<Handle> {
    let bytes = body.as_bytes();
    let mut found: Vec<Handle> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'@' {
            i += 1;
            continue;
        }
        let boundary = i == 0 || {
            let prev = bytes[i - 1];
            !(prev.is_ascii_alphanumeric()
                || prev == b'_'
                || prev == b'.'
                || prev == b'-'
                || prev == b'@'
                || prev >= 0x80)
        };
        let start = i + 1;
        let mut end = start;
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase() || bytes[end].is_ascii_digit() || bytes[end] == b'-')
        {
            end += 1;
        }
        // A handle never ends in a hyphen: treat trailing hyphens as punctuation.
        let mut trimmed = end;
        while trimmed > start && bytes[trimmed - 1] == b'-' {
            trimmed -= 1;
        }
        if boundary && trimmed > start {
            // The slice is ASCII by construction, so it is valid UTF-8 on byte boundaries.
            if let Some(text) = body.get(start..trimmed)
                && let Ok(handle) = Handle::parse(text)
                && !found.contains(&handle)
            {
                found.push(handle);
            }
        }
        i = end.max(i + 1);
    }
    found
}

#[cfg(test)]
mod tests {
    use crate::fuzz::{Rng, mutate};

    /// How many cases a property test runs: `CANOPY_FUZZ_CASES`, else `default`.
    fn cases(default: usize) -> usize {
        std::env::var("CANOPY_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
    }

    #[test]
    fn fuzzed_bodies_yield_only_well_formed_distinct_handles_that_are_in_the_body() {
        let seeds = ["@alpha please see @beta-2.", "mail a@b.c and @gamma", "@-x @y- @@z (@w) @ops\n@ci-manager:"];
        let mut rng = Rng::new(0x6d65_6e74);
        for case in 0..cases(20_000) {
            let body = mutate(&mut rng, seeds[case % seeds.len()]);
            let found = parse_mentions(&body);
            let mut seen = std::collections::HashSet::new();
            for handle in &found {
                assert!(Handle::parse(handle.as_str()).is_ok(), "{handle:?} from {body:?}");
                assert!(body.contains(&format!("@{}", handle.as_str())), "{handle:?} is not in {body:?}");
                assert!(seen.insert(handle.as_str().to_owned()), "{handle:?} twice from {body:?}");
            }
        }
    }

    use super::*;

    fn mentions(body: &str) -> Vec<String> {
        parse_mentions(body).into_iter().map(|h| h.to_string()).collect()
    }

    #[test]
    fn mentions_follow_the_grammar() {
        assert_eq!(mentions("@ci-manager please look"), ["ci-manager"]);
        assert_eq!(mentions("cc @a, @b-c. and @a again"), ["a", "b-c"]);
        assert_eq!(mentions("(@lead-) done"), ["lead"]);
        assert!(mentions("mail me at ops@example.com").is_empty());
        assert!(mentions("@ alone, @@double, @All, @9lives").is_empty());
        assert!(mentions("@all hands").is_empty(), "reserved words are not handles");
        assert_eq!(mentions("«@ünï @ok»"), ["ok"]);
    }
}
