//! The ProcMesh incident timeline (`status.incidents`,
//! `hostmesh_crds::incident`): opening an incident at a failure, refining
//! its root when an earlier failure's report arrives late, and stamping the
//! recovery phases as the plan sees them happen. Pure: the plan calls it
//! with its `now`, and it returns the phase durations that completed, for
//! `hostmesh_recovery_seconds{phase}`.
//!
//! Invariants:
//! 1. Only the last incident is open (not closed, see
//!    `Incident::closed`); a failure joins it while it is undecided or
//!    within the cascade window of its root, else it opens a new one.
//! 2. Each phase time is set once, in order (decided, pods ready, procs
//!    running), so each phase duration is reported exactly once per
//!    incident by the plan that set it.
//! 3. A refined root only moves `failedAt` earlier; `detectedAt` keeps the
//!    first detection, so the times stay monotonic.
//! 4. A failure that happened before the last incident's restart was
//!    decided, within its root's cascade window, joins it even once it has
//!    closed: it is the same crash, reported late (a second host's agent
//!    back after the first host's procs already ran again). Its phases are
//!    kept as stamped (invariant 2): `procsRunningAt` is when every proc
//!    was first seen running after the decision.

use hostmesh_crds::Rank;
use std::time::Duration;

use hostmesh_crds::incident::{self, Incident, IncidentAction};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime as Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::causal::{CASCADE_WINDOW, Failure};

/// Phase names of `hostmesh_recovery_seconds{phase}`.
pub const PHASES: [&str; 5] = ["detect", "decide", "pods", "procs", "total"];

/// A completed recovery phase and how long it took.
pub type PhaseTime = (&'static str, Duration);

fn secs(from: &Time, to: &Time) -> Duration {
    Duration::try_from(to.0.duration_since(from.0)).unwrap_or_default()
}

/// `t` cut to the microsecond, as status keeps it.
pub fn micro(t: Timestamp) -> Timestamp {
    Timestamp::from_microsecond(t.as_microsecond()).unwrap_or(t)
}

fn open(ring: &mut [Incident]) -> Option<&mut Incident> {
    ring.last_mut().filter(|i| !i.closed())
}

/// Records the root failure `root` of what is failing now (described as
/// `cause`, with `collateral` collateral failures): it joins the open
/// incident (or the closed one it belongs to, invariant 4) or opens a new
/// one (invariant 1), and refines the root when it is earlier (invariant 3). With `may_open` false (the mesh has ended) it
/// only refines the last incident, when `root` falls in its window. Returns
/// the incident's root (rank, time).
pub fn on_failure(
    ring: &mut Vec<Incident>,
    root: &Failure,
    cause: &str,
    collateral: Rank,
    may_open: bool,
) -> Option<(Rank, Timestamp)> {
    let window = SignedDuration::try_from(CASCADE_WINDOW).unwrap_or(SignedDuration::MAX);
    let target = if may_open {
        ring.last_mut().filter(|i| {
            let within = root.at <= i.failed_at.0 + window;
            if i.closed() {
                i.action != Some(IncidentAction::GaveUp)
                    && within
                    && i.decided_at.as_ref().is_some_and(|d| root.at <= d.0)
            } else {
                i.decided_at.is_none() || within
            }
        })
    } else {
        ring.last_mut()
            .filter(|i| root.at <= i.failed_at.0 + window)
    };
    if let Some(i) = target {
        if root.rank != i.rank && root.at < i.failed_at.0 {
            i.failed_at = Time(micro(root.at));
            i.rank = root.rank;
            i.root_cause =
                hostmesh_crds::procmesh::head(cause, incident::MAX_ROOT_CAUSE).to_string();
        }
        i.collateral = i.collateral.max(collateral);
        return Some((i.rank, i.failed_at.0));
    }
    if !may_open {
        return None;
    }
    incident::push(
        ring,
        Incident {
            failed_at: Time(micro(root.at)),
            detected_at: Time(micro(root.detected.max(root.at))),
            decided_at: None,
            pods_ready_at: None,
            procs_running_at: None,
            action: None,
            rank: root.rank,
            root_cause: cause.to_string(),
            collateral,
            cause: None,
            evidence: None,
        },
    );
    Some((root.rank, micro(root.at)))
}

/// The restart policy acted on the open incident: `action` at `now`.
pub fn on_decision(
    ring: &mut [Incident],
    action: IncidentAction,
    now: Timestamp,
) -> Vec<PhaseTime> {
    let Some(i) = open(ring).filter(|i| i.decided_at.is_none()) else {
        return Vec::new();
    };
    let t = Time(micro(now).max(i.detected_at.0));
    i.decided_at = Some(t.clone());
    i.action = Some(action);
    vec![
        ("detect", secs(&i.failed_at, &i.detected_at)),
        ("decide", secs(&i.detected_at, &t)),
    ]
}

/// Recovery progress of the open, decided incident at `now`: every host
/// ready (`hosts_ready`), then every proc running (`procs_running`).
pub fn on_progress(
    ring: &mut [Incident],
    hosts_ready: bool,
    procs_running: bool,
    now: Timestamp,
) -> Vec<PhaseTime> {
    let mut out = Vec::new();
    let Some(i) = open(ring) else {
        return out;
    };
    let Some(decided) = i.decided_at.clone() else {
        return out;
    };
    if i.pods_ready_at.is_none() && hosts_ready {
        let t = Time(micro(now).max(decided.0));
        out.push(("pods", secs(&decided, &t)));
        i.pods_ready_at = Some(t);
    }
    if let Some(pods) = i.pods_ready_at.clone()
        && procs_running
    {
        let t = Time(micro(now).max(pods.0));
        out.push(("procs", secs(&pods, &t)));
        out.push(("total", secs(&i.failed_at, &t)));
        i.procs_running_at = Some(t);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostmesh_crds::procmesh::RankStatus;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(1_700_000_000_000 + ms).unwrap()
    }

    fn failure(rank: Rank, ms: i64, detected: i64) -> Failure {
        Failure {
            rank,
            at: at(ms),
            detected: at(detected),
            timed: true,
            status: RankStatus::default(),
            oom_killed: false,
        }
    }

    fn monotonic(i: &Incident) -> bool {
        let mut times = vec![i.failed_at.0, i.detected_at.0];
        times.extend(
            [&i.decided_at, &i.pods_ready_at, &i.procs_running_at]
                .into_iter()
                .flatten()
                .map(|t| t.0),
        );
        times.windows(2).all(|w| w[0] <= w[1])
    }

    #[test]
    fn a_late_root_refines_the_incident_and_phases_come_once_in_order() {
        let mut ring = Vec::new();
        // A collateral failure is reported first...
        assert_eq!(
            on_failure(&mut ring, &failure(1, 50, 60), "rank 1 exited 1", 6, true),
            Some((1, at(50)))
        );
        // ...the restart policy acts...
        let p = on_decision(&mut ring, IncidentAction::RestartGang, at(70));
        assert_eq!(
            p.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            ["detect", "decide"]
        );
        assert!(
            on_decision(&mut ring, IncidentAction::GaveUp, at(80)).is_empty(),
            "once"
        );
        // ...then the root's delayed report: the same incident, refined.
        assert_eq!(
            on_failure(&mut ring, &failure(5, 0, 560), "rank 5 SIGKILL", 7, true),
            Some((5, at(0)))
        );
        assert_eq!(ring.len(), 1);
        assert_eq!((ring[0].rank, ring[0].collateral), (5, 7));
        assert_eq!(ring[0].detected_at.0, at(60), "first detection kept");
        assert!(monotonic(&ring[0]));
        assert!(on_progress(&mut ring, false, false, at(900)).is_empty());
        let p = on_progress(&mut ring, true, false, at(1000));
        assert_eq!(p, vec![("pods", Duration::from_millis(930))]);
        let p = on_progress(&mut ring, true, true, at(3000));
        assert_eq!(
            p.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            ["procs", "total"]
        );
        assert_eq!(p[1].1, Duration::from_secs(3));
        assert!(ring[0].closed() && monotonic(&ring[0]));
        assert!(
            on_progress(&mut ring, true, true, at(4000)).is_empty(),
            "closed"
        );
    }

    #[test]
    fn a_failure_after_the_window_of_a_decided_incident_is_a_new_one() {
        let mut ring = Vec::new();
        on_failure(&mut ring, &failure(1, 0, 1), "a", 0, true);
        on_decision(&mut ring, IncidentAction::RestartRanks, at(2));
        on_failure(&mut ring, &failure(2, 5_000, 5_001), "b", 0, true);
        assert_eq!(ring.len(), 1, "inside the window: the same cascade");
        on_failure(&mut ring, &failure(3, 60_000, 60_001), "c", 0, true);
        assert_eq!(ring.len(), 2);
        assert_eq!(ring[1].rank, 3);
        // An ended mesh only refines: nothing new opens.
        on_decision(&mut ring, IncidentAction::GaveUp, at(60_002));
        assert_eq!(
            on_failure(&mut ring, &failure(4, 600_000, 600_001), "d", 0, false),
            None
        );
        assert_eq!(
            on_failure(&mut ring, &failure(4, 59_000, 600_001), "d", 0, false),
            Some((4, at(59_000))),
            "an earlier root of the last incident, reported late"
        );
        assert_eq!(ring.len(), 2);
    }

    #[test]
    fn a_late_report_of_a_failure_before_the_decision_joins_the_closed_incident() {
        let mut ring = Vec::new();
        on_failure(&mut ring, &failure(0, 0, 5_000), "host 0 lost", 0, true);
        on_decision(&mut ring, IncidentAction::RestartRanks, at(5_001));
        on_progress(&mut ring, true, true, at(5_010));
        assert!(ring[0].closed());
        // Host 1's agent, back 20 ms later, reports a loss from before the
        // decision: the same crash.
        assert_eq!(
            on_failure(&mut ring, &failure(2, 20, 5_020), "host 1 lost", 0, true),
            Some((0, at(0)))
        );
        assert_eq!(ring.len(), 1);
        assert!(ring[0].closed() && monotonic(&ring[0]), "phases as stamped");
        // A failure after the decision is a new incident, even in the window.
        on_failure(
            &mut ring,
            &failure(3, 5_002, 5_030),
            "rank 3 exited",
            0,
            true,
        );
        assert_eq!(ring.len(), 2);
        // A given-up incident is never joined.
        on_decision(&mut ring, IncidentAction::GaveUp, at(5_040));
        on_failure(
            &mut ring,
            &failure(1, 5_003, 5_050),
            "rank 1 exited",
            0,
            true,
        );
        assert_eq!(ring.len(), 3);
    }

    #[test]
    fn giving_up_closes_and_the_ring_stays_bounded() {
        let mut ring = Vec::new();
        for k in 0..40 {
            let f = failure(k, k as i64 * 100_000, k as i64 * 100_000);
            on_failure(&mut ring, &f, &"x".repeat(10_000), 0, true);
            on_decision(
                &mut ring,
                IncidentAction::GaveUp,
                at(k as i64 * 100_000 + 5),
            );
            assert!(ring.last().unwrap().closed());
        }
        assert_eq!(ring.len(), incident::MAX_INCIDENTS);
        assert_eq!(ring[0].rank, 40 - incident::MAX_INCIDENTS);
        assert!(
            ring.iter()
                .all(|i| i.root_cause.len() <= incident::MAX_ROOT_CAUSE && monotonic(i))
        );
    }
}
