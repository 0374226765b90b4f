//! `hostmesh-echo-proc`: the example runtime-aware proc (see
//! `hostmesh_agent::echo`). Logs go to stderr; it prints nothing on stdout.

fn main() -> Result<(), hostmesh_agent::HostError> {
    hostmesh_agent::echo::run_blocking()
}
