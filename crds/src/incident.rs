//! ProcMesh `status.incidents`: the timeline of recent failures and their
//! recoveries, as a ring.
//!
//! Invariants:
//! 1. At most [`MAX_INCIDENTS`] entries, oldest first; a new incident
//!    pushes out the oldest ([`push`]).
//! 2. Each entry is bounded in bytes: its root cause is cut to
//!    [`MAX_ROOT_CAUSE`] bytes, its evidence to
//!    [`crate::cause::MAX_EVIDENCE`], every other field is fixed-size.
//! 3. Times are `MicroTime`s (a phase often takes milliseconds; `Time`
//!    keeps whole seconds). The phase times, where set, never decrease in the order `failedAt`,
//!    `detectedAt`, `decidedAt`, `podsReadyAt`, `procsRunningAt`.

use hostmesh_mesh::Rank;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most incidents kept.
pub const MAX_INCIDENTS: usize = 16;
/// Most bytes of an incident's root cause.
pub const MAX_ROOT_CAUSE: usize = 256;

/// One failure of a ProcMesh and its recovery.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Incident {
    /// When the root failure happened: the agent's clock, corrected by its
    /// estimated offset (for a lost host, when its agent was last heard;
    /// for a spawn timeout, when the operator noticed).
    pub failed_at: MicroTime,
    /// When the operator first received the root failure.
    pub detected_at: MicroTime,
    /// When the restart policy acted (restarted, or gave up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<MicroTime>,
    /// When every host of the World was ready again after the decision
    /// (the decision time for an in-place restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_ready_at: Option<MicroTime>,
    /// When every proc was running again: the incident is over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub procs_running_at: Option<MicroTime>,
    /// What the restart policy did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<IncidentAction>,
    /// The rank that failed first.
    pub rank: Rank,
    /// Why it failed, decoded (at most [`MAX_ROOT_CAUSE`] bytes).
    pub root_cause: String,
    /// Later failures of other ranks within the cascade window.
    #[serde(default)]
    pub collateral: Rank,
    /// Whose fault the root failure was (`crate::cause`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<crate::cause::FailureCause>,
    /// The fact `cause` was read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<crate::cause::Evidence>,
}

/// What the restart policy did about an incident.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum IncidentAction {
    /// The failed ranks were restarted in place (`OnFailure`).
    RestartRanks,
    /// Every rank was restarted (`Gang`).
    RestartGang,
    /// The ProcMesh failed (`Never`, a permanent failure, or the restart
    /// limit).
    GaveUp,
}

impl IncidentAction {
    /// The action as written in status.
    pub fn as_str(self) -> &'static str {
        match self {
            IncidentAction::RestartRanks => "RestartRanks",
            IncidentAction::RestartGang => "RestartGang",
            IncidentAction::GaveUp => "GaveUp",
        }
    }
}

impl Incident {
    /// Whether the incident is over: procs running again, or given up.
    pub fn closed(&self) -> bool {
        self.procs_running_at.is_some() || self.action == Some(IncidentAction::GaveUp)
    }
}

/// Appends `incident` to the ring, dropping the oldest beyond
/// [`MAX_INCIDENTS`], its root cause cut to [`MAX_ROOT_CAUSE`] bytes.
pub fn push(ring: &mut Vec<Incident>, mut incident: Incident) {
    incident.root_cause = crate::procmesh::head(&incident.root_cause, MAX_ROOT_CAUSE).to_string();
    if let Some(e) = incident.evidence.as_mut() {
        e.message = crate::procmesh::head(&e.message, crate::cause::MAX_EVIDENCE).to_string();
    }
    ring.push(incident);
    if ring.len() > MAX_INCIDENTS {
        let extra = ring.len() - MAX_INCIDENTS;
        ring.drain(..extra);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn incident(i: Rank) -> Incident {
        let t = MicroTime(Timestamp::from_second(1_700_000_000 + i as i64).unwrap());
        Incident {
            failed_at: t.clone(),
            detected_at: t.clone(),
            decided_at: Some(t.clone()),
            pods_ready_at: Some(t.clone()),
            procs_running_at: Some(t),
            action: Some(IncidentAction::RestartGang),
            rank: i,
            root_cause: "x".repeat(100_000),
            collateral: Rank::MAX,
            cause: Some(crate::cause::FailureCause::User),
            evidence: Some(crate::cause::Evidence {
                reason: "PythonTraceback".into(),
                message: "x".repeat(crate::cause::MAX_EVIDENCE),
            }),
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_sixteen_within_bounds() {
        let mut ring = Vec::new();
        for i in 0..100 {
            push(&mut ring, incident(i));
        }
        assert_eq!(ring.len(), MAX_INCIDENTS);
        assert_eq!(ring[0].rank, 100 - MAX_INCIDENTS, "oldest dropped");
        assert_eq!(ring[MAX_INCIDENTS - 1].rank, 99);
        assert!(ring.iter().all(|i| i.root_cause.len() == MAX_ROOT_CAUSE));
        let bytes = serde_json::to_vec(&ring).unwrap().len();
        // Fixed fields plus the bounded cause and evidence: about 800 bytes each.
        assert!(bytes <= MAX_INCIDENTS * 900, "{bytes} bytes");
    }
}
