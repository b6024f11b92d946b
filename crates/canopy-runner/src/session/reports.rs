//! One session's reports to the daemon: presence, activity lines and usage, each a
//! `SessionReport` handed to the runner's batching reporter.
//!
//! Owns what a harness event means for presence and usage (`event_report`, a pure function).
//! Does not send to the daemon itself: the runner's `reporter` batches and retries.

use canopy_core::{Incarnation, Presence};
use canopy_harness::HarnessEvent;
use canopy_proto::api::{ReportedActivity, ReportedUsage, SessionReport};
use tokio::sync::mpsc;

/// The sender of one session's reports.
#[derive(Clone)]
pub(crate) struct Reports {
    agent: String,
    incarnation: Incarnation,
    /// The session's model (or its harness's name): what `[pricing]` prices its usage by.
    model: String,
    tx: mpsc::Sender<SessionReport>,
}

impl Reports {
    pub fn new(agent: String, incarnation: Incarnation, model: String, tx: mpsc::Sender<SessionReport>) -> Reports {
        Reports { agent, incarnation, model, tx }
    }

    /// A report with nothing in it yet, for this session.
    fn blank(&self) -> SessionReport {
        SessionReport {
            agent: self.agent.clone(),
            incarnation: self.incarnation,
            presence: None,
            reason: None,
            activity: None,
            ended: false,
            crash_loop: false,
            fatal: false,
            usage: None,
        }
    }

    /// Hands a report to the runner's reporter. The queue is bounded, so a full one makes
    /// the session wait rather than drop it; a closed one means the runner is gone (its
    /// reporter ends only when every session has), so there is nobody to report to.
    async fn send(&self, report: SessionReport) {
        if self.tx.send(report).await.is_err() {
            tracing::debug!("the runner's reporter is gone; a session report is dropped");
        }
    }

    /// The session is starting: presence `starting`, and a `session_starting` line.
    pub async fn starting(&self, harness: &str) {
        let summary = format!("starting session {} ({harness} harness)", self.incarnation);
        let activity = ReportedActivity {
            kind: "session_starting".into(),
            turn_id: None,
            summary,
            detail: serde_json::Value::Null,
        };
        self.send(SessionReport { presence: Some(Presence::Starting), activity: Some(activity), ..self.blank() }).await;
    }

    /// An activity line of `kind`.
    pub async fn activity(&self, kind: &str, summary: String, detail: serde_json::Value) {
        let activity = ReportedActivity { kind: kind.into(), turn_id: None, summary, detail };
        self.send(SessionReport { activity: Some(activity), ..self.blank() }).await;
    }

    /// A harness event: its activity line, the presence it implies, the usage it carries.
    pub async fn event(&self, event: &HarnessEvent) {
        self.send(event_report(self.blank(), &self.model, event)).await;
    }

    /// The session ended (stopped as asked): it is offline, and why.
    pub async fn ended(&self, reason: String) {
        self.send(ended_report(self.agent.clone(), self.incarnation, Presence::Offline, "session_ended", reason)).await;
    }
}

/// The report that a session ended: its last presence, why, and its activity line `kind`.
pub(crate) fn ended_report(
    agent: String,
    incarnation: canopy_core::Incarnation,
    presence: Presence,
    kind: &str,
    reason: String,
) -> SessionReport {
    let activity =
        ReportedActivity { kind: kind.into(), turn_id: None, summary: reason.clone(), detail: serde_json::Value::Null };
    SessionReport {
        agent,
        incarnation,
        presence: Some(presence),
        reason: Some(reason),
        activity: Some(activity),
        ended: true,
        crash_loop: false,
        fatal: false,
        usage: None,
    }
}

/// `blank` filled in for `event`: the presence it implies, its activity line, and its usage
/// priced by `model`.
fn event_report(blank: SessionReport, model: &str, event: &HarnessEvent) -> SessionReport {
    let presence = match event {
        HarnessEvent::TurnStarted { .. } | HarnessEvent::CompactionEnded => Some((Presence::Working, None)),
        HarnessEvent::TurnEnded { .. } => Some((Presence::Idle, Some("waiting for its next input".to_owned()))),
        HarnessEvent::CompactionStarted => Some((Presence::Compacting, None)),
        HarnessEvent::ModelError { text, fatal: false } => Some((Presence::Failing, Some(text.clone()))),
        _ => None,
    };
    let detail = serde_json::to_value(event).unwrap_or_else(|e| {
        tracing::debug!(error = %e, kind = event.kind(), "a harness event did not serialize; its detail is left out");
        serde_json::Value::Null
    });
    let activity = ReportedActivity {
        kind: event.kind().into(),
        turn_id: event.turn_id().map(str::to_owned),
        summary: event.summary(),
        detail,
    };
    let (presence, reason) = presence.map_or((None, None), |(p, r)| (Some(p), r));
    // Usage rides the same report as its activity line; the daemon stores it per turn.
    let usage = match event {
        HarnessEvent::Usage { turn_id, usage } => Some(ReportedUsage {
            turn_id: turn_id.clone(),
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cache_read_tokens: usage.cache_read_tokens,
            cache_write_tokens: usage.cache_write_tokens,
            model: Some(model.to_owned()),
            cost_usd: usage.cost_usd,
        }),
        _ => None,
    };
    SessionReport { presence, reason, activity: Some(activity), usage, ..blank }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use canopy_harness::{TurnStatus, Usage};

    use super::*;

    fn reports() -> (Reports, mpsc::Receiver<SessionReport>) {
        let (tx, rx) = mpsc::channel(8);
        (Reports::new("a".into(), Incarnation(3), "m1".into(), tx), rx)
    }

    #[test]
    fn events_imply_presence() {
        let (reports, _rx) = reports();
        let report = |event: HarnessEvent| event_report(reports.blank(), "m1", &event);
        let started = report(HarnessEvent::TurnStarted { turn_id: "t1".into() });
        assert_eq!(started.presence, Some(Presence::Working));
        assert_eq!(
            started.activity.as_ref().map(|a| (a.kind.as_str(), a.turn_id.as_deref())),
            Some(("turn_started", Some("t1")))
        );
        let ended = report(HarnessEvent::TurnEnded { turn_id: "t1".into(), status: TurnStatus::Completed });
        assert_eq!(
            (ended.presence, ended.reason.as_deref()),
            (Some(Presence::Idle), Some("waiting for its next input"))
        );
        let failing = report(HarnessEvent::ModelError { text: "overloaded".into(), fatal: false });
        assert_eq!((failing.presence, failing.reason.as_deref()), (Some(Presence::Failing), Some("overloaded")));
        let fatal = report(HarnessEvent::ModelError { text: "bad key".into(), fatal: true });
        assert_eq!(fatal.presence, None, "a fatal error's presence comes with the session's end");
        assert_eq!(report(HarnessEvent::CompactionStarted).presence, Some(Presence::Compacting));
        assert_eq!(report(HarnessEvent::Text { turn_id: None, text: "hi".into() }).presence, None);
    }

    #[test]
    fn usage_rides_its_activity_priced_by_the_sessions_model() {
        let (reports, _rx) = reports();
        let usage = Usage { input_tokens: 10, output_tokens: 2, ..Usage::default() };
        let report = event_report(reports.blank(), "m1", &HarnessEvent::Usage { turn_id: Some("t1".into()), usage });
        let usage = report.usage.unwrap();
        assert_eq!((usage.input_tokens, usage.output_tokens, usage.model.as_deref()), (10, 2, Some("m1")));
        assert_eq!(report.activity.map(|a| a.kind), Some("usage".into()));
    }

    #[tokio::test]
    async fn an_end_is_reported_as_ended_with_its_reason() {
        let (reports, mut rx) = reports();
        reports.ended("stopped (exited 0)".into()).await;
        let report = rx.recv().await.unwrap();
        assert!(report.ended);
        assert_eq!((report.presence, report.reason.as_deref()), (Some(Presence::Offline), Some("stopped (exited 0)")));
        assert_eq!(report.activity.map(|a| a.kind), Some("session_ended".into()));
    }

    #[tokio::test]
    async fn a_report_to_a_runner_that_is_gone_is_dropped_without_waiting() {
        let (reports, rx) = reports();
        drop(rx);
        reports.activity("input", "x".into(), serde_json::Value::Null).await;
    }
}
