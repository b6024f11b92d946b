//! `canopy bundle import --from DIR`: a user's existing agent configuration, brought into a
//! prompt bundle so a new tree starts with what the user already relies on.
//!
//! Reads Claude Code's `.claude/skills/*/SKILL.md` (skills), `.claude/agents/*.md` (subagent
//! definitions) and `CLAUDE.md`, Cursor's `.cursor/rules/*.mdc` (rules), `AGENTS.md`, and the
//! MCP server lists in `.mcp.json` and `.cursor/mcp.json`. Writes skills, rules and
//! definitions in the bundle's own format (never over a file that exists), keeps the MCP
//! servers in `imported-mcp-servers.json` beside the bundle (sessions reach Canopy's tools;
//! other servers belong in a harness's own configuration), runs the lint, and says what it
//! could not convert and why. Owns the conversion only; the bundle format is `canopy_prompt`'s.

use std::path::{Path, PathBuf};

use canopy_config::{Config, DataDir};

use crate::output;
use crate::writer::{errln, outln};

/// What one import did.
#[derive(Debug, Default, serde::Serialize)]
struct Report {
    bundle: String,
    written: Vec<String>,
    skipped: Vec<Skipped>,
    problems: Vec<String>,
}

#[derive(Debug, serde::Serialize)]
struct Skipped {
    what: String,
    why: String,
}

impl Report {
    fn skip(&mut self, what: impl Into<String>, why: impl Into<String>) {
        self.skipped.push(Skipped { what: what.into(), why: why.into() });
    }
}

/// Runs the import and prints the report; exit 1 when the result does not pass the check.
pub async fn run(dir: &DataDir, json: bool, from: &Path, bundle: Option<PathBuf>) -> u8 {
    let target = match bundle {
        Some(path) => path,
        None => match Config::load(&dir.config()) {
            Ok(config) if !config.prompts.bundle.trim().is_empty() => {
                canopy_config::paths::relative_to_project(dir.root(), &config.prompts.bundle)
            }
            Ok(_) => {
                return crate::exit::fail_usage(
                    json,
                    "bundle",
                    "the workspace uses the embedded bundle: pass --bundle DIR (and set [prompts] bundle to it)",
                );
            }
            Err(e) => return crate::exit::fail_usage(json, &e.key, &e.to_string()),
        },
    };
    if !from.is_dir() {
        return crate::exit::fail_usage(json, "from", &format!("{} is not a directory", from.display()));
    }
    let mut report = Report { bundle: target.display().to_string(), ..Report::default() };
    if let Err(e) = import(from, &target, &mut report) {
        report.problems.push(e);
    }
    if report.problems.is_empty() {
        let source = canopy_daemon::bundle::BundleSource::Dir(target.clone());
        if let Err(problems) = canopy_daemon::bundle::check(&source, crate::args::cli_commands()) {
            report.problems = problems;
        }
    }
    if json {
        output::json(&report);
    } else {
        outln!("imported into {}: {} file(s) written", report.bundle, report.written.len());
        for w in &report.written {
            outln!("  wrote   {w}");
        }
        for s in &report.skipped {
            outln!("  skipped {}: {}", s.what, s.why);
        }
        match report.problems.is_empty() {
            true => outln!("the bundle passes `canopy bundle check`"),
            false => report.problems.iter().for_each(|p| errln!("  problem {p}")),
        }
    }
    u8::from(!report.problems.is_empty())
}

fn import(from: &Path, target: &Path, report: &mut Report) -> Result<(), String> {
    let root = from.canonicalize().map_err(|e| format!("{}: {e}", from.display()))?;
    // A new bundle starts as a copy of the embedded one, so it has every role it needs.
    if !target.join("config/roles").is_dir() {
        for (path, text) in canopy_prompt::Bundle::embedded_files() {
            write(target, path, text, report)?;
        }
    }
    import_skills(&root, from, target, report)?;
    import_agents(&root, from, target, report)?;
    import_instructions(&root, from, target, report)?;
    import_cursor_rules(&root, from, target, report)?;
    import_mcp_servers(&root, from, target, report)
}

/// Claude Code's skills (`.claude/skills/*/SKILL.md`), as bundle skills.
fn import_skills(root: &Path, from: &Path, target: &Path, report: &mut Report) -> Result<(), String> {
    for (dir, file) in entries(&from.join(".claude/skills")) {
        let path = dir.join("SKILL.md");
        if file.is_empty() || !path.is_file() {
            continue;
        }
        let text = read(root, &path)?;
        let (fields, body) = frontmatter(&text);
        let name = fields.get("name").cloned().unwrap_or_else(|| file.clone());
        let Some(name) = bundle_name(&name) else {
            report.skip(path.display().to_string(), format!("{name:?} cannot be a skill name"));
            continue;
        };
        let description = fields.get("description").cloned().unwrap_or_else(|| format!("Imported skill {name}."));
        note_extra(&path, &fields, &["name", "description"], report);
        let out = format!("---\nname: {name}\ndescription: {}\n---\n{}", quoted(&description), gate_note(body));
        write(target, &format!("skills/{name}/SKILL.md"), &out, report)?;
    }
    Ok(())
}

/// Claude Code's subagents (`.claude/agents/*.md`), as subagent definitions; their harness
/// tools are reported, not converted.
fn import_agents(root: &Path, from: &Path, target: &Path, report: &mut Report) -> Result<(), String> {
    for (path, stem) in files_with(&from.join(".claude/agents"), "md") {
        let text = read(root, &path)?;
        let (fields, body) = frontmatter(&text);
        let Some(name) = bundle_name(fields.get("name").unwrap_or(&stem)) else {
            report.skip(path.display().to_string(), "its name cannot be a definition name");
            continue;
        };
        let description = fields.get("description").cloned().unwrap_or_else(|| format!("Imported subagent {name}."));
        if let Some(tools) = fields.get("tools") {
            report.skip(
                format!("{}: tools {tools}", path.display()),
                "these are the harness's own tools; give them to the implementer role's harness_tools",
            );
        }
        note_extra(&path, &fields, &["name", "description", "tools", "model"], report);
        let mut out = format!("---\nname: {name}\ndescription: {}\n", quoted(&description));
        if let Some(model) = fields.get("model") {
            out.push_str(&format!("model: {}\n", quoted(model)));
        }
        out.push_str(&format!("---\n{}", gate_note(body)));
        write(target, &format!("agents/{name}.md"), &out, report)?;
    }
    Ok(())
}

/// `CLAUDE.md` and `AGENTS.md`, as always-applied rules.
fn import_instructions(root: &Path, from: &Path, target: &Path, report: &mut Report) -> Result<(), String> {
    for (source, name, what) in [("CLAUDE.md", "claude-md", "CLAUDE.md"), ("AGENTS.md", "agents-md", "AGENTS.md")] {
        let path = from.join(source);
        if path.is_file() {
            let body = read(root, &path)?;
            let out = format!(
                "---\ndescription: {}\nalwaysApply: true\n---\n{}",
                quoted(&format!("The project's instructions, from its {what}.")),
                gate_note(&body)
            );
            write(target, &format!("rules/{name}.md"), &out, report)?;
        }
    }
    Ok(())
}

/// Cursor's rules (`.cursor/rules/*.mdc`), with their globs and `alwaysApply`.
fn import_cursor_rules(root: &Path, from: &Path, target: &Path, report: &mut Report) -> Result<(), String> {
    for (path, stem) in files_with(&from.join(".cursor/rules"), "mdc") {
        let text = read(root, &path)?;
        let (fields, body) = frontmatter(&text);
        let Some(name) = bundle_name(&stem) else {
            report.skip(path.display().to_string(), "its name cannot be a rule name");
            continue;
        };
        let description = fields.get("description").cloned().unwrap_or_else(|| format!("Imported rule {name}."));
        let mut out = format!("---\ndescription: {}\n", quoted(&description));
        if fields.get("alwaysApply").is_some_and(|v| v == "true") {
            out.push_str("alwaysApply: true\n");
        }
        if let Some(globs) = fields.get("globs").filter(|g| !g.is_empty()) {
            let list: Vec<String> =
                globs.trim_matches(['[', ']']).split(',').map(|g| quoted(g.trim().trim_matches('"'))).collect();
            out.push_str(&format!("globs: [{}]\n", list.join(", ")));
        }
        note_extra(&path, &fields, &["description", "alwaysApply", "globs"], report);
        out.push_str(&format!("---\n{}", gate_note(body)));
        write(target, &format!("rules/{name}.md"), &out, report)?;
    }
    Ok(())
}

/// The MCP server lists (`.mcp.json`, `.cursor/mcp.json`), kept beside the bundle in
/// `imported-mcp-servers.json` (owner-only: entries often carry secrets).
fn import_mcp_servers(root: &Path, from: &Path, target: &Path, report: &mut Report) -> Result<(), String> {
    let mut servers = serde_json::Map::new();
    for list in [from.join(".mcp.json"), from.join(".cursor/mcp.json")] {
        if !list.is_file() {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(&read(root, &list)?).map_err(|e| format!("{}: not JSON: {e}", list.display()))?;
        for (name, server) in value.get("mcpServers").and_then(|s| s.as_object()).into_iter().flatten() {
            servers.insert(name.clone(), server.clone());
            report.skip(
                format!("MCP server {name} ({})", list.display()),
                "kept in imported-mcp-servers.json: Canopy serves its own tools; add it to the harness's configuration",
            );
        }
    }
    if !servers.is_empty() {
        let text = serde_json::to_string_pretty(&serde_json::json!({ "mcpServers": servers })).unwrap_or_default();
        // Server entries often carry secrets in `env`: owner-only, and never over an existing file.
        let path = target.join("imported-mcp-servers.json");
        if path.exists() {
            report.skip("imported-mcp-servers.json", "the bundle already has it; left as it is");
        } else {
            canopy_sys::write_private(&path, (text + "\n").as_bytes())
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
            report.written.push("imported-mcp-servers.json".into());
        }
    }
    Ok(())
}

/// The authors' note every prompt file opens with, before an imported body.
fn gate_note(body: &str) -> String {
    format!("{}\n{}", canopy_prompt::bundle::NOTE, body.trim_start_matches('\n'))
}

/// Writes `rel` under `root` unless it exists (an import never overwrites).
fn write(root: &Path, rel: &str, text: &str, report: &mut Report) -> Result<(), String> {
    let path = root.join(rel);
    if path.exists() {
        report.skip(rel, "the bundle already has it; left as it is");
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    }
    std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    report.written.push(rel.to_owned());
    Ok(())
}

/// Reads a source file, refusing one that leads (through a link) outside the source
/// directory: an import must not carry `~/.aws/credentials` into every prompt.
fn read(root: &Path, path: &Path) -> Result<String, String> {
    let real = path.canonicalize().map_err(|e| format!("reading {}: {e}", path.display()))?;
    if !real.starts_with(root) {
        return Err(format!("{} leads outside {}; not imported", path.display(), root.display()));
    }
    std::fs::read_to_string(&real).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// The subdirectories (or files) of `dir`, with their names; none when it does not exist.
fn entries(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out: Vec<(PathBuf, String)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| (e.path(), e.file_name().to_string_lossy().into_owned()))
        .collect();
    out.sort();
    out
}

/// The files of `dir` ending in `.ext`, with their stems.
fn files_with(dir: &Path, ext: &str) -> Vec<(PathBuf, String)> {
    entries(dir)
        .into_iter()
        .filter_map(|(path, name)| Some((path.clone(), name.strip_suffix(&format!(".{ext}"))?.to_owned())))
        .collect()
}

/// A lenient reader of the top-level `key: value` lines of a frontmatter block (the sources
/// are other tools' files); the body after it.
fn frontmatter(text: &str) -> (std::collections::BTreeMap<String, String>, &str) {
    let mut fields = std::collections::BTreeMap::new();
    let Some(rest) = text.strip_prefix("---\n") else { return (fields, text) };
    let Some(end) = rest.find("\n---") else { return (fields, text) };
    for line in rest[..end].lines().filter(|l| !l.starts_with([' ', '\t', '#'])) {
        if let Some((key, value)) = line.split_once(':') {
            fields.insert(key.trim().to_owned(), value.trim().trim_matches('"').trim_matches('\'').to_owned());
        }
    }
    let body = rest[end + 4..].strip_prefix('\n').unwrap_or(&rest[end + 4..]);
    (fields, body)
}

/// Keys the bundle format has no place for, reported.
fn note_extra(path: &Path, fields: &std::collections::BTreeMap<String, String>, kept: &[&str], report: &mut Report) {
    for key in fields.keys().filter(|k| !kept.contains(&k.as_str())) {
        report.skip(format!("{}: {key}", path.display()), "the bundle format has no such key");
    }
}

/// `name` in the bundle's name grammar (lowercase, `-` for anything else), if it can be.
fn bundle_name(name: &str) -> Option<String> {
    let name: String =
        name.trim().to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let name = name.trim_matches('-').to_owned();
    canopy_prompt::bundle::check_name(&name).ok().map(|()| name)
}

/// A one-line, double-quoted frontmatter string (inner quotes become single quotes).
fn quoted(text: &str) -> String {
    format!("\"{}\"", text.split_whitespace().collect::<Vec<_>>().join(" ").replace('"', "'"))
}
