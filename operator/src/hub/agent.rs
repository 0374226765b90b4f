//! What the hub needs from host agents, as a small trait: dial an agent
//! with the World's secret, send it requests, receive its pushes. The real
//! implementation wraps the runtime's agent client; tests and benchmarks use
//! in-memory agents.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use hostmesh_crds::procmesh::ProcState;
use tokio::sync::mpsc;

/// A World, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorldKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// One host agent of a World.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostKey {
    /// Its World.
    pub world: WorldKey,
    /// Host rank.
    pub rank: u64,
}

/// Where to dial an agent and how to authenticate.
#[derive(Clone)]
pub struct AgentTarget {
    /// The host.
    pub host: HostKey,
    /// UID of the pod the agent runs in (a replaced pod is a new agent).
    pub pod_uid: String,
    /// Agent address (pod IP and World port).
    pub addr: SocketAddr,
    /// The World's secret.
    pub secret: Arc<[u8]>,
}

impl std::fmt::Debug for AgentTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret stays out of logs.
        f.debug_struct("AgentTarget")
            .field("host", &self.host)
            .field("pod_uid", &self.pod_uid)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// What a proc runs (the operator's half of `CreateOrUpdate`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcSpec {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Environment (the rank contract included).
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub working_dir: Option<String>,
    /// Bumped to restart the proc in place (a changed spec replaces it).
    pub incarnation: u32,
}

/// One proc to create on one host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcRequest {
    /// ProcMesh name.
    pub proc_mesh: String,
    /// Rank within the host.
    pub local_rank: u64,
    /// Global rank in the ProcMesh.
    pub rank: u64,
    /// What to run.
    pub spec: ProcSpec,
}

/// A proc's state as an agent reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcObs {
    /// State.
    pub state: ProcState,
    /// Exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Signal, when killed.
    pub signal: Option<i32>,
    /// Reason, when given.
    pub reason: Option<String>,
    /// Last bytes of stderr.
    pub stderr_tail: Option<String>,
    /// Incarnation of the spec this state belongs to.
    pub incarnation: u32,
}

/// What agents push to the hub.
#[derive(Clone, Debug)]
pub enum AgentPush {
    /// Periodic heartbeat.
    Heartbeat {
        /// From.
        host: HostKey,
        /// Pod UID of the agent.
        pod_uid: String,
    },
    /// A proc changed state.
    ProcState {
        /// From.
        host: HostKey,
        /// ProcMesh name.
        proc_mesh: String,
        /// Local rank.
        local_rank: u64,
        /// New state.
        obs: ProcObs,
    },
    /// Every proc the agent has, sent when (re)subscribing.
    Snapshot {
        /// From.
        host: HostKey,
        /// Pod UID of the agent.
        pod_uid: String,
        /// `(proc mesh, local rank, state)`.
        procs: Vec<(String, u64, ProcObs)>,
    },
    /// The connection dropped.
    Disconnected {
        /// From.
        host: HostKey,
    },
}

/// A connected agent.
pub trait AgentLink: Send + Sync {
    /// Creates or updates a proc (idempotent; a changed spec restarts it).
    fn create_or_update(&self, req: ProcRequest) -> BoxFuture<'_, Result<(), String>>;
    /// Stops every proc of `proc_mesh` on this host, SIGKILL after `grace`.
    fn stop(&self, proc_mesh: String, grace: Duration) -> BoxFuture<'_, Result<(), String>>;
    /// Sends the World's address book (host rank to agent address).
    fn set_address_book(&self, hosts: Vec<(u64, SocketAddr)>) -> BoxFuture<'_, Result<(), String>>;
}

/// Dials agents.
pub trait AgentConnector: Send + Sync + 'static {
    /// Dials `target`, authenticates with its secret and subscribes; the
    /// agent's pushes go to `pushes` (a Snapshot first).
    fn connect(
        &self,
        target: AgentTarget,
        pushes: mpsc::Sender<AgentPush>,
    ) -> BoxFuture<'static, Result<Arc<dyn AgentLink>, String>>;
}
