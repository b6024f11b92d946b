//! The "name only what exists" lint.
//!
//! For every role, it walks each text the role's sessions can see (the block-0, listed
//! skills and their bodies, rules, the delta of every definition the role runs), skips the
//! lines a `requires:` marker would drop for that role's tools, and reports any word that
//! looks like a native tool (it starts with a tool family prefix) but is not registered for
//! the role. Exact tool and skill names in a role file that match nothing are reported too (a
//! typo hides a tool or a skill). With a `Vocabulary` (what the running code offers) it also
//! reads meaning in backticks: a `snake_case` word must be a tool, an argument of a tool, or a
//! state the code has (a presence, an outcome, a request or run state); a word beside a tool
//! on its line must be an argument of that tool or a state; a `canopy ...` command must exist
//! in the CLI; a channel pattern (`home-<you>`) must use a prefix Canopy creates.
//! It changes nothing and renders nothing.

use std::collections::BTreeMap;
use std::fmt;

use crate::bundle::{Body, Bundle, Mode, glob_match};
use crate::render::{Renderer, requires};

/// The prefixes of Canopy's native tool families.
pub const TOOL_PREFIXES: &[&str] = &[
    "comms_",
    "agents_",
    "tree_",
    "roster_",
    "board_",
    "history_",
    "skill_",
    "rule_",
    "workspace_",
    "runs_",
    "merge_",
    "issues_",
    "checks_",
    "review_",
];

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

/// What the running code offers, for the lint to check prose against. Whoever has the facts
/// hands them in: the daemon the tools' arguments and the states, `canopy bundle check` the
/// CLI's commands too. An empty part is not checked.
#[derive(Debug, Clone, Default)]
pub struct Vocabulary {
    /// Each native tool's argument names.
    pub arguments: BTreeMap<String, Vec<String>>,
    /// Names of states prose may mention: presences, outcomes, request, run and account states.
    pub states: Vec<String>,
    /// Every CLI command path: `canopy approve`, `canopy agents`, `canopy agents create`.
    pub commands: Vec<String>,
    /// The prefixes of channel names Canopy creates: `home-`, `coord-`, `dm-`.
    pub channel_prefixes: Vec<String>,
    /// The keys of `canopy.toml` (`read_write`, `request_ttl`), which prose may name too.
    pub settings: Vec<String>,
}

/// Every finding for `renderer`'s bundle, in file order (tool names only).
pub fn lint(renderer: &Renderer) -> Vec<Finding> {
    lint_with(renderer, &Vocabulary::default())
}

/// Every finding for `renderer`'s bundle, checked against `vocabulary` as well.
pub fn lint_with(renderer: &Renderer, vocabulary: &Vocabulary) -> Vec<Finding> {
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
            scan(file, body, tools, &role.id, vocabulary, &mut findings);
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

/// One line a role's sessions do not see yet: the target contract, kept in place, switched
/// on when the tool it waits for is registered for the role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gated {
    pub role: String,
    pub file: String,
    pub line: usize,
    /// The tools it needs that the role lacks.
    pub waits_for: Vec<String>,
    pub text: String,
}

/// Every line each role's sessions do not see because a tool it `requires` is missing.
pub fn gated(renderer: &Renderer) -> Vec<Gated> {
    let bundle = renderer.bundle();
    let mut out = Vec::new();
    for role in bundle.roles.values() {
        let mut texts: Vec<(String, &Body, Vec<String>)> = Vec::new();
        let block_file = format!("config/prompts/{}/SYSTEM.md", role.block0);
        match role.mode {
            Mode::Replace => {
                let tools = renderer.tools_for(role, None);
                if let Some(block) = bundle.blocks.get(&role.block0) {
                    texts.push((block_file.clone(), block, tools.clone()));
                }
                for skill in bundle.skills.values().filter(|s| role.skills.iter().any(|p| glob_match(p, &s.name))) {
                    texts.push((skill.file.clone(), &skill.body, tools.clone()));
                }
                for rule in bundle.rules.values() {
                    texts.push((rule.file.clone(), &rule.body, tools.clone()));
                }
            }
            Mode::Delta => {
                for d in bundle.definitions.values() {
                    if bundle.role_for_definition(&d.name).is_some_and(|r| r.id == role.id) {
                        let tools = renderer.tools_for(role, Some(d));
                        texts.push((d.file.clone(), &d.body, tools));
                    }
                }
            }
        }
        for (file, body, tools) in texts {
            for (index, line) in body.text.lines().enumerate() {
                if let Some((needed, kept)) = requires(line) {
                    let missing: Vec<String> =
                        needed.iter().filter(|n| !tools.iter().any(|t| t == *n)).map(|n| (*n).to_owned()).collect();
                    if !missing.is_empty() {
                        out.push(Gated {
                            role: role.id.clone(),
                            file: file.clone(),
                            line: body.first_line + index,
                            waits_for: missing,
                            text: kept.trim().to_owned(),
                        });
                    }
                }
            }
        }
    }
    out
}

fn scan(file: &str, body: &Body, tools: &[String], role: &str, vocabulary: &Vocabulary, findings: &mut Vec<Finding>) {
    for (index, line) in body.text.lines().enumerate() {
        let text = match requires(line) {
            Some((needed, kept)) => {
                if !needed.iter().all(|n| tools.iter().any(|t| t == n)) {
                    continue;
                }
                for n in needed.iter().filter(|n| !looks_like_tool(n) && **n != crate::render::NATIVE_TASK_TOOL) {
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
        for message in meaning(text, vocabulary) {
            findings.push(Finding {
                file: file.to_owned(),
                line: body.first_line + index,
                role: role.to_owned(),
                message,
            });
        }
    }
}

/// The spans of `line` between backticks.
fn backticked(line: &str) -> impl Iterator<Item = &str> {
    line.split('`').skip(1).step_by(2)
}

/// What `line` names in backticks that the code does not have.
fn meaning(line: &str, v: &Vocabulary) -> Vec<String> {
    let mut out = Vec::new();
    let spans: Vec<&str> = backticked(line).collect();
    // A call written `tool(a, b)` names its arguments; a tool in backticks puts the words
    // beside it on the line in its scope.
    let named: Vec<&str> = spans
        .iter()
        .filter_map(|s| {
            let name = s.split('(').next().unwrap_or(s);
            v.arguments.contains_key(name).then_some(name)
        })
        .collect();
    let is_argument =
        |w: &str, scope: &[&str]| scope.iter().any(|t| v.arguments.get(*t).is_some_and(|a| a.iter().any(|x| x == w)));
    let is_state = |w: &str| v.states.iter().any(|s| s == w);
    for span in &spans {
        let span = span.trim();
        // `tool(arg, arg)`
        if let Some((name, rest)) = span.split_once('(')
            && let Some(args) = v.arguments.get(name)
        {
            for arg in rest.trim_end_matches(')').split(',').map(str::trim).filter(|a| !a.is_empty()) {
                let arg = arg.split(['=', ':', ' ']).next().unwrap_or(arg);
                if !args.iter().any(|a| a == arg) {
                    out.push(format!("names `{arg}` as an argument of `{name}`, which has no such argument"));
                }
            }
            continue;
        }
        if let Some(command) = span.strip_prefix("canopy ")
            && !v.commands.is_empty()
        {
            check_command(command, v, &mut out);
            continue;
        }
        if !v.channel_prefixes.is_empty()
            && let Some((prefix, _)) = span.trim_start_matches('#').split_once("-<")
            // A branch (`canopy/<you>/run-<id>`) is no channel.
            && !prefix.contains('/')
            && !v.channel_prefixes.iter().any(|p| p.trim_end_matches('-') == prefix)
        {
            out.push(format!(
                "names the channel pattern `{span}`, but Canopy's channels start with {}",
                v.channel_prefixes.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
            ));
            continue;
        }
        let word = span.trim_start_matches('#');
        let plain = !word.is_empty() && word.bytes().all(|b| b.is_ascii_lowercase() || b == b'_' || b.is_ascii_digit());
        if !plain || v.arguments.contains_key(word) || v.arguments.is_empty() {
            continue;
        }
        if word.contains('_') {
            // A snake_case word is code: a tool, an argument, or a state.
            let setting = v.settings.iter().any(|s| s == word);
            if !is_state(word) && !setting && !v.arguments.values().any(|a| a.iter().any(|x| x == word)) {
                out.push(format!("names `{word}`, which is no tool, tool argument, state or setting Canopy has"));
            }
        } else if !named.is_empty() && !is_argument(word, &named) && !is_state(word) && looks_like_argument(line) {
            out.push(format!("names `{word}` beside `{}`, which has no such argument", named.join("`, `")));
        }
    }
    out
}

/// Whether `line` talks about a tool's arguments (a filter or an option), so a plain word
/// beside the tool is meant as one.
fn looks_like_argument(line: &str) -> bool {
    let line = line.to_ascii_lowercase();
    ["filter", "argument", "option", "pass "].iter().any(|w| line.contains(w))
}

fn check_command(command: &str, v: &Vocabulary, out: &mut Vec<String>) {
    let words: Vec<&str> = command
        .split_whitespace()
        .take_while(|w| w.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') && !w.starts_with('-'))
        .collect();
    let Some(first) = words.first() else { return };
    let path1 = format!("canopy {first}");
    if !v.commands.contains(&path1) {
        out.push(format!("names the command `{path1}`, which the CLI does not have"));
        return;
    }
    let group = v.commands.iter().any(|c| c.starts_with(&format!("{path1} ")));
    if let (true, Some(second)) = (group, words.get(1)) {
        let path2 = format!("{path1} {second}");
        if !v.commands.contains(&path2) {
            out.push(format!("names the command `{path2}`, which the CLI does not have"));
        }
    }
}

/// Whether `word` has the shape of a native tool name.
pub fn looks_like_tool(word: &str) -> bool {
    TOOL_PREFIXES.iter().any(|p| word.len() > p.len() && word.starts_with(p))
        && word.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}
