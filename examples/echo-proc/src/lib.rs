//! The example runtime-aware proc: [`Echo`] and its proc live in the agent
//! crate (`hostmesh_agent::echo`), so every host pod can run it as
//! `/hostmesh/bin/hostmesh echo-proc`; this crate keeps the standalone
//! binary `hostmesh-echo-proc` and its test.

pub use hostmesh_agent::echo::{Echo, Exit, Fail, echo_type_name, run};
