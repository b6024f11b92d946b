//! The "name only what exists" lint.
//!
//! For every role, it walks each text the role's sessions can see (the block-0, listed
//! skills and their bodies, rules, the delta of every definition the role runs), skips the
//! lines a `requires:` marker would drop for that role's tools, and reports any word that
//! looks like a native tool (it starts with a tool family prefix) but is not registered for
//! the role. Exact tool and skill names in a role file that match nothing are reported too (a
//! typo hides a tool or a skill).
//! It changes nothing and renders nothing.

use std::fmt;

use crate::bundle::{Body, Bundle, Mode, glob_match};
use crate::render::{Renderer, requires};

/// The prefixes of Canopy's native tool families.
pub const TOOL_PREFIXES: &[&str] = &["comms_", "agents_", "tree_", "roster_", "board_", "history_", "skill_", "rule_"];

/// One problem the lint found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub file: String,
    pub line: usize,
    pub role: String,
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (role {})", crate::location(&self.file, self.line), self.message, self.role)
    }
}

/// Every finding for `renderer`'s bundle, in file order.
pub fn lint(renderer: &Renderer) -> Vec<Finding> {
    let bundle: &Bundle = renderer.bundle();
    let mut findings = Vec::new();
    for role in bundle.roles.values() {
        // An exact name that is no tool is a typo; a glob may name a family still empty.
        for pattern in role.tools.iter().filter(|p| !p.contains(['*', '?'])) {
            if !renderer.catalog().iter().any(|t| glob_match(pattern, t)) {
                findings.push(Finding {
                    file: role.file.clone(),
                    line: 0,
                    role: role.id.clone(),
                    message: format!("tools pattern {pattern:?} matches no native tool"),
                });
            }
        }
        for pattern in role.skills.iter().filter(|p| !p.contains(['*', '?'])) {
            if !bundle.skills.contains_key(pattern) {
                findings.push(Finding {
                    file: role.file.clone(),
                    line: 0,
                    role: role.id.clone(),
                    message: format!("skills lists {pattern:?}, but there is no skills/{pattern}/SKILL.md"),
                });
            }
        }
        let mut check = |file: &str, body: &Body, tools: &[String]| {
            scan(file, body, tools, &role.id, &mut findings);
        };
        let block_file = format!("config/prompts/{}/SYSTEM.md", role.block0);
        match role.mode {
            Mode::Replace => {
                let tools = renderer.tools_for(role, None);
                if let Some(block) = bundle.blocks.get(&role.block0) {
                    check(&block_file, block, &tools);
                }
                for skill in bundle.skills.values().filter(|s| role.skills.iter().any(|p| glob_match(p, &s.name))) {
                    let description = Body { text: skill.description.clone(), first_line: 2 };
                    check(&skill.file, &description, &tools);
                    check(&skill.file, &skill.body, &tools);
                }
                for rule in bundle.rules.values() {
                    let description = Body { text: rule.description.clone(), first_line: 2 };
                    check(&rule.file, &description, &tools);
                    check(&rule.file, &rule.body, &tools);
                }
            }
            Mode::Delta => {
                let runs = bundle
                    .definitions
                    .values()
                    .filter(|d| bundle.role_for_definition(&d.name).is_some_and(|r| r.id == role.id));
                for definition in runs {
                    let tools = renderer.tools_for(role, Some(definition));
                    if let Some(block) = bundle.blocks.get(&role.block0) {
                        check(&block_file, block, &tools);
                    }
                    check(&definition.file, &definition.body, &tools);
                }
            }
        }
    }
    findings.sort_by(|a, b| (&a.file, a.line, &a.role, &a.message).cmp(&(&b.file, b.line, &b.role, &b.message)));
    findings.dedup();
    findings
}

fn scan(file: &str, body: &Body, tools: &[String], role: &str, findings: &mut Vec<Finding>) {
    for (index, line) in body.text.lines().enumerate() {
        let text = match requires(line) {
            Some((needed, kept)) => {
                if !needed.iter().all(|n| tools.iter().any(|t| t == n)) {
                    continue;
                }
                for n in needed.iter().filter(|n| !looks_like_tool(n)) {
                    findings.push(Finding {
                        file: file.to_owned(),
                        line: body.first_line + index,
                        role: role.to_owned(),
                        message: format!("the requires marker names {n:?}, which is not a native tool name"),
                    });
                }
                kept
            }
            None => line,
        };
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if looks_like_tool(word) && !tools.iter().any(|t| t == word) {
                findings.push(Finding {
                    file: file.to_owned(),
                    line: body.first_line + index,
                    role: role.to_owned(),
                    message: format!("names the tool `{word}`, which is not registered for this role"),
                });
            }
        }
    }
}

/// Whether `word` has the shape of a native tool name.
pub fn looks_like_tool(word: &str) -> bool {
    TOOL_PREFIXES.iter().any(|p| word.len() > p.len() && word.starts_with(p))
        && word.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}
