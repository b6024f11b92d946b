//! Loading and validating a prompt bundle.
//!
//! A bundle is a directory holding `config/prompts/<name>/SYSTEM.md` (block-0s),
//! `config/roles/<role>.toml` or `.yaml`, `agents/<name>.md` (subagent definitions),
//! `skills/<name>/SKILL.md` and `rules/<name>.md`. A file there that is none of these is an
//! error naming it, never skipped. It is read into a map of relative path to text (from disk, or the
//! copy embedded in the binary) and parsed from that map, so both sources take one path.
//! Every error names the file and line. Names are checked against one grammar before any
//! path is built from them, so nothing reaches outside the bundle; symlinks that leave the
//! directory are refused. `README.md` files are documentation and ignored. This module
//! does not render anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::BundleError;
use crate::frontmatter;

/// Largest bundle file read, in bytes.
pub const MAX_FILE_BYTES: u64 = 256 * 1024;
/// Most files a bundle may hold.
pub const MAX_FILES: usize = 5000;

/// Whether a role's block-0 replaces the harness's prompt or its delta is spliced into a
/// default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    Replace,
    Delta,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Replace => "replace",
            Mode::Delta => "delta",
        }
    }
}

/// One `config/roles/<id>.toml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    pub id: String,
    pub file: String,
    /// The block-0 name (`config/prompts/<block0>/SYSTEM.md`).
    pub block0: String,
    pub mode: Mode,
    /// Glob patterns over native tool names.
    pub tools: Vec<String>,
    /// Glob patterns over skill names.
    pub skills: Vec<String>,
    pub harness: String,
    pub model: String,
    /// The harness's own built-in tools the session may use (Claude Code: `Bash`, `Read`,
    /// `Edit`...); empty: none, only Canopy's.
    pub harness_tools: Vec<String>,
    /// Delta roles: the subagent definition whose body is the delta.
    pub definition: Option<String>,
    /// How its sessions delegate: `canopy` (Canopy's `agents_run_subagent` runs), `native`
    /// (the harness's own subagents, where it has them: omp's `task`), or both.
    pub delegate: Vec<String>,
}

impl Role {
    /// Whether its sessions may brief Canopy runs.
    pub fn delegates_to_canopy(&self) -> bool {
        self.delegate.iter().any(|d| d == "canopy")
    }

    /// Whether its sessions get the harness's own subagents, on a harness that has them.
    pub fn delegates_natively(&self) -> bool {
        self.delegate.iter().any(|d| d == "native")
    }
}

/// One `agents/<name>.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition {
    pub name: String,
    pub file: String,
    pub description: String,
    /// Narrows the role's tools when set.
    pub tools: Option<Vec<String>>,
    pub model: Option<String>,
    pub body: Body,
}

/// One `skills/<name>/SKILL.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub name: String,
    pub file: String,
    pub description: String,
    pub body: Body,
}

/// One `rules/<name>.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: String,
    pub file: String,
    pub description: String,
    pub always_apply: bool,
    pub globs: Vec<String>,
    pub body: Body,
}

/// Markdown text with the line it starts on in its file (for lint messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Body {
    pub text: String,
    pub first_line: usize,
}

/// A parsed, validated bundle.
#[derive(Debug, Clone, Default)]
pub struct Bundle {
    /// Where it came from (a directory, or `embedded`).
    pub source: String,
    pub blocks: BTreeMap<String, Body>,
    pub roles: BTreeMap<String, Role>,
    pub definitions: BTreeMap<String, Definition>,
    pub skills: BTreeMap<String, Skill>,
    pub rules: BTreeMap<String, Rule>,
}

/// The name grammar for roles, block-0s, definitions, skills and rules: what a file or
/// directory name may be.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    match ok {
        true => Ok(()),
        false => Err(format!(
            "{name:?} is not a valid name (1 to 64 of a-z, 0-9, '-', '_', starting with a letter or digit)"
        )),
    }
}

impl Bundle {
    /// The bundle compiled into this binary (the repository's own).
    pub fn embedded() -> Result<Bundle, BundleError> {
        let files = crate::embedded::FILES.iter().map(|(p, t)| ((*p).to_owned(), (*t).to_owned())).collect();
        Bundle::parse("embedded", files)
    }

    /// The files of the embedded bundle, relative path and text (to start a bundle on disk).
    pub fn embedded_files() -> impl Iterator<Item = (&'static str, &'static str)> {
        crate::embedded::FILES.iter().copied()
    }

    /// Reads the bundle under `root`.
    pub fn load(root: &Path) -> Result<Bundle, BundleError> {
        let files = read_files(root)?;
        Bundle::parse(&root.display().to_string(), files)
    }

    /// Parses a bundle from relative path to text.
    pub fn parse(source: &str, files: BTreeMap<String, String>) -> Result<Bundle, BundleError> {
        let mut bundle = Bundle { source: source.to_owned(), ..Bundle::default() };
        for (path, text) in &files {
            let parts: Vec<&str> = path.split('/').collect();
            match parts.as_slice() {
                [.., "README.md"] => {}
                ["config", "prompts", name, "SYSTEM.md"] => {
                    check_name(name).map_err(|m| BundleError::at(path, 0, m))?;
                    bundle.blocks.insert((*name).to_owned(), without_note(text, 1));
                }
                ["config", "roles", file] => {
                    let role = parse_role(path, file, text)?;
                    bundle.roles.insert(role.id.clone(), role);
                }
                ["agents", file] => {
                    let d = parse_definition(path, file, text)?;
                    bundle.definitions.insert(d.name.clone(), d);
                }
                ["skills", dir, "SKILL.md"] => {
                    let s = parse_skill(path, dir, text)?;
                    bundle.skills.insert(s.name.clone(), s);
                }
                ["rules", file] => {
                    let r = parse_rule(path, file, text)?;
                    bundle.rules.insert(r.name.clone(), r);
                }
                _ => {
                    return Err(BundleError::at(
                        path,
                        0,
                        "is not a bundle file (expected config/prompts/<name>/SYSTEM.md, config/roles/<role>.toml or .yaml, \
                         agents/<name>.md, skills/<name>/SKILL.md or rules/<name>.md)"
                            .into(),
                    ));
                }
            }
        }
        bundle.cross_check()?;
        Ok(bundle)
    }

    fn cross_check(&self) -> Result<(), BundleError> {
        for role in self.roles.values() {
            if !self.blocks.contains_key(&role.block0) {
                return Err(BundleError::at(
                    &role.file,
                    0,
                    format!("block0 {:?}: there is no config/prompts/{}/SYSTEM.md", role.block0, role.block0),
                ));
            }
            match (&role.mode, &role.definition) {
                (Mode::Delta, None) => {
                    return Err(BundleError::at(&role.file, 0, "a delta role needs `definition`".into()));
                }
                (_, Some(d)) if !self.definitions.contains_key(d) => {
                    return Err(BundleError::at(&role.file, 0, format!("definition {d:?}: there is no agents/{d}.md")));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The role file for `role`, or the `manager` one for roles without their own.
    pub fn role(&self, role: &str) -> Option<&Role> {
        self.roles.get(role).or_else(|| self.roles.get("manager"))
    }

    /// The delta role a run of `definition` uses: the one naming it, else `implementer`.
    pub fn role_for_definition(&self, definition: &str) -> Option<&Role> {
        self.roles
            .values()
            .find(|r| r.mode == Mode::Delta && r.definition.as_deref() == Some(definition))
            .or_else(|| self.roles.get("implementer").filter(|r| r.mode == Mode::Delta))
    }
}

/// Glob matching with `*` (any run) and `?` (one character), for tool, skill and path names.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleFile {
    id: String,
    block0: String,
    mode: String,
    #[serde(default)]
    tools: Vec<String>,
    #[serde(default)]
    skills: Vec<String>,
    #[serde(default)]
    harness: String,
    #[serde(default)]
    model: String,
    #[serde(default)]
    harness_tools: Vec<String>,
    definition: Option<String>,
    delegate: Option<Vec<String>>,
}

/// A YAML role: the TOML role's keys, read with the frontmatter subset.
fn yaml_role(path: &str, text: &str) -> Result<RoleFile, BundleError> {
    let doc = frontmatter::document(path, text)?;
    doc.only(
        path,
        &["id", "block0", "mode", "tools", "skills", "harness", "model", "harness_tools", "definition", "delegate"],
    )?;
    Ok(RoleFile {
        id: doc.string(path, "id")?,
        block0: doc.string(path, "block0")?,
        mode: doc.string(path, "mode")?,
        tools: doc.optional_list(path, "tools")?.unwrap_or_default(),
        skills: doc.optional_list(path, "skills")?.unwrap_or_default(),
        harness: doc.optional_string(path, "harness")?.unwrap_or_default(),
        model: doc.optional_string(path, "model")?.unwrap_or_default(),
        harness_tools: doc.optional_list(path, "harness_tools")?.unwrap_or_default(),
        definition: doc.optional_string(path, "definition")?,
        delegate: doc.optional_list(path, "delegate")?,
    })
}

fn stem<'a>(path: &str, file: &'a str, ext: &str) -> Result<&'a str, BundleError> {
    let stem = file.strip_suffix(ext).ok_or_else(|| BundleError::at(path, 0, format!("must end in {ext}")))?;
    check_name(stem).map_err(|m| BundleError::at(path, 0, m))?;
    Ok(stem)
}

/// A role file, TOML or YAML (the same keys).
fn parse_role(path: &str, file: &str, text: &str) -> Result<Role, BundleError> {
    let (id, raw) = if file.ends_with(".toml") {
        let id = stem(path, file, ".toml")?;
        let raw: RoleFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(0, |s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            BundleError::at(path, line, e.message().to_owned())
        })?;
        (id, raw)
    } else {
        let ext = if file.ends_with(".yml") { ".yml" } else { ".yaml" };
        (stem(path, file, ext)?, yaml_role(path, text)?)
    };
    let line_of = |key: &str| text.lines().position(|l| l.trim_start().starts_with(key)).map_or(0, |i| i + 1);
    let field = |key: &str, m: String| BundleError::at(path, line_of(key), format!("`{key}`: {m}"));
    if raw.id != id {
        return Err(field("id", format!("{:?} must equal the file name ({id:?})", raw.id)));
    }
    // `block0` may be a name or the path `config/prompts/<name>/SYSTEM.md`.
    let block0 = raw
        .block0
        .strip_prefix("config/prompts/")
        .and_then(|rest| rest.strip_suffix("/SYSTEM.md"))
        .unwrap_or(&raw.block0)
        .to_owned();
    check_name(&block0).map_err(|m| field("block0", m))?;
    let mode = match raw.mode.as_str() {
        "replace" => Mode::Replace,
        "delta" => Mode::Delta,
        other => return Err(field("mode", format!("{other:?} is not one of: replace, delta"))),
    };
    for (key, patterns) in [("tools", &raw.tools), ("skills", &raw.skills)] {
        for p in patterns {
            let bare = p.replace(['*', '?'], "");
            if !bare.is_empty() && check_name(&bare).is_err() {
                return Err(field(key, format!("{p:?} is not a name pattern")));
            }
        }
    }
    if let Some(d) = &raw.definition {
        check_name(d).map_err(|m| field("definition", m))?;
    }
    for tool in &raw.harness_tools {
        let ok = tool.len() <= 64
            && tool.starts_with(|c: char| c.is_ascii_alphabetic())
            && tool.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(field("harness_tools", format!("{tool:?} is not a tool name (letters, digits, '_')")));
        }
    }
    let delegate = raw.delegate.unwrap_or_else(|| vec!["canopy".to_owned()]);
    if let Some(bad) = delegate.iter().find(|d| !["canopy", "native"].contains(&d.as_str())) {
        return Err(field("delegate", format!("{bad:?} is not one of: canopy, native")));
    }
    Ok(Role {
        delegate,
        id: id.to_owned(),
        file: path.to_owned(),
        block0,
        mode,
        tools: raw.tools,
        skills: raw.skills,
        harness: raw.harness,
        model: raw.model,
        harness_tools: raw.harness_tools,
        definition: raw.definition,
    })
}

fn body(fm: &frontmatter::Frontmatter, text: &str) -> Body {
    without_note(text, fm.body_line)
}

/// How a prompt file opens: the authors' note on gated lines, which no session reads.
pub const NOTE_PREFIX: &str = "<!-- flip:";

/// The note every shipped and imported prompt file opens with (its first body line).
pub const NOTE: &str = "<!-- flip: a line ending in a requires marker naming a tool is the target contract, kept in place: roles without that tool do not see it, and it switches on once the tool is theirs. `canopy bundle check --gated` lists, per role, each line still waiting. -->";

/// `text` (starting at `first_line`) without its leading authors' note (`<!-- flip: ... -->`,
/// one line), which says how gated lines work and is not part of any prompt.
fn without_note(text: &str, first_line: usize) -> Body {
    match text.split_once('\n') {
        Some((first, rest)) if first.starts_with(NOTE_PREFIX) && first.trim_end().ends_with("-->") => {
            Body { text: rest.to_owned(), first_line: first_line + 1 }
        }
        _ => Body { text: text.to_owned(), first_line },
    }
}

/// The frontmatter's `name` must equal `expected`, the file or directory name (`what`) the
/// definition or skill is found by; a mismatch names the line.
fn require_name(fm: &frontmatter::Frontmatter, path: &str, expected: &str, what: &str) -> Result<(), BundleError> {
    let declared = fm.string(path, "name")?;
    if declared != expected {
        let line = fm.fields.get("name").map_or(0, |(_, l)| *l);
        return Err(BundleError::at(path, line, format!("name {declared:?} must equal the {what} ({expected:?})")));
    }
    Ok(())
}

fn parse_definition(path: &str, file: &str, text: &str) -> Result<Definition, BundleError> {
    let name = stem(path, file, ".md")?;
    let (fm, rest) = frontmatter::split(path, text)?;
    fm.only(path, &["name", "description", "tools", "model"])?;
    require_name(&fm, path, name, "file name")?;
    Ok(Definition {
        name: name.to_owned(),
        file: path.to_owned(),
        description: fm.string(path, "description")?,
        tools: fm.optional_list(path, "tools")?,
        model: fm.optional_string(path, "model")?,
        body: body(&fm, rest),
    })
}

fn parse_skill(path: &str, dir: &str, text: &str) -> Result<Skill, BundleError> {
    check_name(dir).map_err(|m| BundleError::at(path, 0, m))?;
    let (fm, rest) = frontmatter::split(path, text)?;
    fm.only(path, &["name", "description"])?;
    require_name(&fm, path, dir, "directory name")?;
    Ok(Skill {
        name: dir.to_owned(),
        file: path.to_owned(),
        description: fm.string(path, "description")?,
        body: body(&fm, rest),
    })
}

fn parse_rule(path: &str, file: &str, text: &str) -> Result<Rule, BundleError> {
    let name = stem(path, file, ".md")?;
    let (fm, rest) = frontmatter::split(path, text)?;
    fm.only(path, &["description", "alwaysApply", "globs"])?;
    Ok(Rule {
        name: name.to_owned(),
        file: path.to_owned(),
        description: fm.string(path, "description")?,
        always_apply: fm.optional_bool(path, "alwaysApply")?.unwrap_or(false),
        globs: fm.optional_list(path, "globs")?.unwrap_or_default(),
        body: body(&fm, rest),
    })
}

/// Reads every bundle file under `root` into relative path to text. Only the bundle's own
/// directories are walked; a file or symlink resolving outside `root` is an error.
fn read_files(root: &Path) -> Result<BTreeMap<String, String>, BundleError> {
    let canonical_root = root
        .canonicalize()
        .map_err(|e| BundleError::at(&root.display().to_string(), 0, format!("cannot open the bundle: {e}")))?;
    let mut files = BTreeMap::new();
    for dir in ["config/prompts", "config/roles", "agents", "skills", "rules"] {
        walk(&canonical_root, &canonical_root.join(dir), 0, &mut files)?;
    }
    Ok(files)
}

fn walk(root: &Path, dir: &Path, depth: usize, files: &mut BTreeMap<String, String>) -> Result<(), BundleError> {
    let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).to_string_lossy().replace('\\', "/");
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(BundleError::at(&rel(dir), 0, format!("cannot read: {e}"))),
    };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let name = rel(&path);
        let real = path.canonicalize().map_err(|e| BundleError::at(&name, 0, format!("cannot read: {e}")))?;
        if !real.starts_with(root) {
            return Err(BundleError::at(&name, 0, "points outside the bundle".into()));
        }
        if real.is_dir() {
            if depth >= 2 {
                return Err(BundleError::at(&name, 0, "is nested too deep for a bundle".into()));
            }
            walk(root, &path, depth + 1, files)?;
            continue;
        }
        if path.file_name().is_some_and(|f| f == ".gitkeep") {
            continue;
        }
        if !matches!(path.extension().and_then(|e| e.to_str()), Some("md" | "toml" | "yaml" | "yml")) {
            return Err(BundleError::at(
                &name,
                0,
                "is not a bundle file (bundles hold .md files, and .toml or .yaml role files); move it out".into(),
            ));
        }
        let size = real.metadata().map(|m| m.len()).unwrap_or(0);
        if size > MAX_FILE_BYTES {
            return Err(BundleError::at(
                &name,
                0,
                format!("is {size} bytes; bundle files are at most {MAX_FILE_BYTES}"),
            ));
        }
        if files.len() >= MAX_FILES {
            return Err(BundleError::at(&name, 0, format!("a bundle holds at most {MAX_FILES} files")));
        }
        let text =
            std::fs::read_to_string(&real).map_err(|e| BundleError::at(&name, 0, format!("cannot read: {e}")))?;
        files.insert(name, text);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on purpose")]

    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*", "comms_post_message"));
        assert!(glob_match("comms_*", "comms_post_message"));
        assert!(!glob_match("comms_*", "board_pin"));
        assert!(glob_match("board_pi?", "board_pin"));
        assert!(!glob_match("", "x"));
    }

    #[test]
    fn names_cannot_escape() {
        for bad in ["..", "../x", "a/b", "", "X", "-x", ".hidden"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        let files = BTreeMap::from([("agents/../evil.md".to_owned(), "---\nname: x\n---\n".to_owned())]);
        assert!(Bundle::parse("t", files).is_err());
    }
}
