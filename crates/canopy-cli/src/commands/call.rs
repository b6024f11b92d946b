//! What every area's commands share: one API call printed as JSON or as text, the banner
//! of what waits for the operator that opens a human listing, and text read from stdin (a
//! message's or an issue's body) no further than its limit.
//!
//! Kept apart from `mod.rs` so the areas import this file and `mod.rs` imports the areas,
//! with no circle between them. Knows no command of its own.

use std::io::Read;

use canopy_core::ErrorCode;
use canopy_proto::ApiMethod;
use canopy_proto::api::{MergesListRequest, SpawnListRequest};
use canopy_proto::method;

use crate::client::{CallError, Client};
use crate::exit::{fail, fail_usage};
use crate::output;
use crate::writer::outln;

/// Calls a method and prints the response as JSON or through `human`.
pub async fn call<M: ApiMethod>(
    client: &Client,
    json: bool,
    request: &M::Request,
    human: impl FnOnce(&M::Response),
) -> Result<(), CallError> {
    let response = client.send::<M>(request).await?;
    if json {
        output::json(&response);
    } else {
        human(&response);
    }
    Ok(())
}

/// Opens a human listing with what waits for the operator: pending spawn and merge requests.
pub async fn waiting_banner(client: &Client, json: bool) {
    if json {
        return;
    }
    let pending = SpawnListRequest { state: Some(canopy_core::SpawnState::Pending) };
    let spawns = client.send::<method::SpawnList>(&pending).await.map(|r| r.requests).unwrap_or_default();
    let merges = MergesListRequest { state: Some(canopy_core::MergeState::Pending) };
    let merges = client.send::<method::MergesList>(&merges).await.map(|r| r.merges).unwrap_or_default();
    if let Some(line) = output::waiting(&spawns, &merges) {
        outln!("{line}");
    }
}

/// Text from stdin that cannot be sent: past the limit (refused, exit 1, as the daemon would
/// refuse it), or not text (a usage error, exit 64).
pub enum BadStdin {
    TooLarge(String),
    NotText(String),
}

impl BadStdin {
    /// Prints the error naming `field` and returns its exit code.
    pub fn fail(self, json: bool, field: &str) -> u8 {
        match self {
            BadStdin::NotText(why) => fail_usage(json, field, &why),
            BadStdin::TooLarge(why) => {
                let wire =
                    canopy_proto::WireError { code: ErrorCode::LimitExceeded, message: why, field: Some(field.into()) };
                fail(json, &CallError::Refused(wire))
            }
        }
    }
}

/// Reads `what` (`the message body`) from stdin, no further than `max` bytes (`limit` names
/// where the limit comes from), so text past it is refused by the daemon's rule and code
/// rather than lost in transport. One trailing newline is dropped: `echo text |` and editors
/// end the text with a newline that is not the text's.
pub fn text_from_stdin(what: &str, max: usize, limit: &str) -> Result<String, BadStdin> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| BadStdin::NotText(format!("reading {what} from stdin: {e}")))?;
    if bytes.len() > max {
        return Err(BadStdin::TooLarge(format!("{what} is more than {max} bytes; the limit is {max} ({limit})")));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        BadStdin::NotText(format!("{what} on stdin is not UTF-8 text (at byte {})", e.utf8_error().valid_up_to()))
    })?;
    let trimmed = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t));
    Ok(trimmed.map(str::to_owned).unwrap_or(text))
}
