//! Fuzzed API payloads against a live daemon: for every method, requests generated from its
//! JSON Schema (`proto/schemas/<method>.request.json`), valid shapes with hostile values and
//! invalid shapes (missing, unknown and mistyped fields, non-objects, bytes that are not JSON
//! or not UTF-8), with every kind of token (operator, runner, session, unknown, malformed,
//! none). The daemon must never die, every reply must be a well-formed envelope, nothing that
//! breaks a grammar or limit may be stored, and a normal post must work after every batch.
//!
//! 20,000 payloads by default; `CANOPY_FUZZ_PAYLOADS=1000000` is the long form
//! (`docs/reliability.md`), `CANOPY_FUZZ_SEED` replays a run (the seed is printed).

use std::time::{Duration, Instant};

use bytes::Bytes;
use canopy_proto::Method;
use serde_json::{Map, Value, json};

use canopy_core::fuzz::Rng;

use crate::env::TestEnv;

/// Strings a hostile caller sends: subject tokens, wildcards, control characters, path
/// tricks, near-miss names, real names, very long ones.
fn hostile_string(rng: &mut Rng) -> String {
    const FIXED: &[&str] = &[
        "",
        " ",
        "supervisor",
        "ops",
        "announcements",
        "incidents",
        "home-supervisor",
        "general",
        ">",
        "*",
        "a.b",
        "a b",
        "..",
        "../../etc/passwd",
        "\0",
        "a\0b",
        "\t",
        "\n",
        "@supervisor",
        "@",
        "#announcements",
        "canopy",
        "é",
        "\u{202e}rtl",
        "😀",
        "null",
        "true",
        "-1",
        "0",
        "req-1",
        "mr-1",
        "cns_0",
        "cnr_0",
        "spawn: x",
        "UPPER",
        "a-",
        "-a",
        "a--b",
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "{\"ok\":1}",
        "%00",
        "\\",
        "'",
        "\"",
    ];
    match rng.below(4) {
        0 => (*rng.pick(FIXED)).to_owned(),
        1 => {
            let len = rng.below(40);
            (0..len).map(|_| char::from_u32(rng.below(0x3000) as u32).unwrap_or('?')).collect()
        }
        2 => {
            let len = *rng.pick(&[200, 1_000, 70_000]);
            "z".repeat(len)
        }
        _ => {
            let len = 1 + rng.below(12);
            (0..len).map(|_| *rng.pick(&['a', 'b', '-', '0', '_', '.', '>', '*', ' '])).collect()
        }
    }
}

fn hostile_number(rng: &mut Rng) -> Value {
    match rng.below(8) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(u64::MAX),
        3 => json!(i64::MIN),
        4 => json!(1.5),
        5 => json!(1e300),
        6 => json!(rng.below(10)),
        _ => json!(rng.below(1_000_000)),
    }
}

/// Any JSON value, for mistyped fields.
fn any_value(rng: &mut Rng, depth: u32) -> Value {
    match rng.below(if depth > 2 { 4 } else { 6 }) {
        0 => Value::Null,
        1 => json!(rng.chance(50)),
        2 => hostile_number(rng),
        3 => json!(hostile_string(rng)),
        4 => Value::Array((0..rng.below(4)).map(|_| any_value(rng, depth + 1)).collect()),
        _ => {
            let mut map = Map::new();
            for _ in 0..rng.below(4) {
                map.insert(hostile_string(rng), any_value(rng, depth + 1));
            }
            Value::Object(map)
        }
    }
}

/// A value of the schema's shape, with hostile contents.
fn from_schema(rng: &mut Rng, schema: &Value, root: &Value, depth: u32) -> Value {
    if depth > 6 {
        return Value::Null;
    }
    if let Some(reference) = schema["$ref"].as_str() {
        let name = reference.rsplit('/').next().unwrap_or("");
        return from_schema(rng, &root["$defs"][name], root, depth + 1);
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(options) = schema[key].as_array() {
            let option = rng.pick(options);
            return from_schema(rng, option, root, depth + 1);
        }
    }
    if let Some(values) = schema["enum"].as_array() {
        return rng.pick(values).clone();
    }
    if !schema["const"].is_null() {
        return schema["const"].clone();
    }
    let kind = match &schema["type"] {
        Value::String(s) => s.clone(),
        Value::Array(types) => rng.pick(types).as_str().unwrap_or("null").to_owned(),
        _ => return any_value(rng, depth),
    };
    match kind.as_str() {
        "string" => json!(hostile_string(rng)),
        "integer" | "number" => hostile_number(rng),
        "boolean" => json!(rng.chance(50)),
        "null" => Value::Null,
        "array" => {
            Value::Array((0..rng.below(5)).map(|_| from_schema(rng, &schema["items"], root, depth + 1)).collect())
        }
        _ => {
            let mut map = Map::new();
            let required: Vec<&str> =
                schema["required"].as_array().map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
            if let Some(properties) = schema["properties"].as_object() {
                for (name, property) in properties {
                    if required.contains(&name.as_str()) || rng.chance(60) {
                        map.insert(name.clone(), from_schema(rng, property, root, depth + 1));
                    }
                }
            }
            Value::Object(map)
        }
    }
}

/// One payload for `schema`: mostly its shape with hostile values, else a broken shape.
fn payload(rng: &mut Rng, schema: &Value) -> Bytes {
    let mut value = from_schema(rng, schema, schema, 0);
    match rng.below(10) {
        0 => {
            if let Some(map) = value.as_object_mut()
                && let Some(key) = map.keys().next().cloned()
            {
                map.remove(&key);
            }
        }
        1 => {
            if let Some(map) = value.as_object_mut() {
                map.insert(hostile_string(rng), any_value(rng, 0));
            }
        }
        2 => {
            if let Some(map) = value.as_object_mut()
                && let Some(key) = map.keys().next().cloned()
            {
                map.insert(key, any_value(rng, 0));
            }
        }
        3 => value = any_value(rng, 0),
        4 => {
            return match rng.below(4) {
                0 => Bytes::from_static(b"{\"channel\": "),
                1 => Bytes::from_static(b"\xff\xfe{}"),
                2 => Bytes::new(),
                _ => Bytes::from(vec![b'['; 10_000]),
            };
        }
        _ => {}
    }
    Bytes::from(value.to_string())
}

/// `{"ok": ..}` alone, or `{"error": {code, message[, field]}}` with a known code.
fn well_formed(reply: &[u8]) -> Result<(), String> {
    let value: Value = serde_json::from_slice(reply).map_err(|e| format!("not JSON: {e}"))?;
    let object = value.as_object().ok_or("not an object")?;
    match (object.len(), object.get("ok"), object.get("error")) {
        (1, Some(_), None) => Ok(()),
        (1, None, Some(error)) => {
            let code = error["code"].as_str().ok_or("error without a code")?;
            const CODES: &[&str] = &[
                "not_found",
                "forbidden",
                "invalid_argument",
                "conflict",
                "limit_exceeded",
                "unavailable",
                "internal",
            ];
            if !CODES.contains(&code) {
                return Err(format!("unknown code {code}"));
            }
            if code == "internal" {
                return Err(format!("an internal error from fuzzed input: {error}"));
            }
            error["message"].as_str().ok_or("error without a message")?;
            Ok(())
        }
        _ => Err("neither ok nor error".into()),
    }
}

/// Methods a hostile operator payload would turn against the test itself (its own login
/// and token) or that reach outside the workspace (a repository source path).
fn spared(method: Method, operator: bool) -> bool {
    operator
        && matches!(
            method,
            Method::CredentialsRotate
                | Method::OperatorsRevoke
                | Method::RunnersRemove
                | Method::ReposAdd
                | Method::ReposGc
                | Method::AgentsStop
        )
}

#[test]
fn fuzzed_payloads_to_every_method_get_well_formed_replies_and_store_nothing_invalid() {
    let total: usize = std::env::var("CANOPY_FUZZ_PAYLOADS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let seed: u64 = std::env::var("CANOPY_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| canopy_sys::unix_us().max(1) as u64);
    eprintln!("fuzzing {total} payloads, seed {seed} (CANOPY_FUZZ_SEED={seed} replays)");
    let env = TestEnv::started_with(&[
        ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
        ("quiet_window = \"2s\"", "quiet_window = \"100ms\""),
    ]);
    env.create_scripted("target", "[[rule]]\nmatch = { kind = \"message\" }\nactions = [{ say = \"ok\" }]\n");
    let operator = env.token();
    let runner = env.runner_token("second");
    let session = {
        let pid = env.wait_harness_pid("target", 1);
        crate::sessions::process_env(pid).get("CANOPY_MCP_TOKEN").cloned().unwrap_or_default()
    };
    let tokens: Vec<Option<String>> = vec![
        Some(operator.clone()),
        Some(runner),
        Some(session),
        Some("cns_0000".into()),
        Some("not a token\0".into()),
        Some(String::new()),
        None,
    ];
    let schemas: Vec<(Method, Value)> = Method::ALL
        .iter()
        .map(|m| {
            let path = format!("{}/../proto/schemas/{}.request.json", env!("CARGO_MANIFEST_DIR"), m.as_str());
            (*m, serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap())
        })
        .collect();
    let bus = env.bus();
    let subjects = env.subjects();
    let mut rng = Rng::new(seed);
    let started = Instant::now();
    let (mut sent, mut batch_no) = (0usize, 0u64);
    let mut codes = std::collections::BTreeMap::<String, u64>::new();
    while sent < total {
        let batch = (total - sent).min(2_000);
        let replies: Vec<Result<(String, Vec<u8>), String>> = env.rt.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            let mut out = Vec::new();
            for _ in 0..batch {
                // A spared (method, token) pair is drawn again, so every payload counted is sent.
                let (method, schema, token) = loop {
                    let (method, schema) = rng.pick(&schemas);
                    // The operator's token reaches the most code: four in ten requests carry it.
                    let token = if rng.chance(40) { tokens[0].clone() } else { rng.pick(&tokens).clone() };
                    if !spared(*method, token.as_deref() == Some(operator.as_str())) {
                        break (method, schema, token);
                    }
                };
                let body = payload(&mut rng, schema);
                let subject = subjects.api(*method);
                let bus = bus.clone();
                let what =
                    format!("{} with {}", method.as_str(), String::from_utf8_lossy(&body[..body.len().min(300)]));
                tasks.spawn(async move {
                    bus.request(&subject, token.as_deref(), body, Duration::from_secs(30))
                        .await
                        .map(|reply| (what.clone(), reply.to_vec()))
                        .map_err(|e| format!("{what}: no reply: {e}"))
                });
                // Bounded concurrency: 64 requests in flight.
                while tasks.len() >= 64 {
                    if let Some(done) = tasks.join_next().await {
                        out.push(done.unwrap());
                    }
                }
            }
            while let Some(done) = tasks.join_next().await {
                out.push(done.unwrap());
            }
            out
        });
        for reply in replies {
            let (what, bytes) = reply.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            if let Err(why) = well_formed(&bytes) {
                panic!("seed {seed}: {what}: {why}: {}", String::from_utf8_lossy(&bytes));
            }
            let value: Value = serde_json::from_slice(&bytes).unwrap();
            let code = value["error"]["code"].as_str().unwrap_or("ok").to_owned();
            *codes.entry(code).or_default() += 1;
        }
        sent += batch;
        batch_no += 1;
        // A normal post still works, and the daemon is the same process.
        let posted = env.json(&[
            "post",
            "--channel",
            "announcements",
            "--topic",
            "fuzz",
            "--create-topic",
            &format!("after batch {batch_no}"),
        ]);
        assert!(
            posted["message"]["seq"].as_u64().is_some(),
            "seed {seed}: a normal post failed after batch {batch_no}"
        );
    }
    let elapsed = started.elapsed();
    eprintln!(
        "{sent} payloads in {:.1} s ({:.0}/s), replies by code: {codes:?}",
        elapsed.as_secs_f64(),
        sent as f64 / elapsed.as_secs_f64()
    );

    // Nothing stored breaks a grammar or a limit (read through the API as the operator).
    let call = |method: Method, body: Value| -> Value {
        let reply = env
            .rt
            .block_on(bus.request(
                &subjects.api(method),
                Some(&operator),
                Bytes::from(body.to_string()),
                Duration::from_secs(30),
            ))
            .unwrap();
        let value: Value = serde_json::from_slice(&reply).unwrap();
        assert!(value["error"].is_null(), "{}: {value}", method.as_str());
        value["ok"].clone()
    };
    for channel in call(Method::ChannelsList, json!({}))["channels"].as_array().unwrap() {
        let name = channel["name"].as_str().unwrap();
        canopy_core::ChannelName::parse(name).unwrap_or_else(|e| panic!("seed {seed}: stored channel {name:?}: {e}"));
        for topic in call(Method::TopicsList, json!({ "channel": name }))["topics"].as_array().unwrap() {
            let t = topic["name"].as_str().unwrap();
            canopy_core::TopicName::parse(t)
                .unwrap_or_else(|e| panic!("seed {seed}: stored topic {t:?} in {name}: {e}"));
        }
    }
    for agent in call(Method::AgentsList, json!({}))["agents"].as_array().unwrap() {
        let handle = agent["handle"].as_str().unwrap();
        canopy_core::Handle::parse(handle).unwrap_or_else(|e| panic!("seed {seed}: stored handle {handle:?}: {e}"));
    }
    let mut after = 0u64;
    loop {
        let page = call(Method::MessagesSync, json!({ "after": after }));
        for m in page["messages"].as_array().unwrap() {
            let body = m["body"].as_str().unwrap();
            assert!(body.len() <= 64 * 1024, "seed {seed}: a stored body of {} bytes", body.len());
        }
        after = page["next_after"].as_u64().unwrap();
        if page["more"] != true {
            break;
        }
    }
}
