//! The host agent (`hostmesh agent`): one per host pod, the source of truth
//! for the processes on its host. It spawns procs from specs with the proc
//! environment contract, supervises them (status, stderr tail, no orphans),
//! forwards their output with a rank prefix, serves health checks, and
//! reports every state change to its subscribers. docs/agent.md describes
//! configuration, protocol and environment.
//!
//! Module map:
//! - `config`: flags and environment, validated at start-up.
//! - `contract`: what the operator's pod builder and the agent share.
//! - `protocol`: the messages and the status types.
//! - `env`: the proc environment contract.
//! - `spawn`: starting (see `clone`), signalling and reaping proc processes.
//! - `clone`: the `clone(CLONE_VM|CLONE_VFORK)` + `execve` spawn itself.
//! - `descendants`: the agent as its procs' subreaper; a proc's
//!   descendants (setsid daemons included) go with it.
//! - `fence`: rank epochs and self-fencing.
//! - `lifecycle`: one proc incarnation from spawn to final status.
//! - `manager`: the proc table and the requests on it.
//! - `logs`: output forwarding and stderr tails.
//! - `stall`: progress signals and stall detection per proc.
//! - `stacks`: stack capture (py-spy, else the kernel's view).
//! - `subscription`: snapshot, changes and heartbeats for one subscriber.
//! - `health`: `/healthz`, `/readyz`.
//! - `monarch`: the host's Monarch worker (`spec.monarch` of a World).
//! - `listen`: whether something listens on a port (the socket tables).
//! - `server`: the `HostAgent` actor serving the agent protocol.
//! - `client`: `AgentClient`, the supervisor side.
//! - `supervisor`: the agent dialing its supervisor (`--supervisor`).
//! - `proc_agent`: the proc side of runtime-aware procs (`join_host`, `mesh`).
//! - `agent`: the process itself (`run_agent`, `run_blocking`).
//! - `install`: `install-agent`, the agent binary into a host pod's volume.
//! - `malloc`: allocator settings of the long-running hostmesh processes.

mod agent;
mod client;
mod clone;
mod config;
pub mod contract;
mod descendants;
mod desk;
pub mod echo;
mod env;
mod error;
mod fence;
mod health;
pub mod install;
pub mod keys;
mod lifecycle;
mod listen;
mod logs;
pub mod malloc;
mod manager;
mod monarch;
mod oom;
mod proc_agent;
pub mod protocol;
mod server;
mod spawn;
mod stacks;
mod stall;
mod subscription;
mod supervisor;

pub use agent::{Agent, Secret, run_agent, run_blocking};
pub use client::{
    AgentClient, AgentEvent, AgentEventKind, ClientConfig, ClientError, HostId, SUPERVISOR_ACTOR,
    SupervisorInbox, agent_ref,
};
pub use config::{
    AgentArgs, AgentConfig, DEFAULT_WORKER_THREADS, Limits, parse_duration, read_secret, secret_key,
};
pub use descendants::become_subreaper;
pub use desk::{ProcDesk, desk_ref};
pub use env::{
    AgentIdentity, DEFAULT_MASTER_PORT, PROC_CREDENTIAL_VAR, PROGRESS_FILE_VAR, coordinates,
};
pub use error::HostError;
pub use fence::{
    EpochVerdict, Fence, FencePolicy, RANK_EPOCH_ENV, RANK_EPOCHS_ENV, judge, proc_epochs,
};
pub use health::Readiness;
pub use logs::{LogHub, MAX_LINE, MAX_QUEUE_BYTES};
pub use manager::{DigestEntry, ProcManager, digest, digest_entries};
pub use monarch::MonarchWorker;
pub use proc_agent::{
    ActorState, GetActorState, JoinedProc, Keepalive, MESH_ACTOR, MeshAgent, SpawnFor, join_host,
    mesh_ref,
};
pub use server::{AGENT_PROC_NAME, HOST_AGENT_ACTOR, HostAgent, MAX_SUBSCRIBERS};
pub use stacks::{MAX_PROCESSES, MAX_STACK_BYTES, MAX_THREADS, PY_SPY_TIMEOUT};
pub use subscription::Subscription;
