//! The workspace's NATS logins and runner credentials: created at `init` (and by a start that
//! finds one missing), added and removed per runner, rotated on request, and turned into the
//! managed server's users with the permissions `canopy_proto::access` gives each party.
//!
//! Every secret is 256 random bits in a 0600 file under `credentials/` (0700), which no
//! session's sandbox binds. A user's name carries a random suffix that changes at every
//! rotation, so the server's reload closes every connection made with an old password. Does
//! not serve the API (`runners.add` and the rest are the `credentials` area's), or know the file shapes
//! (`canopy_config::credentials`).

use std::collections::HashMap;
use std::path::Path;

use canopy_bus::NatsUser;
use canopy_config::credentials::{self as files, NatsLogin, RunnerCredential};
use canopy_config::{DataDir, EMBEDDED_RUNNER};
use canopy_core::{Error, RunnerId};
use canopy_proto::{Party, Subjects};

use crate::auth::{random_hex, token_hash, write_private};

/// Everything the daemon needs of the credentials.
#[derive(Clone)]
pub struct Credentials {
    pub daemon: NatsLogin,
    pub operator: NatsLogin,
    pub runners: Vec<RunnerCredential>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.runners.iter().map(|r| r.runner_id.as_str()).collect();
        f.debug_struct("Credentials").field("runners", &ids).finish_non_exhaustive()
    }
}

impl Credentials {
    /// The managed server's users: one per party, each with its permissions.
    pub fn users(&self, subjects: &Subjects) -> Vec<NatsUser> {
        let user = |login: &NatsLogin, party: Party<'_>| NatsUser {
            user: login.user.clone(),
            password: login.password.clone(),
            permissions: subjects.permissions(party),
        };
        let mut users = vec![user(&self.daemon, Party::Daemon), user(&self.operator, Party::Operator)];
        for runner in &self.runners {
            // Ids in files were parsed when they were added; a hand-made bad one is skipped.
            if let Ok(id) = RunnerId::parse(&runner.runner_id) {
                users.push(user(&runner.nats, Party::Runner(&id)));
            }
        }
        users
    }

    /// Runner token hash -> runner id.
    pub fn runner_tokens(&self) -> HashMap<String, RunnerId> {
        self.runners.iter().filter_map(|r| Some((token_hash(&r.token), RunnerId::parse(&r.runner_id).ok()?))).collect()
    }

    /// The user names, for a reply.
    pub fn user_names(&self) -> Vec<String> {
        let mut names = vec![self.daemon.user.clone(), self.operator.user.clone()];
        names.extend(self.runners.iter().map(|r| r.nats.user.clone()));
        names
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::Internal(format!("{what}: {e}"))
}

fn invalid(e: files::CredentialError) -> Error {
    Error::Internal(e.to_string())
}

fn login(role: &str) -> Result<NatsLogin, Error> {
    let suffix = random_hex(4).map_err(io("generating a NATS user name".into()))?;
    let password = random_hex(32).map_err(io("generating a NATS password".into()))?;
    Ok(NatsLogin { user: format!("{role}-{suffix}"), password })
}

fn runner_credential(workspace_id: &str, id: &RunnerId) -> Result<RunnerCredential, Error> {
    let token = format!("cnr_{}", random_hex(32).map_err(io("generating a runner token".into()))?);
    Ok(RunnerCredential {
        workspace_id: workspace_id.to_owned(),
        runner_id: id.to_string(),
        nats: login(&format!("runner-{id}"))?,
        token,
    })
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), Error> {
    write_private(path, &files::to_text(value)).map_err(io(format!("writing {}", path.display())))
}

fn private_dir(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path).map_err(io(format!("creating {}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        .map_err(io(format!("restricting {}", path.display())))
}

/// Creates whichever credential is missing (the daemon's and the operators' logins, the
/// embedded runner's credential) and returns them all.
pub fn ensure(dir: &DataDir, workspace_id: &str) -> Result<Credentials, Error> {
    private_dir(&dir.credentials())?;
    private_dir(&dir.runner_credentials())?;
    for (path, role) in [(dir.daemon_login(), "daemon"), (dir.operator_login(), "operator")] {
        if !path.exists() {
            write_json(&path, &login(role)?)?;
        }
    }
    let embedded = dir.runner_credential(EMBEDDED_RUNNER);
    if !embedded.exists() {
        let id = RunnerId::from_trusted(EMBEDDED_RUNNER.to_owned());
        write_json(&embedded, &runner_credential(workspace_id, &id)?)?;
    }
    load(dir)
}

/// Reads every credential.
pub fn load(dir: &DataDir) -> Result<Credentials, Error> {
    Ok(Credentials {
        daemon: files::read(&dir.daemon_login()).map_err(invalid)?,
        operator: files::read(&dir.operator_login()).map_err(invalid)?,
        runners: files::runners(dir).map_err(invalid)?,
    })
}

/// A new runner's credential, written to its file. Refuses an id that has one.
pub fn add_runner(dir: &DataDir, workspace_id: &str, id: &RunnerId) -> Result<RunnerCredential, Error> {
    let path = dir.runner_credential(id.as_str());
    if path.exists() {
        return Err(Error::AlreadyExists { field: "id", what: format!("a credential for runner {id}") });
    }
    let credential = runner_credential(workspace_id, id)?;
    write_json(&path, &credential)?;
    Ok(credential)
}

/// Deletes a runner's credential. The embedded runner's cannot go (rotate it instead).
pub fn remove_runner(dir: &DataDir, id: &RunnerId) -> Result<(), Error> {
    if id.as_str() == EMBEDDED_RUNNER {
        return Err(Error::invalid("id", "the embedded runner's credential stays; rotate it instead"));
    }
    let path = dir.runner_credential(id.as_str());
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Error::NotFound { field: "id", what: format!("a credential for runner {id}") })
        }
        Err(e) => Err(io(format!("removing {}", path.display()))(e)),
    }
}

/// A new login for operator clients (after a revocation).
pub fn rotate_operator(dir: &DataDir) -> Result<(), Error> {
    write_json(&dir.operator_login(), &login("operator")?)
}

/// New logins and tokens for everyone, every file rewritten.
pub fn rotate(dir: &DataDir, workspace_id: &str) -> Result<Credentials, Error> {
    let old = load(dir)?;
    write_json(&dir.daemon_login(), &login("daemon")?)?;
    write_json(&dir.operator_login(), &login("operator")?)?;
    for runner in &old.runners {
        let id = RunnerId::from_trusted(runner.runner_id.clone());
        write_json(&dir.runner_credential(id.as_str()), &runner_credential(workspace_id, &id)?)?;
    }
    load(dir)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    #[test]
    fn credentials_are_private_complete_and_rotate_to_new_users() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = DataDir::new(root.path());
        let first = ensure(&dir, "ws-1").unwrap();
        assert_eq!(first.runners.len(), 1, "the embedded runner has a credential");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.credentials()), 0o700);
        assert_eq!(mode(&dir.daemon_login()), 0o600);
        assert_eq!(mode(&dir.runner_credential(EMBEDDED_RUNNER)), 0o600);
        let again = ensure(&dir, "ws-1").unwrap();
        assert_eq!(again.daemon.password, first.daemon.password, "ensure keeps what exists");

        let id = RunnerId::parse("build-box").unwrap();
        add_runner(&dir, "ws-1", &id).unwrap();
        assert!(add_runner(&dir, "ws-1", &id).is_err(), "an id gets one credential");
        assert_eq!(load(&dir).unwrap().runner_tokens().len(), 2);

        let rotated = rotate(&dir, "ws-1").unwrap();
        assert_ne!(rotated.daemon.user, first.daemon.user, "a rotation renames the users");
        assert_ne!(rotated.daemon.password, first.daemon.password);
        let old_tokens = load(&dir).unwrap().runner_tokens();
        assert!(!old_tokens.contains_key(&token_hash(&first.runners[0].token)));

        remove_runner(&dir, &id).unwrap();
        assert!(remove_runner(&dir, &RunnerId::parse(EMBEDDED_RUNNER).unwrap()).is_err());
        assert_eq!(load(&dir).unwrap().runners.len(), 1);
    }
}
