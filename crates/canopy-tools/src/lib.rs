//! Canopy's native tools, served over MCP with rmcp.
//!
//! A tool call is a daemon API call made with the calling session's bearer token, so the
//! daemon, not this crate, decides who the caller is and what it may do: no argument can
//! name a different caller. Refusals come back as MCP tool errors carrying the daemon's
//! typed code, message and field, never as protocol failures. `http` serves the tools as
//! streamable HTTP on loopback (the runner's endpoint, refusing unknown tokens before MCP
//! sees the request); stdio-only harnesses reach the same endpoint through `canopy mcp
//! --stdio`, a bridge that holds no NATS credential. `probe` serves an endpoint with no tools on the same HTTP front, for `canopy
//! doctor`'s session start check. Does not know sessions or harnesses.

mod bearer;
mod catalog;
mod direct;
pub mod http;
pub mod probe;
mod server;

pub use catalog::{TOOL_NAMES, tool_names};
pub use server::{CanopyTools, TokenSource};
