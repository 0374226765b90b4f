//! Actor meshes: a [`ProcMesh`] (procs laid over a region) spawns an actor
//! of a registered type on every proc, giving an [`ActorMesh`] that can be
//! sliced, cast to, and called with replies gathered into a [`ValueMesh`].
//!
//! Invariants:
//! 1. Fan-out is concurrent: all envelopes are queued on their peers' links
//!    before any reply is awaited, and links dial in parallel; replies come
//!    back to one port.
//! 2. A mesh operation either yields a value for every rank or fails with
//!    [`RuntimeError::Ranks`] naming every rank that failed and why.
//! 3. A sliced mesh addresses exactly the ranks of its region.

use hostmesh_mesh::Rank;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::Range;
use std::time::Duration;

use bytes::Bytes;

use crate::actor::{ActorRef, Handler, RemoteSpawn};
use crate::error::RuntimeError;
use crate::id::{ActorId, PortId, ProcId};
use crate::port::{self, Message, PortRef, handler_port};
use crate::proc::{CanSend, Proc, SpawnActor};
use crate::supervision::SupervisionEvent;
use hostmesh_mesh::{MeshRef, Region, ValueMesh};

/// Procs laid over a region (text form `name:proc,proc@region`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcMesh {
    mesh: MeshRef<ProcId>,
}

impl ProcMesh {
    /// A proc mesh; one proc per rank of `region`.
    pub fn new(name: &str, region: Region, procs: Vec<ProcId>) -> Result<Self, RuntimeError> {
        Ok(ProcMesh {
            mesh: MeshRef::new(name, region, procs)?,
        })
    }

    /// The underlying mesh reference.
    pub fn mesh_ref(&self) -> &MeshRef<ProcId> {
        &self.mesh
    }

    /// The sub-mesh where `dim` is restricted to `range`.
    pub fn range(&self, dim: &str, range: Range<usize>) -> Result<Self, RuntimeError> {
        Ok(ProcMesh {
            mesh: self.mesh.range(dim, range)?,
        })
    }

    /// Spawns `name[0]` of type `A` on every proc (each proc must have
    /// registered `A`); failures of those actors go to each proc's sink.
    pub async fn spawn<A: RemoteSpawn>(
        &self,
        cx: &impl CanSend,
        name: &str,
        params: &A::Params,
        timeout: Duration,
    ) -> Result<ActorMesh<A>, RuntimeError> {
        self.spawn_supervised(cx, name, params, None, timeout).await
    }

    /// Like [`ProcMesh::spawn`], with every actor's supervision events sent
    /// to `owner`.
    pub async fn spawn_supervised<A: RemoteSpawn>(
        &self,
        cx: &impl CanSend,
        name: &str,
        params: &A::Params,
        owner: Option<PortRef<SupervisionEvent>>,
        timeout: Duration,
    ) -> Result<ActorMesh<A>, RuntimeError> {
        let msg = SpawnActor {
            type_name: std::any::type_name::<A>().to_string(),
            name: name.to_string(),
            params: postcard::to_allocvec(params)
                .map_err(|e| RuntimeError::Encode(e.to_string()))?,
            owner,
        };
        let payload = port::encode(&msg)?;
        let dests: Vec<PortId> = self
            .mesh
            .items()
            .iter()
            .map(|p| {
                Proc::system_actor_of(p)
                    .id()
                    .port(handler_port::<SpawnActor>())
            })
            .collect();
        let replies = gather::<Result<ActorId, String>>(cx, &dests, payload, timeout).await?;
        let mut actors = Vec::with_capacity(replies.len());
        let mut failed = Vec::new();
        for (rank, r) in replies.into_iter().enumerate() {
            match r {
                Ok(Ok(id)) => actors.push(id),
                Ok(Err(reason)) | Err(reason) => failed.push((rank, reason)),
            }
        }
        if !failed.is_empty() {
            return Err(RuntimeError::Ranks {
                op: "spawn",
                total: dests.len(),
                failed,
            });
        }
        Ok(ActorMesh {
            mesh: MeshRef::new(self.mesh.name(), self.mesh.region().clone(), actors)?,
            _a: PhantomData,
        })
    }
}

/// Actors of type `A` laid over a region.
pub struct ActorMesh<A> {
    mesh: MeshRef<ActorId>,
    _a: PhantomData<fn() -> A>,
}

impl<A> Clone for ActorMesh<A> {
    fn clone(&self) -> Self {
        ActorMesh {
            mesh: self.mesh.clone(),
            _a: PhantomData,
        }
    }
}

impl<A: crate::Actor> ActorMesh<A> {
    /// An actor mesh from known actor ids (the caller vouches for the type).
    pub fn attest(name: &str, region: Region, actors: Vec<ActorId>) -> Result<Self, RuntimeError> {
        Ok(ActorMesh {
            mesh: MeshRef::new(name, region, actors)?,
            _a: PhantomData,
        })
    }

    /// The region the actors are laid over.
    pub fn region(&self) -> &Region {
        self.mesh.region()
    }

    /// Number of actors.
    pub fn len(&self) -> usize {
        self.mesh.len()
    }

    /// Whether the mesh is empty (never, for a valid region).
    pub fn is_empty(&self) -> bool {
        self.mesh.is_empty()
    }

    /// The actor of one rank.
    pub fn get(&self, rank: Rank) -> Option<ActorRef<A>> {
        self.mesh.get(rank).cloned().map(ActorRef::attest)
    }

    /// The actor ids in rank order.
    pub fn ids(&self) -> &[ActorId] {
        self.mesh.items()
    }

    /// The sub-mesh where `dim` is restricted to `range`.
    pub fn range(&self, dim: &str, range: Range<usize>) -> Result<Self, RuntimeError> {
        Ok(ActorMesh {
            mesh: self.mesh.range(dim, range)?,
            _a: PhantomData,
        })
    }

    /// The sub-mesh over `region` (inside this mesh's region).
    pub fn sliced(&self, region: Region) -> Result<Self, RuntimeError> {
        Ok(ActorMesh {
            mesh: self.mesh.sliced(region)?,
            _a: PhantomData,
        })
    }

    /// Sends `msg` to every actor (fire and forget); it is encoded once.
    pub async fn cast<M: Message>(&self, cx: &impl CanSend, msg: &M) -> Result<(), RuntimeError>
    where
        A: Handler<M>,
    {
        let payload = port::encode(msg)?;
        let p = handler_port::<M>();
        for id in self.mesh.items() {
            cx.proc()
                .post(cx.sender_id(), id.port(p), None, payload.clone())
                .await;
        }
        Ok(())
    }

    /// Sends `msg` to every actor and gathers the replies into a value mesh
    /// over this mesh's region.
    pub async fn call_all<M: Message>(
        &self,
        cx: &impl CanSend,
        msg: &M,
        timeout: Duration,
    ) -> Result<ValueMesh<<A as Handler<M>>::Reply>, RuntimeError>
    where
        A: Handler<M>,
        <A as Handler<M>>::Reply: PartialEq,
    {
        let payload = port::encode(msg)?;
        let p = handler_port::<M>();
        let dests: Vec<PortId> = self.mesh.items().iter().map(|a| a.port(p)).collect();
        let replies = gather::<<A as Handler<M>>::Reply>(cx, &dests, payload, timeout).await?;
        let mut values = Vec::with_capacity(replies.len());
        let mut failed = Vec::new();
        for (rank, r) in replies.into_iter().enumerate() {
            match r {
                Ok(v) => values.push(v),
                Err(reason) => failed.push((rank, reason)),
            }
        }
        if !failed.is_empty() {
            return Err(RuntimeError::Ranks {
                op: "call",
                total: dests.len(),
                failed,
            });
        }
        Ok(ValueMesh::from_values(self.mesh.region().clone(), values)?)
    }
}

/// Sends `payload` to every destination with one shared reply port and
/// collects one result per destination, in order.
async fn gather<R: Message>(
    cx: &impl CanSend,
    dests: &[PortId],
    payload: Bytes,
    timeout: Duration,
) -> Result<Vec<Result<R, String>>, RuntimeError> {
    let proc = cx.proc();
    let (reply, mut rx) = port::port_pair::<R>(proc, cx.sender_id(), dests.len().max(1));
    let mut rank_of: HashMap<&ActorId, Vec<usize>> = HashMap::with_capacity(dests.len());
    for (rank, d) in dests.iter().enumerate() {
        rank_of.entry(d.actor()).or_default().push(rank);
    }
    for d in dests {
        proc.post(
            cx.sender_id(),
            d.clone(),
            Some(reply.id().clone()),
            payload.clone(),
        )
        .await;
    }
    let mut results: Vec<Option<Result<R, String>>> = (0..dests.len()).map(|_| None).collect();
    let mut remaining = dests.len();
    let deadline = tokio::time::Instant::now() + timeout;
    while remaining > 0 {
        let env = match tokio::time::timeout_at(deadline, rx.recv_envelope()).await {
            Ok(Ok(env)) => env,
            Ok(Err(e)) => return Err(e),
            Err(_) => break,
        };
        let Some(ranks) = rank_of.get_mut(&env.sender) else {
            continue;
        };
        let Some(rank) = ranks.pop() else { continue };
        let r = match &env.error {
            Some(reason) => Err(reason.clone()),
            None => port::decode::<R>(&env).map_err(|e| e.to_string()),
        };
        results[rank] = Some(r);
        remaining -= 1;
    }
    Ok(results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(format!("no reply within {timeout:?}"))))
        .collect())
}

impl<T> std::fmt::Debug for ActorMesh<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ActorMesh")
            .field(&format_args!("{}", self.mesh))
            .finish()
    }
}
