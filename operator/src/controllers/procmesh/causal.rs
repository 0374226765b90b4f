//! Which failure came first, and which followed from it: the root of a
//! cascade is the earliest failure on the agents' corrected clocks
//! (`hub::clock`), not the first report to arrive; a later failure of another
//! rank within [`CASCADE_WINDOW`] of the root is collateral.
//!
//! Invariants:
//! 1. The root is the failure with the earliest time, ties broken by the
//!    lower rank, so the choice does not depend on arrival order.
//! 2. Only failures an agent timed can be collateral: a lost host's ranks
//!    are timed when its agent was last heard (they died after it), a
//!    timed-out rank when the operator noticed; neither orders them
//!    exactly. A lost host can still be a root.
//! 3. The window is fixed and measured on the corrected clock from the
//!    root's time: `root.at <= f.at <= root.at + CASCADE_WINDOW`.

use hostmesh_crds::Rank;
use std::time::Duration;

use hostmesh_crds::procmesh::RankStatus;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Failures of other ranks this soon after the root are its collateral.
/// Long enough for a collective's peers to notice a dead rank (NCCL and
/// Gloo report a reset connection within seconds), short enough that an
/// unrelated failure minutes later is its own root.
pub const CASCADE_WINDOW: Duration = Duration::from_secs(10);

/// One failed rank as the plan sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// The proc rank.
    pub rank: Rank,
    /// When it failed (corrected agent clock, else when noticed).
    pub at: Timestamp,
    /// When the operator first received it.
    pub detected: Timestamp,
    /// Whether `at` is an agent's time (invariant 2).
    pub timed: bool,
    /// Its status (for its description).
    pub status: RankStatus,
    /// Killed by the OOM killer.
    pub oom_killed: bool,
}

/// The root among `failures` (invariant 1).
pub fn root(failures: &[Failure]) -> Option<&Failure> {
    failures.iter().min_by_key(|f| (f.at, f.rank))
}

/// Whether `f` is collateral of a root `root_rank` that failed at `root_at`
/// (invariants 2 and 3).
pub fn is_collateral(root_rank: Rank, root_at: Timestamp, f: &Failure) -> bool {
    let window = SignedDuration::try_from(CASCADE_WINDOW).unwrap_or(SignedDuration::MAX);
    f.rank != root_rank && f.timed && f.at >= root_at && f.at <= root_at + window
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(1_700_000_000_000 + ms).unwrap()
    }

    fn failure(rank: Rank, ms: i64, timed: bool) -> Failure {
        Failure {
            rank,
            at: at(ms),
            detected: at(ms + 1),
            timed,
            status: RankStatus::default(),
            oom_killed: false,
        }
    }

    #[test]
    fn the_root_is_the_earliest_whatever_the_order() {
        // Rank 5 died first; the others 50 ms later, reported first.
        let mut fs: Vec<Failure> = (0..8)
            .filter(|r| *r != 5)
            .map(|r| failure(r, 50, true))
            .collect();
        fs.push(failure(5, 0, true));
        assert_eq!(root(&fs).unwrap().rank, 5);
        fs.reverse();
        assert_eq!(root(&fs).unwrap().rank, 5);
        // Equal times: the lower rank.
        assert_eq!(
            root(&[failure(3, 0, true), failure(2, 0, true)])
                .unwrap()
                .rank,
            2
        );
        assert!(root(&[]).is_none());
    }

    #[test]
    fn collateral_is_another_timed_rank_inside_the_window() {
        let r = at(0);
        assert!(is_collateral(5, r, &failure(1, 50, true)));
        assert!(is_collateral(5, r, &failure(1, 10_000, true)));
        assert!(!is_collateral(5, r, &failure(1, 10_001, true)), "too late");
        assert!(
            !is_collateral(5, r, &failure(5, 50, true)),
            "the root itself"
        );
        assert!(!is_collateral(5, r, &failure(1, 50, false)), "untimed");
        assert!(
            !is_collateral(5, r, &failure(1, -1, true)),
            "before the root"
        );
    }
}
