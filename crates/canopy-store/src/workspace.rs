//! The workspace row and first-time initialisation.
//!
//! `init` lays down the whole starting state in one transaction: the workspace, the root
//! Supervisor and its home channel, `#announcements` and `#incidents`, and the first
//! operator. Running it on an initialised store is a `conflict`, never a second workspace.

use canopy_core::{Error, Handle, Workspace};
use rusqlite::{OptionalExtension, params};

use crate::accounts::{self, AgentSpec, OperatorSpec};
use crate::channels::{self, ChannelSpec};
use crate::{Db, rfc3339, sql};

/// What `init` needs to know.
#[derive(Debug, Clone)]
pub struct InitSpec {
    pub workspace_id: String,
    pub name: String,
    pub mission: String,
    pub operator: OperatorSpec,
    /// The Supervisor's harness and script, from the role defaults.
    pub supervisor_harness: String,
    pub supervisor_script: Option<(String, String)>,
}

/// The workspace, if the store has been initialised.
pub fn workspace(conn: &Db<'_>) -> Result<Option<Workspace>, Error> {
    // Read by every `whoami`: a cached statement, not parsed each time.
    conn.prepare_cached("SELECT id, name, mission, created_at FROM workspace")
        .and_then(|mut s| {
            s.query_row([], |r| {
                Ok(Workspace { id: r.get(0)?, name: r.get(1)?, mission: r.get(2)?, created_at: rfc3339(r.get(3)?) })
            })
            .optional()
        })
        .map_err(sql("reading the workspace"))
}

/// Creates the workspace and its starting accounts and channels.
pub fn init(conn: &Db<'_>, spec: &InitSpec) -> Result<Workspace, Error> {
    if let Some(existing) = workspace(conn)? {
        return Err(Error::Conflict(format!(
            "this data directory already holds workspace {} ({}); it was not changed",
            existing.name, existing.id
        )));
    }
    conn.execute(
        "INSERT INTO workspace (id, name, mission, created_at) VALUES (?1, ?2, ?3, ?4)",
        params![spec.workspace_id, spec.name, spec.mission, conn.now_ms()],
    )
    .map_err(sql("creating the workspace"))?;

    // Canopy itself, the author of notices. Its handle is reserved, so no one can take it.
    conn.execute(
        "INSERT INTO accounts (handle, display_name, kind, state, created_at) VALUES ('canopy', 'Canopy', 'system', 'active', ?1)",
        params![conn.now_ms()],
    )
    .map_err(sql("creating the system account"))?;

    let supervisor = Handle::parse("supervisor").map_err(|e| Error::name("handle", e))?;
    accounts::insert_agent(
        conn,
        None,
        &AgentSpec {
            handle: supervisor.clone(),
            display_name: "Supervisor".into(),
            role: canopy_core::RoleName::from_trusted(canopy_core::RoleName::SUPERVISOR.into()),
            parent: None,
            charter: spec.mission.clone(),
            harness: spec.supervisor_harness.clone(),
            script: spec.supervisor_script.clone(),
            persona: None,
            repo: None,
            needs: Vec::new(),
        },
    )?;
    for name in ["announcements", "incidents"] {
        channels::create_channel(conn, None, &ChannelSpec::broadcast(name, &supervisor)?)?;
    }
    accounts::create_operator(conn, &spec.operator)?;
    workspace(conn)?.ok_or_else(|| Error::Internal("the workspace row vanished during init".into()))
}
