//! Kueue integration of the World, as an external framework of an
//! unmodified Kueue (docs/scheduling.md): the operator plays the part
//! Kueue's `jobframework` plays for its own job kinds.
//!
//! - [`workload`]: pure data: the `kueue.x-k8s.io/v1beta2` Workload a World
//!   asks for, what a Workload's status says ([`workload::Verdict`]), the
//!   placement its flavors give, and the status patch that gives the quota
//!   back after an eviction.
//! - [`sync`]: the I/O: create or replace the Workload, read the flavors,
//!   release the quota, and watch Workloads to wake the World controller.
//!
//! Invariants (cited in the code and tests as "kueue invariant N"):
//! 1. A World labelled `kueue.x-k8s.io/queue-name` runs only while its
//!    Workload is admitted (`Admitted=True`, `status.admission` set, not
//!    `Evicted`); otherwise it is held with the suspend path (phase
//!    `Suspended`, condition `Suspended=True` with a reason saying why),
//!    so its hosts stop gracefully and its status is kept.
//! 2. One Workload per World, owned by it (controller reference); a
//!    Workload whose pod set no longer matches the World (shape, template)
//!    is deleted and created again, so Kueue never runs a World on a stale
//!    admission.
//! 3. After an eviction the quota is given back only once no host pod of
//!    the World is left: `QuotaReserved=False` (reason `Pending`),
//!    `Admitted=False` (`NoReservation`), `Requeued` (True for `Preempted`
//!    and `NodeFailures`, as Kueue does), and `status.admission` removed.
//! 4. Admission places the hosts: the assigned flavors' `nodeLabels` become
//!    node selectors and their `tolerations` tolerations of every host pod
//!    (a flavor's label wins over the template's on the same key), plus
//!    what admission checks add (`podSetUpdates`: node selectors,
//!    tolerations, labels, annotations).
//! 5. `spec.suspend` of the World is the Workload's `spec.active` negated,
//!    so a suspended World gives its quota back (Kueue evicts it with
//!    reason `Deactivated`).
//! 6. An admitted World reports back as Kueue's own integrations do:
//!    `PodsReady` (for `waitForPodsReady`: `WaitForStart` until every host
//!    is first Ready, `Started`, then `WaitForRecovery`/`Recovered` around
//!    a lost host) and `Finished=True` once it finished (reason
//!    `Succeeded` or `Failed`, docs/api.md `finishWhen`), so Kueue gives
//!    its quota back either way. Read from the World's stored
//!    status, so a report lags the World by one reconcile at most.
//! 7. An admission with a `topologyAssignment` for the hosts (Kueue's
//!    topology-aware scheduling) hands the host pods to Kueue's
//!    TopologyUngater as its own integrations do: label
//!    `kueue.x-k8s.io/tas: "true"`, annotation `kueue.x-k8s.io/workload`
//!    and the scheduling gate `kueue.x-k8s.io/topology`. The ungater puts
//!    each pod in its domain (node selector, ordered by the pod set's
//!    `podIndexLabel`, `hostmesh.dev/rank`) and removes the gate; until
//!    then no kubelet runs it.

pub mod sync;
pub mod workload;

pub use workload::{Placement, Verdict, WorkloadProgress};

use hostmesh_crds::WorldStatus;
use hostmesh_crds::world::WorldPhase;

/// What a World's stored status tells its Workload (invariant 6).
pub fn progress(status: Option<&WorldStatus>) -> WorkloadProgress {
    let Some(s) = status else {
        return WorkloadProgress {
            all_ready: false,
            failed: None,
            succeeded: None,
        };
    };
    let failed = (s.phase == Some(WorldPhase::Failed)).then(|| {
        hostmesh_crds::conditions::get(&s.conditions, hostmesh_crds::conditions::FAILED)
            .map(|c| c.message.clone())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "the World failed".to_string())
    });
    let succeeded = (s.phase == Some(WorldPhase::Succeeded)).then(|| {
        hostmesh_crds::conditions::get(&s.conditions, hostmesh_crds::conditions::COMPLETE)
            .map(|c| c.message.clone())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "the World succeeded".to_string())
    });
    WorkloadProgress {
        all_ready: s.phase == Some(WorldPhase::Running)
            && s.desired_hosts > 0
            && s.ready_hosts == s.desired_hosts,
        failed,
        succeeded,
    }
}
