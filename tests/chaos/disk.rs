//! A full disk under load: the data directory is a small tmpfs filled to the last byte while
//! posters run. Posts are refused `unavailable` (never `internal`), nothing refused is stored,
//! the daemon stays up, and posting resumes as soon as space returns.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{Ledger, api, check_posts_exactly_once, figure, scale};
use crate::env::TestEnv;

/// A tmpfs mounted on a directory, lazily unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "canopy-chaos"])
            .arg(at)
            .output()
            .unwrap_or_else(|e| panic!("running mount: {e}"));
        assert!(
            out.status.success(),
            "the full-disk scenario mounts a small tmpfs and needs root (CI runs as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes zeros to `path` until the file system refuses; returns the bytes written.
fn fill(path: &Path) -> u64 {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 << 10];
    let mut written = 0u64;
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("filling the disk: {e}"),
        }
    }
    let _ = file.sync_all();
    written
}

#[test]
fn a_full_disk_refuses_posts_as_unavailable_stores_none_of_them_and_recovers() {
    const SCENARIO: &str = "full disk";
    let rounds = scale(2, 10);
    let mut env = TestEnv::new();
    let _tmpfs = Tmpfs::mount(&env.data_dir(), "48m");
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(&[("embedded = true", "embedded = false")]);
    env.start_daemon();
    env.ok(&["post", "--channel", "announcements", "--topic", "load", "--create-topic", "before"]);

    let api = api(&env);
    let token = env.token();
    let ledger = Arc::new(Ledger::default());
    let stop = Arc::new(AtomicBool::new(false));
    let refusals = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<String, u64>::new()));
    // Posters that count refusals by code, retrying each post until acknowledged.
    let tasks: Vec<_> = (0..4)
        .map(|poster| {
            let (api, token, stop, ledger, refusals) =
                (api.clone(), token.clone(), stop.clone(), ledger.clone(), refusals.clone());
            env.rt.spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("p{poster}-{i}");
                    let request = canopy_proto::api::PostRequest {
                        channel: "announcements".into(),
                        topic: "load".into(),
                        body: format!("POST {key} {}", "x".repeat(2000)),
                        create_topic: false,
                        idempotency_key: Some(key.clone()),
                        ack_only: false,
                        wake: false,
                    };
                    loop {
                        match api.send::<canopy_proto::method::MessagesPost>(&token, &request).await {
                            Ok(reply) => {
                                ledger.acked.lock().unwrap().insert(
                                    key.clone(),
                                    (request.channel.clone(), request.body.clone(), reply.message.seq),
                                );
                                break;
                            }
                            Err(canopy_bus::CallError::Refused(e)) => {
                                *refusals.lock().unwrap().entry(e.code.as_str().to_owned()).or_default() += 1;
                                assert_eq!(e.code.as_str(), "unavailable", "a full disk gave {e}");
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            Err(canopy_bus::CallError::Unreachable(e)) => panic!("the daemon stopped answering: {e}"),
                        }
                    }
                    i += 1;
                }
            })
        })
        .collect();

    let filler = env.data_dir().join("filler");
    let mut recoveries = Vec::new();
    let mut filled_bytes = 0;
    for _ in 0..rounds {
        std::thread::sleep(Duration::from_millis(500));
        filled_bytes = fill(&filler);
        // Full: refusals arrive and nothing is acknowledged for a while.
        let refused_before = refusals.lock().unwrap().get("unavailable").copied().unwrap_or(0);
        crate::assert_eventually!(
            refusals.lock().unwrap().get("unavailable").copied().unwrap_or(0) > refused_before + 20,
            "a full disk refused nothing"
        );
        let acked = ledger.acked().len();
        std::thread::sleep(Duration::from_millis(300));
        assert!(ledger.acked().len() <= acked + 4, "posts kept being acknowledged on a full disk");
        if let Some(daemon) = env.daemon.as_mut() {
            assert!(daemon.try_wait().unwrap().is_none(), "the daemon died on a full disk: {}", env.daemon_log());
        }
        // Space returns: posting resumes.
        std::fs::remove_file(&filler).unwrap();
        let at = Instant::now();
        let acked = ledger.acked().len();
        crate::assert_eventually!(ledger.acked().len() > acked + 4, "posting never resumed after space returned");
        recoveries.push(at.elapsed());
    }
    super::stop_load(&env, &stop, tasks);
    let stored = check_posts_exactly_once(&env, &api, &ledger, &["announcements".to_owned()]);
    // The daemon restarts cleanly on the same files.
    env.kill_daemon();
    env.start_daemon();
    check_posts_exactly_once(&env, &api, &ledger, &["announcements".to_owned()]);
    let (p50, max) = super::p50_max(&mut recoveries);
    let refused = refusals.lock().unwrap().clone();
    figure(
        SCENARIO,
        format!(
            "{rounds} rounds on a 48 MiB tmpfs filled to the last byte ({} MiB of filler); {} posts acknowledged and {stored} stored, refusals {refused:?}; posting resumed p50 {p50:.0} ms, max {max:.0} ms after space returned",
            filled_bytes >> 20,
            ledger.acked().len()
        ),
    );
}
