//! `status.actorFailures`: the failures of actors inside runtime-aware
//! procs, as their agents report them, merged into a bounded list (pure, no
//! I/O).
//!
//! Invariants:
//! 1. One entry per (rank, incarnation): the first actor failure of that
//!    proc incarnation, with the count of failures so far.
//! 2. Entries are kept earliest first (the agent's clock) and never
//!    reordered; at most [`MAX_ACTOR_FAILURES`] are kept, so the first
//!    failures, the likely root causes, survive later ones.
//! 3. A new entry is returned separately, once, so the controller emits one
//!    Event per failure.

use hostmesh_crds::Rank;
use std::collections::BTreeMap;

use hostmesh_crds::procmesh::{ActorFailure, MAX_ACTOR_FAILURES, MAX_REASON, head};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::hub::ProcObs;

/// `prev` with what `states` (by rank) report added (invariants 1-2), and
/// the entries that are new (invariant 3).
pub fn merge(
    prev: &[ActorFailure],
    states: &BTreeMap<Rank, ProcObs>,
) -> (Vec<ActorFailure>, Vec<ActorFailure>) {
    let mut all = prev.to_vec();
    let mut fresh = Vec::new();
    let mut reported: Vec<ActorFailure> = states
        .iter()
        .filter_map(|(rank, o)| {
            let f = o.actor_failure.as_ref()?;
            let ms = i64::try_from(f.at_ms).unwrap_or(i64::MAX);
            Some(ActorFailure {
                rank: *rank,
                host: o.host,
                actor: head(&f.actor, MAX_REASON).to_string(),
                reason: head(&f.reason, MAX_REASON).to_string(),
                time: Time(Timestamp::from_millisecond(ms).unwrap_or(Timestamp::UNIX_EPOCH)),
                incarnation: o.incarnation,
                count: o.actor_failures.max(1),
            })
        })
        .collect();
    reported.sort_by_key(|f| (f.time.0, f.rank));
    for f in reported {
        let known = all
            .iter_mut()
            .find(|e| e.rank == f.rank && e.incarnation == f.incarnation);
        if let Some(e) = known {
            e.count = e.count.max(f.count);
        } else if all.len() < MAX_ACTOR_FAILURES {
            all.push(f.clone());
            fresh.push(f);
        }
    }
    (all, fresh)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostmesh_agent::protocol::FailedActor as Reported;
    use hostmesh_crds::procmesh::ProcState;

    fn obs(inc: u32, failure: Option<(&str, u64)>, count: u32) -> ProcObs {
        ProcObs {
            host: 1,
            state: ProcState::Running,
            incarnation: inc,
            actor_failure: failure.map(|(actor, at_ms)| Reported {
                actor: actor.to_string(),
                reason: "panicked: boom".to_string(),
                at_ms,
            }),
            actor_failures: count,
            ..Default::default()
        }
    }

    #[test]
    fn first_failure_per_incarnation_is_kept_counted_and_new_once() {
        let states = BTreeMap::from([
            (5, obs(0, Some(("p.5/echo[0]", 2_000)), 1)),
            (3, obs(0, Some(("p.3/echo[0]", 1_000)), 1)),
            (4, obs(0, None, 0)),
        ]);
        let (all, fresh) = merge(&[], &states);
        assert_eq!(all.len(), 2);
        assert_eq!(
            (all[0].rank, all[0].actor.as_str()),
            (3, "p.3/echo[0]"),
            "earliest first"
        );
        assert_eq!(all[0].host, 1);
        assert_eq!(all[0].reason, "panicked: boom");
        assert_eq!(fresh.len(), 2);
        // The same report again: nothing new; a later count is taken.
        let states = BTreeMap::from([(3, obs(0, Some(("p.3/echo[0]", 1_000)), 3))]);
        let (again, fresh) = merge(&all, &states);
        assert!(fresh.is_empty());
        assert_eq!(again[0].count, 3);
        assert_eq!(again.len(), 2);
        // A restarted proc's failure is a new entry.
        let states = BTreeMap::from([(3, obs(1, Some(("p.3/echo[0]", 9_000)), 1))]);
        let (after, fresh) = merge(&again, &states);
        assert_eq!(after.len(), 3);
        assert_eq!(fresh[0].incarnation, 1);
    }

    #[test]
    fn the_list_is_bounded_and_keeps_the_first() {
        let states: BTreeMap<Rank, ProcObs> = (0..40)
            .map(|r| (r, obs(0, Some(("a", 1_000 + r as u64)), 1)))
            .collect();
        let (all, fresh) = merge(&[], &states);
        assert_eq!(all.len(), MAX_ACTOR_FAILURES);
        assert_eq!(fresh.len(), MAX_ACTOR_FAILURES);
        assert_eq!(all[0].rank, 0);
        assert_eq!(all.last().unwrap().rank, MAX_ACTOR_FAILURES - 1);
    }
}
