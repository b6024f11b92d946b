//! The daemon's view of the prompt bundle: which bundle, kept current, and the facts a
//! session's prompt is rendered from.
//!
//! The bundle is `[prompts] bundle` (a directory) or the copy built into the binary. A
//! directory is re-read when a file in it changes (checked by size and mtime when a prompt
//! is rendered, never on the per-call tool check), so edits take effect at each session's next start; an edit that breaks the
//! bundle is logged and the last good bundle stays in use. The daemon refuses to start on a
//! bundle that does not load or fails the lint. Rendering itself is `canopy_prompt`'s; tool
//! enforcement per role is here too (`allowed_tools`), so the prompt and the daemon agree
//! on what a session may call.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use canopy_core::Error;
use canopy_prompt::{Bundle, Facts, Renderer};
use canopy_proto::Method;

use canopy_config::paths::relative_to_project;
use canopy_config::{Config, ConfigError};

/// Where the bundle comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BundleSource {
    Embedded,
    Dir(PathBuf),
}

impl BundleSource {
    /// The bundle `config` names, relative paths taken from `data_dir`'s parent.
    pub fn from_config(config: &Config, data_dir: &Path) -> BundleSource {
        match config.prompts.bundle.trim() {
            "" => BundleSource::Embedded,
            path => BundleSource::Dir(relative_to_project(data_dir, path)),
        }
    }

    pub fn load(&self) -> Result<Bundle, canopy_prompt::BundleError> {
        match self {
            BundleSource::Embedded => Bundle::embedded(),
            BundleSource::Dir(dir) => Bundle::load(dir),
        }
    }

    /// A cheap fingerprint of the directory's files (sizes and mtimes); `None` when embedded.
    fn fingerprint(&self) -> Option<u64> {
        let BundleSource::Dir(dir) = self else { return None };
        let mut acc: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |v: u64| acc = (acc ^ v).wrapping_mul(0x0100_0000_01b3);
        fn walk(path: &Path, depth: usize, mix: &mut dyn FnMut(u64)) {
            let Ok(entries) = std::fs::read_dir(path) else { return };
            for entry in entries.flatten() {
                let Ok(meta) = entry.metadata() else { continue };
                for b in entry.file_name().as_encoded_bytes() {
                    mix(u64::from(*b));
                }
                if meta.is_dir() && depth < 3 {
                    walk(&entry.path(), depth + 1, mix);
                } else {
                    mix(meta.len());
                    let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
                    mix(mtime.map_or(0, |d| d.as_nanos() as u64));
                }
            }
        }
        for sub in ["config/prompts", "config/roles", "agents", "skills", "rules"] {
            walk(&dir.join(sub), 0, &mut mix);
        }
        Some(acc)
    }
}

/// Every native tool Canopy serves.
pub fn catalog() -> Vec<&'static str> {
    Method::tools().map(|(_, tool)| tool.name).collect()
}

/// What the lint checks prose against: each tool's arguments, every state name the code
/// has, the channel prefixes. `commands` are the CLI's, when the caller has them.
pub fn vocabulary(commands: Vec<String>) -> canopy_prompt::Vocabulary {
    let mut states: Vec<String> = Vec::new();
    states.extend(canopy_core::Presence::ALL.iter().map(|p| p.as_str().to_owned()));
    states.extend(canopy_core::SpawnState::ALL.iter().map(|s| s.as_str().to_owned()));
    states.extend(canopy_core::AccountState::ALL.iter().map(|s| s.as_str().to_owned()));
    states.extend(canopy_core::issues::IssueState::ALL.iter().map(|s| s.as_str().to_owned()));
    states.extend(canopy_core::MergeState::ALL.iter().map(|s| s.as_str().to_owned()));
    states.extend(canopy_core::checks::CheckState::ALL.iter().map(|s| s.as_str().to_owned()));
    states.extend(canopy_core::review::Verdict::ALL.iter().map(|s| s.as_str().to_owned()));
    states.extend(["steered", "queued", "woke", "held", "refused"].map(str::to_owned));
    states.extend(["running", "done", "failed", "timed_out"].map(str::to_owned));
    canopy_prompt::Vocabulary {
        arguments: canopy_proto::schema::tool_arguments().into_iter().map(|(t, a)| (t.to_owned(), a)).collect(),
        states,
        commands,
        channel_prefixes: canopy_core::names::RESERVED_CHANNEL_PREFIXES.iter().map(|p| (*p).to_owned()).collect(),
        settings: settings(),
    }
}

/// Every key of the default `canopy.toml`, at any depth.
fn settings() -> Vec<String> {
    fn walk(table: &toml::Table, out: &mut Vec<String>) {
        for (key, value) in table {
            out.push(key.clone());
            if let toml::Value::Table(inner) = value {
                walk(inner, out);
            }
        }
    }
    let mut out = Vec::new();
    if let Ok(table) = canopy_config::config::DEFAULT_TOML.parse::<toml::Table>() {
        walk(&table, &mut out);
    }
    out
}

/// Loads `source` and runs the lint: what `canopy bundle check` (with the CLI's commands) and
/// the daemon's start (without) do.
pub fn check(source: &BundleSource, commands: Vec<String>) -> Result<Renderer, Vec<String>> {
    let bundle = source.load().map_err(|e| vec![e.to_string()])?;
    let renderer = Renderer::new(Arc::new(bundle), &catalog());
    let mut problems: Vec<String> =
        canopy_prompt::lint_with(&renderer, &vocabulary(commands)).iter().map(ToString::to_string).collect();
    for role in ["manager", "supervisor"] {
        if renderer.bundle().role(role).is_none() {
            problems.push(format!("config/roles/{role}.toml: the bundle needs a {role} role"));
        }
    }
    match problems.is_empty() {
        true => Ok(renderer),
        false => Err(problems),
    }
}

struct Loaded {
    renderer: Arc<Renderer>,
    fingerprint: Option<u64>,
}

/// The bundle in use, reloaded when its files change.
pub struct Bundles {
    source: BundleSource,
    current: RwLock<Loaded>,
}

impl std::fmt::Debug for Bundles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bundles").field("source", &self.source).finish_non_exhaustive()
    }
}

impl Bundles {
    /// Loads and lints the configured bundle; a bad bundle is a configuration error naming
    /// `prompts.bundle` and the first problem.
    pub fn open(config: &Config, config_path: &Path, data_dir: &Path) -> Result<Bundles, ConfigError> {
        let source = BundleSource::from_config(config, data_dir);
        let fingerprint = source.fingerprint();
        let renderer = check(&source, Vec::new()).map_err(|problems| ConfigError {
            path: config_path.to_owned(),
            key: "prompts.bundle".into(),
            message: format!("the bundle does not pass `canopy bundle check`: {}", problems.join("; ")),
        })?;
        Ok(Bundles { source, current: RwLock::new(Loaded { renderer: Arc::new(renderer), fingerprint }) })
    }

    pub fn source(&self) -> &BundleSource {
        &self.source
    }

    /// The renderer in use, without looking at the bundle's files: for the hot paths (the
    /// per-role tool check on every agent call).
    pub fn current(&self) -> Arc<Renderer> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).renderer.clone()
    }

    /// The renderer, re-reading the bundle first if its files changed: where a prompt is
    /// rendered or a bundle name is resolved (session placement, `prompts.render`,
    /// `runs.start`), so edits take effect at the next session start.
    pub fn refreshed(&self) -> Arc<Renderer> {
        let fingerprint = self.source.fingerprint();
        {
            let current = self.current.read().unwrap_or_else(|e| e.into_inner());
            if current.fingerprint == fingerprint {
                return current.renderer.clone();
            }
        }
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        if current.fingerprint != fingerprint {
            match check(&self.source, Vec::new()) {
                Ok(renderer) => {
                    tracing::info!(bundle = ?self.source, "prompt bundle changed; new sessions use it");
                    current.renderer = Arc::new(renderer);
                }
                Err(problems) => tracing::error!(
                    bundle = ?self.source,
                    problems = %problems.join("; "),
                    "the changed prompt bundle is invalid; sessions keep the last good one"
                ),
            }
            current.fingerprint = fingerprint;
        }
        current.renderer.clone()
    }
}

/// Today's date (UTC), `YYYY-MM-DD`, for the footer.
pub fn today() -> String {
    humantime::format_rfc3339(std::time::SystemTime::now()).to_string().chars().take(10).collect()
}

/// What is known about a session before rendering.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    pub handle: String,
    pub name: String,
    pub role: String,
    pub parent: Option<String>,
    pub home_channel: String,
    pub charter: String,
    pub persona: Option<String>,
}

/// The renderer's facts for `identity` in this workspace, for a session on `harness`.
pub fn facts(
    config: &Config,
    data_dir: &Path,
    workspace: &canopy_core::Workspace,
    identity: &Identity,
    harness: &str,
) -> Facts {
    Facts {
        handle: identity.handle.clone(),
        name: identity.name.clone(),
        role: identity.role.clone(),
        parent: identity.parent.clone(),
        home_channel: identity.home_channel.clone(),
        workspace: workspace.name.clone(),
        cwd: config.workdir(data_dir, &identity.handle).display().to_string(),
        date: today(),
        mission: workspace.mission.clone(),
        project: config.prompts.project.clone(),
        goal: identity.charter.clone(),
        persona: identity.persona.clone(),
        native_subagents: has_native_subagents(harness),
    }
}

/// Whether `harness` has subagents of its own that a role may delegate to (omp's `task`).
pub fn has_native_subagents(harness: &str) -> bool {
    canopy_core::harness::HarnessKind::parse(harness).is_some_and(|k| k.native_subagents())
}

/// Whether `harness` has a default prompt of its own (the delta is then appended to it).
pub fn owns_default_prompt(harness: &str) -> bool {
    canopy_core::harness::HarnessKind::parse(harness).is_some_and(|k| k.capabilities().owns_default_prompt)
}

/// The tools a session of `role` may call (a run of `definition` may be narrower).
pub fn allowed_tools(renderer: &Renderer, role: &str, definition: Option<&str>) -> Result<Vec<String>, Error> {
    let bundle = renderer.bundle();
    let (role, definition) = match definition {
        Some(d) => {
            let role = bundle
                .role_for_definition(d)
                .ok_or_else(|| Error::invalid("definition", format!("no delta role runs {d:?}")))?;
            (role, bundle.definitions.get(d))
        }
        None => {
            let role = bundle
                .role(role)
                .ok_or_else(|| Error::Internal(format!("the bundle has no role {role:?} and no manager role")))?;
            let definition = role.definition.as_deref().and_then(|d| bundle.definitions.get(d));
            (role, definition)
        }
    };
    Ok(renderer.tools_for(role, definition))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on purpose")]

    use super::*;

    #[test]
    fn the_shipped_bundle_passes_the_check() {
        if let Err(problems) = check(&BundleSource::Embedded, Vec::new()) {
            panic!("the shipped bundle fails `canopy bundle check`:\n{}", problems.join("\n"));
        }
    }

    #[test]
    fn the_manager_block0_stays_near_one_screen() {
        let bundle = Bundle::embedded().unwrap();
        let words = bundle.blocks["manager"].text.split_whitespace().filter(|w| !w.starts_with("<!--")).count();
        assert!(words <= 650, "config/prompts/manager/SYSTEM.md has {words} words; keep it near one screen (<= 650)");
        let delta = bundle.definitions["implementer"].body.text.split_whitespace().count();
        assert!(delta <= 250, "agents/implementer.md's delta has {delta} words; a delta stays thin");
    }

    #[test]
    fn the_shipped_manager_prompt_has_its_sections_in_order() {
        let renderer = check(&BundleSource::Embedded, Vec::new()).unwrap();
        let facts = Facts { role: "manager".into(), handle: "m".into(), goal: "g".into(), ..Facts::default() };
        let rendered = renderer.render(&facts, false).unwrap();
        assert_eq!(rendered.sections, ["role", "why_here", "skills", "rules", "footer"]);
    }
}
