//! The work ledger's rules end to end, on a real daemon with scripted sessions calling the
//! API with their own session tokens: assigning outside the subtree refused; a state change by
//! a non-owner refused and audited; `done` with an open sub-issue refused naming it; a
//! dependency cycle refused naming it; a blocker reaching `done` and a sub-issue closing reach
//! the owner in the issue's topic; reassignment moves the topic and tells both owners; an
//! unowned issue reaches the Supervisor to triage; a Manager's turn counts toward its one
//! `in_progress` issue; a spent issue budget holds runs for it; lists page newest first too;
//! and all of it survives a daemon `kill -9`.
//!
//! Owns these scenarios only; the CLI's commands and import are `issues_cli`'s, the board
//! `console`'s, a linked merge landing the demo's.

use serde_json::{Value, json};

use crate::authz::session_token;
use crate::env::TestEnv;

/// Reports usage on `spend`, and notes everything else.
const MANAGER: &str = r#"
[[rule]]
match = { kind = "message", text_contains = "spend now" }
actions = [{ usage = { input_tokens = 1000, output_tokens = 100, cost_usd = 0.40 } }, { say = "spent" }]

[[rule]]
actions = [{ say = "noted" }]
"#;

struct Ledger {
    env: TestEnv,
    bus: canopy_bus::Bus,
    operator: String,
}

impl Ledger {
    /// The reply to `method` as `token`: `Ok(ok)` or `Err(error)`.
    fn call(&self, token: &str, method: &str, request: Value) -> Result<Value, Value> {
        let method = canopy_proto::Method::parse(method).unwrap();
        let subject = self.env.subjects().api(method);
        let reply = crate::wire::request(&self.env, &self.bus, &subject, Some(token), request.to_string().as_bytes());
        match reply.get("ok") {
            Some(ok) => Ok(ok.clone()),
            None => Err(reply["error"].clone()),
        }
    }

    fn ok(&self, token: &str, method: &str, request: Value) -> Value {
        self.call(token, method, request.clone()).unwrap_or_else(|e| panic!("{method} {request}: {e}"))
    }

    fn refused(&self, token: &str, method: &str, request: Value) -> Value {
        match self.call(token, method, request.clone()) {
            Ok(ok) => panic!("{method} {request} was not refused: {ok}"),
            Err(e) => e,
        }
    }

    fn show(&self, number: u64) -> Value {
        self.ok(&self.operator, "issues.show", json!({ "issue": number }))
    }

    /// Canopy's posts in `channel` under `topic`.
    fn told(&self, channel: &str, topic: &str) -> Vec<String> {
        self.env
            .messages(channel)
            .into_iter()
            .filter(|m| m["sender"]["handle"] == "canopy" && m["topic"] == topic)
            .filter_map(|m| m["body"].as_str().map(str::to_owned))
            .collect()
    }
}

fn codes(error: &Value) -> (&str, &str) {
    (error["code"].as_str().unwrap_or(""), error["message"].as_str().unwrap_or(""))
}

#[test]
fn the_ledger_s_rules_hold_end_to_end_and_survive_a_kill_9() {
    let env = TestEnv::started_with(crate::sessions::FAST);
    env.create_scripted("m1", MANAGER);
    env.create_scripted("m2", MANAGER);
    let report = env.script("w1.toml", MANAGER);
    env.json(&["agents", "create", "--handle", "w1", "--name", "w1", "--parent", "m1", "--script", &report]);
    let (m1, m2, w1) = (session_token(&env, "m1"), session_token(&env, "m2"), session_token(&env, "w1"));
    let ledger = Ledger { bus: env.bus(), operator: env.token(), env };
    let op = ledger.operator.clone();

    // The operator files #1 for m1: it arrives in m1's home under the issue's topic.
    let one = ledger.ok(&op, "issues.create", json!({ "title": "Ship the login page", "owner": "m1" }));
    assert_eq!((one["number"].as_u64(), one["state"].as_str()), (Some(1), Some("open")), "{one}");
    crate::assert_eventually!(
        ledger.told("home-m1", "issue #1: Ship the login page").iter().any(|b| b.contains("It is yours")),
        "m1 was not told of #1"
    );
    // Its owner moves it; a stranger's move is refused and audited; a move needs a note.
    let moving = json!({ "issue": 1, "state": "in_progress", "note": "starting" });
    let stranger = ledger.refused(&m2, "issues.update", moving.clone());
    assert_eq!(codes(&stranger).0, "forbidden", "{stranger}");
    let audit = ledger.env.json(&["audit"]);
    assert!(audit.to_string().contains("issues.update.refused"), "the refusal was not audited: {audit}");
    let silent = ledger.refused(&m1, "issues.update", json!({ "issue": 1, "state": "in_progress" }));
    assert_eq!(silent["field"], "note", "{silent}");
    assert_eq!(ledger.ok(&m1, "issues.update", moving)["state"], "in_progress");

    // Assigning outside the subtree is refused; to a report it is a sub-issue of one it owns.
    let sideways = ledger.refused(&m1, "issues.create", json!({ "title": "For m2", "owner": "m2" }));
    assert_eq!(codes(&sideways).0, "forbidden", "{sideways}");
    let loose = ledger.refused(&m1, "issues.create", json!({ "title": "For w1", "owner": "w1" }));
    assert_eq!(codes(&loose).0, "forbidden", "a report's issue is a sub-issue: {loose}");
    let two = ledger.ok(&m1, "issues.create", json!({ "title": "Login form", "owner": "w1", "parent": 1 }));
    assert_eq!((two["number"].as_u64(), two["parent"].as_u64()), (Some(2), Some(1)), "{two}");
    let away = ledger.refused(&m1, "issues.assign", json!({ "issue": 1, "owner": "m2" }));
    assert_eq!(codes(&away).0, "forbidden", "{away}");
    // Nobody hangs a sub-issue under another's issue (it would hold that issue open).
    let hung = ledger.refused(&m2, "issues.create", json!({ "title": "Mine, under yours", "parent": 1 }));
    assert_eq!(codes(&hung).0, "forbidden", "{hung}");
    let huge = ledger.refused(&m1, "issues.show", json!({ "issue": u64::MAX }));
    assert_eq!(huge["field"], "issue", "{huge}");

    // `done` waits for the open sub-issue and names it.
    let early = json!({ "issue": 1, "state": "done", "note": "shipped", "resolution": "login page live" });
    let refused = ledger.refused(&m1, "issues.update", early.clone());
    assert!(codes(&refused).0 == "conflict" && codes(&refused).1.contains("#2"), "{refused}");

    // A dependency cycle is refused, naming it.
    let three = ledger.ok(&m1, "issues.create", json!({ "title": "Session store", "idempotency_key": "store-1" }));
    assert_eq!(three["owner"], "m1", "an agent's own issue by default: {three}");
    let retried = ledger.ok(&m1, "issues.create", json!({ "title": "Session store", "idempotency_key": "store-1" }));
    assert_eq!(retried["number"], three["number"], "a retried filing files once: {retried}");
    ledger.ok(&m1, "issues.update", json!({ "issue": 1, "depends_on": [3] }));
    let cycle = ledger.refused(&m1, "issues.update", json!({ "issue": 3, "depends_on": [1] }));
    assert!(codes(&cycle).1.contains("#3 -> #1 -> #3"), "{cycle}");

    // A Manager's turn counts toward its one in-progress issue.
    ledger.env.ok(&["post", "--channel", "home-m1", "--topic", "work", "--create-topic", "spend now please"]);
    crate::assert_eventually!(ledger.show(1)["spend"]["usd"].as_f64().unwrap_or(0.0) >= 0.4, "no spend on #1");

    // m1 blocks #1 on #2; w1 finishing #2 reaches m1 twice in #1's topic: a blocker done, a
    // sub-issue closed.
    let block = json!({ "issue": 1, "state": "blocked", "note": "waiting for the form", "blocked_by": [2] });
    assert_eq!(ledger.ok(&m1, "issues.update", block)["blocker"], json!({ "issues": [2] }));
    ledger.ok(&w1, "issues.update", json!({ "issue": 2, "state": "in_progress", "note": "on it" }));
    let finish = json!({ "issue": 2, "state": "done", "note": "built", "resolution": "form merged into m1's branch" });
    ledger.ok(&w1, "issues.update", finish);
    crate::assert_eventually!(
        {
            let told = ledger.told("home-m1", "issue #1: Ship the login page");
            told.iter().any(|b| b.contains("#2, which #1 waits for, is done"))
                && told.iter().any(|b| b.contains("Sub-issue #2 of #1 is done"))
        },
        "m1 was not told #2 closed: {:?}",
        ledger.told("home-m1", "issue #1: Ship the login page")
    );

    // Reassignment moves the topic and tells both: the new owner gets the history.
    ledger.ok(&op, "issues.assign", json!({ "issue": 3, "owner": "m2", "note": "m2 owns storage" }));
    crate::assert_eventually!(
        ledger
            .told("home-m2", "issue #3: Session store")
            .iter()
            .any(|b| b.contains("gave you #3") && b.contains("So far")),
        "m2 was not given #3 with its history"
    );
    crate::assert_eventually!(
        ledger.told("home-m1", "issue #3: Session store").iter().any(|b| b.contains("gave #3 to m2")),
        "m1 was not told #3 went"
    );
    let no_more = ledger.refused(&m1, "issues.update", json!({ "issue": 3, "state": "in_progress", "note": "mine?" }));
    assert_eq!(codes(&no_more).0, "forbidden", "{no_more}");

    // A spent issue budget holds runs for it.
    ledger.ok(&op, "issues.budget", json!({ "issue": 1, "usd": 0.1 }));
    ledger.ok(&m1, "issues.update", json!({ "issue": 1, "state": "in_progress", "note": "unblocked" }));
    let run = ledger.refused(&m1, "runs.start", json!({ "definition": "implementer", "brief": "b", "issue": 1 }));
    assert!(codes(&run).0 == "limit_exceeded" && codes(&run).1.contains("#1"), "{run}");

    // The owner closes #1 with a resolution; a comment reaches the owner; nothing else closes.
    ledger.ok(&op, "issues.comment", json!({ "issue": 1, "text": "looks good, @m1" }));
    crate::assert_eventually!(
        ledger.told("home-m1", "issue #1: Ship the login page").iter().any(|b| b.contains("looks good")),
        "the comment did not reach m1"
    );
    let closed = ledger.ok(&m1, "issues.update", early);
    assert_eq!((closed["state"].as_str(), closed["resolution"].as_str()), (Some("done"), Some("login page live")));

    // Filed with no owner, an issue goes to the Supervisor to triage.
    let loose = ledger.ok(&op, "issues.create", json!({ "title": "Nobody's yet" }));
    assert_eq!((loose["number"].as_u64(), &loose["owner"]), (Some(4), &Value::Null), "{loose}");
    crate::assert_eventually!(
        ledger.told("home-supervisor", "issue #4: Nobody's yet").iter().any(|b| b.contains("Triage it")),
        "the Supervisor was not told to triage #4"
    );

    // A kill -9 loses nothing committed.
    let before = ledger.show(1);
    let Ledger { mut env, .. } = ledger;
    env.kill_daemon();
    env.start_daemon();
    let ledger = Ledger { bus: env.bus(), operator: env.token(), env };
    let after = ledger.show(1);
    assert_eq!(before["events"], after["events"], "the history changed across a kill -9");
    assert_eq!(after["issue"]["state"], "done");
    assert_eq!(after["subissues"][0]["number"], 2);
    let listed = ledger.ok(&ledger.operator, "issues.list", json!({ "include_closed": true }));
    assert_eq!(listed["issues"].as_array().unwrap().len(), 4, "{listed}");
    let newest =
        ledger.ok(&ledger.operator, "issues.list", json!({ "include_closed": true, "newest": true, "limit": 2 }));
    let numbers: Vec<u64> = newest["issues"].as_array().unwrap().iter().filter_map(|i| i["number"].as_u64()).collect();
    assert_eq!((numbers, newest["next_after"].as_u64()), (vec![4, 3], Some(3)), "{newest}");
    let nobody = ledger.ok(&ledger.operator, "issues.list", json!({ "owner": "nobody" }));
    assert_eq!(nobody["issues"][0]["number"], 4, "{nobody}");
    let mine = ledger.ok(&ledger.operator, "issues.list", json!({ "owner": "m2" }));
    assert_eq!(mine["issues"][0]["number"], 3, "{mine}");
    // Bad input is refused naming the field.
    let bad = ledger.refused(&ledger.operator, "issues.update", json!({ "issue": 99, "labels": [] }));
    assert_eq!(bad["field"], "issue", "{bad}");
}
