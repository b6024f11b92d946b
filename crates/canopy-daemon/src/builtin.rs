//! The scripted-harness scripts Canopy ships inside its binary, from `config/scripts/`.
//! (The prompt bundle is embedded by `canopy-prompt`; see `prompts.rs`.)

/// Scripted-harness scripts, by file name.
pub const SCRIPTS: &[(&str, &str)] = &[
    ("supervisor.toml", include_str!("../../../config/scripts/supervisor.toml")),
    ("manager.toml", include_str!("../../../config/scripts/manager.toml")),
    ("implementer.toml", include_str!("../../../config/scripts/implementer.toml")),
];

/// A shipped script by file name.
pub fn script(name: &str) -> Option<&'static str> {
    SCRIPTS.iter().find(|(n, _)| *n == name).map(|(_, text)| *text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_scripts_are_valid() {
        for (name, text) in SCRIPTS {
            if let Err(e) = canopy_scripted::script::parse(std::path::Path::new(name), text) {
                panic!("config/scripts/{name} is invalid: {e}");
            }
        }
    }
}
