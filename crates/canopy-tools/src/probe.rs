//! A stand-in MCP endpoint with no tools, for `canopy doctor`.
//!
//! Codex reports a session ready only once every MCP server in its thread is `ready`, and
//! Canopy's tools cannot list themselves without a daemon (`tools/list` asks it which tools
//! the session's role has). So doctor serves this instead: the same loopback HTTP front and
//! rmcp streamable-HTTP transport as a runner's endpoint, the same bearer check, and an empty
//! tool list. It proves the harness reaches and handshakes with an endpoint like Canopy's; it
//! does not prove anything about the tools themselves, and it never talks to a daemon.

use std::sync::Arc;

use rmcp::ServerHandler;
use rmcp::model::{ServerCapabilities, ServerConfig};

use crate::http::{HttpEndpoint, serve_handler};

/// An MCP server that offers no tools.
#[derive(Debug, Clone, Default)]
pub struct NoTools;

impl ServerHandler for NoTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_instructions("canopy doctor: a stand-in for Canopy's tools, with none.")
    }
}

/// Serves `NoTools` on a free loopback port, admitting only `token`. Stops when dropped.
pub async fn serve_probe(token: String) -> std::io::Result<HttpEndpoint> {
    serve_handler(NoTools, None, Arc::new(move |presented: &str| presented == token)).await
}
