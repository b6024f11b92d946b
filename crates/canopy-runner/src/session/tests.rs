//! The session task against real parts: a real `nats-server` carrying the runner's calls to
//! a stand-in daemon (a responder on the API subjects that answers pulls and can be slow to
//! acknowledge), and a real harness process (`sh` speaking the scripted protocol). Owns the
//! task's timing promises: a slow acknowledgement never delays a steer, and a closed command
//! channel ends the task instead of spinning.

#![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

use std::time::Duration;

use canopy_bus::{ApiClient, Bus, ManagedNats, NatsServerConfig};
use canopy_proto::Subjects;
use canopy_proto::api::SessionReport;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::testing::{assignment, message, options};
use super::{SessionCommand, SessionContext, SessionExit, SessionSlot, spawn};

/// A harness in `sh`: ready at once; the start input is a turn that ends at once; any later
/// prompt starts a turn that keeps running; a steer is queued for the running turn.
const HARNESS: &str = r#"
echo '{"type":"ready","pid":1}'
n=0
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
  case "$line" in
    *'"type":"prompt"'*)
      n=$((n+1))
      echo "{\"type\":\"turn_started\",\"turn_id\":\"t$n\",\"input_id\":\"$id\"}"
      case "$id" in start-*) echo "{\"type\":\"turn_ended\",\"turn_id\":\"t$n\",\"status\":\"completed\"}";; esac;;
    *'"type":"steer"'*) echo "{\"type\":\"steer_queued\",\"id\":\"$id\",\"turn_id\":\"t$n\"}";;
    *'"type":"shutdown"'*) exit 0;;
  esac
done
"#;

/// What the stand-in daemon is told to do, and what it saw.
struct Daemon {
    /// Acknowledgements of turn-start deliveries are never answered (they hang, as against
    /// a daemon that has stopped answering), rather than answered at once.
    hold_acks: bool,
    /// Told of every turn-start acknowledgement as it arrives.
    acks: mpsc::UnboundedSender<()>,
}

/// Answers the runner's API calls: the first pull finds nothing, the second finds message 5.
async fn serve(bus: Bus, subjects: Subjects, daemon: Daemon) {
    let mut requests = bus.serve(&subjects.api_wildcard(), "stand-in").await.unwrap();
    let mut pulls = 0;
    while let Some(request) = requests.next().await {
        let Some(reply) = request.reply.clone() else { continue };
        let body: Value = serde_json::from_slice(&request.payload).unwrap_or(Value::Null);
        let answer = if request.subject.ends_with(".deliveries.pull") {
            pulls += 1;
            let messages = if pulls == 2 { vec![message(5, "hello")] } else { Vec::new() };
            json!({ "ok": { "total": messages.len(), "wake": true, "messages": messages } })
        } else if request.subject.ends_with(".deliveries.ack") {
            if body["steered"] == false {
                // The test may have stopped counting acknowledgements; the answer goes on.
                let _ = daemon.acks.send(());
                if daemon.hold_acks {
                    continue;
                }
            }
            json!({ "ok": { "moved": 0 } })
        } else {
            json!({ "error": { "code": "not_found", "message": "the stand-in daemon does not serve this" } })
        };
        // A caller that gave up finds no answer, as against a real daemon.
        let _ = bus.publish(&reply, answer.to_string().into()).await;
    }
}

struct Running {
    _nats: ManagedNats,
    _dir: tempfile::TempDir,
    slot: SessionSlot,
    reports: mpsc::Receiver<SessionReport>,
    exits: mpsc::Receiver<SessionExit>,
    /// One item per turn-start acknowledgement the stand-in daemon received.
    acks: mpsc::UnboundedReceiver<()>,
}

async fn start(hold_acks: bool) -> Running {
    let (acks_tx, acks) = mpsc::unbounded_channel();
    let daemon = Daemon { hold_acks, acks: acks_tx };
    let dir = tempfile::tempdir().unwrap();
    let nats = ManagedNats::start(NatsServerConfig {
        bin: canopy_bus::find_nats_server().unwrap(),
        dir: dir.path().join("nats"),
        users: Vec::new(),
        restart_min: Duration::from_millis(100),
        restart_max: Duration::from_millis(500),
    })
    .await
    .unwrap();
    let subjects = Subjects::new("ws-000000000000");
    let served = Bus::connect(nats.url(), &canopy_bus::Login::open(), "stand-in", true).await.unwrap();
    tokio::spawn(serve(served.clone(), subjects.clone(), daemon));
    served.flush().await.unwrap();
    let bus = Bus::connect(nats.url(), &canopy_bus::Login::open(), "runner", true).await.unwrap();
    let api = ApiClient::new(bus, subjects, Duration::from_millis(500));
    let options = options(api, dir.path(), HARNESS);
    let assignment = assignment();
    let (reports_tx, reports) = mpsc::channel(1024);
    let (exits_tx, exits) = mpsc::channel(16);
    let slot = spawn(SessionContext {
        previous: None,
        assignment,
        options,
        runner_id: canopy_core::RunnerId::parse("r1").unwrap(),
        mcp_url: "http://127.0.0.1:9/mcp".into(),
        reports: reports_tx,
        exits: exits_tx,
    });
    Running { _nats: nats, _dir: dir, slot, reports, exits, acks }
}

impl Running {
    /// Waits for a report of activity `kind` (with `turn` when given).
    async fn until(&mut self, kind: &str, turn: Option<&str>) {
        let wanted = |r: &SessionReport| {
            r.activity.as_ref().is_some_and(|a| a.kind == kind && turn.is_none_or(|t| a.turn_id.as_deref() == Some(t)))
        };
        tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(report) = self.reports.recv().await {
                if wanted(&report) {
                    return;
                }
            }
            panic!("the reports ended before {kind}");
        })
        .await
        .unwrap_or_else(|_| panic!("no {kind} report within 10s"));
    }
}

#[tokio::test]
async fn a_slow_acknowledgement_does_not_delay_a_steer() {
    let mut running = start(true).await;
    // The second turn starts with message 5, and its acknowledgement is in flight and hangs.
    running.until("turn_started", Some("t2")).await;
    tokio::time::timeout(Duration::from_secs(10), running.acks.recv()).await.expect("no acknowledgement was sent");
    let (reply, answer) = oneshot::channel();
    let command = SessionCommand::Steer { message: message(9, "@a look"), reply };
    running.slot.commands.send(command).await.unwrap();
    let started = tokio::time::Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(2), answer)
        .await
        .expect("the steer waited on the slow acknowledgement")
        .unwrap();
    assert!(answer.steered, "{answer:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a_steer_of_a_message_being_delivered_falls_back_instead_of_repeating_it() {
    let mut running = start(true).await;
    running.until("turn_started", Some("t2")).await;
    // Message 5 is in the running turn's input: a steer of it is answered at once.
    let (reply, answer) = oneshot::channel();
    running.slot.commands.send(SessionCommand::Steer { message: message(5, "hello"), reply }).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(2), answer).await.unwrap().unwrap();
    assert!(answer.reason.is_some(), "{answer:?}");
}

#[tokio::test]
async fn a_closed_command_channel_ends_the_task() {
    let mut running = start(false).await;
    running.until("session_ready", None).await;
    // The runner forgets the session without asking it to stop: its commands close.
    let (closed, _) = mpsc::channel(1);
    drop(std::mem::replace(&mut running.slot.commands, closed));
    let exit = tokio::time::timeout(Duration::from_secs(10), running.exits.recv())
        .await
        .expect("the session task kept running with its commands closed")
        .unwrap();
    assert!(exit.requested, "a closed command channel is a stop, not a crash: {}", exit.reason);
}
