//! A client of a runtime-aware ProcMesh's procs: it waits until the mesh
//! runs, reads what the operator publishes for clients (the addresses in
//! ConfigMap `<procmesh>-runtime` and the runtime key in the Secret it
//! names), joins the World's runtime with that key (never the agents'), and
//! spawns actor meshes of a registered type on every rank, which the
//! runtime's [`ActorMesh`] slices, casts to and gathers from. Its actors
//! live while the client sends keepalives; the client's [`MeshEvent`]s say
//! when an actor failed or a proc ended.
//!
//! Invariants:
//! 1. The client authenticates with the runtime key only: it can drive
//!    actors on the procs and nothing on the agents.
//! 2. [`MeshClient::connect`] returns once the ProcMesh is `Running` and
//!    every rank is listed with an address, or fails naming what it
//!    waited for.
//! 3. Every actor the client spawns names it as its controlling client:
//!    keepalives go to every rank at a third of the keepalive bound until
//!    the client is dropped, after which the procs stop its actors.
//! 4. Each proc end (a rank that left `Running` in the ProcMesh's status,
//!    with its exit code, signal or reason) is one [`MeshEvent::ProcEnded`]
//!    per rank and incarnation; each failed actor one
//!    [`MeshEvent::ActorFailed`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::future::join_all;
use hostmesh_agent::{Keepalive, SpawnFor, mesh_ref};
use hostmesh_crds::ProcMesh;
use hostmesh_crds::procmesh::{ProcMeshPhase, ProcState};
use hostmesh_mesh::{Extent, Rank, Region};
use hostmesh_runtime::actor_mesh::ActorMesh;
use hostmesh_runtime::{
    ActorId, ActorStatus, ChannelAddr, Proc, ProcId, RemoteSpawn, SupervisionEvent,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use tokio::sync::mpsc;

/// What a client can fail with; each names what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum MeshClientError {
    /// A Kubernetes read failed.
    #[error("reading {what}: {source}")]
    Kube {
        /// What was read.
        what: String,
        /// The API's error.
        #[source]
        source: kube::Error,
    },
    /// The ProcMesh or what it publishes is not (yet) usable.
    #[error("ProcMesh {namespace}/{name}: {reason}")]
    Mesh {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The runtime refused or failed an operation.
    #[error("runtime: {0}")]
    Runtime(String),
}

/// How a client connects and keeps its actors.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// How long [`MeshClient::connect`] waits for the mesh to run.
    pub ready_timeout: Duration,
    /// How long a rank keeps this client's actors without a keepalive.
    pub keepalive: Duration,
    /// How often the ProcMesh's status is read for proc ends.
    pub status_poll: Duration,
    /// Timeout of each spawn call.
    pub call_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            ready_timeout: Duration::from_secs(300),
            keepalive: Duration::from_secs(30),
            status_poll: Duration::from_millis(250),
            call_timeout: Duration::from_secs(30),
        }
    }
}

/// What happened to the client's actors (invariant 4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MeshEvent {
    /// An actor the client spawned failed; its proc runs on.
    ActorFailed {
        /// The actor.
        actor: ActorId,
        /// Why, as the actor's proc reported it.
        reason: String,
    },
    /// A rank's proc ended, and with it every actor it hosted.
    ProcEnded {
        /// The rank.
        rank: Rank,
        /// Its state in the ProcMesh's status (`Failed`, `Killed`, `Lost`,
        /// ...).
        state: ProcState,
        /// Its exit code, when it exited.
        exit_code: Option<i32>,
        /// The signal that killed it, when one did.
        signal: Option<i32>,
        /// The reason status gives.
        reason: Option<String>,
    },
}

/// A connected client of one ProcMesh (invariants 1-3).
pub struct MeshClient {
    proc: Proc,
    id: String,
    region: Region,
    procs: Vec<ProcId>,
    options: ClientOptions,
    events: tokio::sync::Mutex<mpsc::Receiver<MeshEvent>>,
    tx: mpsc::Sender<MeshEvent>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for MeshClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshClient")
            .field("id", &self.id)
            .field("ranks", &self.procs.len())
            .finish_non_exhaustive()
    }
}

impl Drop for MeshClient {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.proc.shutdown();
    }
}

/// What the operator publishes for a runtime-aware mesh.
struct Published {
    extent: Extent,
    /// Rank to (address, proc name).
    addresses: BTreeMap<Rank, (String, String)>,
    credentials: String,
}

fn parse_published(cm: &ConfigMap) -> Option<Published> {
    let data = cm.data.as_ref()?;
    let extent: Extent = data.get("extent")?.parse().ok()?;
    let addresses = data
        .get("addresses")?
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let rank = f.next()?.parse().ok()?;
            Some((rank, (f.next()?.to_string(), f.next()?.to_string())))
        })
        .collect();
    Some(Published {
        extent,
        addresses,
        credentials: data.get("credentials")?.clone(),
    })
}

impl MeshClient {
    /// Connects to ProcMesh `namespace/name` (invariant 2).
    pub async fn connect(
        kube: kube::Client,
        namespace: &str,
        name: &str,
        options: ClientOptions,
    ) -> Result<MeshClient, MeshClientError> {
        let mesh_err = |reason: String| MeshClientError::Mesh {
            namespace: namespace.into(),
            name: name.into(),
            reason,
        };
        let meshes: Api<ProcMesh> = Api::namespaced(kube.clone(), namespace);
        let cms: Api<ConfigMap> = Api::namespaced(kube.clone(), namespace);
        let cm_name = format!("{name}-runtime");
        let deadline = tokio::time::Instant::now() + options.ready_timeout;
        let published = loop {
            let pm = meshes
                .get_opt(name)
                .await
                .map_err(|source| MeshClientError::Kube {
                    what: format!("ProcMesh {namespace}/{name}"),
                    source,
                })?;
            let Some(pm) = pm else {
                return Err(mesh_err("no such ProcMesh".into()));
            };
            if !pm.spec.runtime_aware {
                return Err(mesh_err(
                    "not runtime-aware (spec.runtimeAware: false): its procs run no actors".into(),
                ));
            }
            let phase = pm.status.as_ref().and_then(|s| s.phase);
            let running = phase == Some(ProcMeshPhase::Running);
            let cm = cms
                .get_opt(&cm_name)
                .await
                .map_err(|source| MeshClientError::Kube {
                    what: format!("ConfigMap {namespace}/{cm_name}"),
                    source,
                })?;
            let published = cm.as_ref().and_then(parse_published);
            let complete = published
                .as_ref()
                .is_some_and(|p| p.addresses.len() == p.extent.num_ranks());
            if let (true, true, Some(p)) = (running, complete, published) {
                break p;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(mesh_err(format!(
                    "not Running with every rank's address in ConfigMap {cm_name} within {:?} (phase {phase:?})",
                    options.ready_timeout
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let secrets: Api<Secret> = Api::namespaced(kube.clone(), namespace);
        let secret = secrets
            .get(&published.credentials)
            .await
            .map_err(|source| MeshClientError::Kube {
                what: format!("Secret {namespace}/{}", published.credentials),
                source,
            })?;
        let hex = secret
            .data
            .as_ref()
            .and_then(|d| d.get("key"))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .ok_or_else(|| {
                mesh_err(format!("Secret {} has no key `key`", published.credentials))
            })?;
        let key = hostmesh_agent::keys::from_hex("key", &hex)
            .map_err(|e| mesh_err(format!("Secret {}: {e}", published.credentials)))?;
        let mut procs = Vec::with_capacity(published.addresses.len());
        for (rank, (addr, proc_name)) in &published.addresses {
            let at: ChannelAddr = addr
                .parse()
                .map_err(|e| mesh_err(format!("rank {rank}: address {addr:?}: {e}")))?;
            procs.push(
                ProcId::new(at, proc_name.as_str())
                    .map_err(|e| mesh_err(format!("rank {rank}: {e}")))?,
            );
        }
        let id = format!("client-{name}-{:016x}", rand::random::<u64>());
        let proc = Proc::builder(id.clone())
            .secret(key)
            .build()
            .await
            .map_err(|e| MeshClientError::Runtime(format!("cannot start the client proc: {e}")))?;
        let (tx, rx) = mpsc::channel(1024);
        let mut client = MeshClient {
            proc,
            id,
            region: Region::from(published.extent),
            procs,
            options,
            events: tokio::sync::Mutex::new(rx),
            tx,
            tasks: Vec::new(),
        };
        client.start_keepalives();
        client.start_status_watch(meshes, name.to_string());
        Ok(client)
    }

    /// The client's proc: the sender to give [`ActorMesh::cast`] and
    /// [`ActorMesh::call_all`].
    pub fn proc(&self) -> &Proc {
        &self.proc
    }

    /// The mesh's region (its extent, ranks in row-major order).
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Spawns `name` of type `A` with `params` on every rank, controlled
    /// by this client (invariant 3).
    pub async fn spawn<A: RemoteSpawn>(
        &self,
        name: &str,
        params: &A::Params,
    ) -> Result<ActorMesh<A>, MeshClientError> {
        let params = postcard::to_allocvec(params)
            .map_err(|e| MeshClientError::Runtime(format!("cannot encode the parameters: {e}")))?;
        let (owner, mut failures) = self.proc.open_port::<SupervisionEvent>();
        let calls = self.procs.iter().enumerate().map(|(rank, p)| {
            let req = SpawnFor {
                type_name: std::any::type_name::<A>().into(),
                name: name.into(),
                params: params.clone(),
                client: self.id.clone(),
                keepalive_ms: u64::try_from(self.options.keepalive.as_millis()).unwrap_or(u64::MAX),
                owner: Some(owner.clone()),
            };
            async move {
                let mesh = mesh_ref(p).map_err(|e| format!("rank {rank}: {e}"))?;
                match mesh.call(&self.proc, &req, self.options.call_timeout).await {
                    Ok(Ok(id)) => Ok(id),
                    Ok(Err(e)) => Err(format!("rank {rank}: {e}")),
                    Err(e) => Err(format!("rank {rank}: {e}")),
                }
            }
        });
        let results = join_all(calls).await;
        let failed: Vec<String> = results.iter().filter_map(|r| r.clone().err()).collect();
        if !failed.is_empty() {
            return Err(MeshClientError::Runtime(format!(
                "spawning {name}: {}",
                failed.join("; ")
            )));
        }
        let ids: Vec<ActorId> = results.into_iter().filter_map(Result::ok).collect();
        let tx = self.tx.clone();
        // Failed actors reach the client's events (invariant 4).
        tokio::spawn(async move {
            while let Ok(ev) = failures.recv().await {
                let root = ev.root_cause();
                if let ActorStatus::Failed(reason) = &root.status {
                    let ev = MeshEvent::ActorFailed {
                        actor: root.actor.clone(),
                        reason: reason.clone(),
                    };
                    if tx.send(ev).await.is_err() {
                        break;
                    }
                }
            }
        });
        ActorMesh::attest(name, self.region.clone(), ids)
            .map_err(|e| MeshClientError::Runtime(e.to_string()))
    }

    /// The next event about this client's actors, or `None` once `wait`
    /// passed without one.
    pub async fn next_event(&self, wait: Duration) -> Option<MeshEvent> {
        let mut rx = self.events.lock().await;
        tokio::time::timeout(wait, rx.recv()).await.ok().flatten()
    }

    fn start_keepalives(&mut self) {
        let every = (self.options.keepalive / 3).max(Duration::from_millis(100));
        let proc = self.proc.clone();
        let procs = self.procs.clone();
        let id = self.id.clone();
        self.tasks.push(tokio::spawn(async move {
            let ka = Keepalive { client: id };
            loop {
                for p in &procs {
                    if let Ok(mesh) = mesh_ref(p) {
                        // Best effort: a rank that is gone is the status
                        // watch's business.
                        let _ = mesh.send(&proc, &ka).await;
                    }
                }
                tokio::time::sleep(every).await;
            }
        }));
    }

    fn start_status_watch(&mut self, meshes: Api<ProcMesh>, name: String) {
        let tx = self.tx.clone();
        let poll = self.options.status_poll;
        let total = self.procs.len();
        self.tasks.push(tokio::spawn(async move {
            let mut base: Option<BTreeMap<Rank, u32>> = None;
            // (rank, incarnation) pairs already reported (invariant 4).
            let mut reported: BTreeSet<(Rank, u32)> = BTreeSet::new();
            loop {
                tokio::time::sleep(poll).await;
                let Ok(pm) = meshes.get(&name).await else {
                    continue;
                };
                let Some(st) = pm.status else { continue };
                let inc = |r: Rank| {
                    hostmesh_crds::runs::get(&st.incarnations, r).map_or(0, |i| i.incarnation)
                };
                // The incarnations the actors were spawned on: the first
                // status read.
                let base = base.get_or_insert_with(|| (0..total).map(|r| (r, inc(r))).collect());
                for rank in 0..total {
                    let Some(s) = hostmesh_crds::runs::get(&st.ranks, rank) else {
                        continue;
                    };
                    let at = base.get(&rank).copied().unwrap_or(0);
                    let ended = !matches!(s.state, ProcState::Running | ProcState::Unreachable)
                        || inc(rank) > at;
                    if !ended {
                        continue;
                    }
                    if reported.insert((rank, at)) {
                        // Restarted within one pass, the rank reads
                        // Starting again: its end is the restart.
                        let restarted = matches!(s.state, ProcState::Starting | ProcState::Pending);
                        let ev = MeshEvent::ProcEnded {
                            rank,
                            state: s.state,
                            exit_code: s.exit_code,
                            signal: s.signal,
                            reason: if restarted {
                                Some(format!(
                                    "restarted as incarnation {}: its actors are gone",
                                    inc(rank)
                                ))
                            } else {
                                s.reason.clone()
                            },
                        };
                        if tx.send(ev).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }));
    }
}
