//! World plan tests from YAML, no client.

use super::*;
use crate::controllers::world::observe::tests::{READY as POD_READY, mk_pod};
use hostmesh_crds::Rank;
use hostmesh_crds::conditions::COMPLETE;

const WORLD: &str = "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {name: w, generation: 1}\n\
spec:\n  hosts: 3\n  failurePolicy: {maxRestarts: 2, backoff: 10s}\n  template: {spec: {containers: [{name: host, image: x}]}}\n";

fn mk_world(policy: &str) -> World {
    let mut w: World =
        serde_saphyr::from_str(&WORLD.replace("{maxRestarts: 2, backoff: 10s}", policy)).unwrap();
    w.metadata.uid = Some("u".into());
    w
}

fn timings(w: &World) -> WorldTimings {
    hostmesh_crds::validate::world("w", &w.spec).unwrap()
}

/// A plan input with every host Alive and nothing else to say: tests
/// override the fields they are about.
fn input<'a>(w: &'a World, pods: &'a BTreeMap<Rank, Pod>, now: i64) -> PlanInput<'a> {
    // The plan reads the pods as the store holds them (shared); a test's
    // few pods are copied once and kept for the test's life.
    let pods: &'a BTreeMap<Rank, std::sync::Arc<Pod>> = Box::leak(Box::new(
        pods.iter()
            .map(|(r, p)| (*r, std::sync::Arc::new(p.clone())))
            .collect(),
    ));
    PlanInput {
        world: w,
        timings: timings(w),
        pods,
        extra_pods: vec![],
        liveness: &|_| Liveness::Alive,
        expired_since: &|_| None,
        link_error: &|_| None,
        watching_since: &|_| None,
        secret_hash: "s1",
        rotated_hashes: &[],
        credentials_note: None,
        hash: "h1",
        critical_failure: None,
        now: Timestamp::from_second(now).unwrap(),
        hold: None,
        admitted: None,
        monarch_worker: &|_| None,
        meshes: &NO_MESHES,
    }
}

static NO_MESHES: Meshes = Meshes {
    total: 0,
    succeeded: Vec::new(),
    failed: Vec::new(),
    oldest: None,
};

fn pod(rank: Rank, status: &str, hash: &str) -> Pod {
    let mut p = mk_pod(status);
    p.metadata.name = Some(format!("w-host-{rank}"));
    p.metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_TEMPLATE_HASH.to_string(),
        hash.to_string(),
    )]));
    p
}

fn run(w: &World, pods: &BTreeMap<Rank, Pod>, live: Liveness, now: i64) -> Plan {
    plan(&PlanInput {
        liveness: &|_| live,
        expired_since: &|_| Some(Timestamp::from_second(90).unwrap()),
        ..input(w, pods, now)
    })
}

const FAILED_POD: &str = "  phase: Failed\n  reason: Evicted\n";

#[test]
fn empty_world_creates_every_host() {
    let w = mk_world("{}");
    let p = run(&w, &BTreeMap::new(), Liveness::Unknown, 100);
    assert_eq!(p.create, [0, 1, 2]);
    assert_eq!(p.status.phase, Some(WorldPhase::Creating));
    assert_eq!(p.status.ready.as_deref(), Some("0/3"));
    assert!(conditions::is_true(&p.status.conditions, PROGRESSING));
    assert!(!conditions::is_true(&p.status.conditions, READY));
    assert_eq!(p.status.hosts.len(), 1);
}

#[test]
fn all_ready_is_running_and_ready_condition() {
    let w = mk_world("{}");
    let pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    let p = run(&w, &pods, Liveness::Alive, 100);
    assert!(p.create.is_empty() && p.delete.is_empty());
    assert_eq!(p.status.phase, Some(WorldPhase::Running));
    assert!(conditions::is_true(&p.status.conditions, READY));
    assert_eq!(p.events[0].reason, "Running");
    // Ready pods without heartbeats are not ready hosts.
    let p = run(&w, &pods, Liveness::Unknown, 100);
    assert_eq!(p.status.ready_hosts, 0);
}

/// worker invariants 1 and 3 through the plan: a killed Monarch worker
/// fails its host, the failure policy replaces it, and `firstFailure`
/// names rank, pod and signal.
#[test]
fn a_killed_monarch_worker_is_a_host_failure() {
    use hostmesh_agent::protocol::ProcPhase;
    let mut w = mk_world("{maxRestarts: 2}");
    w.spec.monarch = Some(Default::default());
    let pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    let killed = ProcReport {
        proc_id: "tcp:10.0.0.2:26602/monarch-worker".into(),
        name: "monarch-worker".into(),
        rank: 1,
        pid: Some(77),
        command: vec!["python".into(), "-u".into()],
        status: ProcPhase::Killed {
            signal: 9,
            core_dumped: false,
            stderr_tail: vec!["bye".into()],
        },
        started_at_ms: 0,
        restarts: 0,
        stop_requested: false,
        seq: 1,
        ..Default::default()
    };
    let p = plan(&PlanInput {
        monarch_worker: &|r| (r == 1).then(|| killed.clone()),
        ..input(&w, &pods, 100)
    });
    assert_eq!(p.delete, ["w-host-1"]);
    assert_eq!(p.status.restarts, 1);
    let ff = p.status.first_failure.unwrap();
    assert_eq!(
        (ff.rank, ff.pod.as_str(), ff.signal),
        (1, "w-host-1", Some(9))
    );
    assert!(ff.reason.contains("SIGKILL"), "{}", ff.reason);
    assert_eq!(ff.stderr_tail.as_deref(), Some("bye"));
    assert_eq!(ff.command.as_deref(), Some("python -u"));
}

/// A host whose agent container was killed: `firstFailure` carries the
/// container's exit code, the signal it means, the log tail the kubelet
/// kept and the container's command.
#[test]
fn a_killed_host_container_is_named_in_first_failure() {
    let w = mk_world("{maxRestarts: 2}");
    let mut pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    let mut dead = pod(
        2,
        "  phase: Failed\n  containerStatuses: [{name: host, image: x, imageID: '', ready: false, restartCount: 0, state: {terminated: {exitCode: 137, reason: Error, message: \"serving\\nlast words\"}}}]\n",
        "h1",
    );
    dead.spec = Some(
        serde_saphyr::from_str(
            "containers: [{name: host, image: x, command: [/hostmesh/hostmesh, agent], args: [--port, '26602']}]",
        )
        .unwrap(),
    );
    pods.insert(2, dead);
    let p = plan(&input(&w, &pods, 100));
    let ff = p.status.first_failure.unwrap();
    assert_eq!(
        (ff.rank, ff.exit_code, ff.signal),
        (2, Some(137), Some(9)),
        "{ff:?}"
    );
    assert_eq!(
        ff.reason, "Error: container host exited with code 137 (SIGKILL)",
        "the log is not why it was killed"
    );
    assert_eq!(ff.stderr_tail.as_deref(), Some("serving\nlast words"));
    assert_eq!(
        ff.command.as_deref(),
        Some("/hostmesh/hostmesh agent --port 26602")
    );
    // A pod-level failure (Evicted) has no container exit to report.
    pods.insert(2, pod(2, FAILED_POD, "h1"));
    let ff = plan(&input(&w, &pods, 100)).status.first_failure.unwrap();
    assert_eq!((ff.exit_code, ff.signal, ff.command), (None, None, None));
}

/// A host first seen failing by its symptom (its agent went silent at the
/// kill) is named by its cause once its pod, now terminating, reports how
/// the container ended: exit code and signal, the time it was first seen
/// kept. A pod created after the failure (the replacement) refines nothing.
#[test]
fn a_silent_host_s_first_failure_takes_its_container_s_exit_when_reported() {
    let mut w = mk_world("{maxRestarts: 2}");
    let mut pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    for p in pods.values_mut() {
        p.metadata.creation_timestamp = Some(Time(Timestamp::from_second(10).unwrap()));
    }
    let silent = |r: Rank| {
        if r == 1 {
            Liveness::Expired
        } else {
            Liveness::Alive
        }
    };
    let p = plan(&PlanInput {
        liveness: &silent,
        expired_since: &|_| Some(Timestamp::from_second(90).unwrap()),
        ..input(&w, &pods, 100)
    });
    let ff = p.status.first_failure.clone().unwrap();
    assert_eq!(
        (ff.rank, ff.reason.as_str(), ff.exit_code),
        (1, "NoHeartbeat", None)
    );
    w.status = Some(p.status);

    let mut ended = pod(
        1,
        "  phase: Running\n  containerStatuses: [{name: host, image: x, imageID: '', ready: false, restartCount: 0, state: {terminated: {exitCode: 137, reason: Error}}}]\n",
        "h1",
    );
    ended.metadata.creation_timestamp = Some(Time(Timestamp::from_second(10).unwrap()));
    ended.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(95).unwrap()));
    pods.insert(1, ended.clone());
    let p = plan(&PlanInput {
        liveness: &silent,
        ..input(&w, &pods, 101)
    });
    let ff = p.status.first_failure.clone().unwrap();
    assert_eq!(
        (ff.rank, ff.exit_code, ff.signal),
        (1, Some(137), Some(9)),
        "{ff:?}"
    );
    assert_eq!(
        ff.reason,
        "Error: container host exited with code 137 (SIGKILL)"
    );
    assert_eq!(ff.time.0, Timestamp::from_second(90).unwrap(), "first seen");

    // The replacement's own end is not the recorded failure's cause.
    let mut w2 = w.clone();
    let mut prev = p.status;
    prev.first_failure.as_mut().unwrap().exit_code = None;
    prev.first_failure.as_mut().unwrap().signal = None;
    w2.status = Some(prev);
    ended.metadata.creation_timestamp = Some(Time(Timestamp::from_second(99).unwrap()));
    pods.insert(1, ended);
    let ff = plan(&PlanInput {
        liveness: &silent,
        ..input(&w2, &pods, 102)
    })
    .status
    .first_failure
    .unwrap();
    assert_eq!(ff.exit_code, None, "{ff:?}");
}

#[test]
fn failed_host_is_replaced_with_backoff_then_gives_up() {
    let mut w = mk_world("{maxRestarts: 2, backoff: 10s}");
    let mut pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    pods.insert(1, pod(1, FAILED_POD, "h1"));
    let p = run(&w, &pods, Liveness::Alive, 100);
    assert_eq!(p.delete, ["w-host-1"]);
    assert_eq!(p.status.restarts, 1);
    assert_eq!(p.status.phase, Some(WorldPhase::Degraded));
    assert_eq!(p.events[0].reason, "HostFailed");
    assert!(p.events[0].note.contains("Evicted"), "{}", p.events[0].note);
    // It fails again right away: the second restart waits 10s.
    w.status = Some(p.status);
    let p = run(&w, &pods, Liveness::Alive, 105);
    assert!(p.delete.is_empty());
    assert_eq!(p.requeue_after, Some(Duration::from_secs(5)));
    assert_eq!(
        conditions::get(&p.status.conditions, PROGRESSING)
            .unwrap()
            .reason,
        "BackoffWaiting"
    );
    let p = run(&w, &pods, Liveness::Alive, 111);
    assert_eq!(p.delete, ["w-host-1"]);
    assert_eq!(p.status.restarts, 2);
    // Beyond the limit: Failed with the reason, and it stays Failed.
    w.status = Some(p.status);
    let p = run(&w, &pods, Liveness::Alive, 500);
    assert_eq!(p.status.phase, Some(WorldPhase::Failed));
    let failed = conditions::get(&p.status.conditions, FAILED).unwrap();
    assert!(
        failed.message.contains("host 1 Failed (Evicted)"),
        "{}",
        failed.message
    );
    assert!(failed.message.contains("restart limit 2"));
    // A failed World is finished: its host pods go (invariant 9).
    assert_eq!(p.delete, ["w-host-0", "w-host-1", "w-host-2"]);
    assert!(p.create.is_empty());
    assert!(p.status.finished_at.is_some());
    w.status = Some(p.status);
    let healed: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    let p = run(&w, &healed, Liveness::Alive, 600);
    assert_eq!(p.status.phase, Some(WorldPhase::Failed));
    assert!(p.create.is_empty());
    // keepFailedHosts keeps them for inspection.
    w.spec.keep_failed_hosts = true;
    let p = run(&w, &healed, Liveness::Alive, 700);
    assert_eq!(p.status.phase, Some(WorldPhase::Failed));
    assert!(p.delete.is_empty() && p.create.is_empty());
}

#[test]
fn gang_policy_recreates_every_pod() {
    let w = mk_world("{action: RecreateGang}");
    let mut pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    pods.insert(2, pod(2, FAILED_POD, "h1"));
    let p = run(&w, &pods, Liveness::Alive, 100);
    assert_eq!(p.delete, ["w-host-0", "w-host-1", "w-host-2"]);
    assert_eq!(p.status.restarts, 1);
    assert_eq!(p.status.attempt, 1, "a gang recreation is a new attempt");
}

/// A new operator (watching since 500) that has not heard the agents
/// of pods Ready since 100 keeps them Ready, not Degraded, for
/// healthTimeout; then they are Expired as unreachable (invariant 3).
#[test]
fn a_new_operator_keeps_ready_hosts_until_it_can_tell() {
    let mut w = mk_world("{}");
    let ready_at = "  phase: Running\n  podIP: 10.244.0.2\n  conditions: [{type: Ready, status: 'True', lastTransitionTime: '1970-01-01T00:01:40Z'}]\n";
    let pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, ready_at, "h1"))).collect();
    let at = |now: i64, w: &World, live: Liveness| {
        plan(&PlanInput {
            liveness: &|_| live,
            watching_since: &|_| Some(Timestamp::from_second(500).unwrap()),
            ..input(w, &pods, now)
        })
    };
    // What the old operator recorded: Running.
    let p = at(400, &w, Liveness::Alive);
    assert_eq!(p.status.phase, Some(WorldPhase::Running));
    w.status = Some(p.status);
    let p = at(501, &w, Liveness::Unknown);
    assert_eq!(
        p.status.phase,
        Some(WorldPhase::Running),
        "{:?}",
        p.status.hosts
    );
    assert!(p.events.is_empty(), "{:?}", p.events);
    assert!(p.requeue_after.is_some_and(|d| d <= Duration::from_secs(9)));
    // Heard: nothing changes.
    let p = at(502, &w, Liveness::Alive);
    assert_eq!(p.status.phase, Some(WorldPhase::Running));
    // Never heard within healthTimeout of the takeover: unreachable.
    let p = at(511, &w, Liveness::Unknown);
    let h0 = runs::get(&p.status.hosts, 0).unwrap();
    assert_eq!(h0.state, HostState::Expired, "{h0:?}");
    assert!(p.delete.is_empty());
}

/// Pods mounting another token than the Secret's are replaced once,
/// with an Event that says why; pods without the annotation stay.
#[test]
fn pods_holding_a_replaced_token_are_replaced() {
    let w = mk_world("{}");
    let mut pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    for r in [0, 1] {
        pods.get_mut(&r)
            .unwrap()
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(
                super::super::desired::ANNOTATION_SECRET_HASH.into(),
                if r == 0 { "old" } else { "s1" }.into(),
            );
    }
    let p = plan(&PlanInput {
        credentials_note: Some("Secret w-agent and its copy were deleted".into()),
        ..input(&w, &pods, 100)
    });
    assert_eq!(p.delete, ["w-host-0"]);
    assert_eq!(p.status.restarts, 0);
    let ev = p
        .events
        .iter()
        .find(|e| e.reason == "CredentialsReplaced")
        .unwrap();
    assert_eq!(
        ev.note,
        "Secret w-agent and its copy were deleted: replacing 1 host pods"
    );
}

/// A pod Ready while the operator never hears its agent (a refused
/// handshake after the credentials changed) is Expired after
/// healthTimeout, says why, and is replaced after evictionTimeout.
#[test]
fn a_ready_host_the_operator_cannot_reach_expires_and_is_replaced() {
    let w = mk_world("{}");
    let ready_at = "  phase: Running\n  podIP: 10.244.0.2\n  conditions: [{type: Ready, status: 'True', lastTransitionTime: '1970-01-01T00:01:40Z'}]\n";
    let pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, ready_at, "h1"))).collect();
    let at = |now: i64, w: &World| {
        plan(&PlanInput {
            liveness: &|r| {
                if r == 0 {
                    Liveness::Unknown
                } else {
                    Liveness::Alive
                }
            },
            watching_since: &|_| Some(Timestamp::from_second(90).unwrap()),
            link_error: &|r| {
                (r == 0).then(|| {
                    "10.244.0.2:26602 failed authentication: it does not hold our shared secret"
                        .to_string()
                })
            },
            ..input(w, &pods, now)
        })
    };
    let p = at(105, &w);
    assert_eq!(
        runs::get(&p.status.hosts, 0).unwrap().state,
        HostState::Starting
    );
    assert!(p.requeue_after.is_some_and(|d| d <= Duration::from_secs(5)));
    let p = at(111, &w);
    let h0 = runs::get(&p.status.hosts, 0).unwrap();
    assert_eq!(h0.state, HostState::Expired);
    assert!(
        h0.reason
            .as_deref()
            .unwrap()
            .contains("failed authentication"),
        "{h0:?}"
    );
    assert_eq!(p.status.phase, Some(WorldPhase::Degraded));
    assert!(p.delete.is_empty(), "evictionTimeout has not passed");
    let p = at(171, &w);
    assert_eq!(p.delete, ["w-host-0"]);
    assert!(
        p.quick.contains("w-host-0"),
        "a hung host does not get its grace period"
    );
    assert_eq!(p.status.restarts, 1);
}

#[test]
fn suspend_writes_the_phase_then_deletes_pods_and_resume_is_a_new_attempt() {
    let mut w = mk_world("{}");
    let pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    let p = run(&w, &pods, Liveness::Alive, 100);
    w.status = Some(p.status);
    w.status.as_mut().unwrap().restarts = 1;
    // Suspending is a spec change (a new generation).
    w.spec.suspend = true;
    w.metadata.generation = Some(2);
    let p = run(&w, &pods, Liveness::Alive, 101);
    assert!(
        p.delete.is_empty(),
        "the phase is written before any pod goes"
    );
    assert!(p.create.is_empty());
    assert_eq!(p.status.phase, Some(WorldPhase::Suspended));
    assert!(conditions::is_true(&p.status.conditions, SUSPENDED));
    assert!(!conditions::is_true(&p.status.conditions, READY));
    assert_eq!(p.status.restarts, 1, "suspending keeps the restart count");
    assert_eq!(p.events[0].reason, "Suspended");
    assert!(p.requeue_after.is_some());
    w.status = Some(p.status);
    let p = run(&w, &pods, Liveness::Alive, 102);
    assert_eq!(p.delete, ["w-host-0", "w-host-1", "w-host-2"]);
    assert!(p.events.is_empty(), "announced once");
    // Gone: nothing is created while suspended.
    w.status = Some(p.status);
    let p = run(&w, &BTreeMap::new(), Liveness::Unknown, 103);
    assert!(p.create.is_empty() && p.delete.is_empty());
    let cond = conditions::get(&p.status.conditions, SUSPENDED).unwrap();
    assert_eq!(cond.message, "spec.suspend is true; no host pods");
    assert_eq!(p.status.attempt, 0);
    // Resume: every host again, a new attempt, restarts kept.
    w.status = Some(p.status);
    w.spec.suspend = false;
    w.metadata.generation = Some(3);
    let p = run(&w, &BTreeMap::new(), Liveness::Unknown, 104);
    assert_eq!(p.create, [0, 1, 2]);
    assert_eq!(p.status.attempt, 1);
    assert_eq!(p.status.restarts, 1);
    assert_eq!(p.status.phase, Some(WorldPhase::Creating));
    let cond = conditions::get(&p.status.conditions, SUSPENDED).unwrap();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("False", "Resumed")
    );
    assert!(p.events.iter().any(|e| e.reason == "Resumed"));
    // A World never suspended has no Suspended condition.
    let fresh = run(&mk_world("{}"), &BTreeMap::new(), Liveness::Unknown, 100);
    assert!(conditions::get(&fresh.status.conditions, SUSPENDED).is_none());
}

fn run_held(w: &World, pods: &BTreeMap<Rank, Pod>, hold: Option<(&str, &str)>, now: i64) -> Plan {
    plan(&PlanInput {
        hold: hold.map(|(r, m)| Hold {
            reason: r.into(),
            message: m.into(),
        }),
        admitted: hold
            .is_none()
            .then(|| "admitted by ClusterQueue cq".to_string()),
        ..input(w, pods, now)
    })
}

/// Invariant 7: held since creation, no pods, no Ready; the first
/// admission is attempt 0.
#[test]
fn a_world_held_since_creation_starts_as_attempt_0_when_admitted() {
    let mut w = mk_world("{}");
    let p = run_held(
        &w,
        &BTreeMap::new(),
        Some(("AwaitingAdmission", "waiting for Kueue")),
        100,
    );
    assert!(p.create.is_empty() && p.delete.is_empty());
    assert_eq!(p.status.phase, Some(WorldPhase::Suspended));
    let c = conditions::get(&p.status.conditions, SUSPENDED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        ("True", "AwaitingAdmission", "waiting for Kueue")
    );
    assert!(conditions::get(&p.status.conditions, READY).is_none());
    w.status = Some(p.status);
    let p = run_held(&w, &BTreeMap::new(), None, 101);
    assert_eq!(p.create, [0, 1, 2]);
    assert_eq!(p.status.attempt, 0);
    let c = conditions::get(&p.status.conditions, SUSPENDED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        (
            "False",
            "Admitted",
            "admitted by ClusterQueue cq; attempt 0"
        )
    );
    assert_eq!(p.events[0].reason, "Admitted");
}

/// Invariants 6, 7: an eviction takes the suspend path (phase first,
/// then the pods), is not a failure, and the re-admission is a new
/// attempt with the restart count kept.
#[test]
fn an_eviction_stops_a_running_world_and_readmission_is_a_new_attempt() {
    let mut w = mk_world("{}");
    let pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    let p = run_held(&w, &pods, None, 100);
    assert_eq!(p.status.phase, Some(WorldPhase::Running));
    w.status = Some(p.status);
    let evicted = Some(("Preempted", "evicted by Kueue (Preempted): for a workload"));
    let p = run_held(&w, &pods, evicted, 101);
    assert!(
        p.delete.is_empty(),
        "the phase is written before any pod goes"
    );
    assert_eq!(p.status.phase, Some(WorldPhase::Suspended));
    assert!(!conditions::is_true(&p.status.conditions, FAILED));
    assert!(!conditions::is_true(&p.status.conditions, READY));
    w.status = Some(p.status);
    let p = run_held(&w, &pods, evicted, 102);
    assert_eq!(p.delete, ["w-host-0", "w-host-1", "w-host-2"]);
    let c = conditions::get(&p.status.conditions, SUSPENDED).unwrap();
    assert_eq!(c.reason, "Preempted");
    assert!(
        c.message.ends_with("3 host pods still terminating"),
        "{}",
        c.message
    );
    w.status = Some(p.status);
    let p = run_held(&w, &BTreeMap::new(), evicted, 103);
    assert_eq!(p.status.restarts, 0);
    w.status = Some(p.status);
    let p = run_held(&w, &BTreeMap::new(), None, 104);
    assert_eq!(p.create, [0, 1, 2]);
    assert_eq!(p.status.attempt, 1);
    assert_eq!(p.status.restarts, 0);
}

#[test]
fn starting_hosts_are_reported_not_restarted() {
    let w = mk_world("{}");
    let stuck = "  phase: Pending\n  conditions: [{type: PodScheduled, status: 'False', reason: Unschedulable}]\n";
    let pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, stuck, "h1"))).collect();
    let p = run(&w, &pods, Liveness::Unknown, 100);
    assert!(p.delete.is_empty() && p.create.is_empty());
    assert_eq!(p.status.phase, Some(WorldPhase::Creating));
    let ready = conditions::get(&p.status.conditions, READY).unwrap();
    assert!(
        ready.message.contains("host 0: Unschedulable"),
        "{}",
        ready.message
    );
    assert_eq!(
        p.status.hosts[0].value.reason.as_deref(),
        Some("Unschedulable")
    );
}

#[test]
fn expired_host_waits_for_eviction_timeout() {
    let mut w = mk_world("{}");
    let pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    // Expired at 90 (see `run`): replaced at 90 + evictionTimeout (60).
    let p = run(&w, &pods, Liveness::Expired, 100);
    assert!(p.delete.is_empty());
    assert_eq!(p.status.phase, Some(WorldPhase::Degraded));
    assert_eq!(p.requeue_after, Some(Duration::from_secs(50)));
    assert_eq!(
        p.status.degraded_since,
        Some(Time(Timestamp::from_second(100).unwrap()))
    );
    // The lowest expired rank is the World's first failure, as of when it
    // expired, with the hub's reason.
    let ff = p
        .status
        .first_failure
        .clone()
        .expect("an expired host is a failure");
    assert_eq!((ff.rank, ff.pod.as_str()), (0, "w-host-0"));
    assert_eq!(ff.time, Time(Timestamp::from_second(90).unwrap()));
    assert_eq!(ff.exit_code.or(ff.signal), None);
    assert!(!ff.reason.is_empty());
    w.status = Some(p.status);
    assert_eq!(p.events[0].reason, "HostExpired");
    assert_eq!(p.events.len(), 3, "one per host");
    let p = run(&w, &pods, Liveness::Expired, 149);
    assert!(p.delete.is_empty());
    assert!(p.events.is_empty(), "once per transition");
    let p = run(&w, &pods, Liveness::Expired, 150);
    assert_eq!(p.delete.len(), 3);
}

#[test]
fn changed_template_rolls_pods_and_extra_pods_go() {
    let w = mk_world("{}");
    let pods: BTreeMap<_, _> = (0..3)
        .map(|r| (r, pod(r, POD_READY, if r == 1 { "old" } else { "h1" })))
        .collect();
    let mut input = PlanInput {
        extra_pods: vec!["w-host-7".into()],
        ..input(&w, &pods, 1)
    };
    let p = plan(&input);
    assert_eq!(p.delete, ["w-host-7", "w-host-1"]);
    assert_eq!(p.events[0].reason, "RollingHosts");
    input.critical_failure = Some("ProcMesh train failed".into());
    let p = plan(&input);
    assert_eq!(p.status.phase, Some(WorldPhase::Failed));
    assert_eq!(
        conditions::get(&p.status.conditions, FAILED)
            .unwrap()
            .reason,
        "CriticalProcMeshFailed"
    );
}

#[test]
fn not_ready_before_ever_ready_is_starting() {
    let mut w = mk_world("{}");
    let unready =
        "  phase: Running\n  podIP: 127.0.1.2\n  conditions: [{type: Ready, status: 'False'}]\n";
    let pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, unready, "h1"))).collect();
    let p = run(&w, &pods, Liveness::Alive, 100);
    assert_eq!(p.status.phase, Some(WorldPhase::Creating));
    assert_eq!(
        p.status.hosts[0].value.reason.as_deref(),
        Some("AwaitingReadiness")
    );
    let ready: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    w.status = Some(run(&w, &ready, Liveness::Alive, 101).status);
    let p = run(&w, &pods, Liveness::Alive, 102);
    assert_eq!(p.status.phase, Some(WorldPhase::Degraded));
    assert_eq!(p.status.hosts[0].value.state, HostState::NotReady);
}

#[test]
fn backoff_doubles_and_caps() {
    let b = Duration::from_secs(1);
    let m = Duration::from_secs(5);
    assert_eq!(backoff_delay(b, m, 0), Duration::from_secs(1));
    assert_eq!(backoff_delay(b, m, 2), Duration::from_secs(4));
    assert_eq!(backoff_delay(b, m, 3), m);
    assert_eq!(backoff_delay(b, m, 1000), m);
}

/// A World that was up and lost a host is Degraded while the host is
/// replaced (it used to go back to Creating), then Running again.
#[test]
fn a_world_that_was_up_recovers_as_degraded_not_creating() {
    let mut w = mk_world("{maxRestarts: 2, backoff: 10s}");
    let mut pods: BTreeMap<Rank, Pod> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    let p = run(&w, &pods, Liveness::Alive, 100);
    assert_eq!(p.status.phase, Some(WorldPhase::Running));
    w.status = Some(p.status);
    // Host 1's pod is gone and its replacement is not up yet.
    pods.remove(&1);
    let p = run(&w, &pods, Liveness::Alive, 110);
    assert_eq!(p.status.phase, Some(WorldPhase::Degraded), "{:?}", p.status);
    let c = conditions::get(&p.status.conditions, DEGRADED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "HostsRecovering")
    );
    assert!(c.message.contains("host 1"), "{}", c.message);
    assert!(p.status.degraded_since.is_some());
    w.status = Some(p.status);
    pods.insert(1, pod(1, POD_READY, "h1"));
    let p = run(&w, &pods, Liveness::Alive, 120);
    assert_eq!(p.status.phase, Some(WorldPhase::Running));
    assert!(p.status.degraded_since.is_none());
}

fn meshes(succeeded: &[&str], failed: &[&str], running: usize) -> Meshes {
    Meshes {
        total: succeeded.len() + failed.len() + running,
        succeeded: succeeded.iter().map(|s| s.to_string()).collect(),
        failed: failed
            .iter()
            .map(|s| (s.to_string(), format!("rank 0 of {s} exited with code 1")))
            .collect(),
        oldest: None,
    }
}

#[test]
fn a_world_finishes_with_its_proc_meshes_and_its_ttl_deletes_it() {
    let mut w = mk_world("{}");
    w.spec.finish_when = hostmesh_crds::world::FinishWhen::ProcMeshesFinished;
    w.spec.ttl_seconds_after_finished = Some(5);
    let pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    // No ProcMesh yet, or one still running: the World runs on.
    for m in [meshes(&[], &[], 0), meshes(&["a"], &[], 1)] {
        let p = plan(&PlanInput {
            meshes: &m,
            ..input(&w, &pods, 100)
        });
        assert_eq!(p.status.phase, Some(WorldPhase::Running), "{m:?}");
        assert!(p.delete.is_empty());
    }
    // Every ProcMesh succeeded: Succeeded, Complete=True, the pods go.
    let done = meshes(&["a", "b"], &[], 0);
    let p = plan(&PlanInput {
        meshes: &done,
        ..input(&w, &pods, 100)
    });
    assert_eq!(p.status.phase, Some(WorldPhase::Succeeded));
    let complete = conditions::get(&p.status.conditions, COMPLETE).unwrap();
    assert_eq!(
        (complete.status.as_str(), complete.reason.as_str()),
        ("True", "ProcMeshesSucceeded")
    );
    assert!(complete.message.contains("a, b"), "{}", complete.message);
    assert!(!conditions::is_true(&p.status.conditions, READY));
    assert!(!conditions::is_true(&p.status.conditions, FAILED));
    assert_eq!(p.delete, ["w-host-0", "w-host-1", "w-host-2"]);
    assert!(p.create.is_empty());
    assert_eq!(p.events.last().unwrap().reason, "Completed");
    assert_eq!(
        p.status.finished_at,
        Some(Time(Timestamp::from_second(100).unwrap()))
    );
    assert!(!p.delete_world);
    // Final: a suspend, a Kueue hold or a ProcMesh restarted change nothing;
    // the TTL runs from finishedAt.
    w.status = Some(p.status);
    w.spec.suspend = true;
    let gone = BTreeMap::new();
    let again = meshes(&["a"], &[], 1);
    let p = plan(&PlanInput {
        meshes: &again,
        hold: Some(Hold {
            reason: "Preempted".into(),
            message: "x".into(),
        }),
        ..input(&w, &gone, 103)
    });
    assert_eq!(p.status.phase, Some(WorldPhase::Succeeded));
    assert!(p.create.is_empty() && p.events.is_empty());
    assert_eq!(p.requeue_after, Some(Duration::from_secs(2)));
    assert!(!p.delete_world);
    w.status = Some(p.status);
    let p = plan(&input(&w, &gone, 105));
    assert!(p.delete_world, "5s after finishing");
    assert_eq!(p.events[0].reason, "TTLExpired");
}

#[test]
fn a_world_whose_proc_mesh_failed_fails_and_may_keep_its_hosts() {
    let mut w = mk_world("{}");
    w.spec.finish_when = hostmesh_crds::world::FinishWhen::ProcMeshesFinished;
    w.spec.keep_failed_hosts = true;
    let pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    let m = meshes(&["prep"], &["train"], 0);
    let p = plan(&PlanInput {
        meshes: &m,
        ..input(&w, &pods, 100)
    });
    assert_eq!(p.status.phase, Some(WorldPhase::Failed));
    let failed = conditions::get(&p.status.conditions, FAILED).unwrap();
    assert_eq!(failed.reason, "ProcMeshesFailed");
    assert!(
        failed
            .message
            .contains("ProcMesh train failed: rank 0 of train exited with code 1"),
        "{}",
        failed.message
    );
    assert!(conditions::get(&p.status.conditions, COMPLETE).is_none());
    assert!(p.delete.is_empty(), "keepFailedHosts");
    // Without finishWhen the same ProcMeshes leave the World running.
    w.spec.finish_when = hostmesh_crds::world::FinishWhen::Never;
    let p = plan(&PlanInput {
        meshes: &m,
        ..input(&w, &pods, 100)
    });
    assert_eq!(p.status.phase, Some(WorldPhase::Running));
}

#[test]
fn a_world_not_ready_by_its_ready_deadline_fails_naming_the_hosts() {
    let mut w = mk_world("{}");
    w.spec.ready_deadline_seconds = Some(30);
    let mut pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    pods.insert(
        2,
        pod(
            2,
            "  phase: Pending\n  conditions: [{type: PodScheduled, status: 'False', reason: Unschedulable, message: '0/1 nodes are available'}]\n",
            "h1",
        ),
    );
    let p = run(&w, &pods, Liveness::Alive, 100);
    assert_eq!(p.status.phase, Some(WorldPhase::Creating));
    assert_eq!(
        p.status.start_time,
        Some(Time(Timestamp::from_second(100).unwrap()))
    );
    assert_eq!(p.requeue_after, Some(Duration::from_millis(30_050)));
    w.status = Some(p.status);
    let p = run(&w, &pods, Liveness::Alive, 131);
    assert_eq!(p.status.phase, Some(WorldPhase::Failed));
    let failed = conditions::get(&p.status.conditions, FAILED).unwrap();
    assert_eq!(failed.reason, "ReadyDeadlineExceeded");
    assert!(
        failed.message.contains("2/3 hosts ready")
            && failed
                .message
                .contains("host 2 Starting (Unschedulable: 0/1 nodes are available)"),
        "{}",
        failed.message
    );
    assert_eq!(p.delete.len(), 3, "a failed World frees its hosts");
}

#[test]
fn a_ready_world_no_longer_has_a_ready_deadline_but_has_an_active_one() {
    let mut w = mk_world("{}");
    w.spec.ready_deadline_seconds = Some(30);
    w.spec.active_deadline_seconds = Some(60);
    let pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    let p = run(&w, &pods, Liveness::Alive, 100);
    assert_eq!(p.status.phase, Some(WorldPhase::Running));
    assert!(p.status.ready_time.is_some());
    w.status = Some(p.status);
    // A host lost after the World was Ready: not a ready-deadline failure.
    let mut lost = pods.clone();
    lost.remove(&1);
    let p = run(&w, &lost, Liveness::Alive, 140);
    assert_eq!(p.status.phase, Some(WorldPhase::Degraded));
    assert_eq!(p.requeue_after, Some(Duration::from_millis(20_050)));
    w.status = Some(p.status);
    let p = run(&w, &pods, Liveness::Alive, 160);
    assert_eq!(p.status.phase, Some(WorldPhase::Failed));
    let failed = conditions::get(&p.status.conditions, FAILED).unwrap();
    assert_eq!(failed.reason, "DeadlineExceeded");
    assert_eq!(p.events[0].reason, "DeadlineExceeded");
    // A suspension ends the run: resuming starts the clocks again.
    let mut s = mk_world("{}");
    s.spec.active_deadline_seconds = Some(60);
    s.status = Some(WorldStatus {
        phase: Some(WorldPhase::Suspended),
        start_time: Some(Time(Timestamp::from_second(1).unwrap())),
        ..Default::default()
    });
    let p = run(&s, &pods, Liveness::Alive, 500);
    assert_eq!(p.status.phase, Some(WorldPhase::Running));
    assert_eq!(
        p.status.start_time,
        Some(Time(Timestamp::from_second(500).unwrap()))
    );
}

#[test]
fn a_failed_host_recreates_the_slice_of_its_scope_as_one_restart() {
    let mut w = mk_world("{scope: replica}");
    w.spec.hosts = None;
    w.spec.shape = vec![
        hostmesh_crds::Dim::new("replica", 2),
        hostmesh_crds::Dim::new("host", 2),
    ];
    let mut pods: BTreeMap<_, _> = (0..4).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    pods.insert(2, pod(2, FAILED_POD, "h1"));
    let p = run(&w, &pods, Liveness::Alive, 100);
    assert_eq!(
        p.delete,
        ["w-host-2", "w-host-3"],
        "replica 1, not replica 0"
    );
    assert_eq!(p.status.restarts, 1);
    assert_eq!(p.status.attempt, 0, "a slice is not a new attempt");
    assert!(
        p.events[0]
            .note
            .contains("recreating the hosts of replica=1 (scope replica)"),
        "{}",
        p.events[0].note
    );
    // Scope `host` (the last dimension) is one host.
    let mut w2 = w.clone();
    w2.spec.failure_policy.scope = Some("host".into());
    let p = run(&w2, &pods, Liveness::Alive, 100);
    assert_eq!(p.delete, ["w-host-2"]);
}

#[test]
fn failure_rules_decide_counting_failing_and_deleted_pods() {
    let mut w = mk_world(
        "{maxRestarts: 1, backoff: 10s, rules: [\
         {name: infra, action: RestartWithoutCounting, reasons: [Evicted, Deleted]},\
         {name: stuck, action: FailWorld, reasons: [Unschedulable], unschedulableFor: 30s}]}",
    );
    let ready: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "h1"))).collect();
    let p = run(&w, &ready, Liveness::Alive, 100);
    w.status = Some(p.status);
    // An evicted host is replaced without counting, again and again.
    let mut pods = ready.clone();
    pods.insert(1, pod(1, FAILED_POD, "h1"));
    for now in [101, 102] {
        let p = run(&w, &pods, Liveness::Alive, now);
        assert_eq!(p.delete, ["w-host-1"]);
        assert_eq!(p.status.restarts, 0, "not counted");
        let fired = p.status.rule_fired.clone().unwrap();
        assert_eq!(
            (fired.name.as_str(), fired.action.as_str(), fired.rank),
            ("infra", "RestartWithoutCounting", 1)
        );
        assert!(
            p.events.iter().any(|e| e.reason == "RuleFired"),
            "{:?}",
            p.events
        );
    }
    // Someone deletes host 2's pod: the rule names it, nothing is counted;
    // the pod is already going, so nothing more is deleted.
    let mut going = ready.clone();
    going.get_mut(&2).unwrap().metadata.deletion_timestamp =
        Some(Time(Timestamp::from_second(103).unwrap()));
    let p = run(&w, &going, Liveness::Alive, 103);
    assert_eq!(p.status.restarts, 0);
    assert!(p.delete.is_empty(), "{:?}", p.delete);
    assert_eq!(p.status.rule_fired.as_ref().unwrap().rank, 2);
    assert!(
        p.status
            .rule_fired
            .as_ref()
            .unwrap()
            .reason
            .contains("Deleted")
    );
    // The operator's own deletions are recorded Terminating at once (and
    // urgently), so they are never taken for someone else's.
    let p = run(&w, &pods, Liveness::Alive, 104);
    assert!(p.urgent);
    assert_eq!(
        hostmesh_crds::runs::get(&p.status.hosts, 1).unwrap().state,
        HostState::Terminating
    );
    // A host unschedulable for 30s fails the World.
    let unschedulable = |since: &str| {
        let mut pods = ready.clone();
        pods.insert(
            0,
            pod(
                0,
                &format!("  phase: Pending\n  conditions: [{{type: PodScheduled, status: 'False', reason: Unschedulable, lastTransitionTime: '{since}'}}]\n"),
                "h1",
            ),
        );
        pods
    };
    let p = run(
        &w,
        &unschedulable("1970-01-01T00:01:30Z"),
        Liveness::Alive,
        100,
    );
    assert_ne!(p.status.phase, Some(WorldPhase::Failed));
    assert_eq!(p.requeue_after, Some(Duration::from_secs(20)));
    let p = run(
        &w,
        &unschedulable("1970-01-01T00:01:00Z"),
        Liveness::Alive,
        100,
    );
    assert_eq!(p.status.phase, Some(WorldPhase::Failed));
    let failed = conditions::get(&p.status.conditions, FAILED).unwrap();
    assert_eq!(failed.reason, "FailurePolicyRule");
    assert!(
        failed.message.contains("(rule stuck: FailWorld)"),
        "{}",
        failed.message
    );
}

#[test]
fn update_policies_roll_all_some_or_none_of_the_stale_hosts() {
    let pods: BTreeMap<_, _> = (0..3).map(|r| (r, pod(r, POD_READY, "old"))).collect();
    let mut w = mk_world("{}");
    let p = run(&w, &pods, Liveness::Alive, 1);
    assert_eq!(p.delete.len(), 3, "Recreate: all at once");
    assert_eq!(p.status.stale_hosts, 0);
    w.spec.update_policy.type_ = UpdateType::OnNextRestart;
    let p = run(&w, &pods, Liveness::Alive, 1);
    assert!(p.delete.is_empty());
    assert_eq!(p.status.stale_hosts, 3);
    assert_eq!(p.events[0].reason, "TemplateChanged");
    // A failed host is recreated with the new template; the others wait.
    let mut failing = pods.clone();
    failing.insert(1, pod(1, FAILED_POD, "old"));
    let p = run(&w, &failing, Liveness::Alive, 1);
    assert_eq!(p.delete, ["w-host-1"]);
    assert_eq!(p.status.stale_hosts, 2);
    w.spec.update_policy.type_ = UpdateType::RollingUpdate;
    let p = run(&w, &pods, Liveness::Alive, 1);
    assert_eq!(p.delete, ["w-host-0"], "maxUnavailable 1 by default");
    assert_eq!(p.status.stale_hosts, 2);
    assert_eq!(
        conditions::get(&p.status.conditions, PROGRESSING)
            .unwrap()
            .reason,
        "RollingUpdate"
    );
    // Host 0 is being recreated (down): nothing more until it is back.
    let mut rolling = pods.clone();
    rolling.remove(&0);
    let p = run(&w, &rolling, Liveness::Alive, 2);
    assert!(p.delete.is_empty());
    assert_eq!(p.create, [0]);
    w.spec.update_policy.max_unavailable =
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("67%".into()));
    let p = run(&w, &pods, Liveness::Alive, 3);
    assert_eq!(p.delete, ["w-host-0", "w-host-1"], "67% of 3 is 2");
    assert_eq!(max_unavailable(&w.spec.update_policy, 100), 67);
}
