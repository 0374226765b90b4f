//! The `hostmesh` command line: the only crate that puts the operator, the
//! host agent and the embedded cluster together. `main.rs` parses the
//! subcommands; this library holds the user-facing ones so tests and
//! benchmarks drive them too.
//!
//! Module map: [`up`] (`hostmesh up`: a manifest on an embedded cluster),
//! [`devenv`] (the embedded API server, process kubelet, workload
//! controllers and operator in one process), [`manifest`] (parsing and
//! applying user manifests), [`status`] (`hostmesh status`), [`stacks`]
//! (`hostmesh stacks`: the stacks a stall captured), [`reaper`] (what `up`
//! leaves on disk, and its clean-up after a kill -9).

pub mod devenv;
pub mod manifest;
pub mod reaper;
pub mod stacks;
pub mod status;
pub mod up;
