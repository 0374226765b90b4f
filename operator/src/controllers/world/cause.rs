//! Whose fault each troubled host is (`hostmesh_crds::cause`), written on
//! its `status.hosts` entry for the World's `firstFailure` and for the
//! ProcMeshes whose procs it ran (`shared::cause` reads the facts).
//!
//! Invariants:
//! 1. A host is attributed when it failed (Failed, Expired), when its pod
//!    is gone or going without the operator having asked (deleted from
//!    outside, evicted, preempted), and whenever its pod reports a device
//!    Unhealthy, whatever its state: a proc failing there is the
//!    device's doing (`hostmesh_crds::cause` invariant 2).
//! 2. A pod is deleted from outside when it is terminating (or gone) while
//!    the World was Running, its host was Ready or NotReady, and nothing
//!    the operator deletes pods for applies: its template and token are
//!    current and this pass did not delete it.
//! 3. A gone host keeps the attribution it had while its pod terminates
//!    and until its replacement starts, so a ProcMesh reconciling late
//!    still reads why its procs were lost.
//! 4. A host counts as a new failure once, in the pass that first
//!    attributes it in a failed or gone state ([`attribute`]'s result).

use hostmesh_crds::Rank;
use hostmesh_crds::cause::{Attribution, FailureCause, reasons};
use hostmesh_crds::runs;
use hostmesh_crds::world::{HostState, HostStatus, WorldPhase, WorldStatus};
use k8s_openapi::api::core::v1::Pod;

use super::desired::{ANNOTATION_SECRET_HASH, ANNOTATION_TEMPLATE_HASH};
use super::plan::PlanInput;
use crate::controllers::shared::cause;

/// Whether `state` is a failure or a loss of the host.
fn down(state: HostState) -> bool {
    matches!(
        state,
        HostState::Failed | HostState::Expired | HostState::Terminating | HostState::Pending
    )
}

/// Sets `cause` and `evidence` on every host that needs them (invariants
/// 1-3) and returns the causes of the hosts that newly failed in this pass
/// (invariant 4), for `hostmesh_failures_total`. `deleting` is what this
/// pass deletes.
pub(super) fn attribute(
    input: &PlanInput<'_>,
    prev: &WorldStatus,
    hosts: &mut [HostStatus],
    deleting: &[String],
) -> Vec<FailureCause> {
    let host_container = host_container(input);
    let mut fresh = Vec::new();
    for (r, h) in hosts.iter_mut().enumerate() {
        let before = runs::get(&prev.hosts, r);
        let Some(a) = of_host(input, prev, r, h, deleting, &host_container) else {
            continue;
        };
        let newly = down(h.state) && before.is_none_or(|b| !down(b.state) || b.cause.is_none());
        if newly {
            fresh.push(a.cause);
        }
        h.cause = Some(a.cause);
        h.evidence = Some(a.evidence);
    }
    fresh
}

/// Whose fault host `r` (observed as `h`) is, if it needs an attribution
/// (invariants 1-3): what [`attribute`] writes, and what
/// `failurePolicy.rules` with `causes` match (`rules.rs`).
pub(super) fn of_host(
    input: &PlanInput<'_>,
    prev: &WorldStatus,
    r: Rank,
    h: &HostStatus,
    deleting: &[String],
    host_container: &str,
) -> Option<Attribution> {
    let pod = input.pods.get(&r).map(|p| &**p);
    let before = runs::get(&prev.hosts, r);
    match h.state {
        HostState::Failed | HostState::Expired => Some(failed(input, r, h, pod, host_container)),
        HostState::Terminating | HostState::Pending => {
            let outside = pod.and_then(cause::of_pod).or_else(|| {
                deleted_from_outside(input, prev, r, pod, deleting).then(|| {
                    Attribution::infrastructure(
                        reasons::POD_DELETED,
                        format!(
                            "host pod {} was deleted by someone other than hostmesh",
                            pod_name(input, r, pod)
                        ),
                    )
                })
            });
            // Invariant 3: the attribution of a host on its way out.
            outside.or_else(|| {
                before
                    .filter(|b| down(b.state))
                    .and_then(|b| Some(attribution_of(b.cause?, b.evidence.clone()?)))
            })
        }
        _ => pod.and_then(cause::unhealthy_device),
    }
}

fn attribution_of(cause: FailureCause, evidence: hostmesh_crds::cause::Evidence) -> Attribution {
    Attribution { cause, evidence }
}

/// Whose fault a Failed or Expired host is: what Kubernetes recorded on
/// its pod, its Monarch worker's end, its container's end, else its state.
fn failed(
    input: &PlanInput<'_>,
    r: Rank,
    h: &HostStatus,
    pod: Option<&Pod>,
    host_container: &str,
) -> Attribution {
    if let Some(a) = pod.and_then(cause::of_pod) {
        return a;
    }
    if input.world.spec.monarch.is_some()
        && let Some(a) = (input.monarch_worker)(r)
            .as_ref()
            .and_then(super::worker::attribution)
    {
        return a;
    }
    if h.state == HostState::Failed
        && let Some(c) = pod.and_then(super::observe::failed_container)
    {
        return cause::of_container_end(&c, host_container);
    }
    let name = pod_name(input, r, pod);
    let why = h.reason.as_deref().unwrap_or("no reason");
    match h.state {
        HostState::Expired => Attribution::infrastructure(
            reasons::AGENT_UNREACHABLE,
            format!(
                "the agent of {name} stopped answering ({why}): it crashed or was killed, its node is NotReady or lost, or the network is cut"
            ),
        ),
        _ if why == "AgentExited" => Attribution::infrastructure(
            reasons::AGENT_EXITED,
            format!("the hostmesh agent of {name} exited"),
        ),
        _ => Attribution::infrastructure(
            reasons::POD_FAILED,
            format!("host pod {name} failed: {why}"),
        ),
    }
}

/// Invariant 2.
fn deleted_from_outside(
    input: &PlanInput<'_>,
    prev: &WorldStatus,
    r: Rank,
    pod: Option<&Pod>,
    deleting: &[String],
) -> bool {
    let was_serving = runs::get(&prev.hosts, r)
        .is_some_and(|b| matches!(b.state, HostState::Ready | HostState::NotReady));
    if prev.phase != Some(WorldPhase::Running) || !was_serving {
        return false;
    }
    let Some(pod) = pod else {
        // Gone at once (a force deletion) while it was serving.
        return true;
    };
    let annotation = |k: &str| {
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .map(String::as_str)
    };
    let current = annotation(ANNOTATION_TEMPLATE_HASH) == Some(input.hash)
        && annotation(ANNOTATION_SECRET_HASH).is_none_or(|h| input.holds_current_token(h));
    let ours = pod
        .metadata
        .name
        .as_ref()
        .is_some_and(|n| deleting.contains(n));
    current && !ours
}

fn pod_name(input: &PlanInput<'_>, r: Rank, pod: Option<&Pod>) -> String {
    pod.and_then(|p| p.metadata.name.clone())
        .unwrap_or_else(|| super::desired::pod_name(&kube::ResourceExt::name_any(input.world), r))
}

pub(super) fn host_container(input: &PlanInput<'_>) -> String {
    host_container_name(&input.world.spec)
}

/// The name of the host container in the World's template (the agent runs
/// in it).
pub(super) fn host_container_name(spec: &hostmesh_crds::WorldSpec) -> String {
    let containers = spec
        .template
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    containers
        .get(super::desired::host_container_index(containers))
        .map_or_else(|| "host".to_string(), |c| c.name.clone())
}
