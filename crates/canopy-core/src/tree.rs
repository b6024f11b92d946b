//! Tree rules: which reparents are allowed, and what of the tree an agent is shown.
//!
//! Owns the cycle rule, the Supervisor's fixed place at the root, and the view around an
//! agent (`around`: its parent, its peers, and its own subtree to a bounded depth). Does not
//! read the tree; the caller passes the ancestor chain or the tree it read.

use crate::error::Error;
use crate::model::TreeNode;
use crate::names::Handle;

/// Default depth of an agent's own subtree in its view of the tree.
pub const DEFAULT_AROUND_DEPTH: u32 = 2;
/// Deepest subtree an agent may ask for.
pub const MAX_AROUND_DEPTH: u32 = 5;
/// Most nodes an agent's view holds; the rest are counted in `omitted`.
pub const MAX_AROUND_NODES: usize = 200;

/// The tree as `agent` sees it: its parent (or itself, for the Supervisor) at the root, with
/// the agent and its peers as the root's children, the peers without their subtrees, and the
/// agent's own subtree `depth` levels down. At most `MAX_AROUND_NODES` nodes; whatever is left
/// out is counted in its parent's `omitted`. `None` when the agent is not in the tree.
pub fn around(tree: &TreeNode, agent: &Handle, depth: u32) -> Option<TreeNode> {
    let depth = depth.min(MAX_AROUND_DEPTH);
    let mut budget = MAX_AROUND_NODES;
    let bare =
        |n: &TreeNode| TreeNode { children: Vec::new(), omitted: n.children.len() as u32 + n.omitted, ..n.clone() };
    if &tree.handle == agent {
        budget -= 1;
        return Some(subtree(tree, depth, &mut budget));
    }
    let parent = find_parent(tree, agent)?;
    let mut root = bare(parent);
    root.omitted = 0;
    budget -= 1;
    // The agent first, with its subtree; then its peers, as far as the budget goes.
    let own = parent.children.iter().find(|c| &c.handle == agent)?;
    budget -= 1;
    root.children.push(subtree(own, depth, &mut budget));
    for peer in parent.children.iter().filter(|c| &c.handle != agent) {
        if budget == 0 {
            root.omitted += 1;
            continue;
        }
        budget -= 1;
        root.children.push(bare(peer));
    }
    Some(root)
}

fn find_parent<'a>(node: &'a TreeNode, agent: &Handle) -> Option<&'a TreeNode> {
    if node.children.iter().any(|c| &c.handle == agent) {
        return Some(node);
    }
    node.children.iter().find_map(|c| find_parent(c, agent))
}

/// `node` with its descendants `depth` levels down, breadth first within the budget: every
/// child of a level is shown before any grandchild, so direct reports are never crowded out.
fn subtree(node: &TreeNode, depth: u32, budget: &mut usize) -> TreeNode {
    let mut shown: std::collections::HashSet<*const TreeNode> = std::collections::HashSet::new();
    let mut queue = std::collections::VecDeque::from([(node, depth)]);
    while let Some((parent, left)) = queue.pop_front() {
        if left == 0 {
            continue;
        }
        for child in &parent.children {
            if *budget == 0 {
                break;
            }
            *budget -= 1;
            shown.insert(child as *const TreeNode);
            queue.push_back((child, left - 1));
        }
    }
    fn build(node: &TreeNode, shown: &std::collections::HashSet<*const TreeNode>) -> TreeNode {
        let children: Vec<TreeNode> = node
            .children
            .iter()
            .filter(|c| shown.contains(&(*c as *const TreeNode)))
            .map(|c| build(c, shown))
            .collect();
        let omitted = node.omitted + (node.children.len() - children.len()) as u32;
        TreeNode { children, omitted, ..node.clone() }
    }
    build(node, &shown)
}

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
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
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

    fn node(handle: &str, children: Vec<TreeNode>) -> TreeNode {
        TreeNode {
            handle: h(handle),
            display_name: handle.into(),
            role: crate::RoleName::from_trusted("manager".into()),
            state: crate::AccountState::Active,
            children,
            omitted: 0,
        }
    }

    fn handles(n: &TreeNode) -> Vec<String> {
        let mut out = vec![format!("{}+{}", n.handle, n.omitted)];
        out.extend(n.children.iter().flat_map(handles));
        out
    }

    #[test]
    fn an_agent_sees_its_parent_peers_and_own_subtree() {
        // supervisor > (ci > (lint > (deep > (deeper))), docs > (writer))
        let deeper = node("deeper", vec![]);
        let tree = node(
            "supervisor",
            vec![
                node("ci", vec![node("lint", vec![node("deep", vec![deeper])])]),
                node("docs", vec![node("writer", vec![])]),
            ],
        );
        let view = around(&tree, &h("ci"), 2).unwrap();
        assert_eq!(handles(&view), ["supervisor+0", "ci+0", "lint+0", "deep+1", "docs+1"]);
        let mine = around(&tree, &h("supervisor"), 1).unwrap();
        assert_eq!(handles(&mine), ["supervisor+0", "ci+1", "docs+1"], "the Supervisor's view is its own subtree");
        assert!(around(&tree, &h("stranger"), 2).is_none());
        let deep = around(&tree, &h("ci"), 99).unwrap();
        assert!(handles(&deep).contains(&"deeper+0".to_owned()), "depth is capped, not refused");
    }

    #[test]
    fn direct_reports_come_before_grandchildren() {
        let reports: Vec<TreeNode> = (0..20)
            .map(|i| node(&format!("r{i}"), (0..20).map(|j| node(&format!("g{i}x{j}"), vec![])).collect()))
            .collect();
        let tree = node("supervisor", vec![node("lead", reports)]);
        let view = around(&tree, &h("lead"), 2).unwrap();
        let lead = &view.children[0];
        assert_eq!(lead.children.len(), 20, "every direct report is shown");
        let shown: usize = lead.children.iter().map(|r| r.children.len()).sum();
        assert_eq!(shown + 20 + 2, MAX_AROUND_NODES, "the rest of the budget goes to grandchildren");
    }

    #[test]
    fn a_view_holds_at_most_its_node_budget() {
        let peers: Vec<TreeNode> = (0..1000).map(|i| node(&format!("m{i}"), vec![])).collect();
        let tree = node("supervisor", peers);
        let view = around(&tree, &h("m7"), 2).unwrap();
        assert_eq!(view.children.len() + 1, MAX_AROUND_NODES);
        assert_eq!(view.children[0].handle.as_str(), "m7", "the agent itself always comes first");
        assert_eq!(view.omitted as usize, 1000 - (MAX_AROUND_NODES - 1));
    }

    #[test]
    fn the_supervisor_never_moves() {
        let err = check_reparent(&h("supervisor"), true, &h("a"), &[h("supervisor")]);
        assert_eq!(err.map_err(|e| e.code()), Err(ErrorCode::Forbidden));
    }
}
