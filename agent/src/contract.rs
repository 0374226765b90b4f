//! The contract between the operator's host-pod builder and the agent it
//! injects: the environment variables the pod sets and the agent reads, its
//! ports, the secret's variable, and where the agent binary is installed. Both
//! sides use these constants, so the contract is typed once
//! (docs/architecture.md, "Host pods").

/// Environment variables the operator sets on the host container and the
/// agent reads (each also a `--flag`, see `AgentArgs`).
pub mod env {
    /// The World's name.
    pub const WORLD: &str = "HOSTMESH_WORLD";
    /// The World's namespace.
    pub const NAMESPACE: &str = "HOSTMESH_NAMESPACE";
    /// This host's rank in the World.
    pub const HOST_RANK: &str = "HOSTMESH_HOST_RANK";
    /// The pod's IP (downward API `status.podIP`): the address to listen on.
    pub const POD_IP: &str = "HOSTMESH_POD_IP";
    /// The agent protocol port (the World's `spec.port`).
    pub const PORT: &str = "HOSTMESH_PORT";
    /// The plain-HTTP health port.
    pub const HEALTH_PORT: &str = "HOSTMESH_HEALTH_PORT";
    /// A full `ip:port` that overrides pod IP and port.
    pub const LISTEN: &str = "HOSTMESH_LISTEN";
    /// The file holding the World's shared secret (agents run by hand and
    /// tests; host pods set [`SECRET`] instead).
    pub const SECRET_FILE: &str = "HOSTMESH_SECRET_FILE";
    /// The World's shared secret itself, from the World's Secret through
    /// `secretKeyRef`: the agent takes it out of its environment at start,
    /// so its procs never inherit it (`keys.rs`). Wins over the file.
    pub const SECRET: &str = "HOSTMESH_SECRET";
    /// An address the agent dials to push to a supervisor.
    pub const SUPERVISOR: &str = "HOSTMESH_SUPERVISOR";
    /// The interval of heartbeats to subscribers.
    pub const HEARTBEAT_INTERVAL: &str = "HOSTMESH_HEARTBEAT_INTERVAL";
    /// The Monarch worker's command line as a JSON array of strings; when
    /// set, the agent runs it at start-up as the supervised proc
    /// [`MONARCH_WORKER_PROC`](super::MONARCH_WORKER_PROC).
    pub const MONARCH_COMMAND: &str = "HOSTMESH_MONARCH_COMMAND";
    /// The port the Monarch worker listens on: the host is ready only once
    /// something listens there.
    pub const MONARCH_PORT: &str = "HOSTMESH_MONARCH_PORT";
    /// This host's rank epoch (docs/architecture.md, "Rank epochs and
    /// fencing").
    pub const EPOCH: &str = "HOSTMESH_EPOCH";
    /// How long the agent runs procs without hearing the operator before
    /// it fences itself (the World's `healthTimeout + evictionTimeout`).
    pub const FENCE_TIMEOUT: &str = "HOSTMESH_FENCE_TIMEOUT";
    /// Grace between TERM and KILL when the agent fences its procs.
    pub const FENCE_GRACE: &str = "HOSTMESH_FENCE_GRACE";
    /// The prefix of every variable the operator owns on the host container
    /// (a user's variable with it is replaced).
    pub const PREFIX: &str = "HOSTMESH_";
}

/// Grace between TERM and KILL when a fenced agent stops its procs: the
/// operator counts on every old proc being gone this long after the fence
/// timeout.
pub const FENCE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
/// The agent protocol port when the World does not set `spec.port`.
pub const AGENT_PORT: u16 = 26602;
/// The agent's plain-HTTP health port (`/healthz`, `/readyz`).
pub const HEALTH_PORT: u16 = 26601;
/// Name of the Monarch worker's proc on its agent (no `.`, so it never
/// parses as a ProcMesh proc name `<mesh id>.<rank>`).
pub const MONARCH_WORKER_PROC: &str = "monarch-worker";
/// The readiness path the host container's probe asks.
pub const READYZ: &str = "/readyz";
/// Where the World's agent Secret is mounted.
pub const SECRET_DIR: &str = "/var/run/hostmesh/secret";
/// The Secret's key holding the token (a file of that name in `SECRET_DIR`).
pub const SECRET_KEY: &str = "token";
/// The agent secret file: `SECRET_DIR/SECRET_KEY`.
pub const SECRET_FILE: &str = "/var/run/hostmesh/secret/token";
/// Where the init container installs the agent binary.
pub const BIN_DIR: &str = "/hostmesh/bin";
/// The agent binary: `BIN_DIR/hostmesh`.
pub const BIN_PATH: &str = "/hostmesh/bin/hostmesh";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_compose() {
        assert_eq!(SECRET_FILE, format!("{SECRET_DIR}/{SECRET_KEY}"));
        assert_eq!(BIN_PATH, format!("{BIN_DIR}/hostmesh"));
        for name in [
            env::WORLD,
            env::PORT,
            env::SECRET_FILE,
            env::SECRET,
            env::EPOCH,
            env::FENCE_TIMEOUT,
        ] {
            assert!(name.starts_with(env::PREFIX));
        }
    }
}
