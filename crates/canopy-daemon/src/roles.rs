//! Per-role session defaults from `canopy.toml` `[roles.<role>]`, resolved and checked.
//!
//! A role names a harness (`scripted`, `claude`, `codex`) and, for the scripted harness, a script: a name shipped in the
//! binary (`config/scripts/`) or a path relative to the data directory. Everything is
//! checked when the daemon starts (a bad entry exits 64 naming the key) and when an agent
//! is created with its own `--harness`/`--script`. A role with no entry takes the
//! `manager` defaults. A run's role may say `harness = "manager"`: its runs take their
//! Manager's harness, and its script serves a scripted Manager's runs. A role switched to a real harness with its `script` line left in
//! keeps working: the script is ignored with a warning (`warnings`), so the switch is one
//! line; an agent created with both `--harness claude` and `--script` is refused.

use std::collections::BTreeMap;
use std::path::Path;

use canopy_config::{Config, ConfigError};
use canopy_core::Error;
use canopy_core::harness::HarnessKind;

/// A run role's `harness = "manager"`: its runs take their Manager's harness (its script
/// serves a Manager on the scripted harness).
pub const FOLLOW_MANAGER: &str = "manager";

/// A harness and its script, ready to store with an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionDefaults {
    pub harness: String,
    /// (file name, text)
    pub script: Option<(String, String)>,
}

/// Checks a scripted-harness script (file name for messages, text): the script grammar is
/// the scripted harness's, so the composition root passes its parser in
/// (`canopy_harness::scripted::check_script`).
pub type ScriptCheck = fn(&Path, &str) -> Result<(), String>;

/// The resolved defaults of every configured role, and the script check they were made with.
#[derive(Debug, Clone)]
pub struct RoleDefaults {
    roles: BTreeMap<String, SessionDefaults>,
    check_script: ScriptCheck,
    /// (key, why) for settings that are ignored: a real harness's leftover `script`.
    pub warnings: Vec<(String, String)>,
}

impl RoleDefaults {
    /// Resolves `[roles.*]`, reading script files relative to `data_dir`.
    pub fn resolve(
        config: &Config,
        config_path: &Path,
        data_dir: &Path,
        check_script: ScriptCheck,
    ) -> Result<RoleDefaults, ConfigError> {
        let mut roles = BTreeMap::new();
        let mut warnings = Vec::new();
        for (role, entry) in &config.roles {
            let error = |key: &str, message: String| ConfigError {
                path: config_path.to_owned(),
                key: format!("roles.{role}.{key}"),
                message,
            };
            if canopy_core::RoleName::parse(role).is_err() {
                return Err(error("", format!("{role:?} is not a valid role name")));
            }
            if entry.harness == FOLLOW_MANAGER {
                // A run's role that follows its Manager: its script is for a scripted Manager's.
                let script = match &entry.script {
                    Some(name) => Some(load_script(name, data_dir).map_err(|e| error("script", e.to_string()))?),
                    None => None,
                };
                let checked = check("scripted", script, check_script).map_err(|e| error("script", e.to_string()))?;
                roles.insert(
                    role.clone(),
                    SessionDefaults { harness: FOLLOW_MANAGER.to_owned(), script: checked.script },
                );
                continue;
            }
            let real = HarnessKind::parse(&entry.harness).is_some_and(|k| k.default_program().is_some());
            let script = match &entry.script {
                Some(_) if real => {
                    let why = format!("ignored: the {} harness takes no script (remove the line)", entry.harness);
                    warnings.push((format!("roles.{role}.script"), why));
                    None
                }
                Some(name) => Some(load_script(name, data_dir).map_err(|e| error("script", e.to_string()))?),
                None => None,
            };
            let defaults = check(&entry.harness, script, check_script).map_err(|e| match e.field() {
                Some("script") => error("script", e.to_string()),
                _ => error("harness", e.to_string()),
            })?;
            roles.insert(role.clone(), defaults);
        }
        Ok(RoleDefaults { roles, check_script, warnings })
    }

    /// The defaults for `role` (the `manager` ones when the role has none).
    pub fn for_role(&self, role: &str) -> SessionDefaults {
        self.configured(role)
            .or_else(|| self.roles.get("manager"))
            .cloned()
            .unwrap_or(SessionDefaults { harness: String::new(), script: None })
    }

    /// The check scripts are held to (an agent's own `--script` too).
    pub fn check_script(&self) -> ScriptCheck {
        self.check_script
    }

    /// The defaults `canopy.toml` gives `role` itself, if it lists it.
    pub fn configured(&self, role: &str) -> Option<&SessionDefaults> {
        self.roles.get(role)
    }
}

/// A script by shipped name or by path (relative to `data_dir`), as (file name, text).
pub fn load_script(name: &str, data_dir: &Path) -> Result<(String, String), Error> {
    if let Some(text) = crate::builtin::script(name) {
        return Ok((name.to_owned(), text.to_owned()));
    }
    let path = data_dir.join(name);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Error::invalid("script", format!("{name} is neither a shipped script ({}) nor a readable file: {e}", shipped()))
    })?;
    Ok((name.to_owned(), text))
}

fn shipped() -> String {
    crate::builtin::SCRIPTS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

/// Longest script accepted, in bytes.
pub const MAX_SCRIPT_BYTES: usize = 1 << 20;

/// Checks a harness name and its script; the scripted harness needs a valid script.
pub fn check(
    harness: &str,
    script: Option<(String, String)>,
    check_script: ScriptCheck,
) -> Result<SessionDefaults, Error> {
    let kind = HarnessKind::parse(harness).ok_or_else(|| {
        Error::invalid("harness", format!("unknown harness {harness:?}; known: {}", HarnessKind::expected()))
    })?;
    match (kind, &script) {
        (HarnessKind::Scripted, None) => {
            return Err(Error::invalid("script", "the scripted harness needs a script"));
        }
        (HarnessKind::Scripted, Some((name, text))) => {
            if text.len() > MAX_SCRIPT_BYTES {
                return Err(Error::TooLarge { field: "script", len: text.len(), max: MAX_SCRIPT_BYTES });
            }
            let file = Path::new(name).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            if file.is_empty() || file.starts_with('.') {
                return Err(Error::invalid("script", format!("{name:?} is not a file name")));
            }
            check_script(Path::new(name), text).map_err(|e| Error::invalid("script", e))?;
        }
        (HarnessKind::Claude | HarnessKind::Codex | HarnessKind::Omp | HarnessKind::Pi, Some(_)) => {
            return Err(Error::invalid("script", format!("the {harness} harness takes no script")));
        }
        (HarnessKind::Claude | HarnessKind::Codex | HarnessKind::Omp | HarnessKind::Pi, None) => {}
    }
    Ok(SessionDefaults { harness: harness.to_owned(), script })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for the scripted harness's parser: an empty script is valid, `bad` is not.
    fn check_script(_: &Path, text: &str) -> Result<(), String> {
        if text.contains("bad") { Err("line 1: bad script".into()) } else { Ok(()) }
    }

    #[test]
    fn real_harnesses_are_accepted_without_a_script_and_refuse_one() {
        assert_eq!(check("claude", None, check_script).map(|d| d.harness), Ok("claude".to_owned()));
        assert_eq!(check("codex", None, check_script).map(|d| d.harness), Ok("codex".to_owned()));
        let refused = check("claude", Some(("manager.toml".into(), String::new())), check_script);
        assert_eq!(refused.as_ref().err().and_then(|e| e.field()), Some("script"));
        let unknown = check("gpt", None, check_script);
        assert!(unknown.as_ref().is_err_and(|e| e.to_string().contains("scripted, claude, codex")), "{unknown:?}");
        let bad = check("scripted", Some(("x.toml".into(), "bad".into())), check_script);
        assert!(bad.is_err_and(|e| e.field() == Some("script") && e.to_string().contains("bad script")));
    }

    #[test]
    fn a_role_on_claude_resolves_and_a_bad_harness_names_the_key() {
        let path = Path::new("canopy.toml");
        let config = Config::parse(path, "[roles.manager]\nharness = \"claude\"\n").unwrap_or_default();
        let roles = RoleDefaults::resolve(&config, path, Path::new("/nonexistent"), check_script);
        assert_eq!(roles.map(|r| r.for_role("manager").harness).ok(), Some("claude".to_owned()));
        let config = Config::parse(path, "[roles.manager]\nharness = \"claud\"\n").unwrap_or_default();
        let err = RoleDefaults::resolve(&config, path, Path::new("/nonexistent"), check_script).err();
        assert_eq!(err.map(|e| e.key), Some("roles.manager.harness".to_owned()));
    }
}
