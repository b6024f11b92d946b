//! Canopy's wire contract: every request, reply and event that crosses NATS.
//!
//! Owns the method table (`methods`: every API method declared once), the subject map
//! (`subject`), what each NATS login may do (`access`), the JSON shapes (`api`), the reply envelope and error shape (`reply`), and the
//! JSON Schemas checked in under `proto/schemas/`. Nothing else in
//! the workspace builds a subject string or decides a JSON field name. Does no IO.

pub mod access;
pub mod api;
pub mod methods;
pub mod reply;
pub mod schema;
pub mod subject;

pub use access::{Party, Permissions};
pub use methods::{Access, ApiMethod, Tool};
pub use reply::{Reply, WireError, decode_request};
pub use subject::{Method, Subjects, TOKEN_HEADER, method};
