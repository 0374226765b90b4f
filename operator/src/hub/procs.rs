//! The hub's proc requests: naming, CreateOrUpdate without duplicates,
//! stop-before-restart, and stopping a whole proc mesh.
//!
//! Proc names are `<mesh id>.<rank>` with mesh id `<ProcMesh name>.<uid
//! prefix>`, so a ProcMesh recreated under the same name never matches the
//! procs of its predecessor (the agent refuses a changed spec under an old
//! name).

use hostmesh_crds::Rank;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hostmesh_crds::procmesh::ProcState;
use k8s_openapi::jiff::Timestamp;

use super::{AgentLink, CreateOrUpdate, Hub, LinkError, MeshKey, ProcObs, WorldKey};

/// Name of the proc of rank `rank` of the proc mesh `mesh_id` on its agent.
pub fn proc_name(mesh_id: &str, rank: Rank) -> String {
    format!("{mesh_id}.{rank}")
}

/// `(mesh id, rank)` of a proc name made by [`proc_name`].
pub fn parse_proc_name(name: &str) -> Option<(&str, Rank)> {
    let (mesh, rank) = name.rsplit_once('.')?;
    Some((mesh, rank.parse().ok()?))
}

/// The ProcMesh name inside a mesh id (`<name>.<uid prefix>`).
pub fn mesh_name(mesh_id: &str) -> &str {
    mesh_id.rsplit_once('.').map_or(mesh_id, |(n, _)| n)
}

/// What the hub keeps of a request it sent: a digest that differs when
/// any field does (SipHash of the whole request).
fn request_digest(req: &CreateOrUpdate) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    req.hash(&mut h);
    h.finish()
}

fn live(state: ProcState) -> bool {
    matches!(
        state,
        ProcState::Starting | ProcState::Running | ProcState::Stopping
    )
}

impl Hub {
    /// Sends the requests of host `host_rank` whose content differs from
    /// what the current connection already carried (module invariant 3). A
    /// proc still running an older incarnation is stopped first (grace
    /// `grace`); its restart is sent once it has ended. Returns how many
    /// requests were sent.
    pub async fn ensure_procs(
        &self,
        world: &WorldKey,
        host_rank: Rank,
        reqs: Vec<CreateOrUpdate>,
        grace: Duration,
    ) -> Result<usize, LinkError> {
        let no_link = || LinkError::NotConnected(host_rank);
        let (link, creates, stops) = {
            let mut st = self.lock();
            let w = st.worlds.get_mut(world).ok_or_else(no_link)?;
            let procs = &w.procs;
            let h = w.hosts.get_mut(&host_rank).ok_or_else(no_link)?;
            let link = h.link.clone().ok_or_else(no_link)?;
            let mut creates = Vec::new();
            let mut stops = Vec::new();
            for r in reqs {
                if h.sent.get(&r.name) == Some(&request_digest(&r)) {
                    continue;
                }
                let observed =
                    parse_proc_name(&r.name).and_then(|(m, rank)| procs.get(m)?.get(&rank));
                if observed.is_some_and(|o| o.incarnation < r.incarnation && live(o.state)) {
                    if h.stopping.insert(r.name.clone()) {
                        stops.push(r.name.clone());
                    }
                } else {
                    creates.push(r);
                }
            }
            (link, creates, stops)
        };
        for name in stops {
            link.stop(name, grace).await?;
        }
        let n = creates.len();
        for req in creates {
            link.create_or_update(req.clone()).await?;
            let mut st = self.lock();
            if let Some(h) = st
                .worlds
                .get_mut(world)
                .and_then(|w| w.hosts.get_mut(&host_rank))
            {
                h.stopping.remove(&req.name);
                h.sent.insert(req.name.clone(), request_digest(&req));
            }
        }
        Ok(n)
    }

    /// Asks every connected host of `world` to stop the procs of `mesh_id`
    /// that it was sent or reports as running.
    pub async fn stop_procs(
        &self,
        world: &WorldKey,
        mesh_id: &str,
        grace: Duration,
    ) -> Result<(), LinkError> {
        let work: Vec<(Rank, Arc<dyn AgentLink>, Vec<String>)> = {
            let mut st = self.lock();
            let Some(w) = st.worlds.get_mut(world) else {
                return Ok(());
            };
            let running: Vec<(Rank, Rank)> = w
                .procs
                .get(mesh_id)
                .map(|m| {
                    m.iter()
                        .filter(|(_, o)| live(o.state))
                        .map(|(r, o)| (o.host, *r))
                        .collect()
                })
                .unwrap_or_default();
            let of_mesh = |n: &String| parse_proc_name(n).is_some_and(|(m, _)| m == mesh_id);
            w.hosts
                .iter_mut()
                .filter_map(|(hr, h)| {
                    let link = h.link.clone()?;
                    let mut names: Vec<String> =
                        h.sent.keys().filter(|n| of_mesh(n)).cloned().collect();
                    names.extend(
                        running
                            .iter()
                            .filter(|(host, _)| host == hr)
                            .map(|(_, r)| proc_name(mesh_id, *r)),
                    );
                    names.sort();
                    names.dedup();
                    names.retain(|n| h.stopping.insert(n.clone()));
                    h.sent.retain(|n, _| !of_mesh(n));
                    Some((*hr, link, names))
                })
                .collect()
        };
        let stops = work.iter().map(|(_, link, names)| async move {
            for n in names {
                link.stop(n.clone(), grace).await?;
            }
            Ok::<_, LinkError>(())
        });
        futures::future::join_all(stops)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map(|_| ())
    }

    /// Forgets what the hub knew of the procs of `mesh_id` (after a stop).
    pub fn forget_procs(&self, world: &WorldKey, mesh_id: &str) {
        let mut st = self.lock();
        if let Some(w) = st.worlds.get_mut(world) {
            w.procs.remove(mesh_id);
            for h in w.hosts.values_mut() {
                h.stopping
                    .retain(|n| parse_proc_name(n).is_none_or(|(m, _)| m != mesh_id));
            }
        }
        let key = MeshKey {
            namespace: world.namespace.clone(),
            name: mesh_name(mesh_id).to_string(),
        };
        st.mesh_triggers.remove(&key);
    }

    /// Proc states of `mesh_id`, by rank.
    pub fn proc_states(&self, world: &WorldKey, mesh_id: &str) -> BTreeMap<Rank, ProcObs> {
        let st = self.lock();
        st.worlds
            .get(world)
            .and_then(|w| w.procs.get(mesh_id))
            .cloned()
            .unwrap_or_default()
    }

    /// Hosts of `world` whose agent's Snapshot this hub has, and since when
    /// (a rank on any other host has not been heard from yet: unknown, not
    /// missing).
    pub fn reported_hosts(&self, world: &WorldKey) -> BTreeMap<Rank, Timestamp> {
        let st = self.lock();
        st.worlds
            .get(world)
            .map(|w| {
                w.hosts
                    .iter()
                    .filter_map(|(r, h)| h.reported_at.map(|t| (*r, t)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every mesh id starting with `prefix` the hub knows of in `world`
    /// (reported by agents, or sent or being stopped on this connection).
    pub fn mesh_ids(&self, world: &WorldKey, prefix: &str) -> Vec<String> {
        let st = self.lock();
        let Some(w) = st.worlds.get(world) else {
            return Vec::new();
        };
        let mut ids: Vec<String> = w
            .procs
            .keys()
            .filter(|m| m.starts_with(prefix))
            .cloned()
            .collect();
        for h in w.hosts.values() {
            for n in h.sent.keys().chain(h.stopping.iter()) {
                if let Some((m, _)) = parse_proc_name(n)
                    && m.starts_with(prefix)
                {
                    ids.push(m.to_string());
                }
            }
        }
        ids.sort();
        ids.dedup();
        ids
    }

    /// Whether any proc of `mesh_id` has not ended.
    pub fn procs_running(&self, world: &WorldKey, mesh_id: &str) -> bool {
        self.proc_states(world, mesh_id)
            .values()
            .any(|o| live(o.state))
    }
}
