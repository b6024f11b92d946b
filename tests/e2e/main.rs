//! Canopy's end-to-end tests: one binary, a real `nats-server` per test, real SQLite files,
//! and the real `canopy` binary (built by this package as `canopy-under-test`).
//!
//! Owns the scenarios; the harness that starts and stops things is `env`.

#![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

mod copy_dir;
mod env;
mod fake_anthropic;
mod fake_http;
mod fake_openai;
mod harness_bins;
mod webdriver;

mod authz;
mod budgets;
#[path = "../chaos/mod.rs"]
mod chaos;
mod claude;
mod cli;
mod codex;
mod confinement;
mod console;
mod continuity;
mod crash;
mod delivery;
mod demo;
mod egress;
mod errors;
mod fuzz;
mod gate;
mod governance;
mod interrupt;
mod issues;
mod issues_cli;
mod lanes;
mod lifecycle;
mod omp;
mod operator;
mod output;
mod pi;
mod pictures;
mod prompts;
mod queue;
mod real_clients;
mod reliability;
mod remote;
mod repos;
mod sessions;
mod tail;
mod tidy;
mod tls;
mod top;
mod wire;
