//! The renderer: a pure function of the bundle, the session's facts and its tool set.
//!
//! Replace mode (Managers, the Supervisor): role block, `# Why You're Here`, skills list,
//! always-apply rules, other rules, footer, persona. Delta mode (implementers): the default
//! block-0, the definition's body, the always-apply rules, the footer; when the harness owns its default prompt,
//! only the body, rules and footer are produced and the caller appends them with the harness's own
//! mechanism. Lines carrying a `<!-- requires: tool -->` marker survive only when every
//! tool they name is registered. Sections that depend only on the bundle, the role and the
//! tool set are cached; identity sections are rebuilt each time (they are a few lines).
//! This module reads no files and knows nothing of sessions beyond `Facts`.

use canopy_core::harness::PromptMode;
use std::fmt::Write as _;
use std::sync::Arc;

use dashmap::DashMap;
use sha2::{Digest, Sha256};

use crate::bundle::{Bundle, Definition, Mode, Role, glob_match};

/// Longest mission, project or goal line in `# Why You're Here`, in characters.
pub const ANCESTRY_CAP: usize = 200;

/// What the renderer needs to know about the session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    pub handle: String,
    pub name: String,
    pub role: String,
    /// The parent's handle; `None` for the root.
    pub parent: Option<String>,
    pub home_channel: String,
    pub workspace: String,
    pub cwd: String,
    /// `YYYY-MM-DD`.
    pub date: String,
    pub mission: String,
    pub project: String,
    /// The agent's charter.
    pub goal: String,
    pub persona: Option<String>,
    /// The session's harness has its own subagents (omp's `task` tool), which a role that
    /// delegates natively then uses: its prompt's `requires: task` lines are kept.
    pub native_subagents: bool,
}

/// A rendered prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    /// SHA-256 of `text`, hex.
    pub hash: String,
    pub delivery: PromptMode,
    pub role: String,
    pub mode: Mode,
    pub definition: Option<String>,
    /// Section names in the order they appear.
    pub sections: Vec<&'static str>,
    /// The native tools the session has.
    pub tools: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("no role {0:?} in the bundle, and no `manager` role to fall back on")]
    UnknownRole(String),
    #[error("no subagent definition {0:?} in the bundle (agents/{0}.md)")]
    UnknownDefinition(String),
    #[error("no delta role can run definition {0:?} (add config/roles/implementer.toml)")]
    NoDeltaRole(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    section: &'static str,
    name: String,
    tools: Arc<str>,
}

/// Renders prompts from one bundle; build a new one when the bundle changes.
#[derive(Debug)]
pub struct Renderer {
    bundle: Arc<Bundle>,
    catalog: Vec<String>,
    cache: DashMap<Key, Arc<str>>,
}

impl Renderer {
    /// `catalog` is every native tool Canopy serves.
    pub fn new(bundle: Arc<Bundle>, catalog: &[&str]) -> Renderer {
        Renderer { bundle, catalog: catalog.iter().map(|t| (*t).to_owned()).collect(), cache: DashMap::new() }
    }

    pub fn bundle(&self) -> &Arc<Bundle> {
        &self.bundle
    }

    /// Every native tool Canopy serves.
    pub fn catalog(&self) -> &[String] {
        &self.catalog
    }

    /// The tools a session of `role` (running `definition`, if any) has.
    pub fn tools_for(&self, role: &Role, definition: Option<&Definition>) -> Vec<String> {
        self.catalog
            .iter()
            .filter(|t| role.tools.iter().any(|p| glob_match(p, t)))
            // A role that does not delegate to Canopy runs has no tool to start one.
            .filter(|t| role.delegates_to_canopy() || *t != "agents_run_subagent")
            .filter(|t| {
                definition.and_then(|d| d.tools.as_ref()).is_none_or(|only| only.iter().any(|p| glob_match(p, t)))
            })
            .cloned()
            .collect()
    }

    /// The prompt of a standing agent of `facts.role`.
    pub fn render(&self, facts: &Facts, owns_default_prompt: bool) -> Result<Rendered, RenderError> {
        let role = self.bundle.role(&facts.role).ok_or_else(|| RenderError::UnknownRole(facts.role.clone()))?;
        match role.mode {
            Mode::Replace => Ok(self.replace(role, facts)),
            Mode::Delta => {
                let name = role.definition.as_deref().unwrap_or_default();
                let definition =
                    self.bundle.definitions.get(name).ok_or_else(|| RenderError::UnknownDefinition(name.to_owned()))?;
                Ok(self.delta(role, definition, facts, owns_default_prompt))
            }
        }
    }

    /// The prompt of a subagent run of `definition`.
    pub fn render_run(
        &self,
        definition: &str,
        facts: &Facts,
        owns_default_prompt: bool,
    ) -> Result<Rendered, RenderError> {
        let d = self
            .bundle
            .definitions
            .get(definition)
            .ok_or_else(|| RenderError::UnknownDefinition(definition.to_owned()))?;
        let role =
            self.bundle.role_for_definition(definition).ok_or_else(|| RenderError::NoDeltaRole(definition.into()))?;
        Ok(self.delta(role, d, facts, owns_default_prompt))
    }

    fn replace(&self, role: &Role, facts: &Facts) -> Rendered {
        let mut tools = self.tools_for(role, None);
        if facts.native_subagents && role.delegates_natively() {
            tools.push(NATIVE_TASK_TOOL.to_owned());
        }
        let fp: Arc<str> = tools.join(",").into();
        let mut out = Sections::default();
        out.push("role", self.cached("role", &role.id, &fp, || self.block(&role.block0, &tools)));
        out.push("why_here", why_here(facts));
        out.push("skills", self.cached("skills", &role.id, &fp, || self.skills(role, &tools)));
        out.push("rules", self.cached("rules", &role.id, &fp, || self.rules(&tools)));
        out.push("other_rules", self.cached("other_rules", &role.id, &fp, || self.other_rules(&tools)));
        out.push("footer", footer(facts).into());
        out.push("persona", persona(facts));
        out.finish(PromptMode::Replace, role, None, tools)
    }

    fn delta(&self, role: &Role, definition: &Definition, facts: &Facts, owns_default: bool) -> Rendered {
        let tools = self.tools_for(role, Some(definition));
        let fp: Arc<str> = tools.join(",").into();
        let mut out = Sections::default();
        if !owns_default {
            out.push("default", self.cached("default", &role.block0, &fp, || self.block(&role.block0, &tools)));
        }
        out.push(
            "delta",
            self.cached("delta", &definition.name, &fp, || apply_requires(&definition.body.text, &tools).into()),
        );
        // The always-apply rules bind a Manager's subagents as they bind the Manager.
        out.push("rules", self.cached("rules", &role.id, &fp, || self.rules(&tools)));
        out.push("footer", footer(facts).into());
        let delivery = if owns_default { PromptMode::Append } else { PromptMode::Replace };
        out.finish(delivery, role, Some(definition.name.clone()), tools)
    }

    fn cached(
        &self,
        section: &'static str,
        name: &str,
        tools: &Arc<str>,
        build: impl FnOnce() -> Arc<str>,
    ) -> Arc<str> {
        let key = Key { section, name: name.to_owned(), tools: tools.clone() };
        if let Some(hit) = self.cache.get(&key) {
            return hit.clone();
        }
        let value = build();
        self.cache.insert(key, value.clone());
        value
    }

    fn block(&self, name: &str, tools: &[String]) -> Arc<str> {
        self.bundle.blocks.get(name).map(|b| apply_requires(&b.text, tools)).unwrap_or_default().into()
    }

    fn skills(&self, role: &Role, tools: &[String]) -> Arc<str> {
        if !has(tools, "skill_read") {
            return "".into();
        }
        let listed: Vec<_> =
            self.bundle.skills.values().filter(|s| role.skills.iter().any(|p| glob_match(p, &s.name))).collect();
        if listed.is_empty() {
            return "".into();
        }
        let mut text = String::from(
            "# Skills\n\nEach skill is a playbook. When your work matches one, read its body with `skill_read` first.\n\n",
        );
        for s in listed {
            // Writing to a String cannot fail.
            let _ = writeln!(text, "- `{}`: {}", s.name, one_line(&apply_requires(&s.description, tools)));
        }
        text.into()
    }

    fn rules(&self, tools: &[String]) -> Arc<str> {
        let always: Vec<_> = self.bundle.rules.values().filter(|r| r.always_apply).collect();
        if always.is_empty() {
            return "".into();
        }
        let mut text = String::from("# Rules\n\nThese always apply.\n");
        for r in always {
            // Writing to a String cannot fail.
            let _ = write!(text, "\n## {}\n\n{}\n", r.name, apply_requires(&r.body.text, tools).trim());
        }
        text.into()
    }

    fn other_rules(&self, tools: &[String]) -> Arc<str> {
        let others: Vec<_> = self.bundle.rules.values().filter(|r| !r.always_apply).collect();
        if others.is_empty() || !has(tools, "rule_read") {
            return "".into();
        }
        let mut text = String::from(
            "# Other Rules\n\nRead one with `rule_read` when its files or description match your work.\n\n",
        );
        for r in others {
            let globs = match r.globs.is_empty() {
                true => String::new(),
                false => format!(" ({})", r.globs.iter().map(|g| format!("`{g}`")).collect::<Vec<_>>().join(", ")),
            };
            // Writing to a String cannot fail.
            let _ = writeln!(text, "- `{}`{globs}: {}", r.name, one_line(&r.description));
        }
        text.into()
    }
}

fn has(tools: &[String], tool: &str) -> bool {
    tools.iter().any(|t| t == tool)
}

/// Sections in order; empty ones are left out entirely.
#[derive(Default)]
struct Sections {
    parts: Vec<(&'static str, Arc<str>)>,
}

impl Sections {
    fn push(&mut self, name: &'static str, text: Arc<str>) {
        if !text.trim().is_empty() {
            self.parts.push((name, text));
        }
    }

    fn finish(self, delivery: PromptMode, role: &Role, definition: Option<String>, tools: Vec<String>) -> Rendered {
        let mut text = String::with_capacity(self.parts.iter().map(|(_, t)| t.len() + 2).sum());
        for (i, (_, part)) in self.parts.iter().enumerate() {
            if i > 0 {
                text.push_str("\n\n");
            }
            text.push_str(part.trim_end());
        }
        text.push('\n');
        Rendered {
            hash: hash(&text),
            text,
            delivery,
            role: role.id.clone(),
            mode: role.mode,
            definition,
            sections: self.parts.iter().map(|(n, _)| *n).collect(),
            tools,
        }
    }
}

/// SHA-256 of `text`, hex.
pub fn hash(text: &str) -> String {
    Sha256::digest(text.as_bytes()).iter().fold(String::with_capacity(64), |mut s, b| {
        // Writing to a String cannot fail.
        let _ = write!(s, "{b:02x}");
        s
    })
}

const MARKER: &str = "<!-- requires:";

/// The name a `requires:` line gives the harness's own subagent tool, whatever the harness
/// calls it (omp's `task`, Claude Code's `Agent`): a session has it when its role delegates
/// natively on a harness with subagents of its own.
pub const NATIVE_TASK_TOOL: &str = "task";

impl Renderer {
    /// The subagent definitions for a harness's own mechanism: each `agents/<name>.md` as
    /// (name, description, body), its body with the `requires:` lines a parent with `tools`
    /// keeps.
    pub fn native_definitions(&self, tools: &[String]) -> Vec<(String, String, String)> {
        self.bundle
            .definitions
            .values()
            .map(|d| (d.name.clone(), d.description.clone(), apply_requires(&d.body.text, tools).trim().to_owned()))
            .collect()
    }
}

/// The tools a line's `<!-- requires: a, b -->` marker names, and the line without it.
pub fn requires(line: &str) -> Option<(Vec<&str>, &str)> {
    let start = line.find(MARKER)?;
    let rest = &line[start + MARKER.len()..];
    let end = rest.find("-->")?;
    let tools = rest[..end].split(',').map(str::trim).filter(|t| !t.is_empty()).collect();
    Some((tools, line[..start].trim_end()))
}

/// Drops lines whose required tools are not all in `tools`, and strips the markers.
pub fn apply_requires(text: &str, tools: &[String]) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        match requires(line) {
            None => out.push_str(line),
            Some((needed, kept)) => {
                if needed.iter().all(|n| has(tools, n)) {
                    out.push_str(kept);
                    if line.ends_with('\n') {
                        out.push('\n');
                    }
                }
            }
        }
    }
    out
}

/// `text` on one line, whitespace collapsed.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` on one line, at most `ANCESTRY_CAP` characters, with an ellipsis when cut.
pub fn cap(text: &str) -> String {
    let line = one_line(text);
    if line.chars().count() <= ANCESTRY_CAP {
        return line;
    }
    let mut cut: String = line.chars().take(ANCESTRY_CAP - 1).collect();
    cut.truncate(cut.trim_end().len());
    cut.push('…');
    cut
}

fn why_here(facts: &Facts) -> Arc<str> {
    let lines: Vec<String> = [("Mission", &facts.mission), ("Project", &facts.project), ("Goal", &facts.goal)]
        .into_iter()
        .filter(|(_, v)| !v.trim().is_empty())
        .map(|(k, v)| format!("- {k}: {}", cap(v)))
        .collect();
    match lines.is_empty() {
        true => "".into(),
        false => format!("# Why You're Here\n\n{}\n", lines.join("\n")).into(),
    }
}

fn footer(facts: &Facts) -> String {
    let parent = match &facts.parent {
        Some(p) => format!("@{p}"),
        None => "none (you are the root)".into(),
    };
    let name = match facts.name.is_empty() {
        true => String::new(),
        false => format!(" ({})", one_line(&facts.name)),
    };
    format!(
        "# This Session\n\n- Agent: @{}{name}, role {}\n- Parent: {parent}\n- Home channel: #{}\n- Workspace: {}\n- Working directory: {}\n- Date: {}\n",
        facts.handle, facts.role, facts.home_channel, facts.workspace, facts.cwd, facts.date
    )
}

fn persona(facts: &Facts) -> Arc<str> {
    match facts.persona.as_deref().map(str::trim) {
        Some(p) if !p.is_empty() => format!("# Persona\n\n{p}\n").into(),
        _ => "".into(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on purpose")]

    use super::*;

    #[test]
    fn requires_markers_keep_or_drop_lines() {
        let text = "a\n- use `x_y` <!-- requires: x_y -->\n- both <!-- requires: x_y, z_w -->\nb\n";
        assert_eq!(apply_requires(text, &["x_y".into()]), "a\n- use `x_y`\nb\n");
        assert_eq!(apply_requires(text, &["x_y".into(), "z_w".into()]), "a\n- use `x_y`\n- both\nb\n");
        assert_eq!(apply_requires(text, &[]), "a\nb\n");
    }

    #[test]
    fn the_cap_is_two_hundred_characters_with_an_ellipsis() {
        let long = "word ".repeat(100);
        let capped = cap(&long);
        assert!(capped.chars().count() <= ANCESTRY_CAP, "{}", capped.chars().count());
        assert!(capped.ends_with('…'));
        let exact = "x".repeat(ANCESTRY_CAP);
        assert_eq!(cap(&exact), exact);
        let over = "y".repeat(ANCESTRY_CAP + 1);
        assert_eq!(cap(&over).chars().count(), ANCESTRY_CAP);
        assert_eq!(cap("two\nlines"), "two lines");
    }
}
