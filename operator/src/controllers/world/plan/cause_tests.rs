//! World plan tests of whose fault a host's failure was (`cause.rs`), from
//! YAML, no client.

use super::*;
use crate::controllers::world::observe::tests::{READY as POD_READY, mk_pod};
use hostmesh_crds::Rank;
use hostmesh_crds::cause::{FailureCause, reasons};

const WORLD: &str = "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {name: w, generation: 1, uid: u}\n\
spec:\n  hosts: 3\n  failurePolicy: {maxRestarts: 2}\n  template: {spec: {containers: [{name: host, image: x}]}}\n";

static NO_MESHES: Meshes = Meshes {
    total: 0,
    succeeded: Vec::new(),
    failed: Vec::new(),
    oldest: None,
};

fn input<'a>(
    w: &'a World,
    pods: &'a BTreeMap<Rank, Pod>,
    live: &'a dyn Fn(Rank) -> Liveness,
) -> PlanInput<'a> {
    PlanInput {
        world: w,
        timings: hostmesh_crds::validate::world("w", &w.spec).unwrap(),
        // As the store holds them (shared); copied once per test.
        pods: Box::leak(Box::new(
            pods.iter()
                .map(|(r, p)| (*r, std::sync::Arc::new(p.clone())))
                .collect(),
        )),
        extra_pods: vec![],
        liveness: live,
        expired_since: &|_| Some(Timestamp::from_second(90).unwrap()),
        link_error: &|_| None,
        watching_since: &|_| None,
        secret_hash: "s1",
        rotated_hashes: &[],
        credentials_note: None,
        hash: "h1",
        critical_failure: None,
        now: Timestamp::from_second(100).unwrap(),
        hold: None,
        admitted: None,
        monarch_worker: &|_| None,
        meshes: &NO_MESHES,
    }
}

fn pod(rank: Rank, status: &str, hash: &str) -> Pod {
    let mut p = mk_pod(status);
    p.metadata.name = Some(format!("w-host-{rank}"));
    p.metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_TEMPLATE_HASH.to_string(),
        hash.to_string(),
    )]));
    p
}

fn ready_pods() -> BTreeMap<Rank, Pod> {
    (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect()
}

/// A World that ran with all three hosts Ready.
fn running() -> World {
    let mut w: World = serde_saphyr::from_str(WORLD).unwrap();
    let pods = ready_pods();
    let p = plan(&input(&w, &pods, &|_| Liveness::Alive));
    assert_eq!(p.status.phase, Some(WorldPhase::Running));
    w.status = Some(p.status);
    w
}

/// [`running`], with these `failurePolicy.rules` (YAML).
fn running_with_rules(rules: &str) -> World {
    let mut w = running();
    w.spec.failure_policy.rules = serde_saphyr::from_str(rules).unwrap();
    w
}

fn host(p: &Plan, r: Rank) -> HostStatus {
    runs::get(&p.status.hosts, r).unwrap().clone()
}

fn terminating(mut p: Pod) -> Pod {
    p.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(99).unwrap()));
    p
}

#[test]
fn a_host_pod_deleted_from_outside_is_the_infrastructure_s_once() {
    let mut w = running();
    let mut pods = ready_pods();
    pods.insert(1, terminating(pods[&1].clone()));
    let p = plan(&input(&w, &pods, &|_| Liveness::Alive));
    let h = host(&p, 1);
    assert_eq!(h.state, HostState::Terminating);
    assert_eq!(h.cause, Some(FailureCause::Infrastructure));
    let ev = h.evidence.unwrap();
    assert_eq!(ev.reason, reasons::POD_DELETED);
    assert_eq!(
        ev.message,
        "host pod w-host-1 was deleted by someone other than hostmesh"
    );
    let ff = p.status.first_failure.clone().unwrap();
    assert_eq!((ff.rank, ff.cause), (1, Some(FailureCause::Infrastructure)));
    assert_eq!(p.failures, vec![FailureCause::Infrastructure]);
    // Still terminating, then gone: the same attribution, counted once.
    w.status = Some(p.status);
    let p = plan(&input(&w, &pods, &|_| Liveness::Alive));
    assert_eq!(host(&p, 1).evidence.unwrap().reason, reasons::POD_DELETED);
    assert!(p.failures.is_empty());
    w.status = Some(p.status);
    pods.remove(&1);
    let p = plan(&input(&w, &pods, &|_| Liveness::Alive));
    assert_eq!(host(&p, 1).state, HostState::Pending);
    assert_eq!(host(&p, 1).cause, Some(FailureCause::Infrastructure));
    assert!(p.failures.is_empty());
    // Its replacement starts: nothing to attribute any more.
    w.status = Some(p.status);
    pods.insert(1, pod(1, "  phase: Pending\n", "h1"));
    let p = plan(&input(&w, &pods, &|_| Liveness::Alive));
    assert_eq!(host(&p, 1).cause, None);
}

#[test]
fn pods_the_operator_deletes_are_not_deleted_from_outside() {
    let w = running();
    // A template roll: the pod's hash is stale.
    let mut pods = ready_pods();
    pods.insert(2, terminating(pod(2, POD_READY, "h0")));
    let p = plan(&input(&w, &pods, &|_| Liveness::Alive));
    assert_eq!(host(&p, 2).cause, None);
    assert!(p.failures.is_empty() && p.status.first_failure.is_none());
    // A World that was not Running (being created) deletes nothing from
    // outside either.
    let mut fresh: World = serde_saphyr::from_str(WORLD).unwrap();
    fresh.status = None;
    let mut pods = ready_pods();
    pods.insert(2, terminating(pods[&2].clone()));
    let p = plan(&input(&fresh, &pods, &|_| Liveness::Alive));
    assert_eq!(host(&p, 2).cause, None);
}

#[test]
fn evicted_preempted_and_killed_agents_are_the_infrastructure_s_oom_the_user_s() {
    let w = running();
    let cases = [
        (
            "  phase: Failed\n  reason: Evicted\n  message: 'The node was low on resource: memory.'\n",
            FailureCause::Infrastructure,
            reasons::EVICTED,
        ),
        (
            "  phase: Failed\n  conditions: [{type: DisruptionTarget, status: 'True', reason: PreemptionByScheduler}]\n",
            FailureCause::Infrastructure,
            reasons::PREEMPTED,
        ),
        (
            "  phase: Failed\n  containerStatuses: [{name: host, image: x, imageID: '', ready: false, restartCount: 0, state: {terminated: {exitCode: 137, signal: 9, reason: Error}}}]\n",
            FailureCause::Infrastructure,
            reasons::AGENT_EXITED,
        ),
        (
            "  phase: Failed\n  containerStatuses: [{name: host, image: x, imageID: '', ready: false, restartCount: 0, state: {terminated: {exitCode: 137, reason: OOMKilled}}}]\n",
            FailureCause::User,
            reasons::OOM_KILLED,
        ),
    ];
    for (status, cause, reason) in cases {
        let mut pods = ready_pods();
        pods.insert(0, pod(0, status, "h1"));
        let p = plan(&input(&w, &pods, &|_| Liveness::Alive));
        let ff = p.status.first_failure.clone().unwrap();
        assert_eq!(ff.cause, Some(cause), "{status}");
        assert_eq!(ff.evidence.as_ref().unwrap().reason, reason, "{status}");
        assert_eq!(p.failures, vec![cause], "{status}");
    }
}

#[test]
fn a_silent_agent_is_unreachable_infrastructure() {
    let w = running();
    let pods = ready_pods();
    let p = plan(&input(&w, &pods, &|r| {
        if r == 2 {
            Liveness::Expired
        } else {
            Liveness::Alive
        }
    }));
    let h = host(&p, 2);
    assert_eq!(h.state, HostState::Expired);
    assert_eq!(h.cause, Some(FailureCause::Infrastructure));
    assert_eq!(h.evidence.unwrap().reason, reasons::AGENT_UNREACHABLE);
    // The kubelet then reports the agent killed: the cause replaces the
    // symptom in firstFailure.
    let mut w = w;
    w.status = Some(p.status);
    let mut pods = pods;
    let mut killed = pod(
        2,
        "  phase: Failed\n  containerStatuses: [{name: host, image: x, imageID: '', ready: false, restartCount: 0, state: {terminated: {exitCode: 137, signal: 9, reason: Error}}}]\n",
        "h1",
    );
    killed.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1).unwrap()));
    pods.insert(2, killed);
    let p = plan(&input(&w, &pods, &|r| {
        if r == 2 {
            Liveness::Expired
        } else {
            Liveness::Alive
        }
    }));
    let ev = p.status.first_failure.unwrap().evidence.unwrap();
    assert_eq!(ev.reason, reasons::AGENT_EXITED, "{}", ev.message);
    assert!(ev.message.contains("SIGKILL"), "{}", ev.message);
}

#[test]
fn an_unhealthy_device_marks_its_ready_host_without_failing_it() {
    let w = running();
    let mut pods = ready_pods();
    pods.insert(
        1,
        pod(
            1,
            "  phase: Running\n  podIP: 127.0.1.3\n  conditions: [{type: Ready, status: 'True'}]\n  containerStatuses:\n  - name: host\n    image: x\n    imageID: ''\n    ready: true\n    restartCount: 0\n    allocatedResourcesStatus:\n    - name: nvidia.com/gpu\n      resources: [{resourceID: gpu-1, health: Unhealthy}]\n",
            "h1",
        ),
    );
    let p = plan(&input(&w, &pods, &|_| Liveness::Alive));
    let h = host(&p, 1);
    assert_eq!(h.state, HostState::Ready);
    assert_eq!(h.cause, Some(FailureCause::Infrastructure));
    assert_eq!(
        h.evidence.unwrap().message,
        "device nvidia.com/gpu gpu-1 of container host is Unhealthy"
    );
    assert_eq!(p.status.phase, Some(WorldPhase::Running));
    assert!(p.failures.is_empty() && p.status.first_failure.is_none());
}

/// A `failurePolicy` rule on `causes: [Infrastructure]` takes a host pod
/// deleted from outside (no rule on its reason needed) and restarts it
/// without counting; a host out of memory is the user's and falls to the
/// default, counted.
#[test]
fn a_rule_on_infrastructure_restarts_an_outside_deletion_without_counting() {
    let w = running_with_rules(
        "[{name: infra, action: RestartWithoutCounting, causes: [Infrastructure]}]",
    );
    let mut pods = ready_pods();
    pods.insert(1, terminating(pods[&1].clone()));
    let p = plan(&input(&w, &pods, &|_| Liveness::Alive));
    let fired = p.status.rule_fired.clone().expect("the rule fired");
    assert_eq!((fired.name.as_str(), fired.rank), ("infra", 1));
    assert_eq!(p.status.restarts, 0, "{:?}", p.status);
    // The user's failure: the host container out of its memory limit.
    let w = running_with_rules(
        "[{name: infra, action: RestartWithoutCounting, causes: [Infrastructure]}]",
    );
    let mut pods = ready_pods();
    pods.insert(
        2,
        pod(
            2,
            "  phase: Failed\n  containerStatuses: [{name: host, image: x, imageID: '', ready: false, restartCount: 0, state: {terminated: {exitCode: 137, reason: OOMKilled}}}]\n",
            "h1",
        ),
    );
    let p = plan(&input(&w, &pods, &|_| Liveness::Alive));
    assert_eq!(host(&p, 2).cause, Some(FailureCause::User));
    assert!(p.status.rule_fired.is_none(), "{:?}", p.status.rule_fired);
    assert_eq!(p.status.restarts, 1);
}

/// Issue 30, item 9: an Expired host whose agent is known to have fenced
/// itself (its pushes refused as fenced) is replaced at once, not after
/// `evictionTimeout`, with the reason that says so.
#[test]
fn a_host_whose_agent_fenced_itself_is_replaced_at_once() {
    let w = running();
    let pods = ready_pods();
    let live = |r: Rank| {
        if r == 1 {
            Liveness::Expired
        } else {
            Liveness::Alive
        }
    };
    // Expired just now: without more said, it waits for evictionTimeout.
    let mut silent = input(&w, &pods, &live);
    silent.expired_since = &|_| Some(Timestamp::from_second(100).unwrap());
    let p = plan(&silent);
    assert!(p.delete.is_empty(), "{:?}", p.delete);
    assert_eq!(host(&p, 1).reason.as_deref(), Some("NoHeartbeat"));
    // Known fenced: replaced now, and said so.
    let mut fenced = input(&w, &pods, &live);
    fenced.expired_since = &|_| Some(Timestamp::from_second(100).unwrap());
    fenced.link_error = &|r| {
        (r == 1).then(|| {
            format!(
                "{}: no contact from the operator for 70.0s",
                crate::hub::fence::FENCED
            )
        })
    };
    let p = plan(&fenced);
    assert_eq!(p.delete, vec!["w-host-1".to_string()]);
    let reason = host(&p, 1).reason.unwrap_or_default();
    assert!(
        reason.starts_with("AgentFenced: the agent fenced itself"),
        "{reason}"
    );
}

/// A rule on `Deleted` takes a host pod deleted from outside also when it
/// is gone before any pass saw it terminating (a quick deletion between
/// two passes), as `cause.rs` attributes it.
#[test]
fn a_deleted_rule_takes_a_pod_gone_between_two_passes() {
    let w =
        running_with_rules("[{name: infra, action: RestartWithoutCounting, reasons: [Deleted]}]");
    let mut pods = ready_pods();
    pods.remove(&1);
    let p = plan(&input(&w, &pods, &|_| Liveness::Alive));
    let fired = p.status.rule_fired.clone().expect("the rule fired");
    assert_eq!((fired.name.as_str(), fired.rank), ("infra", 1));
    assert_eq!(p.status.restarts, 0);
}
