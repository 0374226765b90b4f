//! Simulated agents for tests and benchmarks: an in-memory connector whose
//! agents record every request and answer `CreateOrUpdate` by pushing a
//! Running state, as a real agent would after spawning.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use hostmesh_crds::procmesh::ProcState;
use tokio::sync::mpsc;

use super::agent::{
    AgentConnector, AgentLink, AgentPush, AgentTarget, HostKey, ProcObs, ProcRequest,
};

/// A request a simulated agent received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimRequest {
    /// CreateOrUpdate.
    Create(ProcRequest),
    /// Stop.
    Stop(String),
    /// SetAddressBook.
    Book(Vec<(u64, SocketAddr)>),
}

/// Procs an agent runs: `(proc mesh, local rank, state)`.
pub type SimProcs = Vec<(String, u64, ProcObs)>;

/// Connector to simulated agents.
#[derive(Default)]
pub struct SimConnector {
    /// Requests per host, in arrival order.
    pub requests: Mutex<HashMap<HostKey, Vec<SimRequest>>>,
    /// Addresses that refuse connections.
    pub refuse: Mutex<Vec<SocketAddr>>,
    /// Procs each agent already runs (for the Snapshot), by host.
    pub running: Mutex<HashMap<HostKey, SimProcs>>,
}

impl SimConnector {
    /// Requests received by `host`.
    pub fn requests_of(&self, host: &HostKey) -> Vec<SimRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(host)
            .cloned()
            .unwrap_or_default()
    }
}

struct SimLink {
    connector: Arc<SimConnector>,
    host: HostKey,
    pushes: mpsc::Sender<AgentPush>,
}

impl SimLink {
    fn record(&self, r: SimRequest) {
        self.connector
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(self.host.clone())
            .or_default()
            .push(r);
    }
}

impl AgentLink for SimLink {
    fn create_or_update(&self, req: ProcRequest) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            self.record(SimRequest::Create(req.clone()));
            let obs = ProcObs {
                state: ProcState::Running,
                exit_code: None,
                signal: None,
                reason: None,
                stderr_tail: None,
                incarnation: req.spec.incarnation,
            };
            self.connector
                .running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(self.host.clone())
                .or_default()
                .push((req.proc_mesh.clone(), req.local_rank, obs.clone()));
            let push = AgentPush::ProcState {
                host: self.host.clone(),
                proc_mesh: req.proc_mesh,
                local_rank: req.local_rank,
                obs,
            };
            self.pushes
                .send(push)
                .await
                .map_err(|_| "hub gone".to_string())
        })
    }

    fn stop(&self, proc_mesh: String, _grace: Duration) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            self.record(SimRequest::Stop(proc_mesh.clone()));
            if let Some(procs) = self
                .connector
                .running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(&self.host)
            {
                procs.retain(|(m, _, _)| *m != proc_mesh);
            }
            Ok(())
        })
    }

    fn set_address_book(&self, hosts: Vec<(u64, SocketAddr)>) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            self.record(SimRequest::Book(hosts));
            Ok(())
        })
    }
}

/// The connector as the hub takes it.
pub fn connector(sim: &Arc<SimConnector>) -> Arc<dyn AgentConnector> {
    Arc::new(SimHandle(sim.clone()))
}

struct SimHandle(Arc<SimConnector>);

impl AgentConnector for SimHandle {
    fn connect(
        &self,
        target: AgentTarget,
        pushes: mpsc::Sender<AgentPush>,
    ) -> BoxFuture<'static, Result<Arc<dyn AgentLink>, String>> {
        let sim = self.0.clone();
        Box::pin(async move {
            if sim
                .refuse
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&target.addr)
            {
                return Err(format!("connection refused by {}", target.addr));
            }
            let procs = sim
                .running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&target.host)
                .cloned()
                .unwrap_or_default();
            let snap = AgentPush::Snapshot {
                host: target.host.clone(),
                pod_uid: target.pod_uid.clone(),
                procs,
            };
            pushes
                .send(snap)
                .await
                .map_err(|_| "hub gone".to_string())?;
            let link: Arc<dyn AgentLink> = Arc::new(SimLink {
                connector: sim,
                host: target.host,
                pushes,
            });
            Ok(link)
        })
    }
}
