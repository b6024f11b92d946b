//! JSON Schemas for every request, response and event, as checked in under `proto/schemas/`.
//!
//! Owns the list of (file name, schema) pairs. The drift test compares it with the files;
//! `CANOPY_BLESS=1 cargo test -p canopy-proto` rewrites them.

use schemars::{JsonSchema, schema_for};
use serde_json::Value;

use crate::api::*;
use crate::reply::{Reply, WireError};
use crate::subject::Method;

fn pair<Req: JsonSchema, Resp: JsonSchema>(method: Method) -> [(String, Value); 2] {
    [
        (format!("{}.request.json", method.as_str()), schema_for!(Req).to_value()),
        (format!("{}.reply.json", method.as_str()), schema_for!(Reply<Resp>).to_value()),
    ]
}

/// The request and reply schemas of every method in the table.
macro_rules! method_schemas {
    ($(($variant:ident, $area:ident . $handler:ident, $name:literal, $req:ty => $resp:ty, $access:ident, $who:literal, $what:literal, $tool:expr)),* $(,)?) => {
        fn method_schemas() -> Vec<(String, Value)> {
            let mut out = Vec::new();
            $(out.extend(pair::<$req, $resp>(Method::$variant));)*
            out
        }
    };
}
crate::api_methods!(method_schemas);

/// The argument names of a request type: its schema's top-level properties.
fn properties<T: schemars::JsonSchema>() -> Vec<String> {
    let schema = schema_for!(T).to_value();
    schema.get("properties").and_then(|p| p.as_object()).map(|p| p.keys().cloned().collect()).unwrap_or_default()
}

/// Each native tool's argument names, from its request type.
macro_rules! tool_arguments {
    ($(($variant:ident, $area:ident . $handler:ident, $name:literal, $req:ty => $resp:ty, $access:ident, $who:literal, $what:literal, $tool:expr)),* $(,)?) => {
        /// Each native tool's argument names (its request type's fields), by tool name.
        pub fn tool_arguments() -> std::collections::BTreeMap<&'static str, Vec<String>> {
            let mut out = std::collections::BTreeMap::new();
            $(if let Some(tool) = Method::$variant.tool() {
                out.insert(tool.name, properties::<$req>());
            })*
            out
        }
    };
}
crate::api_methods!(tool_arguments);

/// Every schema, keyed by its file name under `proto/schemas/`.
pub fn all() -> Vec<(String, Value)> {
    let mut out = method_schemas();
    out.push(("event.message.json".to_owned(), schema_for!(MessageEvent).to_value()));
    out.push(("event.activity.json".to_owned(), schema_for!(ActivityEvent).to_value()));
    out.push(("event.issue.json".to_owned(), schema_for!(IssueChanged).to_value()));
    out.push(("runner.deliver.json".to_owned(), schema_for!(DeliverDoorbell).to_value()));
    out.push(("runner.steer.request.json".to_owned(), schema_for!(SteerRequest).to_value()));
    out.push(("runner.steer.reply.json".to_owned(), schema_for!(SteerReply).to_value()));
    out.push(("runner.interrupt.request.json".to_owned(), schema_for!(InterruptRequest).to_value()));
    out.push(("runner.interrupt.reply.json".to_owned(), schema_for!(InterruptReply).to_value()));
    out.push(("runner.git.request.json".to_owned(), schema_for!(RunnerGitRequest).to_value()));
    out.push(("runner.git.reply.json".to_owned(), schema_for!(RunnerGitReply).to_value()));
    out.push(("error.json".to_owned(), schema_for!(WireError).to_value()));
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    #[test]
    fn checked_in_schemas_match_the_code() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto/schemas");
        let bless = std::env::var_os("CANOPY_BLESS").is_some();
        let schemas = super::all();
        let mut stale = Vec::new();
        for (name, schema) in &schemas {
            let text = serde_json::to_string_pretty(schema).unwrap_or_default() + "\n";
            let path = dir.join(name);
            if bless {
                std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
                std::fs::write(&path, &text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            } else if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                stale.push(name.clone());
            }
        }
        let on_disk: Vec<String> = std::fs::read_dir(&dir)
            .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let extra: Vec<&String> = on_disk.iter().filter(|f| !schemas.iter().any(|(n, _)| n == *f)).collect();
        assert!(
            stale.is_empty() && (bless || extra.is_empty()),
            "proto/schemas drifted from the code (stale: {stale:?}, not generated: {extra:?}); \
             rerun with CANOPY_BLESS=1 cargo test -p canopy-proto and commit the result"
        );
    }
}
