//! The message ids a session already injected (bounded), and those a turn-start delivery is
//! handing to the harness right now: what lets a session drop a message it already gave the
//! agent, and a steer stand back from a message being delivered.
//!
//! Owns only this set. Does not pull, send or acknowledge anything.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use canopy_core::{Message, Seq};

/// Most message ids a session remembers for dropping duplicates.
const REMEMBERED: usize = 10_000;

/// Message ids this session already injected (bounded), and those a turn-start delivery is
/// handing to the harness right now. Shared through a `std` mutex that is only ever held for
/// a lookup or an insert, never across an await: a slow acknowledgement or harness write
/// cannot hold up a steer or the session loop (the guard is not `Send`, so the compiler
/// refuses one held across an await in a spawned task).
#[derive(Default)]
pub(crate) struct Seen {
    ids: HashSet<Seq>,
    order: VecDeque<Seq>,
    delivering: HashSet<Seq>,
}

/// What a steer finds out about its message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SteerCheck {
    /// Not injected, not being delivered: steer it.
    Steer,
    /// Already in the agent's context.
    Injected,
    /// In a turn-start delivery being written now: it arrives with that turn.
    Delivering,
}

pub(crate) type SharedSeen = Arc<std::sync::Mutex<Seen>>;

/// Runs `f` on the shared set; the lock is held only for `f`. A poisoned lock is taken as
/// it is: every change to the set is a single insert or remove, so a panic elsewhere cannot
/// leave it half-written.
pub(crate) fn with_seen<T>(seen: &SharedSeen, f: impl FnOnce(&mut Seen) -> T) -> T {
    let mut guard = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    f(&mut guard)
}

impl Seen {
    /// Takes the messages of a turn-start delivery: those injected before (to acknowledge
    /// again) and the fresh ones, which are marked as being delivered.
    pub fn reserve(&mut self, messages: Vec<Message>) -> (Vec<Message>, Vec<Message>) {
        let (again, fresh): (Vec<Message>, Vec<Message>) =
            messages.into_iter().partition(|m| self.contains(m.seq) || self.delivering.contains(&m.seq));
        self.delivering.extend(fresh.iter().map(|m| m.seq));
        (again, fresh)
    }

    /// Ends a delivery: its messages are injected (`started`) or pending again.
    pub fn settle(&mut self, seqs: &[Seq], started: bool) {
        for seq in seqs {
            self.delivering.remove(seq);
            if started {
                self.insert(*seq);
            }
        }
    }

    pub fn check_steer(&self, seq: Seq) -> SteerCheck {
        if self.contains(seq) {
            SteerCheck::Injected
        } else if self.delivering.contains(&seq) {
            SteerCheck::Delivering
        } else {
            SteerCheck::Steer
        }
    }

    pub fn insert(&mut self, seq: Seq) {
        if self.ids.insert(seq) {
            self.order.push_back(seq);
            if self.order.len() > REMEMBERED
                && let Some(old) = self.order.pop_front()
            {
                self.ids.remove(&old);
            }
        }
    }

    pub fn contains(&self, seq: Seq) -> bool {
        self.ids.contains(&seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::testing::message;

    #[test]
    fn a_delivery_reserves_fresh_messages_and_settles_them() {
        let mut seen = Seen::default();
        seen.insert(Seq(1));
        let (again, fresh) = seen.reserve(vec![message(1, "old"), message(2, "new")]);
        assert_eq!(again.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![Seq(1)]);
        assert_eq!(fresh.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![Seq(2)]);
        assert_eq!(seen.check_steer(Seq(2)), SteerCheck::Delivering);
        let (again, fresh) = seen.reserve(vec![message(2, "new")]);
        assert_eq!((again.len(), fresh.len()), (1, 0), "a message being delivered is not handed out twice");
        seen.settle(&[Seq(2)], false);
        assert_eq!(seen.check_steer(Seq(2)), SteerCheck::Steer, "not taken: pending again");
        seen.reserve(vec![message(2, "new")]);
        seen.settle(&[Seq(2)], true);
        assert_eq!(seen.check_steer(Seq(2)), SteerCheck::Injected);
    }

    #[test]
    fn only_the_newest_ids_are_remembered() {
        let mut seen = Seen::default();
        for seq in 0..=REMEMBERED as u64 {
            seen.insert(Seq(seq));
        }
        assert!(!seen.contains(Seq(0)), "the oldest is forgotten");
        assert!(seen.contains(Seq(1)));
        assert!(seen.contains(Seq(REMEMBERED as u64)));
    }
}
