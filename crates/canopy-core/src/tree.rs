//! Tree rules: which reparents are allowed.
//!
//! Owns the cycle rule and the Supervisor's fixed place at the root. Does not read the tree;
//! the caller passes the ancestor chain it read inside its transaction.

use crate::error::Error;
use crate::names::Handle;

/// Checks that `child` may move under `new_parent`.
///
/// `new_parent_ancestors` is the chain from `new_parent`'s parent up to the root. Refuses
/// moving the Supervisor, parenting an agent to itself, and any move that makes a cycle.
pub fn check_reparent(
    child: &Handle,
    child_is_supervisor: bool,
    new_parent: &Handle,
    new_parent_ancestors: &[Handle],
) -> Result<(), Error> {
    if child_is_supervisor {
        return Err(Error::Forbidden {
            action: format!("reparent {child}"),
            reason: "the Supervisor is the root of the tree and has no parent".into(),
        });
    }
    if child == new_parent || new_parent_ancestors.contains(child) {
        return Err(Error::ConflictOn {
            field: "parent",
            reason: format!(
                "moving {child} under {new_parent} would make a cycle: {new_parent} is {child} or one of its descendants"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    fn h(s: &str) -> Handle {
        Handle::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn cycles_are_conflicts() {
        // supervisor > a > b; moving a under b makes a cycle.
        let err = check_reparent(&h("a"), false, &h("b"), &[h("a"), h("supervisor")]);
        assert_eq!(err.map_err(|e| e.code()), Err(ErrorCode::Conflict));
        let err = check_reparent(&h("a"), false, &h("a"), &[h("supervisor")]);
        assert_eq!(err.map_err(|e| e.code()), Err(ErrorCode::Conflict));
        assert!(check_reparent(&h("b"), false, &h("supervisor"), &[]).is_ok());
    }

    #[test]
    fn the_supervisor_never_moves() {
        let err = check_reparent(&h("supervisor"), true, &h("a"), &[h("supervisor")]);
        assert_eq!(err.map_err(|e| e.code()), Err(ErrorCode::Forbidden));
    }
}
