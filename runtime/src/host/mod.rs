//! The host agent (`hostmesh agent`): one per host pod, the source of truth
//! for the processes on its host. It spawns procs from specs with the proc
//! environment contract, supervises them (status, stderr tail, no orphans),
//! forwards their output with a rank prefix, serves health checks, and
//! reports every state change to its subscribers. docs/agent.md describes
//! configuration, protocol and environment.
//!
//! Module map:
//! - `config`: flags and environment, validated at start-up.
//! - `protocol`: the messages and the status types.
//! - `env`: the proc environment contract.
//! - `spawn`: forking with a process group and a parent-death signal.
//! - `lifecycle`: one proc incarnation from spawn to final status.
//! - `manager`: the proc table and the requests on it.
//! - `logs`: output forwarding and stderr tails.
//! - `health`: `/healthz`, `/readyz`.
//! - `agent`: the process itself (`run_agent`).

mod agent;
mod config;
mod env;
mod error;
mod health;
mod lifecycle;
mod logs;
mod manager;
pub mod protocol;
mod spawn;

pub use agent::{Agent, Secret, run_agent};
pub use config::{AgentArgs, AgentConfig, Limits, parse_duration, read_secret};
pub use env::{AgentIdentity, DEFAULT_MASTER_PORT, coordinates};
pub use error::HostError;
pub use health::Readiness;
pub use logs::{LogHub, MAX_LINE};
pub use manager::{ProcManager, digest};
