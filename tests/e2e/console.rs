//! The operator console in a real headless Chromium: log in with `canopy web`'s link, see a
//! scripted Manager's spawn request arrive live, approve one and deny one with a reason, post
//! and see the outcomes, watch a running turn's tool call and a steer land, restart the daemon
//! under the open page, and refuse forged requests. The Issues board: file an issue for an
//! agent from the form, assign it, comment on it, and see its card change columns live when its
//! state changes through the API, and the Waiting page name it once it waits on the operator.
//! Then, without a browser, that every page and action goes through the API with the
//! logged-in operator's own token. With
//! `CANOPY_CONSOLE_SHOTS=<dir>` it also writes each page's screenshot (`scripts/console-shots.sh`).

use canopy_proto::Method;
use serde_json::{Value, json};

use crate::env::TestEnv;
use crate::webdriver::{Browser, http};

const QUICK: &[(&str, &str)] = &[
    ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
    ("quiet_window = \"2s\"", "quiet_window = \"100ms\""),
    ("resync = \"5s\"", "resync = \"500ms\""),
];

fn requester(child: &str, reason: &str) -> String {
    format!(
        "[[rule]]\nmatch = {{ kind = \"start\" }}\nactions = [{{ call = \"agents_spawn_peer\", args = {{ handle = \"{child}\", \
         name = \"{child} Manager\", charter = \"Own the {child} lane\", reason = \"{reason}\" }} }}]\n\
         [[rule]]\nmatch = {{ kind = \"message\" }}\nactions = [{{ say = \"noted\" }}]\n"
    )
}

/// A worker whose first turn calls a tool, then stays busy long enough to be steered.
const WORKER: &str = "[[rule]]\nmatch = { kind = \"start\" }\nactions = [{ call = \"comms_set_activity\", args = { text = \"reading the flaky logs\" } }, { sleep = \"8s\" }, { say = \"done\" }]\n\
                      [[rule]]\nmatch = { steer = true }\nactions = [{ say = \"heard you mid-turn\" }]\n";

pub(crate) fn link(env: &TestEnv) -> String {
    env.json(&["web", "--no-open"])["link"].as_str().unwrap().to_owned()
}

fn request_id(env: &TestEnv, handle: &str) -> Option<String> {
    env.json(&["requests"])["requests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["handle"] == handle)
        .map(|r| r["id"].as_str().unwrap().to_owned())
}

fn shoot(browser: &Browser, name: &str) {
    if let Ok(dir) = std::env::var("CANOPY_CONSOLE_SHOTS") {
        std::fs::create_dir_all(&dir).unwrap();
        browser.screenshot(&std::path::Path::new(&dir).join(format!("{name}.png")));
    }
}

/// True while the page has not been reloaded since `mark` set its marker.
const NOT_RELOADED: &str = "return window.__canopyMark === 1;";
const MARK: &str = "window.__canopyMark = 1; return true;";

#[test]
fn the_console_shows_the_tree_live_and_decides_what_waits_in_a_real_browser() {
    let mut env = TestEnv::started_with(QUICK);
    let browser = Browser::start(1280);
    let login = link(&env);
    let base = login.split("/login/").next().unwrap().to_owned();
    browser.go(&login);
    browser.wait_text("Spawn requests (0)");
    browser.eval(MARK);

    // A Manager asks for a child while the page is open: it appears without a reload.
    env.create_scripted("lead", &requester("flaky", "CI is red twice a day"));
    crate::assert_eventually!(request_id(&env, "flaky").is_some(), "lead never asked");
    let flaky = request_id(&env, "flaky").unwrap();
    browser.wait_text("CI is red twice a day");
    assert_eq!(browser.eval(NOT_RELOADED), Value::Bool(true), "the request arrived by a reload");
    shoot(&browser, "waiting");

    browser.click(&format!("article[data-id=\"{flaky}\"] button.approve"));
    browser.wait_text(&format!("Request {flaky} is"));
    crate::assert_eventually!(env.json(&["agents", "show", "flaky"])["account"]["handle"] == "flaky", "no child");

    // Another is denied with a reason, which the requester is told.
    env.create_scripted("docs", &requester("scribe", "the docs lag the code"));
    crate::assert_eventually!(request_id(&env, "scribe").is_some(), "docs never asked");
    let scribe = request_id(&env, "scribe").unwrap();
    browser.wait_text("the docs lag the code");
    browser.type_into(&format!("article[data-id=\"{scribe}\"] input[name=reason]"), "not this quarter");
    browser.click(&format!("article[data-id=\"{scribe}\"] button.deny"));
    browser.wait_text(&format!("Request {scribe} is denied"));
    let requests = env.json(&["requests"]);
    let denied = requests["requests"].as_array().unwrap().iter().find(|r| r["id"] == scribe.as_str()).unwrap().clone();
    assert_eq!(denied["state"], "denied", "{denied}");
    assert_eq!(denied["note"], "not this quarter", "{denied}");
    browser.wait_text("not this quarter");

    // The child is in the tree.
    browser.go(&format!("{base}/tree"));
    browser.wait_text("flaky");
    browser.wait_text("lead");
    shoot(&browser, "tree");

    // A post from the page: its outcomes per recipient show under the box.
    browser.go(&format!("{base}/channels/home-lead"));
    browser.fill("form.post input[name=topic]", "plan");
    browser.click("form.post input[name=create_topic]");
    browser.type_into("form.post textarea[name=body]", "@lead please look at the flaky suite");
    browser.click("form.post button[type=submit]");
    browser.wait_true(
        "const o = document.querySelector('form.post [data-outcome]'); return !!o && /Posted/.test(o.innerText) && /lead/.test(o.innerText);",
        "the post's outcomes never showed",
    );
    browser.wait_text("please look at the flaky suite");
    shoot(&browser, "channel");

    // A running turn: its tool call appears live, then a steer lands in it.
    env.create_scripted("worker", WORKER);
    browser.go(&format!("{base}/agents/worker"));
    browser.eval(MARK);
    browser.wait_text("comms_set_activity");
    browser.wait_text("turn running");
    env.json(&["post", "--channel", "home-worker", "--topic", "now", "--create-topic", "@worker stop and summarise"]);
    browser.wait_text("steered into turn");
    assert_eq!(browser.eval(NOT_RELOADED), Value::Bool(true), "the activity arrived by a reload");
    shoot(&browser, "agent");

    browser.go(&format!("{base}/audit?action=spawn"));
    browser.wait_text("spawn");
    shoot(&browser, "audit");

    // The daemon restarts under an open page: it says so, then catches up by itself.
    browser.go(&format!("{base}/channels/home-lead?topic=plan"));
    browser.wait_text("please look at the flaky suite");
    browser.eval(MARK);
    env.stop_daemon();
    browser.wait_true("return !document.getElementById('conn').hidden;", "the page never said it was reconnecting");
    env.start_daemon();
    env.json(&["post", "--channel", "home-lead", "--topic", "plan", "posted after the restart"]);
    browser.wait_text("posted after the restart");
    browser.wait_true("return document.getElementById('conn').hidden;", "the page stayed 'reconnecting'");
    assert_eq!(browser.eval(NOT_RELOADED), Value::Bool(true), "the page recovered by a reload");

    // Forged requests: a session cookie without the page's CSRF token, an agent's token.
    let cookie = format!("canopy_session={}", browser.cookie("canopy_session"));
    let form = "decision=approve";
    let (status, _, body) = http(
        "POST",
        &format!("{base}/spawn/{scribe}"),
        &[("Cookie", &cookie), ("Content-Type", "application/x-www-form-urlencoded")],
        form,
    );
    assert_eq!(status, 403, "{body}");
    let wrong = "decision=approve&csrf=0123456789abcdef0123456789abcdef0123456789abcdef";
    let (status, _, _) = http(
        "POST",
        &format!("{base}/spawn/{scribe}"),
        &[("Cookie", &cookie), ("Content-Type", "application/x-www-form-urlencoded")],
        wrong,
    );
    assert_eq!(status, 403);
    // The restart started a new session: its harness holds the live token.
    let live_token = || {
        let incarnation = env.roster_entry("docs")["incarnation"].as_u64().unwrap_or(1);
        let pid = env.wait_harness_pid("docs", incarnation);
        crate::sessions::process_env(pid).get("CANOPY_MCP_TOKEN").cloned().unwrap_or_default()
    };
    crate::assert_eventually!(!live_token().is_empty(), "docs has no live session token");
    let agent_token = live_token();
    let bearer = format!("Bearer {agent_token}");
    let (status, _, _) = http(
        "POST",
        &format!("{base}/spawn/{scribe}"),
        &[("Authorization", &bearer), ("Content-Type", "application/x-www-form-urlencoded")],
        form,
    );
    assert_eq!(status, 401, "an agent's token is no console session");
    let (status, _, body) = http("POST", &format!("{base}/link"), &[("Authorization", &bearer)], "");
    assert_eq!(status, 403, "an agent's token gets no login link: {body}");
    let (status, _, _) = http("GET", &format!("{base}/tree"), &[("Authorization", &bearer)], "");
    assert_eq!(status, 401);
    assert_eq!(
        env.json(&["requests"])["requests"].as_array().unwrap().iter().find(|r| r["id"] == scribe.as_str()).unwrap()["state"],
        "denied"
    );

    // A used link does not open again, and logout ends the session.
    let (status, _, _) = http("GET", &login, &[], "");
    assert_eq!(status, 401, "a login link works once");
    browser.click("form.logout button");
    browser.wait_text("Logged out");
    let (status, _, _) = http("GET", &format!("{base}/tree"), &[("Cookie", &cookie)], "");
    assert_eq!(status, 401, "a logged-out session still reads");
}

/// Calls an issues method as the operator (through the API, as the CLI would): its answer.
fn as_operator(env: &TestEnv, method: Method, body: Value) -> Value {
    let (bus, token) = (env.bus(), env.token());
    let subject = env.subjects().api(method);
    let reply = crate::wire::request(env, &bus, &subject, Some(token.as_str()), body.to_string().as_bytes());
    reply.get("ok").cloned().unwrap_or_else(|| panic!("{}: {reply}", method.as_str()))
}

/// The script of agents that only own issues here: they say nothing, whatever reaches them.
const QUIET: &str = "";

/// True once the board's `state` column holds the card of issue `number`, and no other column does.
fn card_in(state: &str, number: u64) -> String {
    format!(
        "const cards = document.querySelectorAll('article.card[data-issue=\"{number}\"]'); \
         return cards.length === 1 && !!cards[0].closest('#col-{state}');"
    )
}

#[test]
fn the_issues_board_files_assigns_comments_and_moves_a_card_live_in_a_real_browser() {
    let env = TestEnv::started_with(QUICK);
    env.create_scripted("lead", QUIET);
    env.create_scripted("scout", QUIET);
    let browser = Browser::start(1400);
    let login = link(&env);
    let base = login.split("/login/").next().unwrap().to_owned();
    browser.go(&login);
    browser.wait_text("Spawn requests (0)");
    browser.wait_text("Issues waiting on you (0)");

    // Filed from the form, for an agent: the card is in the open column.
    browser.go(&format!("{base}/issues"));
    browser.wait_text("File an issue");
    browser.fill("form.file input[name=title]", "Fix the flaky login test");
    browser.type_into("form.file textarea[name=body]", "It fails one run in five.");
    browser.fill("form.file input[name=owner]", "lead");
    browser.fill("form.file input[name=labels]", "ci, flaky");
    browser.click("form.file button[type=submit]");
    browser.wait_true(
        "const o = document.querySelector('form.file [data-outcome]'); return !!o && /Filed #\\d+/.test(o.innerText) && /lead/.test(o.innerText);",
        "the filing's outcome never showed",
    );
    let listed = as_operator(&env, Method::IssuesList, json!({ "include_closed": true }));
    let filed = listed["issues"].as_array().unwrap().iter().find(|i| i["title"] == "Fix the flaky login test").cloned();
    let filed = filed.unwrap_or_else(|| panic!("the form filed nothing: {listed}"));
    assert_eq!(filed["owner"], "lead", "{filed}");
    assert_eq!(filed["labels"], json!(["ci", "flaky"]), "{filed}");
    let number = filed["number"].as_u64().unwrap();
    browser.wait_true(&card_in("open", number), "the filed issue's card is not in the open column");
    let card = format!("article.card[data-issue=\"{number}\"]");
    let text = browser.eval(&format!("return document.querySelector('{card}').innerText;"));
    let text = text.as_str().unwrap_or_default();
    assert!(text.contains(&format!("#{number} Fix the flaky login test")), "{text}");
    assert!(text.contains("lead") && text.contains("$0.00"), "{text}");
    let labels = browser.eval(&format!(
        "return Array.from(document.querySelectorAll('{card} a.label')).map((a) => a.innerText).join(',');"
    ));
    assert_eq!(labels, "ci,flaky");
    shoot(&browser, "issues");

    // Its page: assigned to another agent, then a comment, each shown once it lands.
    browser.click(&format!("{card} h3 a"));
    browser.wait_text("It fails one run in five.");
    browser.fill("form.assign input[name=owner]", "scout");
    browser.type_into("form.assign input[name=note]", "scout knows the login flow");
    browser.click("form.assign button[type=submit]");
    browser.wait_true(
        "const o = document.querySelector('#issue [data-field=owner]'); return !!o && o.innerText.trim() === 'scout';",
        "the issue never showed its new owner",
    );
    browser.type_into("form.comment textarea[name=text]", "Seen again on main today");
    browser.click("form.comment button[type=submit]");
    browser.wait_true(
        "return /Seen again on main today/.test(document.getElementById('events').innerText);",
        "the comment never joined the history",
    );
    let shown = as_operator(&env, Method::IssuesShow, json!({ "issue": number }));
    assert_eq!(shown["issue"]["owner"], "scout", "{shown}");
    let events = shown["events"].as_array().unwrap();
    let by_ops = |kind: &str, needle: &str| {
        events
            .iter()
            .any(|e| e["kind"] == kind && e["actor"] == "ops" && e["text"].as_str().unwrap_or("").contains(needle))
    };
    assert!(by_ops("commented", "Seen again on main today"), "the comment is not the operator's: {shown}");
    assert!(events.iter().any(|e| e["kind"] == "assigned" && e["actor"] == "ops"), "no assignment by ops: {shown}");
    shoot(&browser, "issue");

    // Its state changes elsewhere: the card moves columns on the open board without a reload.
    browser.go(&format!("{base}/issues"));
    browser.wait_true(&card_in("open", number), "the card left the open column early");
    browser.eval(MARK);
    let moved = json!({ "issue": number, "state": "in_progress", "note": "picking it up" });
    assert_eq!(as_operator(&env, Method::IssuesUpdate, moved)["state"], "in_progress");
    browser.wait_true(&card_in("in_progress", number), "the card never moved to in progress");
    assert_eq!(browser.eval(NOT_RELOADED), Value::Bool(true), "the card moved by a reload");

    // Blocked on the operator: the card says the question, and the Waiting page names the issue.
    let question = "Which browsers must the login support?";
    let blocked = json!({ "issue": number, "state": "blocked", "note": "need an answer", "question": question });
    assert_eq!(as_operator(&env, Method::IssuesUpdate, blocked)["state"], "blocked");
    browser.wait_true(&card_in("blocked", number), "the card never moved to blocked");
    browser.wait_text(&format!("operator: {question}"));
    assert_eq!(browser.eval(NOT_RELOADED), Value::Bool(true), "the card moved by a reload");
    browser.go(&format!("{base}/"));
    browser.wait_text("Issues waiting on you (1)");
    browser.wait_text(question);
    browser.click(&format!("#waiting-issue-{number} h3 a"));
    browser.wait_text("Seen again on main today");
}

/// Logs in over HTTP with `token` (as `canopy web` and a browser would): the session cookie.
pub(crate) fn session_for(base: &str, token: &str) -> String {
    let (status, _, body) = http("POST", &format!("{base}/link"), &[("Authorization", &format!("Bearer {token}"))], "");
    assert_eq!(status, 200, "{body}");
    let path = serde_json::from_str::<Value>(&body).unwrap()["path"].as_str().unwrap().to_owned();
    let (status, headers, _) = http("GET", &format!("{base}{path}"), &[], "");
    assert_eq!(status, 200);
    let set = headers.iter().find(|(k, _)| k == "set-cookie").map(|(_, v)| v.clone()).unwrap();
    set.split(';').next().unwrap().to_owned()
}

pub(crate) fn csrf_of(page: &str) -> String {
    let at = page.find("name=\"csrf\" content=\"").unwrap() + "name=\"csrf\" content=\"".len();
    page[at..at + 48].to_owned()
}

#[test]
fn every_console_page_and_action_goes_through_the_api_with_the_operators_token() {
    let env = TestEnv::started_with(QUICK);
    let base = link(&env).split("/login/").next().unwrap().to_owned();
    let file = env.dir.path().join("second.token");
    env.ok(&["operators", "add", "second", "--out", file.to_str().unwrap()]);
    let second = std::fs::read_to_string(&file).unwrap().trim().to_owned();
    let first = session_for(&base, &env.token());
    let cookie = session_for(&base, &second);
    let pages = ["/", "/tree", "/channels", "/channels/announcements", "/agents/supervisor", "/audit"];
    for page in pages {
        let (status, _, body) = http("GET", &format!("{base}{page}"), &[("Cookie", &cookie)], "");
        assert_eq!(status, 200, "{page}: {body}");
    }
    let (_, _, home) = http("GET", &format!("{base}/"), &[("Cookie", &cookie)], "");
    let csrf = csrf_of(&home);

    // The console holds no authority of its own: once the API refuses the operator's token,
    // the next page is refused, and every session holding that token ends at once.
    env.ok(&["operators", "revoke", "second"]);
    let (status, _, body) = http("GET", &format!("{base}/tree"), &[("Cookie", &cookie)], "");
    assert_eq!(status, 403, "a revoked operator's page: {body}");
    assert!(body.contains("forbidden"), "{body}");
    for page in pages {
        let (status, _, body) = http("GET", &format!("{base}{page}"), &[("Cookie", &cookie)], "");
        assert_eq!(status, 401, "{page} answered for a revoked operator: {body}");
    }
    let form = [
        ("Cookie", cookie.as_str()),
        ("x-canopy-csrf", csrf.as_str()),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ];
    let (status, _, body) =
        http("POST", &format!("{base}/post"), &form, "channel=announcements&topic=general&body=hello&create_topic=on");
    assert_eq!(status, 401, "{body}");
    let (status, _, _) = http("POST", &format!("{base}/spawn/sr-0"), &form, "decision=deny&reason=no");
    assert_eq!(status, 401);
    let messages = env.json(&["read", "--channel", "announcements"]);
    assert!(!messages.to_string().contains("hello"), "a refused post was stored: {messages}");

    // The other operator's session is untouched, and acts as that operator.
    let (status, _, page) = http("GET", &format!("{base}/"), &[("Cookie", &first)], "");
    assert_eq!(status, 200);
    let form = [
        ("Cookie", first.as_str()),
        ("x-canopy-csrf", &csrf_of(&page)),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ];
    let (status, _, body) = http(
        "POST",
        &format!("{base}/post"),
        &form,
        "channel=announcements&topic=general&body=from+the+console&create_topic=on",
    );
    assert_eq!(status, 200, "{body}");
    let read = env.json(&["read", "--channel", "announcements"]);
    let posted = read["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["messages"].as_array().unwrap().clone())
        .find(|m| m["body"] == "from the console");
    let me = env.json(&["whoami"])["account"]["handle"].clone();
    assert_eq!(posted.unwrap()["sender"]["handle"], me, "the post is the logged-in operator's");
}
