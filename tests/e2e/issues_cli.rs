//! The operator's issue commands end to end: `canopy issues import` of a `gh`-format file
//! (200 issues, re-imported without duplicates, a malformed file refused whole), the
//! new/assign/move/comment/close flow with its `--json` answers and its errors, what waits on
//! the operator in `whoami` and `status`, and `canopy issues export` as JSON lines.
//!
//! Owns these scenarios only; the environment is `env`'s. The rules themselves (who may move,
//! assign, close) are tested against the tools elsewhere.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::env::{TestEnv, text};

/// A `gh issue list --json number,title,body,labels,state` file of `n` issues (source numbers
/// 1001 and up): every third labelled `bug` (with the fields gh prints beside the name), every
/// fifth also `good first issue`, every fourth CLOSED.
fn gh_file(dir: &Path, n: u64) -> PathBuf {
    let issues: Vec<Value> = (1..=n)
        .map(|i| {
            let label = |id: &str, name: &str| json!({ "id": id, "name": name, "description": "", "color": "d73a4a" });
            let mut labels = Vec::new();
            if i % 3 == 0 {
                labels.push(label("LA_kwDO1", "bug"));
            }
            if i % 5 == 0 {
                labels.push(label("LA_kwDO2", "good first issue"));
            }
            let state = if i % 4 == 0 { "CLOSED" } else { "OPEN" };
            let title = format!("Imported issue {i}");
            let body = format!("Body of issue {i}.\n\nSteps:\n- one\n- two");
            json!({ "number": 1000 + i, "title": title, "body": body, "labels": labels, "state": state })
        })
        .collect();
    let path = dir.join("gh-issues.json");
    std::fs::write(&path, serde_json::to_string_pretty(&issues).unwrap()).unwrap();
    path
}

fn count(list: &Value) -> usize {
    list["issues"].as_array().unwrap_or_else(|| panic!("no issues in {list}")).len()
}

fn number(issue: &Value) -> String {
    issue["number"].as_u64().unwrap_or_else(|| panic!("no number in {issue}")).to_string()
}

#[test]
fn a_gh_import_of_200_issues_files_each_once_and_a_bad_file_changes_nothing() {
    let env = TestEnv::started();
    let file = gh_file(env.dir.path(), 200);
    let file = file.to_str().unwrap();

    let first = env.json(&["issues", "import", file]);
    assert_eq!(first["created"].as_array().unwrap().len(), 200, "{first}");
    assert_eq!(first["skipped"], 0);
    let all = env.json(&["issues", "--all"]);
    assert_eq!(count(&all), 200);
    assert!(all["next_after"].is_null(), "every page was read: {}", all["next_after"]);
    let closed = all["issues"].as_array().unwrap().iter().filter(|i| i["state"] == "done").count();
    assert_eq!(closed, 50, "every CLOSED issue is imported closed");
    assert_eq!(count(&env.json(&["issues"])), 150, "without --all only open issues are listed");
    assert_eq!(count(&env.json(&["issues", "--all", "--label", "bug"])), 66);
    assert_eq!(count(&env.json(&["issues", "--all", "--label", "good first issue"])), 40);
    let page = env.json(&["issues", "--all", "--limit", "150"]);
    assert_eq!(count(&page), 150);
    assert!(!page["next_after"].is_null(), "a list cut by --limit says where it stopped");

    let again = env.json(&["issues", "import", file, "--source", "github"]);
    assert_eq!(again["created"].as_array().unwrap().len(), 0, "{again}");
    assert_eq!(again["skipped"], 200);
    assert_eq!(count(&env.json(&["issues", "--all"])), 200, "a re-import filed duplicates");
    let said = env.ok(&["issues", "import", file]);
    assert!(said.contains("0 created") && said.contains("200 skipped"), "{said}");

    let table = env.ok(&["issues", "--all"]);
    assert_eq!(table.lines().count(), 201, "a header and a row per issue:\n{table}");
    assert!(table.lines().next().unwrap().starts_with("issue  state"), "{table}");
    assert!(table.contains("Imported issue 200"), "{table}");

    // A malformed file is refused whole, before anything is sent, naming the file and entry.
    let bad = env.dir.path().join("bad.json");
    let entries = json!([{"number": 5001, "title": "Fine"}, {"number": 5002, "body": "no title"}]);
    std::fs::write(&bad, entries.to_string()).unwrap();
    let out = env.run(&["--json", "issues", "import", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(64), "{}{}", text(&out.stdout), text(&out.stderr));
    let error: Value = serde_json::from_slice(&out.stdout).unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("bad.json") && message.contains("entry 2 (#5002)"), "{message}");
    assert!(message.contains("title"), "{message}");
    assert_eq!(error["error"]["field"], "file");
    let out = env.run(&["issues", "import", bad.to_str().unwrap()]);
    assert!(text(&out.stderr).starts_with("error: "), "{}", text(&out.stderr));
    std::fs::write(&bad, "{\"number\": 1, \"title\": \"an object, not an array\"}").unwrap();
    let out = env.run(&["issues", "import", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).contains("not a JSON array"), "{}", text(&out.stderr));
    let missing = env.run(&["issues", "import", "/nonexistent/issues.json"]);
    assert_eq!(missing.status.code(), Some(64));
    assert!(text(&missing.stderr).contains("/nonexistent/issues.json"), "{}", text(&missing.stderr));
    assert_eq!(count(&env.json(&["issues", "--all"])), 200, "a refused file filed something");
}

#[test]
fn an_operator_files_assigns_moves_comments_and_closes_an_issue() {
    let env = TestEnv::started();
    env.json(&["agents", "create", "--handle", "web-manager", "--name", "Web Manager"]);

    let filed = env.run_with_stdin(
        &["--json", "issues", "new", "--title", "Fix the login", "--body", "-", "--label", "bug", "--label", "ui"],
        "It fails on Safari.\n\nSteps below.\n",
    );
    assert!(filed.status.success(), "{}{}", text(&filed.stdout), text(&filed.stderr));
    let filed: Value = serde_json::from_slice(&filed.stdout).unwrap();
    assert_eq!(filed["state"], "open");
    assert!(filed["owner"].is_null(), "filed by an operator without --assign: nobody's ({filed})");
    assert_eq!(filed["reporter"], "ops");
    assert_eq!(filed["body"], "It fails on Safari.\n\nSteps below.");
    assert_eq!(filed["labels"], json!(["bug", "ui"]));
    let n = number(&filed);
    let hash = format!("#{n}");

    let sub =
        env.json(&["issues", "new", "--title", "Check Safari's cookies", "--assign", "web-manager", "--parent", &hash]);
    assert_eq!(sub["owner"], "web-manager");
    assert_eq!(sub["parent"].as_u64().unwrap().to_string(), n);
    let s = number(&sub);

    let assigned = env.json(&["issues", "assign", &hash, "web-manager", "--note", "your lane"]);
    assert_eq!(assigned["owner"], "web-manager");
    let moved = env.json(&["issues", "move", &n, "in_progress", "--note", "starting"]);
    assert_eq!(moved["state"], "in_progress");
    let blocked =
        env.json(&["issues", "move", &n, "blocked", "--note", "need a decision", "--question", "Which database?"]);
    assert_eq!(blocked["state"], "blocked");
    assert_eq!(blocked["blocker"], json!({"operator": {"question": "Which database?"}}));

    // Blocked on the operator: `whoami` and `status` name it.
    let me = env.json(&["whoami"]);
    let waiting: Vec<u64> =
        me["waiting_issues"].as_array().unwrap().iter().map(|i| i["number"].as_u64().unwrap()).collect();
    assert_eq!(waiting, [n.parse::<u64>().unwrap()], "{me}");
    assert_eq!(env.json(&["status"])["waiting_issues"][0]["number"], blocked["number"]);
    let whoami = env.ok(&["whoami"]);
    assert!(
        whoami.contains("Waiting on you") && whoami.contains(&format!("#{n} Fix the login: Which database?")),
        "{whoami}"
    );
    let status = env.ok(&["status"]);
    assert!(status.contains(&format!("  #{n} Fix the login: Which database?")), "{status}");
    assert!(!status.contains("nothing waits for you"), "{status}");
    let listed = env.ok(&["issues", "--state", "blocked"]);
    assert!(listed.contains("operator: Which database?"), "{listed}");

    let commented = env.json(&["issues", "comment", &n, "Use SQLite."]);
    assert_eq!(commented["number"], filed["number"]);
    let resumed = env.json(&["issues", "move", &n, "in_progress", "--note", "answered"]);
    assert!(resumed["blocker"].is_null(), "{resumed}");
    assert!(env.json(&["whoami"])["waiting_issues"].as_array().unwrap().is_empty());

    let edited = env.json(&["issues", "edit", &n, "--title", "Fix the login on Safari", "--label", "auth"]);
    assert_eq!((edited["title"].as_str(), &edited["labels"]), (Some("Fix the login on Safari"), &json!(["auth"])));
    assert_eq!(env.json(&["issues", "budget", &n, "--usd", "5"])["budget_usd"], 5.0);
    assert!(env.json(&["issues", "budget", &n, "--clear"])["budget_usd"].is_null());

    // `done` waits for the open sub-issue, and the refusal names it.
    let refused = env.refused(&["issues", "close", &n, "--resolution", "fixed in merge-1"]);
    assert_eq!(refused["code"], "conflict", "{refused}");
    assert!(refused["message"].as_str().unwrap().contains(&format!("#{s}")), "{refused}");
    let dropped = env.json(&["issues", "close", &s, "--wontdo", "--resolution", "not needed after all"]);
    assert_eq!(
        (dropped["state"].as_str(), dropped["resolution"].as_str()),
        (Some("wontdo"), Some("not needed after all"))
    );
    let closed = env.json(&["issues", "close", &hash, "--resolution", "fixed in merge-1"]);
    assert_eq!((closed["state"].as_str(), closed["resolution"].as_str()), (Some("done"), Some("fixed in merge-1")));

    let shown = env.json(&["issues", "show", &n]);
    assert_eq!(shown["issue"]["state"], "done");
    assert_eq!(shown["subissues"][0]["number"], sub["number"]);
    let kinds: Vec<&str> = shown["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"filed"), "oldest first: {kinds:?}");
    let at = |kind: &str| kinds.iter().position(|k| *k == kind).unwrap_or_else(|| panic!("no {kind} in {kinds:?}"));
    assert!(at("filed") < at("assigned") && at("assigned") < at("moved") && at("moved") < at("commented"), "{kinds:?}");
    assert!(shown["events"].as_array().unwrap().iter().any(|e| e["text"].as_str().unwrap().contains("Use SQLite.")));
    let human = env.ok(&["issues", "show", &hash]);
    for expected in [
        format!("#{n} Fix the login on Safari"),
        "  state       done".to_owned(),
        "  owner       web-manager".to_owned(),
        "  resolution  fixed in merge-1".to_owned(),
        "sub-issues".to_owned(),
        "events".to_owned(),
        "Use SQLite.".to_owned(),
    ] {
        assert!(human.contains(&expected), "missing {expected:?} in:\n{human}");
    }
    let mine = env.json(&["issues", "--owner", "web-manager", "--all"]);
    assert_eq!(count(&mine), 2, "{mine}");
    assert_eq!(count(&env.json(&["issues"])), 0, "closed issues are not listed without --all");

    // Errors name what is wrong: a state or number that is not one is a usage error (64),
    // before any call; what the daemon refuses exits 1 with its code.
    let bad_state = env.run(&["--json", "issues", "move", &n, "started", "--note", "x"]);
    assert_eq!(bad_state.status.code(), Some(64), "{}", text(&bad_state.stdout));
    let error: Value = serde_json::from_slice(&bad_state.stdout).unwrap();
    assert_eq!(error["error"]["field"], "state");
    assert!(error["error"]["message"].as_str().unwrap().contains("one of open, in_progress"), "{error}");
    let bad_number = env.run(&["issues", "show", "#x"]);
    assert_eq!(bad_number.status.code(), Some(64));
    assert!(text(&bad_number.stderr).contains("\"#x\" is not an issue number"), "{}", text(&bad_number.stderr));
    let closing_by_move = env.run(&["issues", "move", &n, "done", "--note", "x"]);
    assert_eq!(closing_by_move.status.code(), Some(64));
    assert!(text(&closing_by_move.stderr).contains("canopy issues close"), "{}", text(&closing_by_move.stderr));
    assert_eq!(env.refused(&["issues", "show", "99999"])["code"], "not_found");
    let nothing = env.run(&["issues", "edit", &n]);
    assert_eq!(nothing.status.code(), Some(64), "an edit without a change");

    let mut seen = String::new();
    let views: [&[&str]; 5] = [
        &["issues", "--all"],
        &["issues", "show", n.as_str()],
        &["issues", "show", s.as_str()],
        &["whoami"],
        &["status"],
    ];
    for args in views {
        seen.push_str(&env.ok(args));
    }
    for debug in ["Some(", "None", "Handle(", "Blocker", "Operator {", "InProgress"] {
        let line = seen.lines().find(|l| l.contains(debug));
        assert!(line.is_none(), "human output shows {debug:?}: {}", line.unwrap_or_default());
    }
}

#[test]
fn export_writes_every_issue_as_a_json_line() {
    let env = TestEnv::started();
    let file = gh_file(env.dir.path(), 200);
    env.json(&["issues", "import", file.to_str().unwrap()]);
    env.json(&["issues", "new", "--title", "Filed here"]);

    let out = env.dir.path().join("export.jsonl");
    let said = env.json(&["issues", "export", "--output", out.to_str().unwrap()]);
    assert_eq!(said["exported"], 201, "{said}");
    let written = std::fs::read_to_string(&out).unwrap();
    let issues: Vec<Value> = written
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    assert_eq!(issues.len(), 201);
    let numbers: Vec<u64> = issues.iter().map(|i| i["number"].as_u64().unwrap()).collect();
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "lowest number first, each once: {numbers:?}");
    let sources: Vec<&str> = issues.iter().filter_map(|i| i["source"].as_str()).collect();
    assert_eq!(sources.len(), 200, "each imported issue keeps where it came from");
    assert!(sources.contains(&"github#1001") && sources.contains(&"github#1200"), "{sources:?}");
    assert!(issues.iter().any(|i| i["title"] == "Filed here" && i["source"].is_null()));

    let stdout = env.ok(&["issues", "export"]);
    assert_eq!(stdout.lines().count(), 201, "to stdout without --output");
    assert_eq!(stdout, written, "the same lines either way");
    let human = env.ok(&["issues", "export", "--output", out.to_str().unwrap()]);
    assert!(human.starts_with("exported 201 issues to "), "{human}");
}
