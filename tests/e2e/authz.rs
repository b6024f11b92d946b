//! Authorization below and at the API: each NATS login connects and is refused what it may
//! not do (on the daemon's managed server, and on an external server configured with
//! `canopy nats-config`), rotation and revocation close what they replace, and a runner on
//! a second data directory joins with nothing but its credential file.

use std::process::Stdio;
use std::time::Duration;

use canopy_bus::{Bus, ConnectionEvent, Login};
use canopy_proto::{Method, Subjects};
use serde_json::Value;

use crate::env::{Guarded, TestEnv};

/// The managed server's URL and the workspace's subjects, from `daemon.json`.
fn managed(env: &TestEnv) -> (String, Subjects) {
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(env.data_dir().join("daemon.json")).unwrap()).unwrap();
    (info["nats_url"].as_str().unwrap().to_owned(), Subjects::new(info["workspace_id"].as_str().unwrap()))
}

/// A login's user and password from its file (a NATS login or a runner credential).
fn login_of(env: &TestEnv, file: &str) -> (String, String) {
    canopy_config::credentials::read_login(&env.data_dir().join(file)).unwrap()
}

fn connect(env: &TestEnv, url: &str, login: (String, String), inbox: String) -> Result<Bus, String> {
    let login = Login::fixed(&login.0, &login.1, Some(inbox));
    env.rt.block_on(Bus::connect(url, &login, "authz-test", false)).map_err(|e| e.to_string())
}

/// Subscribes to `subject` and says whether the server refused it (it answers a refusal
/// with an error on the connection; an accepted one is proven by a flush without one).
fn may_subscribe(env: &TestEnv, bus: &Bus, subject: &str) -> bool {
    refused(env, bus, |bus| {
        env.rt.block_on(async {
            let _subscription = bus.subscribe(subject).await.unwrap();
            bus.flush().await.unwrap();
        })
    })
    .is_none()
}

fn may_publish(env: &TestEnv, bus: &Bus, subject: &str) -> bool {
    refused(env, bus, |bus| env.rt.block_on(async { bus.publish(subject, bytes::Bytes::new()).await.unwrap() }))
        .is_none()
}

/// Runs `act` and returns the refusal the server sent for it, if any.
fn refused(env: &TestEnv, bus: &Bus, act: impl FnOnce(&Bus)) -> Option<String> {
    let mut events = bus.connection_events();
    act(bus);
    env.rt.block_on(async {
        // A refusal comes back in the round trip of a flush; a PING after it proves none came.
        let _ = bus.flush().await;
        tokio::time::timeout(Duration::from_millis(300), async {
            loop {
                match events.recv().await {
                    Ok(ConnectionEvent::Refused(why)) => return Some(why),
                    Ok(_) => {}
                    Err(_) => return None,
                }
            }
        })
        .await
        .ok()
        .flatten()
    })
}

#[test]
fn each_nats_login_may_do_only_its_part_on_the_managed_server() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.spawn_daemon(&["daemon"]);
    let (url, s) = managed(&env);
    let embedded = canopy_core::RunnerId::parse("embedded").unwrap();
    let second = canopy_core::RunnerId::parse("second").unwrap();
    env.runner_credential("second");

    // No login, or a wrong password: not even a connection.
    let open = env.rt.block_on(Bus::connect(&url, &Login::open(), "authz-test", false));
    assert!(open.is_err(), "the managed server took a client without credentials");
    let (user, _) = login_of(&env, "credentials/nats-operator.json");
    assert!(connect(&env, &url, (user, "wrong".into()), s.inbox(canopy_proto::Party::Operator)).is_err());

    // An operator client requests and reads events; it cannot serve the API, ring a runner,
    // hear a runner's steers, or read another party's replies.
    let operator =
        connect(&env, &url, login_of(&env, "credentials/nats-operator.json"), s.inbox(canopy_proto::Party::Operator))
            .unwrap();
    let whoami = canopy_bus::ApiClient::new(operator.clone(), s.clone(), Duration::from_secs(5));
    let who = env.rt.block_on(whoami.send::<canopy_proto::method::Whoami>(&env.token(), &Default::default()));
    assert!(who.is_ok(), "the operator login cannot make a request: {who:?}");
    assert!(may_subscribe(&env, &operator, &s.message_events_all()));
    assert!(!may_subscribe(&env, &operator, &s.api_wildcard()), "an operator login could answer API requests");
    assert!(!may_subscribe(&env, &operator, &s.runner_steer(&embedded)));
    assert!(!may_publish(&env, &operator, &s.runner_deliver(&embedded)), "an operator login rang a runner");
    assert!(!may_publish(&env, &operator, &s.message_event("announcements")), "an operator login faked an event");
    assert!(!may_subscribe(&env, &operator, &format!("{}.>", s.inbox(canopy_proto::Party::Runner(&second)))));

    // A runner's login: its own subjects and the poke; not the API, not another runner's.
    let runner = connect(
        &env,
        &url,
        login_of(&env, "credentials/runners/second.json"),
        s.inbox(canopy_proto::Party::Runner(&second)),
    )
    .unwrap();
    assert!(may_subscribe(&env, &runner, &s.runner_steer(&second)));
    assert!(may_subscribe(&env, &runner, &s.runner_poke()));
    assert!(!may_subscribe(&env, &runner, &s.api_wildcard()), "a runner login could answer API requests");
    assert!(!may_subscribe(&env, &runner, &s.runner_steer(&embedded)), "a runner heard another's steers");
    assert!(!may_subscribe(&env, &runner, &s.message_events_all()), "a runner read every channel's events");
    assert!(!may_publish(&env, &runner, &s.runner_deliver(&embedded)), "a runner rang another runner");
    assert!(!may_publish(&env, &runner, &s.api(Method::AgentsCreate)), "a runner requested an operator method");
    assert!(may_publish(&env, &runner, &s.api(Method::MessagesPost)), "a runner cannot forward a tool call");

    // The runner joins with its credential and hosts sessions.
    let _second = Guarded(
        env.command(&["runner", "--id", "second"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(env.dir.path().join("second.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let log = env.dir.path().join("second.log");
    crate::assert_eventually!(
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("registered with the daemon")),
        "the second runner never registered: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    // Rotation: the old logins stop working, everyone on this machine logs in again.
    let old_operator = login_of(&env, "credentials/nats-operator.json");
    let old_runner_token = env.runner_token("second");
    env.ok(&["credentials", "rotate"]);
    crate::assert_eventually!(
        connect(&env, &url, old_operator.clone(), s.inbox(canopy_proto::Party::Operator)).is_err(),
        "the old operator login still connects after a rotation"
    );
    crate::assert_eventually!(env.run(&["whoami"]).status.success(), "the CLI did not log in with the new login");
    assert_ne!(env.runner_token("second"), old_runner_token);
    env.ok(&["post", "--channel", "announcements", "--topic", "t", "--create-topic", "after the rotation"]);
    let audit = env.ok(&["--json", "audit"]);
    assert!(audit.contains("credentials.rotate") && audit.contains("runners.add"), "{audit}");

    // Revocation: the runner's login and token are gone.
    let revoked = login_of(&env, "credentials/runners/second.json");
    env.ok(&["runners", "remove", "second"]);
    crate::assert_eventually!(
        connect(&env, &url, revoked.clone(), s.inbox(canopy_proto::Party::Runner(&second))).is_err(),
        "a revoked runner still connects"
    );
}

/// A free loopback port (bound, then released for the server to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `nats-server` with `canopy nats-config`'s block, as an operator would run it.
fn external_server(env: &TestEnv, port: u16) -> Guarded {
    let conf = env.dir.path().join("external.conf");
    let block = env.ok(&["nats-config"]);
    std::fs::write(&conf, format!("listen: 127.0.0.1:{port}\n{block}")).unwrap();
    let server = Guarded(
        std::process::Command::new(canopy_bus::find_nats_server().unwrap())
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    crate::assert_eventually!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(), "nats-server did not start");
    server
}

#[test]
fn an_external_server_set_up_by_nats_config_takes_a_runner_from_a_second_directory() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    let block = env.ok(&["nats-config"]);
    assert!(block.contains("$2b$04$") && !block.contains(&login_of(&env, "credentials/nats-daemon.json").1), "{block}");
    let port = free_port();
    let url = format!("nats://127.0.0.1:{port}");
    let mut server = external_server(&env, port);
    env.spawn_daemon(&["daemon", "--nats-url", &url]);
    assert!(
        env.rt.block_on(Bus::connect(&url, &Login::open(), "authz-test", false)).is_err(),
        "the configured server took a client without credentials"
    );

    // A runner for another machine: its file, the server told, a second data directory.
    let file = env.dir.path().join("far.json");
    let added = env.json(&["runners", "add", "far", "--out", file.to_str().unwrap()]);
    assert_eq!(added["applied"], false, "an external server cannot have applied it: {added}");
    drop(server);
    server = external_server(&env, port);
    let far = env.dir.path().join("far-data");
    std::fs::create_dir_all(&far).unwrap();
    let log = env.dir.path().join("far.log");
    let _runner = Guarded(
        std::process::Command::new(crate::env::CANOPY)
            .arg("--dir")
            .arg(&far)
            .args(["runner", "--credentials", file.to_str().unwrap(), "--nats-url", &url])
            .env("RUST_LOG", "info")
            .env_remove("CANOPY_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    crate::assert_eventually!(
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("registered with the daemon")),
        "the far runner never registered: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    drop(server);
}
