//! A MonarchMesh's status, computed as plain data from the mesh and its
//! World: monarch-kubernetes' `replicas`, `readyReplicas` and `Ready`
//! condition, then the World's health.
//!
//! Invariants:
//! 1. `Ready` is True exactly when the World runs (`phase: Running`) with
//!    `spec.replicas` ready hosts; its reasons are monarch-kubernetes'
//!    `AllReady` and `Waiting`, or `InvalidSpec` / `WorldConflict` when
//!    this controller cannot run the mesh.
//! 2. The World's other conditions are copied as they are (type, status,
//!    reason, message, times); a condition the World no longer has goes.
//! 3. `lastTransitionTime` of `Ready` is kept while its status holds
//!    ([`hostmesh_crds::conditions::set`]).

use hostmesh_crds::World;
use hostmesh_crds::conditions::{self, READY};
use hostmesh_crds::monarchmesh::{MonarchMesh, MonarchMeshStatus};
use hostmesh_crds::world::WorldPhase;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;

/// `Ready` reason: every replica is ready.
pub const ALL_READY: &str = "AllReady";
/// `Ready` reason: waiting for replicas.
pub const WAITING: &str = "Waiting";
/// `Ready` reason: the spec is invalid; the message names the field.
pub const INVALID_SPEC: &str = "InvalidSpec";
/// `Ready` reason: a World of the same name belongs to someone else.
pub const WORLD_CONFLICT: &str = "WorldConflict";

/// The status of `mesh` run by `world` (invariants 1-3).
pub fn from_world(mesh: &MonarchMesh, world: &World, now: &Time) -> MonarchMeshStatus {
    let old = mesh.status.clone().unwrap_or_default();
    let ws = world.status.clone().unwrap_or_default();
    let want = mesh.spec.replicas;
    let ready = i32::try_from(ws.ready_hosts).unwrap_or(i32::MAX);
    let running = ws.phase == Some(WorldPhase::Running);
    let all_ready =
        running && ready == want && usize::try_from(want).is_ok_and(|w| ws.desired_hosts == w);
    let mut conds: Vec<_> = old
        .conditions
        .into_iter()
        .filter(|c| c.type_ == READY)
        .collect();
    let message = if all_ready {
        format!("{ready}/{want} Monarch workers ready")
    } else {
        let why = conditions::get(&ws.conditions, READY)
            .map(|c| c.message.clone())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| {
                format!(
                    "World {} is {}",
                    world.name_any(),
                    ws.phase.map_or("starting", WorldPhase::as_str)
                )
            });
        format!("{ready}/{want} Monarch workers ready: {why}")
    };
    let reason = if all_ready { ALL_READY } else { WAITING };
    let generation = mesh.metadata.generation;
    conditions::set(
        &mut conds, READY, all_ready, reason, &message, generation, now,
    );
    conds.extend(ws.conditions.into_iter().filter(|c| c.type_ != READY));
    MonarchMeshStatus {
        replicas: i32::try_from(ws.desired_hosts).unwrap_or(i32::MAX),
        ready_replicas: ready,
        conditions: conds,
        ready: Some(format!("{ready}/{want}")),
        phase: ws.phase,
        world: Some(world.name_any()),
        hosts: ws.hosts,
        restarts: ws.restarts,
        first_failure: ws.first_failure,
        observed_generation: generation,
    }
}

/// The status of a mesh this controller cannot run: `Ready` False with
/// `reason` and `message`; the rest kept from before.
pub fn blocked(mesh: &MonarchMesh, reason: &str, message: &str, now: &Time) -> MonarchMeshStatus {
    let mut status = mesh.status.clone().unwrap_or_default();
    let generation = mesh.metadata.generation;
    conditions::set(
        &mut status.conditions,
        READY,
        false,
        reason,
        message,
        generation,
        now,
    );
    status.ready = Some(format!("{}/{}", status.ready_replicas, mesh.spec.replicas));
    status.observed_generation = generation;
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::monarchmesh::desired::tests::mk_mesh;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn world(status: serde_json::Value) -> World {
        serde_json::from_value(json!({
            "apiVersion": "hostmesh.dev/v1alpha1", "kind": "World",
            "metadata": {"name": "trainer", "namespace": "ns"},
            "spec": {"hosts": 2, "template": {"spec": {"containers": []}}},
            "status": status,
        }))
        .unwrap()
    }

    fn t(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn running_world_with_all_hosts_is_ready() {
        let w = world(json!({
            "phase": "Running", "readyHosts": 2, "desiredHosts": 2, "restarts": 1,
            "hosts": [{"start": 0, "count": 2, "state": "Ready"}],
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "AllHostsReady", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Degraded", "status": "False", "reason": "Healthy", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ],
        }));
        let s = from_world(&mk_mesh("trainer"), &w, &t(10));
        assert_eq!((s.replicas, s.ready_replicas), (2, 2));
        assert_eq!(s.ready.as_deref(), Some("2/2"));
        assert_eq!(s.phase, Some(WorldPhase::Running));
        assert_eq!(s.restarts, 1);
        assert_eq!(s.hosts.len(), 1);
        assert_eq!(s.observed_generation, Some(3));
        let types: Vec<&str> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Ready", "Degraded"]);
        assert_eq!(s.conditions[0].status, "True");
        assert_eq!(s.conditions[0].reason, ALL_READY);
    }

    #[test]
    fn degraded_world_is_waiting_with_its_failure_and_keeps_transition_time() {
        let w = world(json!({
            "phase": "Degraded", "readyHosts": 1, "desiredHosts": 2,
            "firstFailure": {"rank": 1, "pod": "trainer-host-1", "time": "2026-01-01T00:00:00Z",
                              "reason": "Monarch worker killed by signal 9", "signal": 9},
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "HostsNotReady", "message": "host 1 Failed", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ],
        }));
        let mut mesh = mk_mesh("trainer");
        let s = from_world(&mesh, &w, &t(10));
        assert_eq!(s.conditions[0].status, "False");
        assert_eq!(s.conditions[0].reason, WAITING);
        assert!(
            s.conditions[0].message.contains("1/2")
                && s.conditions[0].message.contains("host 1 Failed"),
            "{}",
            s.conditions[0].message
        );
        assert_eq!(s.first_failure.as_ref().unwrap().signal, Some(9));
        assert_eq!(s.conditions.len(), 1, "the World's Ready is not copied");
        mesh.status = Some(s);
        let again = from_world(&mesh, &w, &t(20));
        assert_eq!(again.conditions[0].last_transition_time, t(10));
    }

    #[test]
    fn world_without_status_and_blocked_meshes() {
        let mesh = mk_mesh("trainer");
        let s = from_world(&mesh, &world(json!({})), &t(1));
        assert_eq!((s.replicas, s.ready_replicas), (0, 0));
        assert!(
            s.conditions[0].message.contains("starting"),
            "{}",
            s.conditions[0].message
        );
        let b = blocked(&mesh, INVALID_SPEC, "spec.port: 26601 is ...", &t(1));
        assert_eq!(b.conditions[0].reason, INVALID_SPEC);
        assert!(b.conditions[0].message.starts_with("spec.port"));
        assert_eq!(b.ready.as_deref(), Some("0/2"));
    }
}
