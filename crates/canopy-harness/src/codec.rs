//! The `Codec` trait: how one harness's JSON-lines protocol encodes inputs and decodes
//! output lines, and `Decoded`, what an output line means.
//!
//! Implemented by each adapter (`claude`, `codex`, `omp`, `pi`, `scripted`) and driven by
//! `session`, which owns the process and the framing. Does not know any harness's wire
//! format itself.

use crate::event::{HarnessEvent, SendMode, SendOutcome};
use crate::launch::InputContext;

/// Encodes inputs and decodes output lines for one harness's protocol.
pub(crate) trait Codec: Send + 'static {
    /// The conversation this launch resumes, if it resumes one: a launch that fails is then
    /// tried once more with a fresh conversation.
    fn resuming(&self) -> Option<String> {
        None
    }
    /// Lines written as soon as the process starts, before it is ready (a handshake's first
    /// step; later steps are `Decoded::Write`s answering what the harness printed).
    fn start(&mut self) -> Vec<Vec<u8>> {
        Vec::new()
    }
    /// Answers a send at once, without writing anything, when the harness cannot take it
    /// now (a next-turn input while a turn runs, a steer for a turn that already ended).
    fn answer_now(&mut self, _mode: &SendMode) -> Option<SendOutcome> {
        None
    }
    /// Called once the line for `input_id` is written: an outcome resolves the send at once
    /// (the harness confirms nothing more for it, or the adapter already knows the answer).
    fn written(&mut self, _input_id: &str) -> Option<SendOutcome> {
        None
    }
    /// One line (without the newline) that delivers `text`.
    fn encode_send(&mut self, input_id: &str, text: &str, context: &InputContext, mode: &SendMode) -> Vec<u8>;
    /// The line that stops the running turn; empty when there is nothing to stop.
    fn encode_interrupt(&mut self) -> Vec<u8>;
    /// The line that asks the harness to exit, or empty; stdin is closed after it either way.
    fn encode_shutdown(&mut self) -> Vec<u8>;
    /// Decodes one output line.
    fn decode(&mut self, line: &[u8]) -> Vec<Decoded>;
}

/// What one output line means.
pub(crate) enum Decoded {
    Event(HarnessEvent),
    /// The harness confirmed what became of an input.
    Ack {
        input_id: String,
        outcome: SendOutcome,
    },
    /// A line to write back to the harness: the next handshake step, or an answer to a
    /// request the harness made.
    Write(Vec<u8>),
}
