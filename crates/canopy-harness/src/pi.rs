//! The pi adapter: `pi --mode rpc` (pi-coding-agent on Node), spoken by the omp codec in its
//! pi dialect ([notes](../../../docs/harnesses/pi.md)).
//!
//! pi has no MCP client, so Canopy's tools reach it through a small extension shipped here
//! (`pi-extension.ts`, written into the session directory and loaded with `-e`, discovery of
//! any other extension off): it lists the session's MCP endpoint's tools with the session's
//! token, registers each under its own name, forwards each call, and narrows pi's built-in
//! tools to the role's. Owns pi's private agent directory (`PI_CODING_AGENT_DIR`:
//! `models.json` with the one configured provider, `settings.json` without install telemetry),
//! offline mode, and the command line (replace or append prompt file, `--session` to resume).

use serde_json::json;
use tokio::process::Command;

use crate::PromptMode;
use crate::codec::Codec;
use crate::launch::{LaunchError, LaunchSpec, Resume, write_private};
use crate::omp::{Dialect, OmpCodec, omp_tool, provider_and_model, quiet_env, recorded_session};

/// The prompt file and the extension in the session directory.
pub const PROMPT_FILE: &str = "system-prompt.md";
pub const EXTENSION_FILE: &str = "canopy-tools.ts";
/// pi's agent directory and the session-file record, in the agent's directory.
pub const AGENT_DIR: &str = "pi-agent";
pub const CONVERSATION_FILE: &str = "pi-session";
const PROVIDER: &str = "canopy";
const EXTENSION: &str = include_str!("pi-extension.ts");

/// Environment that keeps pi offline (no update, package or telemetry checks).
const QUIET_ENV: &[(&str, &str)] = &[
    ("LANG", "C.UTF-8"),
    ("TERM", "dumb"),
    ("NO_COLOR", "1"),
    ("PI_OFFLINE", "1"),
    ("PI_TELEMETRY", "0"),
    ("PI_SKIP_VERSION_CHECK", "1"),
];

/// Writes pi's agent directory, the prompt and the extension, and adds pi's arguments and
/// environment.
pub(crate) fn prepare(spec: &LaunchSpec, command: &mut Command, resume: Resume) -> Result<Box<dyn Codec>, LaunchError> {
    let (provider, model) = provider_and_model(spec, "pi")?;
    let keep = spec.agent_dir.as_ref().unwrap_or(&spec.session_dir);
    let agent_dir = keep.join(AGENT_DIR);
    std::fs::create_dir_all(&agent_dir).map_err(LaunchError::files(agent_dir.clone()))?;
    let models = json!({
        "providers": {
            PROVIDER: {
                "baseUrl": provider.base_url,
                "api": provider.api.as_deref().unwrap_or("anthropic-messages"),
                "apiKey": provider.api_key_env.as_deref().unwrap_or("CANOPY_PI_NO_KEY"),
                "models": [{
                    "id": model, "name": model, "reasoning": false, "input": ["text"],
                    "contextWindow": 200000, "maxTokens": 8192,
                    "cost": { "input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0 }
                }]
            }
        }
    });
    let settings = json!({ "enableInstallTelemetry": false });
    for (name, doc) in [("models.json", models), ("settings.json", settings)] {
        write_private(agent_dir.join(name), &serde_json::to_vec_pretty(&doc).unwrap_or_default())?;
    }
    write_private(spec.session_dir.join(PROMPT_FILE), spec.prompt.text().as_bytes())?;
    write_private(spec.session_dir.join(EXTENSION_FILE), EXTENSION.as_bytes())?;

    let record = keep.join(CONVERSATION_FILE);
    let resumed = recorded_session(spec, &record, resume);
    command.args(arguments(spec, model, resumed.as_deref())).env("PI_CODING_AGENT_DIR", &agent_dir);
    quiet_env(command, spec, provider, QUIET_ENV);
    command
        .env("CANOPY_MCP_URL", &spec.mcp_url)
        .env("CANOPY_MCP_TOKEN", &spec.mcp_token)
        .env("CANOPY_PI_BUILTIN_TOOLS", spec.builtin_tools.iter().map(|t| omp_tool(t)).collect::<Vec<_>>().join(","));
    Ok(Box::new(OmpCodec::new(Dialect::Pi, spec.agent_dir.as_ref().map(|_| record), resumed)))
}

/// The arguments for one session, without the program.
pub fn arguments(spec: &LaunchSpec, model: &str, resume: Option<&str>) -> Vec<String> {
    let dir = &spec.session_dir;
    let mut args = vec!["--mode".to_owned(), "rpc".to_owned(), "--model".to_owned(), format!("{PROVIDER}/{model}")];
    args.push(
        match spec.prompt.mode {
            PromptMode::Replace => "--system-prompt",
            PromptMode::Append => "--append-system-prompt",
        }
        .into(),
    );
    args.push(dir.join(PROMPT_FILE).display().to_string());
    args.extend(["--no-extensions".to_owned(), "-e".to_owned(), dir.join(EXTENSION_FILE).display().to_string()]);
    if let Some(path) = resume {
        args.extend(["--session".to_owned(), path.to_owned()]);
    }
    args
}
