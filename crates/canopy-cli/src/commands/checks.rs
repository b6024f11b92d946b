//! The checks area: named checks' runs (by repository or branch, newest first) and one
//! check's log, read a page at a time and printed whole.
//!
//! Does not run checks: the daemon runs them on runs, branches, merge requests and the queue.

use canopy_core::checks::CheckRun;
use canopy_proto::api::*;
use canopy_proto::method;

use super::call::call;
use crate::args::ChecksCommand;
use crate::client::Client;
use crate::exit::{code, fail};
use crate::output;
use crate::writer::{out, outln};

/// `canopy checks [--repo R] [--branch B] [log ID]`.
pub async fn checks(
    client: &Client,
    json: bool,
    repo: Option<String>,
    branch: Option<String>,
    limit: u32,
    command: Option<ChecksCommand>,
) -> u8 {
    match command {
        Some(ChecksCommand::Log { id }) => log(client, json, id).await,
        None => {
            let request = ChecksListRequest { repo, branch, limit: Some(limit) };
            code(json, call::<method::ChecksList>(client, json, &request, |r| print_table(&r.checks)).await)
        }
    }
}

/// `canopy checks log ID`: every page, then the log printed as it was written.
async fn log(client: &Client, json: bool, id: String) -> u8 {
    let mut offset = 0;
    let mut text = String::new();
    let check = loop {
        let request = ChecksLogRequest { id: id.clone(), offset };
        match client.send::<method::ChecksLog>(&request).await {
            Ok(page) => {
                text.push_str(&page.log);
                match page.next_offset {
                    Some(next) => offset = next,
                    None => break page.check,
                }
            }
            Err(e) => return fail(json, &e),
        }
    };
    if json {
        output::json(&serde_json::json!({ "check": check, "log": text }));
    } else {
        outln!("{}  {}", check.id, check.line());
        outln!("{} on {} ({}), `{}`", check.subject, short(&check.commit), check.trigger, check.command);
        outln!();
        out!("{text}");
        if !text.is_empty() && !text.ends_with('\n') {
            outln!();
        }
    }
    0
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(10)]
}

/// Check runs as an aligned table, newest first.
pub fn print_table(checks: &[CheckRun]) {
    if checks.is_empty() {
        outln!("no checks have run");
        return;
    }
    let subject = checks.iter().map(|c| c.subject.len()).max().unwrap_or(7).max(7);
    let name = checks.iter().map(|c| c.name.len()).max().unwrap_or(5).max(5);
    outln!(
        "{:10}  {:8}  {:subject$}  {:name$}  {:10}  {:9}  outcome",
        "id",
        "repo",
        "subject",
        "check",
        "commit",
        "state"
    );
    for c in checks {
        let secs = c.duration_ms as f64 / 1000.0;
        outln!(
            "{:10}  {:8}  {:subject$}  {:name$}  {:10}  {:9}  {} ({secs:.1} s)",
            c.id,
            c.repo,
            c.subject,
            c.name,
            short(&c.commit),
            c.state.as_str(),
            c.outcome
        );
    }
}
