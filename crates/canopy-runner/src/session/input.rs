//! What a session writes to its harness as input: the first input (who the agent is, its
//! charter or a run's brief, the continuity block, what waited while it was offline), a
//! turn-start delivery's messages, a steered message, and the one-line summaries `watch`
//! shows for them.
//!
//! Pure functions of the assignment and the messages (the fence's nonce is random). Does not
//! send anything, and does not decide when input goes: the session loop does.

use canopy_core::{Message, Seq};
use canopy_harness::InputContext;
use canopy_proto::api::SessionAssignment;

/// A session's first input, composed from what the daemon had for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FirstInput {
    pub input_id: String,
    pub text: String,
    pub context: InputContext,
    /// The waiting messages it carries: injected, and acknowledged, once the harness takes it.
    pub seqs: Vec<Seq>,
    /// What `watch` shows for it.
    pub summary: String,
}

impl FirstInput {
    /// The first input of the session `assignment`: the `continuity` block first (never the
    /// system prompt, so block 0 stays stable), who the agent is (or a run's brief), then
    /// the messages that `waiting` while it was offline (`redelivered` marks those an
    /// earlier session was handed).
    pub fn compose(
        assignment: &SessionAssignment,
        continuity: Option<String>,
        waiting: &[Message],
        redelivered: &[Seq],
    ) -> FirstInput {
        let mut text = continuity.map(|block| block + "\n\n").unwrap_or_default();
        text.push_str(&start_input(assignment));
        if !waiting.is_empty() {
            text.push_str("\n\n");
            text.push_str(&render(waiting, "Messages that arrived while you were offline:", redelivered));
        }
        let mut context = match &assignment.run {
            Some(run) => {
                InputContext { kind: "start".into(), sender: Some(run.manager.clone()), ..InputContext::default() }
            }
            None => context_of("start", &[], &[]),
        };
        context.redelivered = waiting.iter().any(|m| redelivered.contains(&m.seq));
        let summary = match (&assignment.run, waiting.is_empty()) {
            (Some(run), _) => format!("input: the brief from {}", run.manager),
            (None, true) => "input: who it is, at its session start".to_owned(),
            (None, false) => format!("{}, at its session start", input_summary(waiting)),
        };
        FirstInput {
            input_id: format!("start-{}", assignment.incarnation),
            text,
            context,
            seqs: waiting.iter().map(|m| m.seq).collect(),
            summary,
        }
    }
}

/// A turn-start delivery's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TurnInput {
    pub input_id: String,
    pub text: String,
    pub context: InputContext,
    pub seqs: Vec<Seq>,
}

impl TurnInput {
    /// The input that starts a turn with `fresh` messages, opening with the `continuity`
    /// block when one is owed and could be had.
    pub fn of(fresh: &[Message], redelivered: &[Seq], continuity: Option<&str>) -> TurnInput {
        let mut text = render(fresh, "New messages since your last turn:", redelivered);
        if let Some(block) = continuity {
            text = format!("{block}\n\n{text}");
        }
        TurnInput {
            input_id: format!("deliver-{}", fresh.last().map_or(0, |m| m.seq.get())),
            text,
            context: context_of("message", fresh, redelivered),
            seqs: fresh.iter().map(|m| m.seq).collect(),
        }
    }
}

/// The input that steers `message` into a running turn.
pub(crate) fn steer_input(message: &Message) -> (String, InputContext) {
    let text = render(std::slice::from_ref(message), "A message for you arrived while you were working:", &[]);
    (text, context_of("message", std::slice::from_ref(message), &[]))
}

/// Renders messages fenced with a fresh random nonce no body contains, marking those an
/// earlier session was handed (`redelivered`).
fn render(messages: &[Message], heading: &str, redelivered: &[Seq]) -> String {
    canopy_core::render::render_fenced(messages, heading, redelivered, || {
        // Without the system's randomness the nonce is only guessable, not repeated: the
        // clock moves it on, and `render_fenced` asks again while a body contains it.
        canopy_sys::random_hex(8).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "no random fence nonce; using the clock");
            format!("{:x}{:x}", std::process::id(), canopy_sys::unix_us())
        })
    })
}

/// Where the input came from, for the harness (the scripted one matches rules on it).
fn context_of(kind: &str, messages: &[Message], redelivered: &[Seq]) -> InputContext {
    let last = messages.last();
    InputContext {
        kind: kind.to_owned(),
        sender: last.map(|m| m.sender.handle.to_string()),
        channel: last.map(|m| m.channel.to_string()),
        topic: last.map(|m| m.topic.to_string()),
        seq: last.map(|m| m.seq.get()),
        redelivered: messages.iter().any(|m| redelivered.contains(&m.seq)),
    }
}

/// `input: 3 messages (from ops, lead in #home-x > plans)`: what started a turn, for `watch`.
pub(crate) fn input_summary(messages: &[Message]) -> String {
    let mut senders: Vec<&str> = messages.iter().map(|m| m.sender.handle.as_str()).collect();
    senders.dedup();
    senders.sort_unstable();
    senders.dedup();
    let places: std::collections::BTreeSet<String> =
        messages.iter().map(|m| format!("#{} > {}", m.channel, m.topic)).collect();
    let noun = if messages.len() == 1 { "message" } else { "messages" };
    let places: Vec<String> = places.into_iter().take(3).collect();
    format!("input: {} {noun} (from {} in {})", messages.len(), senders.join(", "), places.join(", "))
}

/// The first input of a session: who it is, and what its lane is for.
fn start_input(assignment: &SessionAssignment) -> String {
    if let Some(run) = &assignment.run {
        return format!(
            "Brief from @{} (subagent run {}, definition {}):\n\n{}",
            run.manager,
            run.id,
            run.definition,
            run.brief.trim()
        );
    }
    let mut text = format!(
        "Session {} started for {} (@{}, role {}). Your home channel is #{}.",
        assignment.incarnation, assignment.display_name, assignment.agent, assignment.role, assignment.home_channel
    );
    if !assignment.charter.trim().is_empty() {
        text.push_str(&format!("\n\nYour charter: {}", assignment.charter.trim()));
    }
    text
}

#[cfg(test)]
mod tests {
    use canopy_proto::api::RunAssignment;

    use super::*;
    use crate::session::testing::{assignment, message};

    #[test]
    fn a_first_input_opens_with_continuity_then_who_it_is_then_what_waited() {
        let mut manager = assignment();
        manager.charter = "  keep the lights on ".into();
        let waiting = [message(3, "hello"), message(4, "again")];
        let first = FirstInput::compose(&manager, Some("CONTINUITY".into()), &waiting, &[Seq(4)]);
        assert_eq!(first.input_id, "start-1");
        assert!(first.text.starts_with("CONTINUITY\n\nSession 1 started for A (@a, role manager)."), "{}", first.text);
        assert!(first.text.contains("Your charter: keep the lights on\n\n"), "{}", first.text);
        assert!(first.text.contains("Messages that arrived while you were offline:"), "{}", first.text);
        assert!(first.text.contains("hello") && first.text.contains("again"));
        assert_eq!(first.seqs, vec![Seq(3), Seq(4)]);
        assert_eq!(first.context.kind, "start");
        assert_eq!(first.context.sender, None, "a start input has no sender");
        assert!(first.context.redelivered, "message 4 was handed to an earlier session");
        assert_eq!(first.summary, "input: 2 messages (from ops in #home-a > t), at its session start");
    }

    #[test]
    fn a_first_input_with_nothing_waiting_says_who_it_is() {
        let first = FirstInput::compose(&assignment(), None, &[], &[]);
        assert_eq!(first.text, "Session 1 started for A (@a, role manager). Your home channel is #home-a.");
        assert_eq!(first.summary, "input: who it is, at its session start");
        assert!(first.seqs.is_empty() && !first.context.redelivered);
    }

    #[test]
    fn a_runs_first_input_is_its_brief_from_its_manager() {
        let mut run = assignment();
        run.run = Some(RunAssignment {
            id: 7,
            definition: "review".into(),
            manager: "lead".into(),
            brief: " look \n".into(),
        });
        let first = FirstInput::compose(&run, None, &[], &[]);
        assert_eq!(first.text, "Brief from @lead (subagent run 7, definition review):\n\nlook");
        assert_eq!(first.context.sender.as_deref(), Some("lead"));
        assert_eq!(first.summary, "input: the brief from lead");
    }

    #[test]
    fn a_turn_input_names_its_newest_message_and_may_open_with_continuity() {
        let fresh = [message(5, "one"), message(6, "two")];
        let input = TurnInput::of(&fresh, &[], None);
        assert_eq!(input.input_id, "deliver-6");
        assert!(input.text.starts_with("New messages since your last turn:"), "{}", input.text);
        assert_eq!(input.seqs, vec![Seq(5), Seq(6)]);
        assert_eq!((input.context.kind.as_str(), input.context.seq), ("message", Some(6)));
        assert_eq!(input.context.sender.as_deref(), Some("ops"));
        let owed = TurnInput::of(&fresh, &[Seq(5)], Some("CONTINUITY"));
        assert!(owed.text.starts_with("CONTINUITY\n\nNew messages"), "{}", owed.text);
        assert!(owed.context.redelivered);
    }

    #[test]
    fn a_steer_input_carries_its_one_message() {
        let (text, context) = steer_input(&message(9, "@a look"));
        assert!(text.starts_with("A message for you arrived while you were working:"), "{text}");
        assert!(text.contains("@a look"));
        assert_eq!(context.seq, Some(9));
    }
}
