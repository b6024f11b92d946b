//! The scripted-harness scripts Canopy ships inside its binary, from `config/scripts/`.
//! (The prompt bundle is embedded by `canopy-prompt`; see `prompts.rs`.) A test in the
//! `canopy` binary, which knows the scripted harness, checks they parse.

/// Scripted-harness scripts, by file name.
pub const SCRIPTS: &[(&str, &str)] = &[
    ("supervisor.toml", include_str!("../../../config/scripts/supervisor.toml")),
    ("manager.toml", include_str!("../../../config/scripts/manager.toml")),
    ("implementer.toml", include_str!("../../../config/scripts/implementer.toml")),
    ("reviewer.toml", include_str!("../../../config/scripts/reviewer.toml")),
];

/// A shipped script by file name.
pub fn script(name: &str) -> Option<&'static str> {
    SCRIPTS.iter().find(|(n, _)| *n == name).map(|(_, text)| *text)
}
