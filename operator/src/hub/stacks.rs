//! Stack capture through the hub: asks every host's agent for the stacks
//! of the given ranks of one proc mesh, all hosts at once.
//!
//! Invariants:
//! 1. Bounded in time: each agent gets `timeout` (plus its call timeout);
//!    a host that does not answer yields an error per rank, never a hang.
//! 2. The hub's lock is not held across the requests (hub invariant 4).

use hostmesh_crds::Rank;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::{AgentLink, Hub, WorldKey, proc_name};

/// The stacks of one rank, or why there are none.
pub type RankStacks = Result<super::protocol::ProcStacks, String>;

impl Hub {
    /// The stacks of `ranks` of `mesh_id`, by rank, each at most
    /// `max_bytes`. A rank whose host is unknown or unreachable has an
    /// error (invariants 1-2).
    pub async fn capture_stacks(
        &self,
        world: &WorldKey,
        mesh_id: &str,
        ranks: &[Rank],
        max_bytes: usize,
        timeout: Duration,
    ) -> BTreeMap<Rank, RankStacks> {
        let mut out = BTreeMap::new();
        let mut by_host: BTreeMap<Rank, (Arc<dyn AgentLink>, Vec<Rank>)> = BTreeMap::new();
        {
            let st = self.lock();
            let Some(w) = st.worlds.get(world) else {
                return ranks
                    .iter()
                    .map(|r| (*r, Err("the operator does not know this World".into())))
                    .collect();
            };
            let procs = w.procs.get(mesh_id);
            for r in ranks {
                let host = procs.and_then(|p| p.get(r)).map(|o| o.host);
                match host.and_then(|h| Some((h, w.hosts.get(&h)?.link.clone()?))) {
                    Some((h, link)) => by_host
                        .entry(h)
                        .or_insert_with(|| (link, Vec::new()))
                        .1
                        .push(*r),
                    None => {
                        out.insert(*r, Err("its host's agent is not connected".to_string()));
                    }
                }
            }
        }
        let asks = by_host.into_iter().map(|(host, (link, ranks))| async move {
            let names = ranks.iter().map(|r| proc_name(mesh_id, *r)).collect();
            let got = link.capture_stacks(names, max_bytes, timeout).await;
            (host, ranks, got)
        });
        for (host, ranks, got) in futures::future::join_all(asks).await {
            match got {
                Ok(stacks) => {
                    let mut stacks: BTreeMap<Rank, _> = stacks
                        .into_iter()
                        .filter_map(|s| Some((super::parse_proc_name(&s.name)?.1, s)))
                        .collect();
                    for r in ranks {
                        let got = stacks
                            .remove(&r)
                            .ok_or_else(|| format!("host {host}'s agent sent none"));
                        out.insert(r, got);
                    }
                }
                Err(e) => {
                    for r in ranks {
                        out.insert(r, Err(format!("host {host}: {e}")));
                    }
                }
            }
        }
        out
    }
}
