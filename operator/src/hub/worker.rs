//! The hub's view of each host's Monarch worker (a World with
//! `spec.monarch`, docs/monarch.md): the agent's latest report of its proc
//! [`MONARCH_WORKER_PROC`], kept per host and read by the World controller.
//!
//! Invariants:
//! 1. A report belongs to the host entry of the pod whose agent sent it: a
//!    replaced pod starts with no report (the entry is new).
//! 2. A worker that ended wakes its World at once (an urgent trigger); any
//!    other change (it listens now) wakes it within the coalescing
//!    interval.

use hostmesh_crds::Rank;
use std::time::Instant;

use hostmesh_agent::contract::MONARCH_WORKER_PROC;

use super::{HostKey, Hub, State, WorldKey, protocol};

/// Whether `state` is the host's Monarch worker.
pub(super) fn is_worker(state: &protocol::ProcReport) -> bool {
    state.name == MONARCH_WORKER_PROC
}

/// Records a pushed worker state (invariant 2).
pub(super) fn record(st: &mut State, host: &HostKey, state: protocol::ProcReport, now: Instant) {
    let Some(h) = st
        .worlds
        .get_mut(&host.world)
        .and_then(|w| w.hosts.get_mut(&host.rank))
    else {
        return;
    };
    if h.worker.as_ref() == Some(&state) {
        return;
    }
    let urgent = state.status.is_terminal();
    h.worker = Some(state);
    st.world_triggers.mark(host.world.clone(), urgent, now);
}

/// Takes the worker's state from a Snapshot, if it has one.
pub(super) fn from_snapshot(
    st: &mut State,
    host: &HostKey,
    procs: &[protocol::ProcReport],
    now: Instant,
) {
    if let Some(w) = procs.iter().find(|p| is_worker(p)) {
        record(st, host, w.clone(), now);
    }
}

impl Hub {
    /// The Monarch worker of host `rank` in pod `pod_uid`, as its agent last
    /// reported it (invariant 1).
    pub fn monarch_worker(
        &self,
        world: &WorldKey,
        rank: Rank,
        pod_uid: &str,
    ) -> Option<protocol::ProcReport> {
        self.lock()
            .worlds
            .get(world)
            .and_then(|w| w.hosts.get(&rank))
            .filter(|h| h.pod_uid == pod_uid)
            .and_then(|h| h.worker.clone())
    }
}
