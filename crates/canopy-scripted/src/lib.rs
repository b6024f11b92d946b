//! The scripted harness: a deterministic stand-in for an LLM coding agent in tests and demos.
//!
//! It speaks a JSON-lines protocol over stdio (`protocol`), follows a TOML script of rules
//! (`script`), and calls Canopy's native tools over MCP streamable HTTP (`mcp`), exactly as a
//! real harness would. `run` ties them together for the `canopy-scripted` binary. This crate
//! does not host sessions or serve tools: that is the daemon's side.

pub mod mcp;
pub mod protocol;
pub mod run;
pub mod script;
