//! The bundle Canopy ships inside its binary: role system prompts and scripted-harness
//! scripts, from `config/prompts/` and `config/scripts/`.
//!
//! Until the Prompts issue renders block-0 from a bundle on disk, a session's system prompt
//! is its role's raw `SYSTEM.md` (the `default` one for roles without their own). A test
//! keeps every prompt naming only tools the sessions have.

/// Role system prompts, by role.
const PROMPTS: &[(&str, &str)] = &[
    ("supervisor", include_str!("../../../config/prompts/supervisor/SYSTEM.md")),
    ("manager", include_str!("../../../config/prompts/manager/SYSTEM.md")),
    ("default", include_str!("../../../config/prompts/default/SYSTEM.md")),
];

/// Scripted-harness scripts, by file name.
pub const SCRIPTS: &[(&str, &str)] = &[
    ("supervisor.toml", include_str!("../../../config/scripts/supervisor.toml")),
    ("manager.toml", include_str!("../../../config/scripts/manager.toml")),
];

/// The system prompt a session of `role` starts with.
pub fn system_prompt(role: &str) -> &'static str {
    PROMPTS
        .iter()
        .find(|(name, _)| *name == role)
        .or_else(|| PROMPTS.iter().find(|(name, _)| *name == "default"))
        .map_or("", |(_, text)| text)
}

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

    #[test]
    fn prompts_name_only_tools_the_sessions_have() {
        let tools = canopy_tools::tool_names();
        for (role, text) in PROMPTS {
            for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                let looks_like_tool = word.contains('_')
                    && ["comms_", "agents_", "tree_", "roster_", "board_", "history_", "skill_", "rule_"]
                        .iter()
                        .any(|p| word.starts_with(p));
                assert!(
                    !looks_like_tool || tools.iter().any(|t| t == word),
                    "config/prompts/{role}/SYSTEM.md names {word}, which sessions do not have"
                );
            }
        }
    }

    #[test]
    fn roles_without_a_prompt_get_the_default() {
        assert!(system_prompt("reviewer").contains("You are an agent"));
        assert!(system_prompt("manager").contains("Manager"));
    }
}
