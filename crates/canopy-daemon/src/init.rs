//! `canopy init`: lay down a new workspace in a data directory.
//!
//! Creates the directory (mode 0700), the database with its starting state, the
//! operator's token file (0600) and the commented `canopy.toml`. A directory that already
//! holds a workspace is refused and left untouched.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};

use canopy_core::{Error, Handle, Workspace};
use canopy_store::{InitSpec, OperatorSpec, Store};
use serde::Serialize;

use crate::auth::{load_or_create, new_token, random_hex, token_hash, write_private};
use crate::roles::RoleDefaults;
use canopy_config::Config;
use canopy_config::DataDir;
use canopy_config::config::DEFAULT_TOML;

/// What the operator asked `init` for.
#[derive(Debug, Clone)]
pub struct InitOptions {
    pub mission: String,
    /// The operator's handle (from `--operator` or `$USER`).
    pub operator: String,
    pub name: String,
    /// How the built-in role defaults' scripts are checked.
    pub check_script: crate::roles::ScriptCheck,
}

/// What `init` made, for the CLI to print.
#[derive(Debug, Clone, Serialize)]
pub struct InitReport {
    pub workspace: Workspace,
    pub operator: String,
    pub data_dir: String,
    pub token_file: String,
    pub config_file: String,
}

/// Longest mission statement, in bytes.
pub const MAX_MISSION_BYTES: usize = 4096;

pub async fn init(dir: &DataDir, options: &InitOptions) -> Result<InitReport, Error> {
    let operator = Handle::parse(&options.operator).map_err(|e| Error::name("operator", e))?;
    if options.mission.len() > MAX_MISSION_BYTES {
        return Err(Error::TooLarge { field: "mission", len: options.mission.len(), max: MAX_MISSION_BYTES });
    }
    if options.name.trim().is_empty() || options.name.chars().any(char::is_control) || options.name.len() > 128 {
        return Err(Error::invalid("name", "a workspace name is 1 to 128 bytes of text on one line"));
    }
    let io = |what: String| move |e: std::io::Error| Error::Unavailable(format!("{what}: {e}"));
    if dir.db().exists() {
        // Read-only look first, so a second init never opens the writer on a live store.
        return Err(Error::Conflict(format!(
            "{} already holds a Canopy workspace; nothing was changed (use another --dir, or remove it to start over)",
            dir.root().display()
        )));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir.root())
        .map_err(io(format!("creating {}", dir.root().display())))?;

    let token = new_token().map_err(io("generating the operator token".into()))?;
    // The Supervisor's session defaults come from the configuration `init` is about to write.
    let supervisor = RoleDefaults::resolve(&Config::default(), &dir.config(), dir.root(), options.check_script)
        .map_err(|e| Error::Internal(format!("the built-in role defaults are invalid: {e}")))?
        .for_role(canopy_core::RoleName::SUPERVISOR);
    let spec = InitSpec {
        workspace_id: format!("ws-{}", random_hex(6).map_err(io("generating the workspace id".into()))?),
        name: options.name.clone(),
        mission: options.mission.clone(),
        operator: OperatorSpec {
            handle: operator.clone(),
            display_name: operator.to_string(),
            token_hash: token_hash(&token),
        },
        supervisor_harness: supervisor.harness,
        supervisor_script: supervisor.script,
    };
    let store = Store::open(&dir.db(), 16)?;
    let result = store.write(move |conn| canopy_store::ops::init(conn, &spec)).await;
    store.close().await;
    let workspace = result?;

    write_private(&dir.operator_token(), &format!("{token}\n"))
        .map_err(io(format!("writing {}", dir.operator_token().display())))?;
    crate::logins::ensure(dir, &workspace.id)?;
    load_or_create(&dir.session_secret(), "").map_err(io(format!("writing {}", dir.session_secret().display())))?;
    if !dir.config().exists() {
        std::fs::write(dir.config(), DEFAULT_TOML).map_err(io(format!("writing {}", dir.config().display())))?;
        // The file holds no secret; its mode is a courtesy, and the workspace already exists.
        if let Err(e) = std::fs::set_permissions(dir.config(), std::fs::Permissions::from_mode(0o644)) {
            tracing::warn!(error = %e, path = %dir.config().display(), "setting canopy.toml's mode failed");
        }
    }
    Ok(InitReport {
        workspace,
        operator: operator.to_string(),
        data_dir: dir.root().display().to_string(),
        token_file: dir.operator_token().display().to_string(),
        config_file: dir.config().display().to_string(),
    })
}
