//! How to run each real harness on this machine: program, model, extra environment, and
//! (Codex) a model provider, as `[harness.<name>]` in `canopy.toml` gives them.
//!
//! Owns the lookup of a harness program on `PATH`. Does not read configuration files (the
//! daemon does) and does not decide which harness an agent runs (its role or `--harness`).

use std::path::{Path, PathBuf};

/// One harness's settings from `[harness.<name>]`; the runner copies them into each
/// `LaunchSpec` of that harness.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HarnessSettings {
    /// The CLI to run; `None` looks the harness's default name up on `PATH`.
    pub program: Option<PathBuf>,
    /// The model name passed to the CLI; `None` leaves the CLI's default.
    pub model: Option<String>,
    /// Extra environment for every session of this harness (credentials, base URLs). The
    /// session otherwise starts from a clean environment.
    pub env: Vec<(String, String)>,
    /// A model provider for harnesses that take one in their own config (Codex).
    pub provider: Option<ProviderSettings>,
}

/// A model provider endpoint (Codex's `model_providers.<id>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderSettings {
    /// The provider's base URL (`http://127.0.0.1:8080/v1`).
    pub base_url: String,
    /// The environment variable holding the API key, when the provider needs one.
    pub api_key_env: Option<String>,
    /// The wire protocol, for harnesses that name it (omp: `anthropic-messages`).
    pub api: Option<String>,
}

/// Finds `name` the way a shell would: a path with a slash as is (if it is an executable
/// file), otherwise the first executable file of that name on `path` (a `PATH` value).
pub fn find_program(name: &Path, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if name.components().count() > 1 || name.is_absolute() {
        return executable(name).then(|| name.to_owned());
    }
    std::env::split_paths(path?).map(|dir| dir.join(name)).find(|candidate| executable(candidate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_programs_on_path_and_by_path() {
        let path = std::env::var_os("PATH");
        assert!(find_program(Path::new("sh"), path.as_deref()).is_some());
        assert!(find_program(Path::new("/bin/sh"), None).is_some());
        assert_eq!(find_program(Path::new("no-such-program-canopy"), path.as_deref()), None);
        assert_eq!(find_program(Path::new("./no/such/file"), None), None);
    }
}
