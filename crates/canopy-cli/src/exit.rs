//! Exit codes, and how a failed command says why: the error on stderr (or as a JSON document
//! on stdout with `--json`) and the code a script can branch on.
//!
//! Every command and `import` end here; this file depends on nothing of the CLI but
//! `output`, so no file that reports an error imports the commands that call it. Public for
//! binaries built on the CLI (`canopy-bench`), so their errors read and exit the same.

use canopy_bus::CallError;
use canopy_core::ErrorCode;

use crate::output;
use crate::writer::errln;

/// Exit code for bad usage or configuration (EX_USAGE).
pub const EXIT_USAGE: u8 = 64;
/// Exit code when the daemon cannot be reached (EX_UNAVAILABLE).
pub const EXIT_UNAVAILABLE: u8 = 69;
/// Exit code when the daemon refused the request.
pub const EXIT_REFUSED: u8 = 1;

/// Prints a usage error naming `field` and returns 64.
pub fn fail_usage(json: bool, field: &str, message: &str) -> u8 {
    let wire = canopy_proto::WireError {
        code: ErrorCode::InvalidArgument,
        message: message.to_owned(),
        field: Some(field.to_owned()),
    };
    print_error(json, &wire);
    EXIT_USAGE
}

/// Refuses an argument the daemon would refuse (`invalid_argument` naming `field`, exit 1),
/// without asking it: a value the request's type cannot carry.
pub fn refuse_locally(json: bool, field: &str, message: String) -> u8 {
    let wire = canopy_proto::WireError { code: ErrorCode::InvalidArgument, message, field: Some(field.to_owned()) };
    fail(json, &CallError::Refused(wire))
}

/// Prints an error and returns its exit code.
pub fn fail(json: bool, error: &CallError) -> u8 {
    let (code, wire) = match error {
        CallError::Refused(wire) => (EXIT_REFUSED, wire.clone()),
        CallError::Unreachable(message) => (
            EXIT_UNAVAILABLE,
            canopy_proto::WireError { code: ErrorCode::Unavailable, message: message.clone(), field: None },
        ),
    };
    print_error(json, &wire);
    code
}

/// The exit code of a command that printed its answer (0), or of the error it failed with.
pub fn code(json: bool, result: Result<(), CallError>) -> u8 {
    match result {
        Ok(()) => 0,
        Err(e) => fail(json, &e),
    }
}

fn print_error(json: bool, wire: &canopy_proto::WireError) {
    if json {
        output::json(&serde_json::json!({ "error": wire }));
    } else {
        errln!("error: {wire}");
    }
}
