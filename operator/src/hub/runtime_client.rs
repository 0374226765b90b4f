//! The hub's connector over the runtime's agent client
//! ([`hostmesh_agent::AgentClient`]): one client per World (its
//! secret), one watch per host, every agent event translated into a hub push.
//!
//! Invariants:
//! 1. One client per World and secret (and previous secret, while it is
//!    rotated); a changed secret gets a new client.
//! 2. Each push carries the pod UID the host was last dialed for, so a
//!    replaced pod's agent is never mistaken for its predecessor.
//! 3. Requests go through the client with its call timeout; errors come back
//!    as text for the hub to log and retry.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use hostmesh_agent::protocol::AgentPush as RtPush;
use hostmesh_agent::protocol::{BookEntry, PatchAddressBook};
use hostmesh_agent::{AgentClient, AgentEvent, AgentEventKind, ClientConfig};
use tokio::sync::mpsc;

use super::agent::{
    AgentConnector, AgentLink, AgentTarget, BookAck, BookUpdate, CreateOrUpdate, HostKey,
    HostReport, LinkError, WorldKey,
};
use super::clock::ClockSample;

/// Name of the operator's client proc (agents see `<name>-<random>`).
const CLIENT_NAME: &str = "hostmesh-operator";
const EVENT_QUEUE: usize = 4096;

/// What is known of the host each rank was last dialed for.
#[derive(Clone)]
struct Dialed {
    pod_uid: String,
    /// The agent's address: an event of another address is an earlier
    /// pod's agent of this rank, whose pushes are not this pod's.
    addr: SocketAddr,
    epoch: u64,
    /// Its last snapshot or heartbeat was refused as another epoch's: its
    /// proc changes are not this pod's either.
    stale: bool,
}

type Uids = Arc<Mutex<HashMap<usize, Dialed>>>;

struct WorldClient {
    secret: Arc<[u8]>,
    previous: Option<Arc<[u8]>>,
    /// Its subscriptions' silence bound (`AgentTarget::silence`).
    silence: Duration,
    client: AgentClient,
    uids: Uids,
}

impl WorldClient {
    /// Whether this client dials as `target` asks (invariant 1).
    fn serves(&self, target: &AgentTarget) -> bool {
        self.secret == target.secret
            && self.previous == target.previous
            && self.silence == target.silence
    }
}

/// Dials agents with the runtime's agent client.
#[derive(Default)]
pub struct RuntimeConnector {
    /// Never held across an await, so forgetting a World or a host always
    /// takes effect (a client left here would keep dialing addresses that
    /// later belong to other Worlds' agents).
    worlds: Mutex<HashMap<WorldKey, WorldClient>>,
}

fn translate(world: &WorldKey, uids: &Uids, ev: AgentEvent) -> Option<HostReport> {
    let host = HostKey {
        world: world.clone(),
        rank: ev.host.rank,
    };
    let mut uids = uids.lock().unwrap_or_else(|e| e.into_inner());
    // No pod dialed for this rank now, or its agent at another address (an
    // earlier pod's, its events still queued): nothing of it is this pod's.
    let dialed = uids
        .get_mut(&ev.host.rank)
        .filter(|d| d.addr == ev.host.addr)?;
    let pod_uid = dialed.pod_uid.clone();
    let uid = || pod_uid.clone();
    // Hub invariant 7: a stale or fenced agent's pushes do not count; a
    // fenced one's proc changes do (its procs end as failures), a stale
    // one's do not (they are another pod's procs).
    match &ev.kind {
        AgentEventKind::Push(
            RtPush::Snapshot { epoch, fenced, .. } | RtPush::Heartbeat { epoch, fenced, .. },
        ) => {
            dialed.stale = *epoch != dialed.epoch;
            if let Some(reason) = super::fence::refusal(dialed.epoch, *epoch, fenced.as_deref()) {
                return Some(HostReport::Refused {
                    host,
                    pod_uid: uid(),
                    reason,
                });
            }
        }
        AgentEventKind::Push(RtPush::Changed(_)) if dialed.stale => return None,
        _ => {}
    }
    drop(uids);
    Some(match ev.kind {
        AgentEventKind::Connected => return None,
        AgentEventKind::Disconnected { reason } => HostReport::Disconnected { host, reason },
        AgentEventKind::Push(RtPush::Snapshot {
            procs, sent_at_ms, ..
        }) => HostReport::Snapshot {
            host,
            pod_uid: uid(),
            procs,
            clock: Some(ClockSample::now(sent_at_ms)),
        },
        AgentEventKind::Push(RtPush::Changed(c)) => HostReport::ProcState {
            host,
            pod_uid: uid(),
            state: c.state,
        },
        AgentEventKind::Push(RtPush::Heartbeat {
            sent_at_ms, digest, ..
        }) => HostReport::Heartbeat {
            host,
            pod_uid: uid(),
            clock: Some(ClockSample::now(sent_at_ms)),
            digest: Some(digest),
        },
    })
}

impl RuntimeConnector {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<WorldKey, WorldClient>> {
        self.worlds.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn existing(&self, target: &AgentTarget) -> Option<(AgentClient, Uids)> {
        self.lock()
            .get(&target.host.world)
            .filter(|w| w.serves(target))
            .map(|w| (w.client.clone(), w.uids.clone()))
    }

    async fn client_for(
        &self,
        target: &AgentTarget,
        pushes: mpsc::Sender<HostReport>,
    ) -> Result<(AgentClient, Uids), LinkError> {
        if let Some(found) = self.existing(target) {
            return Ok(found);
        }
        let (tx, mut rx) = mpsc::channel(EVENT_QUEUE);
        let config = ClientConfig {
            heartbeat_timeout: target.silence,
            ..ClientConfig::default()
        };
        let client = AgentClient::rotating(
            CLIENT_NAME,
            &target.secret,
            target.previous.as_deref(),
            config,
            tx,
        )
        .await?;
        let world = target.host.world.clone();
        let mut worlds = self.lock();
        // Another dial of this World made its client meanwhile: use that one
        // (ours is dropped, which shuts its proc down).
        if let Some(w) = worlds.get(&world).filter(|w| w.serves(target)) {
            return Ok((w.client.clone(), w.uids.clone()));
        }
        let uids: Uids = Arc::default();
        let (w, u) = (world.clone(), uids.clone());
        tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                if let Some(push) = translate(&w, &u, ev)
                    && pushes.send(push).await.is_err()
                {
                    return;
                }
            }
        });
        worlds.insert(
            world,
            WorldClient {
                secret: target.secret.clone(),
                previous: target.previous.clone(),
                silence: target.silence,
                client: client.clone(),
                uids: uids.clone(),
            },
        );
        Ok((client, uids))
    }
}

impl AgentConnector for Arc<RuntimeConnector> {
    fn connect(
        &self,
        target: AgentTarget,
        pushes: mpsc::Sender<HostReport>,
    ) -> BoxFuture<'static, Result<Arc<dyn AgentLink>, LinkError>> {
        let this = self.clone();
        Box::pin(async move {
            let (client, uids) = this.client_for(&target, pushes).await?;
            let rank = target.host.rank;
            uids.lock().unwrap_or_else(|e| e.into_inner()).insert(
                rank,
                Dialed {
                    pod_uid: target.pod_uid.clone(),
                    addr: target.addr,
                    epoch: target.epoch,
                    stale: false,
                },
            );
            client.watch(rank, target.addr);
            let link: Arc<dyn AgentLink> = Arc::new(RuntimeLink {
                client,
                addr: target.addr,
                rank,
            });
            Ok(link)
        })
    }

    fn forget_host(&self, host: &HostKey) {
        if let Some(w) = self.lock().get(&host.world) {
            w.client.unwatch(host.rank);
            w.uids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&host.rank);
        }
    }

    fn forget_world(&self, world: &WorldKey) {
        // Dropped outside the lock: dropping the last handle cancels the
        // client's watches and shuts its proc down.
        let gone = self.lock().remove(world);
        drop(gone);
    }
}

struct RuntimeLink {
    client: AgentClient,
    addr: SocketAddr,
    rank: usize,
}

impl AgentLink for RuntimeLink {
    fn create_or_update(&self, req: CreateOrUpdate) -> BoxFuture<'_, Result<(), LinkError>> {
        Box::pin(async move {
            self.client
                .create_or_update(self.addr, req)
                .await
                .map(|_| ())
                .map_err(LinkError::from)
        })
    }

    fn rekey(&self, secret: Arc<[u8]>, lineage: Arc<str>) -> BoxFuture<'_, Result<(), LinkError>> {
        Box::pin(async move {
            self.client
                .rekey(self.addr, &secret, &lineage)
                .await
                .map_err(LinkError::from)
        })
    }

    fn stop(&self, name: String, grace: Duration) -> BoxFuture<'_, Result<(), LinkError>> {
        Box::pin(async move {
            self.client
                .stop(self.addr, &name, grace)
                .await
                .map_err(LinkError::from)
        })
    }

    fn capture_stacks(
        &self,
        names: Vec<String>,
        max_bytes: usize,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Vec<hostmesh_agent::protocol::ProcStacks>, LinkError>> {
        Box::pin(async move {
            self.client
                .capture_stacks(self.addr, names, max_bytes, timeout)
                .await
                .map_err(LinkError::from)
        })
    }

    fn send_book(&self, update: BookUpdate) -> BoxFuture<'_, Result<BookAck, LinkError>> {
        Box::pin(async move {
            match update {
                BookUpdate::Full { version, hosts } => {
                    let n = hosts.iter().map(|(r, _, _)| *r + 1).max().unwrap_or(0);
                    let mut book = vec![String::new(); n];
                    let mut epochs = vec![0; n];
                    for (r, a, e) in hosts {
                        book[r] = a.to_string();
                        epochs[r] = e;
                    }
                    self.client
                        .set_address_book(self.addr, book, epochs, version)
                        .await?;
                    Ok(BookAck::Applied)
                }
                BookUpdate::Patch {
                    base,
                    version,
                    len,
                    changes,
                } => {
                    let patch = PatchAddressBook {
                        base,
                        version,
                        len,
                        changes: changes
                            .into_iter()
                            .map(|(rank, addr, epoch)| BookEntry {
                                rank,
                                addr: addr.map(|a| a.to_string()).unwrap_or_default(),
                                epoch,
                            })
                            .collect(),
                    };
                    Ok(
                        match self.client.patch_address_book(self.addr, patch).await? {
                            Ok(()) => BookAck::Applied,
                            Err(held) => BookAck::Holds(held),
                        },
                    )
                }
            }
        })
    }

    fn renew(&self, epoch: u64) -> BoxFuture<'_, Result<hostmesh_agent::EpochVerdict, LinkError>> {
        Box::pin(async move {
            self.client
                .renew(self.addr, epoch)
                .await
                .map_err(LinkError::from)
        })
    }

    fn resync(&self) {
        self.client.resync(self.rank);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostmesh_agent::HostId;
    use hostmesh_agent::protocol::{ProcPhase, ProcReport, ProcStateChanged};

    fn ev(kind: RtPush) -> AgentEvent {
        AgentEvent {
            host: HostId {
                rank: 0,
                addr: "127.0.0.1:26600".parse().unwrap(),
            },
            kind: AgentEventKind::Push(kind),
        }
    }

    fn beat(epoch: u64, fenced: Option<&str>) -> AgentEvent {
        ev(RtPush::Heartbeat {
            host_rank: 0,
            seq: 1,
            digest: 0,
            procs: 0,
            sent_at_ms: 0,
            epoch,
            fenced: fenced.map(str::to_owned),
        })
    }

    fn changed() -> AgentEvent {
        ev(RtPush::Changed(ProcStateChanged {
            host_rank: 0,
            state: ProcReport {
                proc_id: "tcp:127.0.0.1:26600/pm.0".into(),
                name: "pm.0".into(),
                rank: 0,
                pid: None,
                command: vec![],
                status: ProcPhase::Starting,
                started_at_ms: 0,
                restarts: 0,
                stop_requested: false,
                seq: 1,
                ..Default::default()
            },
        }))
    }

    /// Hub invariant 7 at the connector: which pushes of an agent reach
    /// the hub, by its epoch against its pod's.
    #[test]
    fn stale_and_fenced_agents_are_refused() {
        let world = WorldKey {
            namespace: "ns".into(),
            name: "w".into(),
        };
        let uids: Uids = Arc::default();
        uids.lock().unwrap().insert(
            0,
            Dialed {
                pod_uid: "pod".into(),
                addr: "127.0.0.1:26600".parse().unwrap(),
                epoch: 5,
                stale: false,
            },
        );
        let t = |e| translate(&world, &uids, e);
        assert!(
            matches!(t(beat(5, None)), Some(HostReport::Heartbeat { pod_uid, .. }) if pod_uid == "pod")
        );
        assert!(matches!(t(changed()), Some(HostReport::ProcState { .. })));
        // An older epoch: refused, and its proc changes dropped.
        assert!(
            matches!(t(beat(4, None)), Some(HostReport::Refused { reason, .. }) if reason.contains("stale"))
        );
        assert!(t(changed()).is_none());
        // Fenced at the pod's epoch: refused, but its procs' ends count.
        assert!(
            matches!(t(beat(5, Some("no contact"))), Some(HostReport::Refused { reason, .. }) if reason.contains("fenced itself"))
        );
        assert!(matches!(t(changed()), Some(HostReport::ProcState { .. })));
    }

    /// An event of an agent at another address than the one dialed for its
    /// rank (an earlier pod's, still queued), or of a rank no pod is
    /// dialed for now (its host forgotten), reaches the hub as nothing.
    #[test]
    fn events_of_an_earlier_pods_agent_are_dropped() {
        let world = WorldKey {
            namespace: "ns".into(),
            name: "w".into(),
        };
        let uids: Uids = Arc::default();
        let t = |e| translate(&world, &uids, e);
        assert!(t(changed()).is_none(), "no pod dialed for rank 0");
        uids.lock().unwrap().insert(
            0,
            Dialed {
                pod_uid: "new-pod".into(),
                addr: "127.0.0.1:26601".parse().unwrap(),
                epoch: 0,
                stale: false,
            },
        );
        assert!(t(changed()).is_none(), "the old pod's agent at :26600");
        assert!(t(beat(0, None)).is_none());
        uids.lock().unwrap().get_mut(&0).unwrap().addr = "127.0.0.1:26600".parse().unwrap();
        assert!(
            matches!(t(changed()), Some(HostReport::ProcState { pod_uid, .. }) if pod_uid == "new-pod")
        );
    }
}
