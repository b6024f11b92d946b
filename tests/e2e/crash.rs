//! `kill -9` of the daemon loses no acknowledged message and duplicates none.

use std::sync::{Arc, Mutex};

use crate::env::TestEnv;

#[test]
fn acknowledged_posts_survive_kill_9_exactly_once() {
    let mut env = TestEnv::started();
    env.json(&[
        "post",
        "--channel",
        "announcements",
        "--topic",
        "load",
        "--create-topic",
        "--idempotency-key",
        "k-0",
        "m-0",
    ]);

    // Post continuously from another thread; record what the daemon acknowledged.
    let acknowledged = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poster = {
        let acknowledged = acknowledged.clone();
        let stop = stop.clone();
        let data_dir = env.data_dir();
        std::thread::spawn(move || {
            let mut i = 1;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 400 {
                let body = format!("m-{i}");
                let key = format!("k-{i}");
                let out = std::process::Command::new(crate::env::CANOPY)
                    .arg("--dir")
                    .arg(&data_dir)
                    .args(["post", "--channel", "announcements", "--topic", "load", "--idempotency-key", &key, &body])
                    .env("RUST_LOG", "off")
                    .output()
                    .unwrap();
                if out.status.success() {
                    acknowledged.lock().unwrap().push(body);
                }
                i += 1;
            }
        })
    };
    crate::assert_eventually!(acknowledged.lock().unwrap().len() >= 15, "no posts were acknowledged");
    env.kill_daemon();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    poster.join().unwrap();

    env.start_daemon();
    let page = env.json(&["read", "--channel", "announcements", "--limit", "1000"]);
    let stored: Vec<String> = page["groups"][0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_owned())
        .collect();
    let mut unique = stored.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), stored.len(), "a message was stored twice: {stored:?}");
    for body in acknowledged.lock().unwrap().iter().chain(std::iter::once(&"m-0".to_owned())) {
        assert!(stored.contains(body), "acknowledged {body} was lost across kill -9");
    }

    // A retry of an acknowledged post after the restart returns the stored message.
    let retry = env.json(&["post", "--channel", "announcements", "--topic", "load", "--idempotency-key", "k-0", "m-0"]);
    assert_eq!(retry["duplicate"], true);
}

#[test]
fn the_done_means_scenario_post_kill_restart_read() {
    let mut env = TestEnv::started();
    env.ok(&["post", "--channel", "announcements", "--topic", "hello", "--create-topic", "hi"]);
    env.kill_daemon();
    env.start_daemon();
    let page = env.json(&["read", "--channel", "announcements"]);
    assert_eq!(page["groups"][0]["messages"].as_array().unwrap().len(), 1);
    assert_eq!(page["groups"][0]["messages"][0]["body"], "hi");
}
