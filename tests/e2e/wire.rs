//! Raw payloads straight onto every API subject: typed errors, and the daemon keeps serving.

use std::time::Duration;

use bytes::Bytes;
use canopy_proto::{Method, Reply};
use serde_json::Value;

use crate::env::TestEnv;

pub fn request(env: &TestEnv, bus: &canopy_bus::Bus, subject: &str, token: Option<&str>, payload: &[u8]) -> Value {
    let reply = env
        .rt
        .block_on(bus.request(subject, token, Bytes::copy_from_slice(payload), Duration::from_secs(5)))
        .unwrap_or_else(|e| panic!("{subject}: no reply to {:?}: {e}", String::from_utf8_lossy(payload)));
    serde_json::from_slice(&reply).unwrap_or_else(|e| panic!("{subject}: reply is not JSON ({e})"))
}

#[test]
fn malformed_payloads_on_every_subject_get_typed_errors() {
    let env = TestEnv::started();
    let bus = env.bus();
    let subjects = env.subjects();
    let operator = env.token();
    let runner = env.runner_token("embedded");
    let garbage: &[&[u8]] = &[
        b"not json",
        b"[]",
        b"42",
        b"\"string\"",
        b"{\"unknown_field\": 1}",
        b"{\"channel\": {\"nested\": [1,2,3]}}",
        b"\xff\xfe\x00",
        b"{\"channel\": \"announcements\", \"topic\": 7}",
        b"{",
    ];
    for method in Method::ALL {
        let subject = subjects.api(*method);
        let token = if method.is_runner_method() { &runner } else { &operator };
        for payload in garbage {
            let reply = request(&env, &bus, &subject, Some(token), payload);
            assert_eq!(
                reply["error"]["code"],
                "invalid_argument",
                "{subject} with {:?} gave {reply}",
                String::from_utf8_lossy(payload)
            );
        }
        let reply = request(&env, &bus, &subject, None, b"{}");
        assert_eq!(reply["error"]["code"], "forbidden", "{subject} without a token gave {reply}");
        let reply = request(&env, &bus, &subject, Some("cnp_forged"), b"{}");
        assert_eq!(reply["error"]["code"], "forbidden", "{subject} with a forged token gave {reply}");
        // Operators and runners each have their own methods.
        let other = if method.is_runner_method() { &operator } else { &runner };
        let reply = request(&env, &bus, &subject, Some(other), b"{}");
        assert_eq!(reply["error"]["code"], "forbidden", "{subject} with the wrong kind of token gave {reply}");
    }
    let reply = request(&env, &bus, &format!("{}.nope", subjects.api(Method::Tree)), Some(&operator), b"{}");
    assert_eq!(reply["error"]["code"], "not_found");

    // Nothing above changed anything, and the daemon still answers.
    let reply: Reply<Value> =
        serde_json::from_value(request(&env, &bus, &subjects.api(Method::Whoami), Some(&operator), b"")).unwrap();
    assert!(matches!(reply, Reply::Ok(_)), "the daemon stopped answering");
    assert_eq!(env.json(&["agents", "list"])["agents"].as_array().unwrap().len(), 1);
    assert_eq!(env.json(&["read", "--channel", "announcements"])["groups"].as_array().unwrap().len(), 0);
}

#[test]
fn a_large_garbage_payload_is_refused_and_the_daemon_survives() {
    let env = TestEnv::started();
    let bus = env.bus();
    let subject = env.subjects().api(Method::MessagesPost);
    let deep = "[".repeat(100_000);
    let reply = request(&env, &bus, &subject, Some(&env.token()), deep.as_bytes());
    assert_eq!(reply["error"]["code"], "invalid_argument");
    let nested = format!("{{\"channel\":{}", "[".repeat(100_000));
    let reply = request(&env, &bus, &subject, Some(&env.token()), nested.as_bytes());
    assert_eq!(reply["error"]["code"], "invalid_argument");
    env.json(&["whoami"]);
}
