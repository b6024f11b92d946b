//! What a session's harness is launched with, and what a launch that cannot happen or fails
//! means for the session: the `LaunchSpec` built from the assignment and the runner's
//! options, and the `Ending` (with its fix for the operator) of each refusal.
//!
//! Pure apart from one look at the file system (whether a checkout is on this machine). Does
//! not start the process: `canopy_harness::Session::launch` does, in the session loop.

use std::collections::HashMap;
use std::path::PathBuf;

use canopy_harness::{HarnessKind, HarnessSettings, LaunchError, LaunchSpec, Prompt, PromptMode, Subagent};
use canopy_proto::api::SessionAssignment;

use crate::options::RunnerOptions;
use crate::session::interface::{EndReport, Ending};

/// The model a session's usage is priced by: the assignment's, else its harness's
/// configured one, else the harness's name.
pub(crate) fn model_of(assignment: &SessionAssignment, harnesses: &HashMap<HarnessKind, HarnessSettings>) -> String {
    match assignment.model.is_empty() {
        false => assignment.model.clone(),
        true => HarnessKind::parse(&assignment.harness)
            .and_then(|k| harnesses.get(&k))
            .and_then(|h| h.model.clone())
            .unwrap_or_else(|| assignment.harness.clone()),
    }
}

/// The launch of the session `assignment`, or how the session ends because there can be
/// none: an unknown harness, or a checkout that is not on this machine.
pub(crate) fn prepare(
    assignment: &SessionAssignment,
    options: &RunnerOptions,
    mcp_url: &str,
) -> Result<LaunchSpec, Ending> {
    let Some(kind) = HarnessKind::parse(&assignment.harness) else {
        return Err(Ending::failed(format!("unknown harness {:?}", assignment.harness), false));
    };
    let spec = launch_spec(assignment, options, kind, mcp_url);
    if spec.repo_mirror.is_some() && !spec.cwd.join(".git").exists() {
        let reason = format!(
            "its checkout {} is not on this machine: the daemon hands its own checkouts only to its embedded runner",
            spec.cwd.display()
        );
        return Err(Ending::failed(reason, true));
    }
    Ok(spec)
}

/// The launch of `assignment` with the harness `kind`, as the runner's options configure it.
fn launch_spec(
    assignment: &SessionAssignment,
    options: &RunnerOptions,
    kind: HarnessKind,
    mcp_url: &str,
) -> LaunchSpec {
    let agent_dir = options.sessions_dir.join(&assignment.agent);
    let harness = options.harnesses.get(&kind).cloned().unwrap_or_default();
    let (program, program_args) = match kind.default_program() {
        None => (options.scripted_program.clone(), options.scripted_args.clone()),
        Some(name) => (harness.program.clone().unwrap_or_else(|| name.into()), Vec::new()),
    };
    let mut env: Vec<(String, String)> = vec![
        ("CANOPY_AGENT".into(), assignment.agent.clone()),
        ("CANOPY_HOME_CHANNEL".into(), assignment.home_channel.clone()),
        ("CANOPY_INCARNATION".into(), assignment.incarnation.to_string()),
    ];
    env.extend(harness.env.iter().cloned());
    let settings = &options.settings;
    LaunchSpec {
        kind,
        program,
        program_args,
        session_dir: agent_dir.join(assignment.incarnation.to_string()),
        // Conversations a harness keeps live here across incarnations on this runner; a
        // session placed on another runner has none and starts fresh.
        agent_dir: Some(agent_dir.clone()),
        cwd: match assignment.cwd.is_empty() {
            true => agent_dir.join("work"),
            false => PathBuf::from(&assignment.cwd),
        },
        builtin_tools: assignment.harness_tools.clone(),
        prompt: match assignment.prompt_mode {
            PromptMode::Replace => Prompt::replace(assignment.system_prompt.clone()),
            PromptMode::Append => Prompt::append(assignment.system_prompt.clone()),
        },
        mcp_url: mcp_url.to_owned(),
        mcp_token: assignment.token.clone(),
        env,
        model: match assignment.model.is_empty() {
            true => harness.model.clone(),
            false => Some(assignment.model.clone()),
        },
        provider: harness.provider.clone(),
        script: assignment.script.as_ref().map(|s| (s.name.clone(), s.text.clone())),
        max_line_bytes: settings.max_line_bytes,
        ready_timeout: settings.ready_timeout,
        sandbox: {
            let mut sandbox = options.sandbox.clone();
            sandbox.allow_hosts.extend(assignment.allow_hosts.iter().cloned());
            sandbox
        },
        repo_mirror: assignment.repo_mirror.as_ref().map(PathBuf::from),
        cwd_read_only: assignment.cwd_read_only,
        subagents: assignment
            .subagents
            .iter()
            .map(|f| Subagent { name: f.name.clone(), description: f.description.clone(), body: f.body.clone() })
            .collect(),
    }
}

/// How a session ends when launching its `kind` harness failed with `error`. Retrying
/// cannot confine a session the machine cannot confine, find a program that is not there,
/// or set a setting that is not set: those end the agent at once, with the fix.
pub(crate) fn launch_failed(kind: HarnessKind, error: LaunchError) -> Ending {
    match error {
        e @ LaunchError::Unconfinable(_) => Ending {
            requested: false,
            fatal: true,
            reason: format!("{e}; see `canopy doctor` and [sandbox] in canopy.toml"),
            // The runner's crash report names it.
            report: EndReport::Nothing,
        },
        LaunchError::Spawn { program, source } if source.kind() == std::io::ErrorKind::NotFound => {
            let reason = format!(
                "the {kind} harness's program `{}` was not found (on PATH, or as a path): install it or set \
                 [harness.{kind}] bin in canopy.toml; `canopy doctor` checks it",
                program.display(),
                kind = kind.as_str()
            );
            Ending::failed(reason, true)
        }
        LaunchError::Invalid(why) => Ending::failed(
            format!("{why}; fix it in canopy.toml or the environment that runs canopy (`canopy doctor` checks)"),
            true,
        ),
        e => Ending::failed(format!("the harness did not start: {e}"), false),
    }
}

#[cfg(test)]
mod tests;
