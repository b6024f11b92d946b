//! Canopy's NATS layer: the connection, request/reply, subscriptions, and the managed
//! `nats-server` child process.
//!
//! The only crate that links async-nats. It knows nothing of subjects or payload shapes
//! (those are `canopy-proto`'s): it moves bytes, carries the caller token header, and
//! reports connection changes so callers can resync from their cursors after a reconnect,
//! because core NATS is at-most-once.

pub mod api;
mod client;
mod server;

pub use api::{ApiClient, CallError};
pub use client::{Bus, BusError, ConnectionEvent, Incoming, Login, ReadLogin, Received, refused_login};
pub use server::{ManagedNats, NatsServerConfig, NatsUser, find_nats_server, render_authorization};
