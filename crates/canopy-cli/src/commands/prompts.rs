//! The prompts area: `canopy prompt render` (by the daemon for an agent or a role, or here
//! for a role when no daemon runs) and `canopy bundle check`, the bundle's lint, which needs
//! no daemon.
//!
//! Rendering and the lint are `canopy_daemon::prompts`'s, `canopy_daemon::bundle`'s and
//! `canopy_prompt`'s; this prints what they give. `canopy bundle import` is `import.rs`'s.

use canopy_config::{Config, DataDir};
use canopy_daemon::bundle::{BundleSource, check};
use canopy_prompt::Renderer;
use canopy_proto::api::{PromptsRenderRequest, PromptsRenderResponse};
use canopy_proto::method;

use super::call::call;
use crate::args::{PromptCommand, cli_commands};
use crate::client::{CallError, Client};
use crate::exit::{code, fail, fail_usage};
use crate::output;
use crate::writer::{errln, out, outln};

/// `canopy prompt render --agent A | --role R`, by the daemon.
pub async fn render(client: &Client, json: bool, command: PromptCommand) -> u8 {
    let PromptCommand::Render { agent, role } = command;
    code(json, call::<method::PromptsRender>(client, json, &PromptsRenderRequest { agent, role }, print_render).await)
}

/// `canopy prompt render --role` with no daemon running: the bundle and `canopy.toml` are
/// local; the workspace's name and mission are examples (said on stderr).
pub fn render_role_here(dir: &DataDir, json: bool, role: &str) -> u8 {
    let config = match Config::load(&dir.config()) {
        Ok(config) => config,
        Err(_) if !dir.config().exists() => Config::default(),
        Err(e) => return fail_usage(json, &e.key, &e.message),
    };
    let prompts = match canopy_daemon::bundle::Bundles::open(&config, &dir.config(), dir.root()) {
        Ok(prompts) => prompts,
        Err(e) => return fail_usage(json, &e.key, &e.message),
    };
    let roles = match canopy_daemon::roles::RoleDefaults::resolve(
        &config,
        &dir.config(),
        dir.root(),
        canopy_harness::scripted::check_script,
    ) {
        Ok(roles) => roles,
        Err(e) => return fail_usage(json, &e.key, &e.message),
    };
    let workspace = canopy_core::Workspace {
        id: "example".into(),
        name: "example workspace".into(),
        mission: "(the workspace's mission)".into(),
        created_at: String::new(),
    };
    let rendered =
        canopy_daemon::prompts::render_role(&config, dir.root(), &prompts.refreshed(), &roles, &workspace, role);
    match rendered {
        Ok(r) if json => {
            output::json(&r);
            0
        }
        Ok(r) => {
            print_render(&r);
            errln!("-- rendered without a daemon: the workspace's name and mission are examples");
            0
        }
        Err(e) => fail(json, &CallError::Refused(canopy_proto::WireError::from(&e))),
    }
}

fn print_render(r: &PromptsRenderResponse) {
    out!("{}", r.text);
    errln!(
        "-- {} {} ({} mode, {}), sections: {}; sha256 {}",
        r.role,
        r.definition.as_deref().map(|d| format!("[{d}]")).unwrap_or_default(),
        r.mode,
        r.delivery,
        r.sections.join(", "),
        r.hash
    );
    if let Some(s) = &r.session {
        let same = if s.hash == r.hash { "same" } else { "differs: the bundle or facts changed since" };
        errln!("-- session {} started with sha256 {} ({same})", s.incarnation, s.hash);
    }
}

/// `canopy bundle check`: loads and lints a bundle locally (no daemon needed).
pub fn bundle_check(dir: &DataDir, json: bool, bundle: Option<std::path::PathBuf>, gated: bool) -> u8 {
    let source = match bundle {
        Some(path) => BundleSource::Dir(path),
        None => match Config::load(&dir.config()) {
            Ok(config) => BundleSource::from_config(&config, dir.root()),
            Err(e) => return fail(json, &CallError::Unreachable(e.to_string())),
        },
    };
    let name = match &source {
        BundleSource::Embedded => "embedded".to_owned(),
        BundleSource::Dir(path) => path.display().to_string(),
    };
    match check(&source, cli_commands()) {
        Ok(renderer) => {
            print_bundle_ok(json, &name, &renderer, gated);
            0
        }
        Err(problems) => {
            if json {
                output::json(&serde_json::json!({ "ok": false, "bundle": name, "problems": problems }));
            } else {
                errln!("bundle {name}: {} problem(s)", problems.len());
                for p in &problems {
                    errln!("  {p}");
                }
            }
            1
        }
    }
}

/// What a bundle that passed holds, and with `gated` the lines its sessions do not see yet.
fn print_bundle_ok(json: bool, name: &str, renderer: &Renderer, gated: bool) {
    let b = renderer.bundle();
    let counts = serde_json::json!({
        "roles": b.roles.len(), "definitions": b.definitions.len(),
        "skills": b.skills.len(), "rules": b.rules.len(),
    });
    let waiting = if gated { canopy_prompt::gated(renderer) } else { Vec::new() };
    if json {
        let waiting: Vec<serde_json::Value> = waiting
            .iter()
            .map(|g| serde_json::json!({ "role": g.role, "file": g.file, "line": g.line, "waits_for": g.waits_for, "text": g.text }))
            .collect();
        output::json(
            &serde_json::json!({ "ok": true, "bundle": name, "counts": counts, "problems": [], "gated": waiting }),
        );
    } else {
        let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        outln!(
            "bundle {name}: ok ({}, {}, {}, {})",
            count(b.roles.len(), "role"),
            count(b.definitions.len(), "definition"),
            count(b.skills.len(), "skill"),
            count(b.rules.len(), "rule")
        );
        if gated {
            output::gated(&waiting);
        }
    }
}
