//! The one writer of everything the CLI prints: stdout through `out!`/`outln!`, diagnostics on
//! stderr through `errln!`. The crate denies `print!` and `eprint!` (clippy's `print_stdout`
//! and `print_stderr`), so no line reaches a terminal another way.
//!
//! A write that fails never panics (the standard library's `print!` does, with exit 101). A
//! closed stdout (`| head -1`) ends the command quietly with 141, as a Unix tool killed by
//! SIGPIPE does; any other failure (a full device) is reported once on stderr and ends the
//! command with 74 (EX_IOERR). Either way the running command is dropped at its next await
//! (`block_on` selects on `stopped`), so its children end with it, and later writes do
//! nothing. Diagnostics are best effort: a stderr that cannot be written is ignored, since
//! there is nowhere left to say so. Does not format anything: callers do.

use std::fmt::Arguments;
use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicU8, Ordering};

use tokio::sync::Notify;

/// Exit code when stdout is closed early: 128 + SIGPIPE, what a shell shows for a tool the
/// signal ended.
pub const EXIT_CLOSED: u8 = 141;
/// Exit code when the output could not be written (EX_IOERR).
pub const EXIT_IO: u8 = 74;

const OPEN: u8 = 0;
const CLOSED: u8 = 1;
const FAILED: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(OPEN);
static STOPPED: Notify = Notify::const_new();

/// Writes `args` to stdout and flushes, so a failure is seen at the write that caused it.
pub fn write_out(args: Arguments<'_>) {
    if STATE.load(Ordering::Acquire) != OPEN {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        failed(&e);
    }
}

/// Writes raw bytes to stdout (generated pages, not formatted text).
pub fn out_bytes(bytes: &[u8]) {
    if STATE.load(Ordering::Acquire) != OPEN {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        failed(&e);
    }
}

/// Writes `args` to stderr, best effort.
pub fn write_err(args: Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

fn failed(e: &std::io::Error) {
    let state = if e.kind() == ErrorKind::BrokenPipe { CLOSED } else { FAILED };
    if STATE.compare_exchange(OPEN, state, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        if state == FAILED {
            write_err(format_args!("error: cannot write the output to stdout: {e}\n"));
        }
        STOPPED.notify_waiters();
    }
}

/// Resolves once stdout has failed: the command has nothing left to do.
pub async fn stopped() {
    if STATE.load(Ordering::Acquire) != OPEN {
        return;
    }
    let notified = STOPPED.notified();
    if STATE.load(Ordering::Acquire) != OPEN {
        return;
    }
    notified.await;
}

/// The process's exit code: the command's own, unless its output failed.
pub fn exit_code(command: u8) -> u8 {
    match STATE.load(Ordering::Acquire) {
        CLOSED => EXIT_CLOSED,
        FAILED => EXIT_IO,
        _ => command,
    }
}

/// `print!` through the writer.
macro_rules! out {
    ($($arg:tt)*) => { $crate::writer::write_out(format_args!($($arg)*)) };
}

/// `println!` through the writer.
macro_rules! outln {
    () => { $crate::writer::write_out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::writer::write_out(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprint!` through the writer (a question before reading the answer).
macro_rules! err {
    ($($arg:tt)*) => { $crate::writer::write_err(format_args!($($arg)*)) };
}

/// `eprintln!` through the writer.
macro_rules! errln {
    ($($arg:tt)*) => { $crate::writer::write_err(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {err, errln, out, outln};
