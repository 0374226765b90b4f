//! A client of a runtime-aware ProcMesh's procs: it waits until the mesh
//! runs, reads what the operator publishes for clients (the addresses in
//! ConfigMap `<procmesh>-runtime` and the runtime key in the Secret it
//! names), joins the World's runtime with a credential it issues itself
//! from that key (never the agents' secret), and
//! spawns actor meshes of a registered type on every rank, which the
//! runtime's [`ActorMesh`] slices, casts to and gathers from. Its actors
//! live while the client sends keepalives; the client's [`MeshEvent`]s say
//! when an actor failed or a proc ended.
//!
//! Invariants:
//! 1. The client authenticates with a credential from the runtime key
//!    only: it can drive
//!    actors on the procs and nothing on the agents.
//! 2. [`MeshClient::connect`] returns once the ProcMesh is `Running` and
//!    every rank is listed with an address, or fails naming what it
//!    waited for.
//! 3. Every actor the client spawns names it as its controlling client:
//!    keepalives go to every rank at a third of the keepalive bound until
//!    the client is dropped, after which the procs stop its actors.
//! 4. Each proc end (a rank that left `Running` in the ProcMesh's status,
//!    with its exit code, signal or reason, or that was restarted) is one
//!    [`MeshEvent::ProcEnded`] per rank and incarnation; each failed actor
//!    one [`MeshEvent::ActorFailed`]. The client watches the ProcMesh (and
//!    its addresses ConfigMap): an end reaches it as soon as the operator
//!    wrote it into status, nothing is polled.
//! 5. A restarted rank rejoins: once its new incarnation runs and its
//!    address is published for that incarnation, the client uses the new
//!    proc (keepalives, spawns) and says so with one
//!    [`MeshEvent::ProcRejoined`]; [`MeshClient::respawn`] puts a mesh's
//!    actor on the rejoined ranks. The rank's next end is an event again.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt as _;
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
use kube::runtime::{WatchStreamExt as _, watcher};
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
    /// Timeout of each spawn call.
    pub call_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            ready_timeout: Duration::from_secs(300),
            keepalive: Duration::from_secs(30),
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
        /// Every rank whose proc is down now, this one included, in rank
        /// order: the rest of the mesh is usable (slice around these).
        down: Vec<Rank>,
    },
    /// A restarted rank's new proc runs and checked in: the client uses it
    /// from now on; [`MeshClient::respawn`] puts actors on it.
    ProcRejoined {
        /// The rank.
        rank: Rank,
        /// Its new incarnation.
        incarnation: u32,
    },
}

/// A connected client of one ProcMesh (invariants 1-3).
pub struct MeshClient {
    proc: Proc,
    id: String,
    region: Region,
    /// Each rank's current proc (invariant 5).
    procs: Arc<RwLock<Vec<ProcId>>>,
    options: ClientOptions,
    events: tokio::sync::Mutex<mpsc::Receiver<MeshEvent>>,
    tx: mpsc::Sender<MeshEvent>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for MeshClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshClient")
            .field("id", &self.id)
            .field("ranks", &self.region.num_ranks())
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

/// One rank's published proc.
#[derive(Clone, Debug, PartialEq)]
struct Listed {
    addr: String,
    name: String,
    incarnation: u32,
}

impl Listed {
    fn proc_id(&self, rank: Rank) -> Result<ProcId, String> {
        let at: ChannelAddr = self
            .addr
            .parse()
            .map_err(|e| format!("rank {rank}: address {:?}: {e}", self.addr))?;
        ProcId::new(at, self.name.as_str()).map_err(|e| format!("rank {rank}: {e}"))
    }
}

/// What the operator publishes for a runtime-aware mesh.
struct Published {
    extent: Extent,
    addresses: BTreeMap<Rank, Listed>,
    credentials: String,
}

/// The ConfigMap's data: lines `<rank> <address> <proc name> <incarnation>`
/// (docs/api.md, "Runtime addresses").
fn parse_published(cm: &ConfigMap) -> Option<Published> {
    let data = cm.data.as_ref()?;
    let extent: Extent = data.get("extent")?.parse().ok()?;
    let addresses = data
        .get("addresses")?
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let rank = f.next()?.parse().ok()?;
            let (addr, name) = (f.next()?.to_string(), f.next()?.to_string());
            let incarnation = f.next().and_then(|i| i.parse().ok()).unwrap_or(0);
            Some((
                rank,
                Listed {
                    addr,
                    name,
                    incarnation,
                },
            ))
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
        // After a rotation of the World's token, the lineage that links the
        // issuer of procs spawned before it to the current one.
        let lineage = secret
            .data
            .as_ref()
            .and_then(|d| d.get("lineage"))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .unwrap_or_default();
        let issuer = hostmesh_runtime::Issuer::from_runtime_key(&key)
            .with_lineage_text(&lineage)
            .map_err(|e| {
                mesh_err(format!(
                    "Secret {}: key `lineage`: {e}",
                    published.credentials
                ))
            })?;
        let mut procs = Vec::with_capacity(published.addresses.len());
        for (rank, listed) in &published.addresses {
            procs.push(listed.proc_id(*rank).map_err(mesh_err)?);
        }
        let incarnations: Vec<u32> = published
            .addresses
            .values()
            .map(|l| l.incarnation)
            .collect();
        let id = format!("client-{name}-{:016x}", rand::random::<u64>());
        // The runtime key is the World's issuer: the client issues itself
        // a credential for its own name, as the agents' desks do.
        let proc = Proc::builder(id.clone())
            .issued_by(issuer)
            .build()
            .await
            .map_err(|e| MeshClientError::Runtime(format!("cannot start the client proc: {e}")))?;
        let (tx, rx) = mpsc::channel(1024);
        let mut client = MeshClient {
            proc,
            id,
            region: Region::from(published.extent),
            procs: Arc::new(RwLock::new(procs)),
            options,
            events: tokio::sync::Mutex::new(rx),
            tx,
            tasks: Vec::new(),
        };
        client.start_keepalives();
        client.start_watch(meshes, cms, name, incarnations);
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
        let procs = self.current_procs();
        let ids = self.spawn_on::<A>(name, params, &procs).await?;
        ActorMesh::attest(name, self.region.clone(), ids)
            .map_err(|e| MeshClientError::Runtime(e.to_string()))
    }

    /// Spawns `mesh`'s actor (named `name`, as it was spawned) again, with
    /// `params`, on every rank whose current proc is not the one its actor
    /// lives on (ranks that rejoined, invariant 5), and returns the mesh
    /// with those ranks' new actors. `mesh` must span the whole ProcMesh.
    pub async fn respawn<A: RemoteSpawn>(
        &self,
        mesh: &ActorMesh<A>,
        name: &str,
        params: &A::Params,
    ) -> Result<ActorMesh<A>, MeshClientError> {
        if mesh.region() != &self.region {
            return Err(MeshClientError::Runtime(format!(
                "respawn takes the whole mesh ({}), not a slice ({})",
                self.region,
                mesh.region()
            )));
        }
        let procs = self.current_procs();
        let mut ids = mesh.ids().to_vec();
        let moved: Vec<(Rank, ProcId)> = ids
            .iter()
            .zip(&procs)
            .enumerate()
            .filter(|(_, (id, p))| id.proc() != *p)
            .map(|(rank, (_, p))| (rank, p.clone()))
            .collect();
        if moved.is_empty() {
            return Ok(mesh.clone());
        }
        let on: Vec<ProcId> = moved.iter().map(|(_, p)| p.clone()).collect();
        let fresh = self.spawn_on::<A>(name, params, &on).await?;
        for ((rank, _), id) in moved.into_iter().zip(fresh) {
            ids[rank] = id;
        }
        ActorMesh::attest(name, self.region.clone(), ids)
            .map_err(|e| MeshClientError::Runtime(e.to_string()))
    }

    fn current_procs(&self) -> Vec<ProcId> {
        self.procs
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Spawns `name` of type `A` on each of `procs`; their actors in order.
    async fn spawn_on<A: RemoteSpawn>(
        &self,
        name: &str,
        params: &A::Params,
        procs: &[ProcId],
    ) -> Result<Vec<ActorId>, MeshClientError> {
        let params = postcard::to_allocvec(params)
            .map_err(|e| MeshClientError::Runtime(format!("cannot encode the parameters: {e}")))?;
        let (owner, mut failures) = self.proc.open_port::<SupervisionEvent>();
        let calls = procs.iter().map(|p| {
            let req = SpawnFor {
                type_name: std::any::type_name::<A>().into(),
                name: name.into(),
                params: params.clone(),
                client: self.id.clone(),
                keepalive_ms: u64::try_from(self.options.keepalive.as_millis()).unwrap_or(u64::MAX),
                owner: Some(owner.clone()),
            };
            async move {
                let mesh = mesh_ref(p).map_err(|e| format!("{}: {e}", p.name()))?;
                match mesh.call(&self.proc, &req, self.options.call_timeout).await {
                    Ok(Ok(id)) => Ok(id),
                    Ok(Err(e)) => Err(format!("{}: {e}", p.name())),
                    Err(e) => Err(format!("{}: {e}", p.name())),
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
        Ok(ids)
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
        let procs = Arc::clone(&self.procs);
        let id = self.id.clone();
        self.tasks.push(tokio::spawn(async move {
            let ka = Keepalive { client: id };
            loop {
                let now = procs
                    .read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                for p in &now {
                    if let Ok(mesh) = mesh_ref(p) {
                        // Best effort: a rank that is gone is the watch's
                        // business.
                        let _ = mesh.send(&proc, &ka).await;
                    }
                }
                tokio::time::sleep(every).await;
            }
        }));
    }

    /// Watches the ProcMesh and its addresses ConfigMap (invariants 4-5);
    /// `incarnations` are those of the procs the client connected to.
    fn start_watch(
        &mut self,
        meshes: Api<ProcMesh>,
        cms: Api<ConfigMap>,
        name: &str,
        incarnations: Vec<u32>,
    ) {
        let mut tracker = Tracker {
            tx: self.tx.clone(),
            procs: Arc::clone(&self.procs),
            watching: incarnations,
            reported: Vec::new(),
        };
        tracker.reported = vec![false; tracker.watching.len()];
        let by_name = |n: &str| watcher::Config::default().fields(&format!("metadata.name={n}"));
        let mut pms = watcher::watcher(meshes, by_name(name))
            .default_backoff()
            .boxed();
        let mut maps = watcher::watcher(cms, by_name(&format!("{name}-runtime")))
            .default_backoff()
            .boxed();
        self.tasks.push(tokio::spawn(async move {
            let (mut pm, mut cm): (Option<ProcMesh>, Option<ConfigMap>) = (None, None);
            loop {
                tokio::select! {
                    ev = pms.next() => match ev {
                        Some(Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o))) => pm = Some(o),
                        Some(_) => continue,
                        None => return,
                    },
                    ev = maps.next() => match ev {
                        Some(Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o))) => cm = Some(o),
                        Some(_) => continue,
                        None => return,
                    },
                }
                let Some(st) = pm.as_ref().and_then(|p| p.status.as_ref()) else {
                    continue;
                };
                let published = cm.as_ref().and_then(parse_published);
                if !tracker.update(st, published.as_ref()).await {
                    return;
                }
            }
        }));
    }
}

/// Each rank's proc as the client follows it (invariants 4-5).
struct Tracker {
    tx: mpsc::Sender<MeshEvent>,
    procs: Arc<RwLock<Vec<ProcId>>>,
    /// The incarnation whose proc the client uses, per rank.
    watching: Vec<u32>,
    /// Whether that incarnation's end was reported.
    reported: Vec<bool>,
}

impl Tracker {
    /// Ranks whose proc ended and has not rejoined.
    fn down(&self) -> Vec<Rank> {
        (0..self.reported.len())
            .filter(|r| self.reported[*r])
            .collect()
    }

    /// Reports ends and rejoins that `st` and `published` show; `false`
    /// once the client is gone.
    async fn update(
        &mut self,
        st: &hostmesh_crds::procmesh::ProcMeshStatus,
        published: Option<&Published>,
    ) -> bool {
        let inc =
            |r: Rank| hostmesh_crds::runs::get(&st.incarnations, r).map_or(0, |i| i.incarnation);
        for rank in 0..self.watching.len() {
            let Some(s) = hostmesh_crds::runs::get(&st.ranks, rank) else {
                continue;
            };
            let now = inc(rank);
            let at = self.watching[rank];
            let alive = matches!(s.state, ProcState::Running | ProcState::Unreachable);
            if !self.reported[rank] && (!alive || now > at) {
                self.reported[rank] = true;
                // Restarted within one status write, the rank reads
                // Starting (or Running) again: its end is the restart.
                let restarted = now > at
                    && matches!(
                        s.state,
                        ProcState::Pending | ProcState::Starting | ProcState::Running
                    );
                let ev = MeshEvent::ProcEnded {
                    rank,
                    state: s.state,
                    exit_code: s.exit_code,
                    signal: s.signal,
                    reason: if restarted {
                        Some(format!(
                            "restarted as incarnation {now}: its actors are gone"
                        ))
                    } else {
                        s.reason.clone()
                    },
                    down: self.down(),
                };
                if self.tx.send(ev).await.is_err() {
                    return false;
                }
            }
            // Invariant 5: the new incarnation runs and its address is out.
            let listed = published.and_then(|p| p.addresses.get(&rank));
            if let Some(l) = listed.filter(|l| {
                l.incarnation > at && l.incarnation == now && s.state == ProcState::Running
            }) && let Ok(id) = l.proc_id(rank)
            {
                if let Some(slot) = self
                    .procs
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get_mut(rank)
                {
                    *slot = id;
                }
                self.watching[rank] = now;
                self.reported[rank] = false;
                let ev = MeshEvent::ProcRejoined {
                    rank,
                    incarnation: now,
                };
                if self.tx.send(ev).await.is_err() {
                    return false;
                }
            }
        }
        true
    }
}
