//! ProcMesh plan tests of whose fault a failure was (invariant 13), from
//! YAML, no client.

use super::*;
use crate::controllers::procmesh::desired::tests::mk_pm;
use hostmesh_crds::cause::reasons;

const RUNNING: Option<WorldPhase> = Some(WorldPhase::Running);

fn mesh(restart: &str) -> ProcMesh {
    let mut pm = mk_pm(restart);
    pm.spec.per_host = vec![hostmesh_crds::Dim::new("gpu", 2)];
    pm.metadata.generation = Some(1);
    pm
}

fn obs(host: Rank, state: ProcState) -> ProcObs {
    ProcObs {
        host,
        state,
        exit_code: None,
        signal: None,
        reason: None,
        stderr_tail: None,
        stderr_head: None,
        oom_killed: false,
        failed_at: None,
        detected_at: None,
        incarnation: 0,
        actor_failure: None,
        actor_failures: 0,
        stall: None,
        addr: None,
    }
}

fn running() -> BTreeMap<Rank, ProcObs> {
    (0..4)
        .map(|r| (r, obs(r / 2, ProcState::Running)))
        .collect()
}

/// A proc on `host` that printed a traceback and exited 1, as its agent
/// reports it (timed at 99 s, received at once).
fn exits_with_traceback(host: Rank) -> ProcObs {
    ProcObs {
        exit_code: Some(1),
        failed_at: Some(Timestamp::from_second(99).unwrap()),
        detected_at: Some(Timestamp::from_second(99).unwrap()),
        stderr_tail: Some(
            "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n    raise ValueError(\"bad shard 7\")\nValueError: bad shard 7\n"
                .into(),
        ),
        ..obs(host, ProcState::Failed)
    }
}

fn run(
    pm: &ProcMesh,
    states: &BTreeMap<Rank, ProcObs>,
    lost: &BTreeMap<Rank, HostState>,
    host_causes: &BTreeMap<Rank, Attribution>,
    now: i64,
) -> Plan {
    let w = crate::controllers::procmesh::desired::tests::mk_world();
    let reported = (0..2).map(|h| (h, Timestamp::UNIX_EPOCH)).collect();
    plan(&PlanInput {
        pm,
        timings: hostmesh_crds::validate::proc_mesh(&pm.spec, Some(&w.spec)).unwrap(),
        world_phase: if lost.is_empty() {
            RUNNING
        } else {
            Some(WorldPhase::Degraded)
        },
        world_suspended: false,
        hosts: 2,
        extent: "host=2,gpu=2".into(),
        shape: hostmesh_crds::Shape::new(vec![
            hostmesh_crds::Dim::new("host", 2),
            hostmesh_crds::Dim::new("gpu", 2),
        ]),
        states,
        lost_hosts: lost,
        reported: &reported,
        last_heard: &BTreeMap::new(),
        now: Timestamp::from_second(now).unwrap(),
        world_ended: None,
        deps: Default::default(),
        host_causes,
    })
}

#[test]
fn a_traceback_exit_is_the_user_s_in_every_record() {
    let pm = mesh(", restartPolicy: {policy: OnFailure, maxRestarts: 2}");
    let mut states = running();
    states.insert(3, exits_with_traceback(1));
    let p = run(&pm, &states, &BTreeMap::new(), &BTreeMap::new(), 100);
    let ff = p.status.first_failure.clone().unwrap();
    assert_eq!(ff.cause, Some(FailureCause::User));
    let ev = ff.evidence.unwrap();
    assert_eq!(ev.reason, reasons::PYTHON_TRACEBACK);
    assert_eq!(ev.message, "Python traceback: ValueError: bad shard 7");
    let inc = p.status.incidents.last().unwrap();
    assert_eq!(
        (inc.cause, inc.evidence.as_ref().map(|e| e.reason.as_str())),
        (Some(FailureCause::User), Some(reasons::PYTHON_TRACEBACK))
    );
    assert_eq!(p.failures, vec![FailureCause::User], "one new incident");
    // The rank restarts; the next pass opens nothing new.
    let mut pm = pm;
    pm.status = Some(p.status);
    let p = run(&pm, &states, &BTreeMap::new(), &BTreeMap::new(), 101);
    assert!(p.failures.is_empty(), "{:?}", p.failures);
}

#[test]
fn a_failed_rank_carries_its_cause_in_the_rank_runs() {
    let pm = mesh("");
    let mut states = running();
    states.insert(
        1,
        ProcObs {
            signal: Some(11),
            ..obs(0, ProcState::Killed)
        },
    );
    let p = run(&pm, &states, &BTreeMap::new(), &BTreeMap::new(), 100);
    let r1 = runs::get(&p.status.ranks, 1).unwrap();
    assert_eq!(r1.cause, Some(FailureCause::User), "SIGSEGV is raised");
    assert_eq!(runs::get(&p.status.ranks, 0).unwrap().cause, None);
}

#[test]
fn procs_of_a_host_deleted_from_outside_are_the_infrastructure_s() {
    let pm = mesh(", restartPolicy: {policy: OnFailure, maxRestarts: 2}");
    let lost = BTreeMap::from([(1, HostState::Terminating)]);
    let deleted = Attribution::infrastructure(
        reasons::POD_DELETED,
        "host pod w-host-1 was deleted by someone other than hostmesh",
    );
    let causes = BTreeMap::from([(1, deleted.clone())]);
    let p = run(&pm, &running(), &lost, &causes, 100);
    let ff = p.status.first_failure.unwrap();
    assert_eq!((ff.rank, ff.state), (2, ProcState::Lost));
    assert_eq!(ff.cause, Some(FailureCause::Infrastructure));
    assert_eq!(ff.evidence, Some(deleted.evidence));
    assert_eq!(p.failures, vec![FailureCause::Infrastructure]);
    // Without the World's evidence, a lost host is still the
    // infrastructure's.
    let p = run(&pm, &running(), &lost, &BTreeMap::new(), 100);
    let ff = p.status.first_failure.unwrap();
    assert_eq!(ff.cause, Some(FailureCause::Infrastructure));
    assert_eq!(ff.evidence.unwrap().reason, reasons::HOST_LOST);
}

#[test]
fn a_traceback_on_an_unhealthy_device_is_the_infrastructure_s_even_when_told_late() {
    let mut pm = mesh("");
    let mut states = running();
    states.insert(2, exits_with_traceback(1));
    let device = Attribution::infrastructure(
        reasons::DEVICE_UNHEALTHY,
        "device nvidia.com/gpu gpu-1 of container host is Unhealthy",
    );
    let causes = BTreeMap::from([(1, device.clone())]);
    let p = run(&pm, &states, &BTreeMap::new(), &causes, 100);
    let ff = p.status.first_failure.clone().unwrap();
    assert_eq!(ff.cause, Some(FailureCause::Infrastructure));
    assert_eq!(ff.evidence, Some(device.evidence.clone()));
    // The device's health reported after the crash: the record is
    // upgraded, the failure itself kept.
    let p = run(&pm, &states, &BTreeMap::new(), &BTreeMap::new(), 100);
    assert_eq!(
        p.status.first_failure.as_ref().unwrap().cause,
        Some(FailureCause::User)
    );
    pm.status = Some(p.status);
    let p = run(&pm, &states, &BTreeMap::new(), &causes, 101);
    let upgraded = p.status.first_failure.unwrap();
    assert_eq!(upgraded.cause, Some(FailureCause::Infrastructure));
    assert_eq!(upgraded.evidence, Some(device.evidence));
    assert_eq!((upgraded.rank, upgraded.time), (ff.rank, ff.time));
    // A device on another host says nothing about this failure.
    let elsewhere = BTreeMap::from([(
        0,
        Attribution::infrastructure(reasons::DEVICE_UNHEALTHY, "gpu-0"),
    )]);
    let p = run(&mesh(""), &states, &BTreeMap::new(), &elsewhere, 100);
    assert_eq!(
        p.status.first_failure.unwrap().cause,
        Some(FailureCause::User)
    );
}
