//! A session's network and limits end to end (`[sandbox] network = "proxy"`, the default): from
//! a session's shell (the scripted `shell` action, and a real Claude Code Bash tool in
//! `confinement.rs`), a connection to a host that is not allowed (a server on another loopback
//! address, on a port `connect_ports` allows) fails and is counted and told; UDP and a DNS query
//! to listeners on this machine's loopback never arrive; a raw socket cannot be opened; a host
//! in `allow_hosts` works, and so does the session's own MCP endpoint. A fork bomb and a memory
//! hog end only their own sessions, with the limit as the reason, while another agent answers a
//! post as quickly as before.
//!
//! Every target is on this machine's loopback; nothing is sent anywhere else.

use std::io::{Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::env::TestEnv;

const QUICK: &[(&str, &str)] = &[
    ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
    ("quiet_window = \"2s\"", "quiet_window = \"100ms\""),
    ("resync = \"5s\"", "resync = \"500ms\""),
];

/// The listeners a session must not reach, and the one it may.
pub struct Targets {
    /// A TCP server on 127.0.0.2 (not allowed), counting the connections it accepts.
    pub refused_port: u16,
    refused_accepts: Arc<AtomicUsize>,
    /// A UDP listener and a "DNS resolver" (a UDP listener) on 127.0.0.1.
    pub udp_port: u16,
    pub dns_port: u16,
    udp: UdpSocket,
    dns: UdpSocket,
    /// An HTTP server on 127.0.0.3 that `allow_hosts` names; it answers `allowed-ok`.
    pub allowed_port: u16,
}

impl Targets {
    pub fn start() -> Targets {
        let refused = TcpListener::bind("127.0.0.2:0").unwrap();
        let refused_port = refused.local_addr().unwrap().port();
        let refused_accepts = Arc::new(AtomicUsize::new(0));
        let counter = refused_accepts.clone();
        std::thread::spawn(move || {
            for stream in refused.incoming() {
                counter.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        let allowed = TcpListener::bind("127.0.0.3:0").unwrap();
        let allowed_port = allowed.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut stream in allowed.incoming().flatten() {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf);
                let body = "allowed-ok\n";
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dns = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (udp_port, dns_port) = (udp.local_addr().unwrap().port(), dns.local_addr().unwrap().port());
        Targets { refused_port, refused_accepts, udp_port, dns_port, udp, dns, allowed_port }
    }

    /// The config edits that allow the allowed host, and the refused port by the old port rule.
    pub fn edits(&self) -> Vec<(&'static str, String)> {
        vec![
            ("allow_hosts = []", format!("allow_hosts = [\"127.0.0.3:{}\"]", self.allowed_port)),
            ("connect_ports = []", format!("connect_ports = [{}]", self.refused_port)),
        ]
    }

    /// The attempts, each a shell command with whether it must fail (`None`: either; what it
    /// sent is checked at the listener).
    pub fn attempts(&self) -> Vec<(String, Option<bool>)> {
        let (refused, udp, dns, allowed) = (self.refused_port, self.udp_port, self.dns_port, self.allowed_port);
        // A DNS query for example.com, as bytes bash can write.
        let query = r"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01";
        vec![
            (format!("curl -sS --max-time 5 https://127.0.0.2:{refused}/"), Some(true)),
            (format!("curl -sS --max-time 5 --noproxy '*' http://127.0.0.2:{refused}/"), Some(true)),
            (format!("echo leak > /dev/udp/127.0.0.1/{udp}"), None),
            (format!("printf '{query}' > /dev/udp/127.0.0.1/{dns}"), None),
            ("getent hosts example.com".to_owned(), Some(true)),
            (
                "/usr/bin/python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)'"
                    .to_owned(),
                Some(true),
            ),
            (format!("curl -sS --max-time 5 http://127.0.0.3:{allowed}/"), Some(false)),
        ]
    }

    /// Nothing reached the refused server, the UDP listener or the resolver.
    pub fn assert_nothing_arrived(&self) {
        assert_eq!(self.refused_accepts.load(Ordering::SeqCst), 0, "a connection reached 127.0.0.2");
        let mut buf = [0u8; 512];
        for (socket, what) in [(&self.udp, "a UDP datagram"), (&self.dns, "a DNS query")] {
            socket.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
            assert!(socket.recv_from(&mut buf).is_err(), "{what} arrived from a session");
        }
    }
}

/// The refusals were counted on the roster line and the first one told in the home channel.
pub fn assert_refusals_told(env: &TestEnv, agent: &str, home: &str) {
    crate::assert_eventually!(
        env.roster_entry(agent)["egress_refused"].as_u64().unwrap_or(0) >= 1,
        "no refusal counted: {}",
        env.roster_entry(agent)
    );
    assert!(env.ok(&["roster"]).contains("egress refused: "), "{}", env.ok(&["roster"]));
    let told: Vec<String> = env
        .messages(home)
        .iter()
        .filter_map(|m| m["body"].as_str().map(str::to_owned))
        .filter(|b| b.contains("sandbox refused a connection"))
        .collect();
    assert_eq!(told.len(), 1, "the first refusal is told once: {told:#?}");
    assert!(told[0].contains("127.0.0.2"), "{told:#?}");
}

#[test]
fn a_scripted_session_reaches_only_its_endpoints_and_allowed_hosts() {
    let targets = Targets::start();
    let mut edits: Vec<(&str, String)> = QUICK.iter().map(|(a, b)| (*a, b.to_string())).collect();
    edits.extend(targets.edits());
    let edits: Vec<(&str, &str)> = edits.iter().map(|(a, b)| (*a, b.as_str())).collect();
    let env = TestEnv::started_with(&edits);
    let attempts = targets.attempts();
    let mut script = String::from("[[rule]]\nmatch = { kind = \"start\" }\nactions = [\n");
    for (command, must_fail) in &attempts {
        let expect = match must_fail {
            Some(true) => ", expect = \"fail\"",
            Some(false) => ", expect = \"ok\"",
            None => "",
        };
        script.push_str(&format!("  {{ shell = {}{expect} }},\n", json!(command)));
    }
    script.push_str(
        "  { call = \"comms_post_message\", args = { channel = \"{home}\", topic = \"net\", body = \"done trying\", \
         create_topic = true } },\n]\n",
    );
    env.create_scripted("prober", &script);
    crate::assert_eventually!(
        env.messages("home-prober").iter().any(|m| m["body"] == "done trying"),
        "the prober's MCP tools did not work: {:?}",
        env.activity("prober")
    );
    let transcript = crate::delivery::transcript(&env, "prober");
    let shells: Vec<&Value> = transcript.iter().filter(|t| t["kind"] == "shell").collect();
    assert_eq!(shells.len(), attempts.len(), "{transcript:#?}");
    for (shell, (command, must_fail)) in shells.iter().zip(&attempts) {
        if must_fail.is_some() {
            assert_eq!(shell["met"], true, "{command} went otherwise than meant: {shell:#}");
        }
    }
    let allowed = shells.last().unwrap()["output"].as_str().unwrap_or_default();
    assert!(allowed.contains("allowed-ok"), "the allowed host did not answer: {allowed}");
    targets.assert_nothing_arrived();
    assert_refusals_told(&env, "prober", "home-prober");
    let log = env.daemon_log();
    assert!(log.contains("egress refused") && log.contains("127.0.0.2"), "the refusal was not logged");
}

/// How long `steady` takes to answer a post, in the home channel it replies in.
fn answer_time(env: &TestEnv, nonce: &str) -> Duration {
    let started = Instant::now();
    env.ok(&["post", "--channel", "home-steady", "--topic", "ping", "--create-topic", &format!("ping {nonce}")]);
    crate::assert_eventually!(
        env.messages("home-steady")
            .iter()
            .any(|m| m["sender"]["handle"] == "steady" && m["body"].as_str().unwrap_or_default().contains(nonce)),
        "steady did not answer {nonce}"
    );
    started.elapsed()
}

#[test]
fn a_fork_bomb_or_a_memory_hog_ends_only_its_own_session_with_the_reason() {
    let mut edits = QUICK.to_vec();
    edits.extend([
        ("max_processes = 1024", "max_processes = 64"),
        ("max_memory = \"4 GiB\"", "max_memory = \"256 MiB\""),
    ]);
    let env = TestEnv::started_with(&edits);
    env.create_scripted(
        "steady",
        "[[rule]]\nmatch = { kind = \"message\", text_contains = \"ping\" }\nactions = [\n  { call = \
         \"comms_post_message\", args = { channel = \"{home}\", topic = \"ping\", body = \"pong {input.text}\" } },\n]\n",
    );
    env.wait_harness_pid("steady", 1);
    let usual = (1..=3).map(|i| answer_time(&env, &format!("before{i}"))).max().unwrap();
    // Each misbehaves once (a marker in its own agent directory), so its restart is quiet.
    let bomb = "test -e ../bombed || { touch ../bombed; f() { f | f & }; f; sleep 20; }";
    let hog = "test -e ../hogged || { touch ../hogged; head -c 600M /dev/zero | tail > /dev/null; }";
    for (agent, command, reason) in
        [("bomb", bomb, "process limit 64 reached"), ("hog", hog, "memory limit 256 MiB reached")]
    {
        env.create_scripted(
            agent,
            &format!("[[rule]]\nmatch = {{ kind = \"start\" }}\nactions = [\n  {{ shell = {} }},\n]\n", json!(command)),
        );
        let home = format!("home-{agent}");
        let told =
            |env: &TestEnv| env.messages(&home).iter().any(|m| m["body"].as_str().unwrap_or_default().contains(reason));
        let during = answer_time(&env, &format!("during-{agent}"));
        crate::assert_eventually!(told(&env), "{agent} was not ended with {reason:?}: {:?}", env.messages(&home));
        let activity = env.activity(agent);
        assert!(
            activity
                .iter()
                .any(|a| a["kind"] == "limit_reached" && a["summary"].as_str().unwrap_or("").contains(reason)),
            "{activity:#?}"
        );
        // It is restarted like any crash, and its second session stays within its limits.
        env.wait_harness_pid(agent, 2);
        let after = answer_time(&env, &format!("after-{agent}"));
        let bound = usual.mul_f64(5.0).max(Duration::from_secs(3));
        assert!(
            during <= bound && after <= bound,
            "steady slowed: usual {usual:?}, during {during:?}, after {after:?}"
        );
    }
    assert!(env.roster_entry("steady")["incarnation"] == 1, "steady's session was touched");
}

#[test]
fn a_claude_code_bash_tool_reaches_only_its_model_its_mcp_endpoint_and_allowed_hosts() {
    use crate::fake_anthropic::{FakeAnthropic, Reply};
    let targets = Targets::start();
    let fake = FakeAnthropic::start(Vec::new());
    let edits = targets.edits();
    let edits: Vec<(&str, &str)> = edits.iter().map(|(a, b)| (*a, b.as_str())).collect();
    let env = crate::claude::claude_env_with(&fake, &edits);
    let attempts = targets.attempts();
    for (command, _) in &attempts {
        fake.push(Reply::default().and_call("Bash", json!({ "command": command, "description": "x" })));
    }
    fake.push(Reply::canopy_tool(
        "comms_post_message",
        json!({"channel": "home-prober", "topic": "net", "body": "done trying", "create_topic": true}),
    ));
    fake.push(Reply::text("done"));
    env.json(&["agents", "create", "--handle", "prober", "--name", "prober", "--harness", "claude"]);
    // Its model endpoint answered every step and its MCP endpoint took the post.
    crate::assert_eventually!(
        env.messages("home-prober").iter().any(|m| m["body"] == "done trying"),
        "the prober's MCP tools did not work: {:?}",
        env.activity("prober")
    );
    let requests = fake.wait_requests(attempts.len() + 2, Duration::from_secs(60));
    // Each Bash result is in the request after its call: the allowed host answered, the rest
    // failed.
    let results: Vec<String> = requests[1..=attempts.len()].iter().map(|r| r.to_string()).collect();
    assert!(results.last().unwrap().contains("allowed-ok"), "{}", results.last().unwrap());
    for (result, (command, must_fail)) in results.iter().zip(&attempts) {
        if *must_fail == Some(true) {
            assert!(result.contains("\"is_error\":true") || result.contains("Exit code"), "{command}: {result}");
        }
    }
    targets.assert_nothing_arrived();
    assert_refusals_told(&env, "prober", "home-prober");
}

#[test]
fn doctor_names_the_network_and_the_limits_and_the_host_network_is_loud() {
    let env = TestEnv::started_with(QUICK);
    let doctor = crate::env::text(&env.run(&["doctor"]).stdout);
    let line =
        |name: &str| doctor.lines().find(|l| l.split_whitespace().nth(1) == Some(name)).unwrap_or_default().to_owned();
    assert!(line("network").starts_with("ok") && line("network").contains("proxy: a namespace of its own"), "{doctor}");
    assert!(
        line("limits").contains("1024 processes, 4 GiB memory") && line("limits").contains("enforced by"),
        "{doctor}"
    );
    drop(env);

    let mut edits = QUICK.to_vec();
    edits.push(("network = \"proxy\"", "network = \"host\""));
    let env = TestEnv::started_with(&edits);
    env.create_scripted("open", "");
    env.wait_harness_pid("open", 1);
    assert!(env.daemon_log().contains("sessions share this machine's network"), "{}", env.daemon_log());
    assert_eq!(env.roster_entry("open")["host_network"], true);
    assert!(env.ok(&["roster"]).contains("host network"), "{}", env.ok(&["roster"]));
    let doctor = crate::env::text(&env.run(&["doctor"]).stdout);
    assert!(doctor.lines().any(|l| l.starts_with("WARNING network") && l.contains("network = \"host\"")), "{doctor}");
}
