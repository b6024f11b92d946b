//! `BudgetGate`: who a spent budget holds and who is near one, the in-memory snapshot every
//! delivery, pull, session start and run start consults (one hash lookup per recipient on the
//! post path). The store is the truth; the `budgets` area re-reads the snapshot after anything
//! that can change it. Does not read the store or decide a budget (`canopy_store::budgets`,
//! `canopy_core::budget`).

use std::sync::{Arc, RwLock};

use canopy_core::Error;
use canopy_store::Holds;

/// Who is held by a spent budget, and who is near one: the snapshot the daemon checks.
#[derive(Debug, Default)]
pub struct BudgetGate {
    holds: RwLock<Arc<Holds>>,
}

impl BudgetGate {
    /// The holds as of the last refresh.
    pub fn snapshot(&self) -> Arc<Holds> {
        self.holds.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Why `handle` is held, if a spent budget covers it.
    pub fn hold(&self, handle: &str) -> Option<String> {
        self.holds.read().unwrap_or_else(std::sync::PoisonError::into_inner).held.get(handle).cloned()
    }

    /// Refuses to start spending for an agent a spent budget covers.
    pub fn require(&self, handle: &str, what: &str) -> Result<(), Error> {
        match self.hold(handle) {
            None => Ok(()),
            Some(why) => Err(Error::LimitExceeded(format!("no {what} starts for @{handle}: {why}"))),
        }
    }

    /// Installs new holds; returns who is no longer held.
    pub fn replace(&self, holds: Holds) -> Vec<String> {
        let mut current = self.holds.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let released = current.held.keys().filter(|h| !holds.held.contains_key(*h)).cloned().collect();
        *current = Arc::new(holds);
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_snapshot_names_who_it_released_and_holds_the_rest() {
        let gate = BudgetGate::default();
        let mut holds = Holds::default();
        holds.held.insert("a".into(), "spent".into());
        holds.held.insert("b".into(), "spent".into());
        assert!(gate.replace(holds).is_empty());
        assert!(gate.require("a", "turn").is_err());
        let mut fewer = Holds::default();
        fewer.held.insert("b".into(), "spent".into());
        assert_eq!(gate.replace(fewer), vec!["a".to_owned()]);
        assert!(gate.require("a", "turn").is_ok());
        assert_eq!(gate.hold("b").as_deref(), Some("spent"));
    }
}
