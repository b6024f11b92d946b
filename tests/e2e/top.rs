//! `canopy top` through a pseudo-terminal (util-linux `script` makes it; `vt100` reads the
//! screen as a terminal would): it draws the tree and what waits; `a` approves the selected
//! request and the child appears; `d` asks a reason and denies; it follows the daemon through
//! a restart; `q` quits cleanly; `NO_COLOR` draws it plain.
//!
//! Owns these scenarios only; the environment is `env`'s.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::env::{CANOPY, TestEnv, wait_timeout};

const QUICK: &[(&str, &str)] = &[
    ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
    ("quiet_window = \"2s\"", "quiet_window = \"100ms\""),
    ("resync = \"5s\"", "resync = \"500ms\""),
];

fn requester(child: &str) -> String {
    format!(
        "[[rule]]\nmatch = {{ kind = \"start\" }}\nactions = [{{ call = \"agents_spawn_peer\", args = {{ handle = \"{child}\", \
         name = \"{child} Manager\", charter = \"Own the {child} lane\", reason = \"needed for {child}\" }} }}]\n"
    )
}

/// `canopy top` on a 140x40 pseudo-terminal, and the screen it draws.
struct Top {
    child: Child,
    keys: ChildStdin,
    screen: Arc<Mutex<vt100::Parser>>,
}

impl Top {
    fn start(env: &TestEnv, no_color: bool) -> Top {
        let line =
            format!("stty cols 140 rows 40; exec '{CANOPY}' --dir '{}' top --interval 300ms", env.data_dir().display());
        let mut command = Command::new("script");
        command.args(["-qfec", &line, "/dev/null"]).env("TERM", "xterm-256color").env_remove("CANOPY_DIR");
        match no_color {
            true => command.env("NO_COLOR", "1"),
            false => command.env_remove("NO_COLOR"),
        };
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("util-linux `script` runs commands on a pseudo-terminal");
        let keys = child.stdin.take().unwrap();
        let mut out = child.stdout.take().unwrap();
        let screen = Arc::new(Mutex::new(vt100::Parser::new(40, 140, 0)));
        let feed = screen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    return;
                }
                feed.lock().unwrap().process(&buf[..n]);
            }
        });
        Top { child, keys, screen }
    }

    fn contents(&self) -> String {
        self.screen.lock().unwrap().screen().contents()
    }

    fn wait_for(&self, needle: &str) {
        crate::assert_eventually!(
            self.contents().contains(needle),
            "top never showed {needle:?}:\n{}",
            self.contents()
        );
    }

    /// Whether any cell is drawn in a colour.
    fn coloured(&self) -> bool {
        let parser = self.screen.lock().unwrap();
        let screen = parser.screen();
        (0..40)
            .any(|row| (0..140).any(|col| screen.cell(row, col).is_some_and(|c| c.fgcolor() != vt100::Color::Default)))
    }

    fn press(&mut self, keys: &str) {
        self.keys.write_all(keys.as_bytes()).unwrap();
        self.keys.flush().unwrap();
    }
}

impl Drop for Top {
    /// A failed test leaves no `top` behind: closing the terminal hangs it up.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn request_state(env: &TestEnv, handle: &str) -> serde_json::Value {
    env.json(&["requests"])["requests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["handle"] == handle)
        .cloned()
        .unwrap_or_default()
}

#[test]
fn top_draws_the_tree_approves_and_denies_and_follows_a_restarted_daemon() {
    let mut env = TestEnv::started_with(QUICK);
    env.create_scripted("lead", &requester("flaky"));
    crate::assert_eventually!(request_state(&env, "flaky")["state"] == "pending", "no request from lead");
    let mut top = Top::start(&env, false);
    top.wait_for("Tree (2 agents)");
    top.wait_for("supervisor");
    top.wait_for("Waiting for you (1)");
    top.wait_for("req-1 lead asks for flaky");
    if let Some(path) = std::env::var_os("CANOPY_TOP_SCREEN") {
        std::fs::write(path, top.contents()).unwrap();
    }

    // `a` approves the selected request: the child spawns and appears in the tree.
    top.press("a");
    top.wait_for("req-1 approved");
    crate::assert_eventually!(request_state(&env, "flaky")["state"] == "spawned", "{}", request_state(&env, "flaky"));
    top.wait_for("Tree (3 agents)");
    top.wait_for("flaky");

    // `d` asks for the reason, then denies.
    env.create_scripted("docs", &requester("scribe"));
    top.wait_for("req-2 docs asks for scribe");
    top.press("d");
    top.wait_for("deny req-2, reason");
    top.press("not this quarter\r");
    top.wait_for("req-2 denied");
    assert_eq!(request_state(&env, "scribe")["note"], "not this quarter");

    // The daemon restarts on a new port: top says it is away, then finds it again.
    env.stop_daemon();
    top.wait_for("the daemon is away");
    env.start_daemon();
    let info = std::fs::read_to_string(env.data_dir().join("daemon.json")).unwrap();
    let pid = serde_json::from_str::<serde_json::Value>(&info).unwrap()["pid"].as_u64().unwrap();
    crate::assert_eventually!(
        top.contents().contains(&format!("daemon pid {pid}")) && top.contents().contains("flaky"),
        "top did not follow the restarted daemon (pid {pid}):\n{}",
        top.contents()
    );

    assert!(top.coloured(), "presence is drawn in colour on a terminal");
    top.press("q");
    let status = wait_timeout(&mut top.child, Duration::from_secs(10)).expect("top did not quit on q");
    assert!(status.success(), "{status}");

    // `NO_COLOR`: the same view, plain.
    let mut plain = Top::start(&env, true);
    plain.wait_for("flaky");
    assert!(!plain.coloured(), "NO_COLOR drew colour:\n{}", plain.contents());
    plain.press("q");
    assert!(wait_timeout(&mut plain.child, Duration::from_secs(10)).is_some_and(|s| s.success()));
}
