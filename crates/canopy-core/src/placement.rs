//! Where a session runs: runner labels, what an agent needs, and the choice among the live
//! runners (`choose`). Pure: the store reads the runners and applies the choice in the
//! writer's transaction, so two runners never take the same agent.
//!
//! The rule: a session goes only to a live runner that has every label it needs, is not
//! draining and has room under its capacity; among those, the one with the fewest live
//! sessions, ties by id. With no live runner that has the labels at all, the agent is
//! `unplaced` and says what it needs; with some that are full or draining it waits.

use crate::error::Error;

/// Most labels a runner carries or an agent needs.
pub const MAX_LABELS: usize = 16;

/// Checks one label: 1-32 of `a-z`, `0-9`, `-`, `_`, `.`, starting with a letter or digit.
pub fn check_label(field: &'static str, label: &str) -> Result<(), Error> {
    let ok = !label.is_empty()
        && label.len() <= 32
        && label.as_bytes()[0].is_ascii_alphanumeric()
        && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.'));
    match ok {
        true => Ok(()),
        false => Err(Error::invalid(
            field,
            format!("{label:?} is not a label: 1-32 of a-z, 0-9, '-', '_' and '.', starting with a letter or digit"),
        )),
    }
}

/// Checks a list of labels and returns it sorted without repeats.
pub fn check_labels(field: &'static str, labels: &[String]) -> Result<Vec<String>, Error> {
    if labels.len() > MAX_LABELS {
        return Err(Error::invalid(field, format!("at most {MAX_LABELS} labels")));
    }
    for label in labels {
        check_label(field, label)?;
    }
    let mut sorted = labels.to_vec();
    sorted.sort();
    sorted.dedup();
    Ok(sorted)
}

/// Labels as stored: space-separated, sorted.
pub fn join(labels: &[String]) -> String {
    labels.join(" ")
}

/// Labels as stored, read back.
pub fn split(stored: &str) -> Vec<String> {
    stored.split_whitespace().map(str::to_owned).collect()
}

/// A live runner as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: String,
    pub labels: Vec<String>,
    pub capacity: u32,
    /// Its live sessions now.
    pub sessions: u32,
    pub draining: bool,
}

/// Where an agent's session goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// To this runner.
    Runner(String),
    /// Runners with its labels are live, but all are full or draining: it waits.
    Wait,
    /// No live runner has every label it needs.
    Unplaced,
}

/// The runner for a session that needs `needs`, among the live `runners`.
pub fn choose(needs: &[String], runners: &[Candidate]) -> Choice {
    let able: Vec<&Candidate> = runners.iter().filter(|r| needs.iter().all(|n| r.labels.contains(n))).collect();
    if able.is_empty() {
        return Choice::Unplaced;
    }
    able.into_iter()
        .filter(|r| !r.draining && r.sessions < r.capacity)
        .min_by(|a, b| (a.sessions, &a.id).cmp(&(b.sessions, &b.id)))
        .map_or(Choice::Wait, |r| Choice::Runner(r.id.clone()))
}

/// What the roster says of an agent no live runner can take.
pub fn unplaced(needs: &[String]) -> String {
    format!("unplaced (needs {})", needs.join(", "))
}

/// What Canopy tells the agent's home channel, once, when it becomes unplaced.
pub fn say_unplaced(handle: &str, needs: &[String]) -> String {
    format!(
        "@{handle} waits for a runner: none that is live has the labels it needs ({}). Start a runner with them \
         (`[runner] labels` in its canopy.toml), or change what it needs; `canopy runners` lists each runner's labels.",
        needs.join(", ")
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    fn runner(id: &str, labels: &[&str], sessions: u32, capacity: u32, draining: bool) -> Candidate {
        Candidate {
            id: id.into(),
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            capacity,
            sessions,
            draining,
        }
    }

    #[test]
    fn a_session_goes_to_the_least_loaded_runner_with_its_labels() {
        let runners = [
            runner("a", &["linux"], 1, 10, false),
            runner("b", &["gpu", "linux"], 3, 10, false),
            runner("c", &["gpu", "linux"], 2, 10, false),
        ];
        assert_eq!(choose(&[], &runners), Choice::Runner("a".into()));
        assert_eq!(choose(&["gpu".into()], &runners), Choice::Runner("c".into()));
        assert_eq!(choose(&["gpu".into(), "linux".into()], &runners), Choice::Runner("c".into()));
        assert_eq!(choose(&["tpu".into()], &runners), Choice::Unplaced);
        assert_eq!(choose(&[], &[]), Choice::Unplaced);
    }

    #[test]
    fn a_full_or_draining_runner_takes_nothing_and_its_agents_wait() {
        let runners = [runner("a", &["gpu"], 2, 2, false), runner("b", &["gpu"], 0, 5, true)];
        assert_eq!(choose(&["gpu".into()], &runners), Choice::Wait);
        let ties = [runner("b", &[], 1, 5, false), runner("a", &[], 1, 5, false)];
        assert_eq!(choose(&[], &ties), Choice::Runner("a".into()));
    }

    #[test]
    fn labels_are_checked_sorted_and_stored_as_words() {
        assert_eq!(
            check_labels("needs", &["gpu".into(), "big-disk".into(), "gpu".into()]).unwrap(),
            ["big-disk", "gpu"]
        );
        for bad in ["", "GPU", "-x", "a b", "x".repeat(33).as_str()] {
            assert!(check_label("needs", bad).is_err(), "{bad:?}");
        }
        assert!(check_labels("needs", &vec!["a".to_owned(); 17]).is_err());
        assert_eq!(split(&join(&["a".into(), "b".into()])), ["a", "b"]);
        assert_eq!(unplaced(&["gpu".into()]), "unplaced (needs gpu)");
    }
}
