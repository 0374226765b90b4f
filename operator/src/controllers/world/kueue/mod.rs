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

pub mod sync;
pub mod workload;

pub use workload::{Placement, Verdict};
