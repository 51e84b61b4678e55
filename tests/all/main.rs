//! One integration-test binary (one link of the crate, not one per file): end-to-end tests
//! of `sup` against fake model servers on loopback and real MCP servers, plus in-process
//! tests of the loops. Each file beside this one is a module; `common` holds the helpers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod approval;
mod attack;
mod config;
mod console_health;
mod daemon;
mod decisions;
mod exam;
mod fleet;
mod fleet_history;
mod inprocess;
mod jail;
mod judge;
mod long_runs;
mod mcp;
mod mcp_http;
mod network;
mod newuser;
pub(crate) mod otel;
mod perf;
mod providers;
mod reliability;
mod rules;
mod sandbox;
mod schedule;
mod unattended;
mod verify_loop;
mod watch;
mod web;
mod webhook;
mod wire_replay;
mod work_loop;
mod worktree;
