//! The credentials area: operators (add with a token of their own, list, revoke), runner
//! credentials (add, remove) and the rotation of every NATS login and runner token.
//!
//! Secrets the operator asks for on disk are written mode 0600; the daemon makes and keeps
//! the rest. A change to NATS logins returns once the managed server has applied it (the new
//! login accepted, a removed one refused), so the next command can rely on it. `canopy nats-config`, which needs no daemon, is `local.rs`'s.

use canopy_proto::api::*;
use canopy_proto::method;

use canopy_config::DataDir;

use super::call::call;
use crate::args::{CredentialsCommand, OperatorsCommand, RunnersCommand};
use crate::client::{CallError, Client};
use crate::exit::code;
use crate::output;
use crate::writer::outln;

/// `canopy operators add|list|revoke`.
pub async fn operators(client: &Client, json: bool, command: OperatorsCommand) -> u8 {
    let result = match command {
        OperatorsCommand::Add { handle, name, out } => {
            operators_add(client, json, OperatorsAddRequest { handle, name }, out).await
        }
        OperatorsCommand::List => {
            call::<method::OperatorsList>(client, json, &OperatorsListRequest {}, |r: &OperatorsListResponse| {
                output::operators(&r.operators)
            })
            .await
        }
        OperatorsCommand::Revoke { handle } => {
            let request = OperatorsRevokeRequest { handle };
            call::<method::OperatorsRevoke>(client, json, &request, |a: &canopy_core::Account| {
                outln!("revoked operator {}: its token is refused from now on", a.handle)
            })
            .await
        }
    };
    code(json, result)
}

/// `canopy runners add|remove`. Each returns once the managed NATS server has applied it: the
/// new runner's login accepted, the removed one's refused.
pub async fn runners(dir: &DataDir, client: &Client, json: bool, command: Option<RunnersCommand>) -> u8 {
    let result = match command.unwrap_or(RunnersCommand::List) {
        RunnersCommand::Add { id, out } => runners_add(client, json, id, out).await,
        RunnersCommand::Remove { id } => runners_remove(dir, client, json, id).await,
        RunnersCommand::List => {
            let listed = client.send::<method::RunnersList>(&RunnersListRequest {}).await;
            listed.map(|r| if json { output::json(&r) } else { output::runners(&r.runners) })
        }
        RunnersCommand::Drain { id } => runners_drain(client, json, id, true).await,
        RunnersCommand::Undrain { id } => runners_drain(client, json, id, false).await,
    };
    code(json, result)
}

/// `canopy runners drain` and `undrain`.
async fn runners_drain(client: &Client, json: bool, id: String, drain: bool) -> Result<(), CallError> {
    let runner = client.send::<method::RunnersDrain>(&RunnersDrainRequest { id, drain }).await?;
    match json {
        true => output::json(&runner),
        false if drain => outln!(
            "runner {} is draining: it takes no new session, and its {} session(s) move at their next turn boundary",
            runner.id,
            runner.sessions
        ),
        false => outln!("runner {} is back in service", runner.id),
    }
    Ok(())
}

/// `canopy runners remove`: the runner's login (read before it goes) is refused when it returns.
async fn runners_remove(dir: &DataDir, client: &Client, json: bool, id: String) -> Result<(), CallError> {
    let old: Option<canopy_config::RunnerCredential> =
        canopy_config::credentials::read(&dir.runner_credential(&id)).ok();
    let response = client.send::<method::RunnersRemove>(&RunnersRemoveRequest { id: id.clone() }).await?;
    if let (true, Some(old)) = (response.applied, &old) {
        client.await_login(&old.nats.user, &old.nats.password, false).await?;
    }
    match json {
        true => output::json(&response),
        false => output::credentials_changed(&format!("revoked runner {id}"), &response),
    }
    Ok(())
}

/// `canopy credentials rotate`: returns once the server accepts the operators' new login (the
/// daemon applies a rotation just after answering, since it renames the login that carries
/// the answer).
pub async fn credentials(dir: &DataDir, client: &Client, json: bool, command: CredentialsCommand) -> u8 {
    let CredentialsCommand::Rotate = command;
    let result = async {
        let response = client.send::<method::CredentialsRotate>(&CredentialsRotateRequest {}).await?;
        if response.applied {
            let (user, password) = canopy_config::credentials::read_login(&dir.operator_login())
                .map_err(|e| CallError::Unreachable(format!("reading the new operator login: {e}")))?;
            client.await_login(&user, &password, true).await?;
        }
        match json {
            true => output::json(&response),
            false => output::credentials_changed("rotated every NATS login and runner token", &response),
        }
        Ok(())
    }
    .await;
    code(json, result)
}

/// `canopy operators add`: the token goes to `--out` (0600), or is printed once.
async fn operators_add(
    client: &Client,
    json: bool,
    request: OperatorsAddRequest,
    out: Option<std::path::PathBuf>,
) -> Result<(), CallError> {
    let response = client.send::<method::OperatorsAdd>(&request).await?;
    if let Some(out) = &out {
        write_secret(out, &format!("{}\n", response.token))?;
    }
    if json {
        output::json(&response);
    } else {
        let handle = &response.account.handle;
        match &out {
            Some(out) => outln!("operator {handle}: token written to {} (0600)", out.display()),
            None => outln!("operator {handle}: token {} (shown once; keep it 0600)", response.token),
        }
    }
    Ok(())
}

/// `canopy runners add`: the daemon writes the credential; `--out` writes a copy to carry.
async fn runners_add(
    client: &Client,
    json: bool,
    id: String,
    out: Option<std::path::PathBuf>,
) -> Result<(), CallError> {
    let response = client.send::<method::RunnersAdd>(&RunnersAddRequest { id }).await?;
    if response.applied {
        client.await_login(&response.credential.nats_user, &response.credential.nats_password, true).await?;
    }
    if let Some(out) = &out {
        write_credential(out, &response.credential)?;
    }
    if json {
        output::json(&response);
    } else {
        output::runner_added(&response, out.as_deref());
    }
    Ok(())
}

/// Writes a runner credential where the operator asked, mode 0600.
fn write_credential(path: &std::path::Path, wire: &RunnerCredentialWire) -> Result<(), CallError> {
    let credential = canopy_config::RunnerCredential {
        workspace_id: wire.workspace_id.clone(),
        runner_id: wire.runner_id.to_string(),
        nats: canopy_config::NatsLogin { user: wire.nats_user.clone(), password: wire.nats_password.clone() },
        token: wire.token.clone(),
    };
    write_secret(path, &canopy_config::credentials::to_text(&credential))
}

/// Writes a secret where the operator asked, mode 0600.
fn write_secret(path: &std::path::Path, text: &str) -> Result<(), CallError> {
    canopy_sys::write_private(path, text.as_bytes())
        .map_err(|e| CallError::Unreachable(format!("writing {}: {e}", path.display())))
}
