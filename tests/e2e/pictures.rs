//! The console's pictures in a real Chromium: the tree diagram in presence colours, updated
//! live; spend per hour with the right totals for a scripted usage history (and the same
//! series from `canopy usage --series`); a scripted agent's timeline, its turns in order with
//! their tool calls, zoomed to one turn (and `canopy watch --timeline --json`). Then every page
//! at a phone's width (390 px): no sideways scroll, the spawn and merge decisions' buttons in
//! reach; screenshots of both widths go to `CANOPY_CONSOLE_SHOTS` when set.
//!
//! Owns these scenarios; the console's flows are `console`'s, its TLS `tls`'s.

use serde_json::Value;

use crate::console::link;
use crate::env::TestEnv;
use crate::webdriver::Browser;

const QUICK: &[(&str, &str)] = &[
    ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
    ("quiet_window = \"2s\"", "quiet_window = \"100ms\""),
    ("resync = \"5s\"", "resync = \"500ms\""),
];

/// Spends 25 cents on its first turn and 50 on each `charge me` message; works a while on a
/// `long job` (the words are not in its channel's name, which every input carries).
const SPENDER: &str = r#"
[[rule]]
match = { kind = "start" }
actions = [{ fake_tool = "bash", output = "built" }, { usage = { input_tokens = 1000, output_tokens = 200, cost_usd = 0.25 } }, { say = "ready" }]

[[rule]]
match = { kind = "message", text_contains = "charge me" }
actions = [{ fake_tool = "grep", output = "found" }, { usage = { input_tokens = 2000, output_tokens = 300, cost_usd = 0.50 } }, { say = "spent" }]

[[rule]]
match = { kind = "message", text_contains = "long job" }
actions = [{ sleep = "4s" }, { say = "worked" }]
"#;

fn shoot(browser: &Browser, name: &str) {
    if let Ok(dir) = std::env::var("CANOPY_CONSOLE_SHOTS") {
        std::fs::create_dir_all(&dir).unwrap();
        browser.screenshot(&std::path::Path::new(&dir).join(format!("{name}.png")));
    }
}

fn presence_in_diagram(browser: &Browser, handle: &str) -> Value {
    browser.eval(&format!(
        "const n = document.querySelector('g.node[data-agent=\"{handle}\"]'); \
         return n ? [n.dataset.presence, n.querySelector('circle').getAttribute('fill')] : null;"
    ))
}

fn post(env: &TestEnv, body: &str) {
    env.json(&["post", "--channel", "home-spender", "--topic", "t", "--create-topic", body]);
}

#[test]
fn the_tree_the_spend_and_a_timeline_are_pictures_in_a_real_browser() {
    let env = TestEnv::started_with(QUICK);
    env.create_scripted("spender", SPENDER);
    crate::assert_eventually!(env.roster_entry("spender")["presence"] == "idle", "spender never settled");
    post(&env, "charge me please");
    crate::assert_eventually!(
        env.json(&["usage", "--agent", "spender"])["total"]["reports"] == 2,
        "the second turn's usage never arrived"
    );

    let browser = Browser::start(1280);
    let login = link(&env);
    let base = login.split("/login/").next().unwrap().to_owned();
    browser.go(&login);
    browser.wait_text("Spawn requests");

    // The tree: each agent a node in its presence's colour; a long turn turns it blue live.
    browser.go(&format!("{base}/tree"));
    crate::assert_eventually!(
        presence_in_diagram(&browser, "spender") == serde_json::json!(["idle", "#1b6b34"]),
        "spender is not an idle node: {}",
        presence_in_diagram(&browser, "spender")
    );
    assert_eq!(presence_in_diagram(&browser, "supervisor")[0], env.roster_entry("supervisor")["presence"]);
    browser.eval("window.__canopyMark = 1; return true;");
    post(&env, "a long job for you");
    browser.wait_true(
        "const n = document.querySelector('g.node[data-agent=\"spender\"]'); return !!n && n.dataset.presence === 'working' \
         && n.querySelector('circle').getAttribute('fill') === '#0b5cad';",
        "the node never turned to working",
    );
    shoot(&browser, "tree");
    browser.wait_true(
        "const n = document.querySelector('g.node[data-agent=\"spender\"]'); return !!n && n.dataset.presence === 'idle';",
        "the node never went back to idle",
    );
    assert_eq!(browser.eval("return window.__canopyMark === 1;"), Value::Bool(true), "the diagram changed by a reload");
    let opens = browser
        .eval("return document.querySelector('g.node[data-agent=\"spender\"]').closest('a').getAttribute('href');");
    assert_eq!(opens, "/agents/spender", "a node opens its agent");

    // Spend: a bar per hour, the right total, the same series from the CLI.
    browser.go(&format!("{base}/spend?agent=spender"));
    let bars =
        browser.eval("return [...document.querySelectorAll('svg.chart rect.bar')].map(b => Number(b.dataset.usd));");
    let bars: Vec<f64> = bars.as_array().unwrap().iter().map(|b| b.as_f64().unwrap()).collect();
    assert_eq!(bars.len(), 24, "a point per hour");
    assert!((bars.iter().sum::<f64>() - 0.75).abs() < 1e-9, "{bars:?}");
    assert!(bars[22] + bars[23] > 0.74, "the spend is in the last hours: {bars:?}");
    shoot(&browser, "spend");
    let series = env.json(&["usage", "--series", "--agent", "spender"]);
    let points = series["points"].as_array().unwrap();
    assert_eq!(points.len(), 24);
    let sum: f64 = points.iter().map(|p| p["usd"].as_f64().unwrap()).sum();
    assert!((sum - 0.75).abs() < 1e-9, "{series}");
    assert_eq!(env.json(&["usage", "--series", "--daily"])["points"].as_array().unwrap().len(), 30);
    assert!(env.ok(&["usage", "--series", "--agent", "spender"]).contains("spend per hour"));

    // The timeline: the turns in order, each with its tool calls; one turn zoomed.
    browser.go(&format!("{base}/agents/spender/timeline"));
    let turns = browser.eval(
        "return [...document.querySelectorAll('svg.timeline rect.turn')].map(t => [t.dataset.turn, Number(t.dataset.start)]);",
    );
    let turns = turns.as_array().unwrap().clone();
    assert_eq!(turns.len(), 3, "three turns: {turns:?}");
    let starts: Vec<i64> = turns.iter().map(|t| t[1].as_i64().unwrap()).collect();
    assert!(starts.windows(2).all(|w| w[0] <= w[1]), "in order: {turns:?}");
    let tools = browser.eval(
        "return [...document.querySelectorAll('svg.timeline rect.tool')].map(t => [t.dataset.turn, t.dataset.tool]);",
    );
    let first = turns[0][0].as_str().unwrap();
    let second = turns[1][0].as_str().unwrap();
    let tools = tools.as_array().unwrap();
    assert!(tools.iter().any(|t| t[0] == first && t[1] == "bash"), "{tools:?}");
    assert!(tools.iter().any(|t| t[0] == second && t[1] == "grep"), "{tools:?}");
    assert!(tools.iter().any(|t| t[1] == "sleep"), "the long turn's pretend tool: {tools:?}");
    shoot(&browser, "timeline");
    let zoom = browser.eval("return document.querySelector('svg.timeline a').getAttribute('href');");
    browser.go(&format!("{base}/agents/spender/timeline{}", zoom.as_str().unwrap()));
    browser.wait_true(
        "return /turn=/.test(location.search) && !!document.querySelector('li[data-tool=\"bash\"]');",
        "the zoom",
    );
    let cli = env.json(&["watch", "spender", "--timeline"]);
    let ids: Vec<&str> = cli["turns"].as_array().unwrap().iter().map(|t| t["turn_id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 3, "{cli}");
    assert_eq!(cli["turns"][0]["tools"][0]["name"], "bash", "{cli}");
    assert!(env.ok(&["watch", "spender", "--timeline"]).contains("turn "));
}

/// Whether the page scrolls sideways at its width.
const SIDEWAYS: &str = "return document.documentElement.scrollWidth > window.innerWidth + 1;";

#[test]
fn every_page_fits_a_phone_with_its_decision_buttons_in_reach() {
    let env = TestEnv::started_with(QUICK);
    env.create_scripted(
        "lead",
        "[[rule]]\nmatch = { kind = \"start\" }\nactions = [{ call = \"agents_spawn_peer\", args = { handle = \"flaky\", \
         name = \"Flaky Tests Manager\", charter = \"Hunt down the flaky tests in the nightly build\", reason = \
         \"CI went red twice today on tests that pass on retry\" } }]\n",
    );
    env.create_scripted("spender", SPENDER);
    // A Manager on a repository that commits and asks to merge: a merge decision on Waiting too.
    let repo = crate::repos::canonical(env.dir.path());
    env.json(&["repos", "add", "app", repo.to_str().unwrap()]);
    let builder = env.script(
        "builder.toml",
        "[[rule]]\nmatch = { kind = \"start\" }\nactions = [\n  { shell = \"echo a > a.txt && git add a.txt && git commit -qm 'Add a'\", expect = \"ok\" },\n  { call = \"merge_request\", args = { title = \"Add a\", summary = \"Adds a.txt.\" } },\n]\n",
    );
    env.json(&["agents", "create", "--handle", "builder", "--name", "Builder", "--script", &builder, "--repo", "app"]);
    crate::assert_eventually!(!env.json(&["requests"])["requests"].as_array().unwrap().is_empty(), "no request");
    crate::assert_eventually!(
        env.json(&["merges"])["merges"].as_array().unwrap().iter().any(|m| m["state"] == "pending"),
        "no merge request waits: {}",
        env.json(&["merges"])
    );
    env.json(&["issues", "new", "--title", "Make the nightly build green", "--assign", "lead"]);
    for (width, suffix) in [(390, "-phone"), (1280, "")] {
        let browser = Browser::start(width);
        let login = link(&env);
        let base = login.split("/login/").next().unwrap().to_owned();
        browser.go(&login);
        browser.wait_text("Spawn requests (1)");
        assert_eq!(browser.eval("return window.innerWidth;"), serde_json::json!(width), "the viewport is {width} px");
        let pages = [
            ("/", "waiting"),
            ("/tree", "tree"),
            ("/channels", "channels"),
            ("/channels/home-lead", "channel"),
            ("/agents/spender", "agent"),
            ("/agents/spender/timeline", "timeline"),
            ("/spend", "spend"),
            ("/issues", "issues"),
            ("/issues/1", "issue"),
            ("/audit", "audit"),
        ];
        for (path, name) in pages {
            browser.go(&format!("{base}{path}"));
            browser
                .wait_true("return document.readyState === 'complete' && !!document.querySelector('main h1');", path);
            assert_eq!(browser.eval(SIDEWAYS), Value::Bool(false), "{path} scrolls sideways at {width} px");
            if suffix == "-phone" {
                shoot(&browser, &format!("{name}{suffix}"));
            }
        }
        // Waiting: approve and deny stay on the screen, each inside the page's width.
        browser.go(&format!("{base}/"));
        let reach = browser.eval(
            "return [...document.querySelectorAll('article.request button')].map(b => { const r = b.getBoundingClientRect(); \
             return [b.innerText, r.left >= 0 && r.right <= window.innerWidth && r.width >= 40 && r.height >= 28]; });",
        );
        let reach = reach.as_array().unwrap();
        assert!(reach.len() >= 4, "approve and deny for the spawn and for the merge: {reach:?}");
        assert!(reach.iter().all(|b| b[1] == true), "a decision button is out of reach at {width} px: {reach:?}");
    }
}
