//! The operator console: one web page to watch the tree live and decide what waits.
//!
//! Served by the daemon process on loopback (`[web]`), it is an API client like the CLI:
//! every page is read, and every action taken, by an API call carrying the token of the
//! operator who logged in, so the daemon's authorization is the console's. It holds no store
//! access and decides nothing about who may do what. It does not start browsers (the CLI's
//! `canopy web` does) and knows no harness or runner.
//!
//! - `auth.rs`: one-time login links, browser sessions (kept in `web/sessions.json`), CSRF.
//! - `console.rs`: what every handler shares: the `Console`, the logged-in session, `call`.
//! - `server.rs`: binding (its port kept in `web/port`), routes, actions; `listener.rs`: the
//!   connections, plain on loopback or TLS; `tls.rs`: certificates (`canopy web --init-tls`).
//! - `pages.rs`: the pages, rendered on the server with compile-checked `maud` templates;
//!   `charts.rs`: the pictures in them (the tree, spend over time, a timeline), as SVG;
//!   `issue_pages.rs`: the Issues board and an issue's page, on `pages.rs`'s helpers.
//! - `live.rs`: server-sent events from the daemon's event subjects, resumable by cursor.
//! - `link.rs`: the client side of `canopy web`: asks a running console for a login link.

mod auth;
mod charts;
mod console;
mod issue_pages;
mod link;
mod listener;
mod live;
mod pages;
mod server;
pub mod tls;

pub use console::AuditHook;
pub use link::{LinkError, request_link};
pub use server::start;

/// The cookie that carries a browser session's id (never a token).
pub const SESSION_COOKIE: &str = "canopy_session";
/// The header that carries a page's CSRF token on every state-changing request.
pub const CSRF_HEADER: &str = "x-canopy-csrf";
