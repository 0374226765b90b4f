//! ProcMesh plan tests from YAML, no client.

use super::*;
use crate::controllers::procmesh::desired::tests::mk_pm;
use hostmesh_crds::Rank;

fn timings(pm: &ProcMesh) -> ProcMeshTimings {
    let w = crate::controllers::procmesh::desired::tests::mk_world();
    hostmesh_crds::validate::proc_mesh(&pm.spec, Some(&w.spec)).unwrap()
}

fn obs(state: ProcState, code: Option<i32>, inc: u32) -> ProcObs {
    ProcObs {
        host: 0,
        state,
        exit_code: code,
        signal: None,
        reason: None,
        stderr_tail: Some("Traceback: boom".into()),
        stderr_head: None,
        oom_killed: false,
        failed_at: None,
        detected_at: None,
        incarnation: inc,
        actor_failure: None,
        actor_failures: 0,
        stall: None,
        addr: None,
    }
}

fn all(hosts: Rank, per: Rank, state: ProcState, inc: u32) -> BTreeMap<Rank, ProcObs> {
    (0..hosts * per)
        .map(|r| (r, obs(state, None, inc)))
        .collect()
}

fn run(
    pm: &ProcMesh,
    world: Option<WorldPhase>,
    states: &BTreeMap<Rank, ProcObs>,
    now: i64,
) -> Plan {
    run_lost(pm, world, states, &BTreeMap::new(), now)
}

fn run_lost(
    pm: &ProcMesh,
    world: Option<WorldPhase>,
    states: &BTreeMap<Rank, ProcObs>,
    lost_hosts: &BTreeMap<Rank, HostState>,
    now: i64,
) -> Plan {
    // Both agents reported long ago: the spawn clock alone decides.
    let reported = (0..2).map(|h| (h, Timestamp::UNIX_EPOCH)).collect();
    run_reported(pm, world, states, lost_hosts, &reported, now)
}

fn run_reported(
    pm: &ProcMesh,
    world: Option<WorldPhase>,
    states: &BTreeMap<Rank, ProcObs>,
    lost_hosts: &BTreeMap<Rank, HostState>,
    reported: &BTreeMap<Rank, Timestamp>,
    now: i64,
) -> Plan {
    plan(&PlanInput {
        pm,
        timings: timings(pm),
        world_phase: world,
        world_suspended: world == Some(WorldPhase::Suspended),
        hosts: 2,
        extent: "host=2,gpu=2".into(),
        shape: hostmesh_crds::Shape::new(vec![
            hostmesh_crds::Dim::new("host", 2),
            hostmesh_crds::Dim::new("gpu", 2),
        ]),
        states,
        lost_hosts,
        reported,
        last_heard: &BTreeMap::new(),
        now: Timestamp::from_second(now).unwrap(),
        world_ended: None,
        deps: Default::default(),
        host_causes: &BTreeMap::new(),
    })
}

fn small(extra: &str) -> ProcMesh {
    let mut pm = mk_pm(extra);
    pm.spec.per_host = vec![hostmesh_crds::Dim::new("gpu", 2)];
    pm.metadata.generation = Some(1);
    pm
}

const RUNNING: Option<WorldPhase> = Some(WorldPhase::Running);

#[test]
fn waits_for_world_then_spawns_then_runs() {
    let pm = small("");
    let p = run(&pm, Some(WorldPhase::Creating), &BTreeMap::new(), 100);
    assert!(p.spawn.is_none());
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Pending));
    assert_eq!(
        conditions::get(&p.status.conditions, READY).unwrap().reason,
        "WaitingForWorld"
    );
    let p = run(&pm, RUNNING, &BTreeMap::new(), 100);
    assert_eq!(p.spawn, Some(Incarnations::default()));
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Spawning));
    assert_eq!(p.requeue_after, Some(Duration::from_millis(60_100)));
    let p = run(&pm, RUNNING, &all(2, 2, ProcState::Running, 0), 101);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Running));
    assert_eq!(p.status.running, 4);
    assert_eq!(p.status.extent.as_deref(), Some("host=2,gpu=2"));
    assert!(conditions::is_true(&p.status.conditions, READY));
    assert_eq!(p.status.ranks.len(), 1);
}

#[test]
fn a_suspended_world_stops_without_failures_and_respawns_on_resume() {
    let mut pm = small(", restartPolicy: {policy: OnFailure, maxRestarts: 1}");
    let p = run(&pm, RUNNING, &all(2, 2, ProcState::Running, 0), 100);
    pm.status = Some(p.status);
    // The World is suspended: its agents stop the procs (Stopped, or Killed
    // by their TERM) and its hosts go; none of that is a failure.
    let mut states = all(2, 2, ProcState::Stopped, 0);
    states.insert(1, obs(ProcState::Killed, None, 0));
    let suspended = Some(WorldPhase::Suspended);
    let lost: BTreeMap<Rank, HostState> = (0..2).map(|h| (h, HostState::Terminating)).collect();
    let p = run_lost(&pm, suspended, &states, &lost, 101);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Pending));
    assert!(p.spawn.is_none() && !p.stop);
    assert_eq!((p.status.failed, p.status.restarts), (0, 0));
    assert!(p.status.first_failure.is_none());
    let ready = conditions::get(&p.status.conditions, READY).unwrap();
    assert_eq!(ready.reason, "WorldSuspended");
    assert!(ready.message.contains("is suspended"), "{}", ready.message);
    assert_eq!(p.events[0].reason, "WorldSuspended");
    pm.status = Some(p.status);
    let p = run_lost(&pm, suspended, &BTreeMap::new(), &lost, 102);
    assert!(p.events.is_empty(), "announced once");
    assert_eq!(p.status.spawn_time, None);
    // Resumed: it waits for the World, then spawns every rank afresh.
    // What a suspended host's agent still reports while its pod goes (rank
    // 3 still stopping on host 1, which is Terminating, then Pending) is of
    // the stopped procs, no failure (CI once saw rank 3 Lost here).
    pm.status = Some(p.status);
    let mut late = BTreeMap::new();
    late.insert(
        3,
        ProcObs {
            host: 1,
            ..obs(ProcState::Stopping, None, 0)
        },
    );
    for (t, host) in [(200, HostState::Terminating), (201, HostState::Pending)] {
        let lost = BTreeMap::from([(1, host)]);
        let p = run_lost(&pm, Some(WorldPhase::Creating), &late, &lost, t);
        assert!(p.spawn.is_none() && !p.stop);
        assert_eq!((p.status.failed, p.status.restarts), (0, 0), "{host:?}");
        assert!(p.status.first_failure.is_none(), "{host:?}");
        assert_eq!(p.status.phase, Some(ProcMeshPhase::Pending));
        let ready = conditions::get(&p.status.conditions, READY).unwrap();
        assert_eq!(ready.reason, "WorldResuming");
        pm.status = Some(p.status);
    }
    let p = run(&pm, Some(WorldPhase::Creating), &BTreeMap::new(), 202);
    assert!(p.spawn.is_none());
    assert_eq!(p.status.failed, 0);
    pm.status = Some(p.status);
    let p = run(&pm, RUNNING, &BTreeMap::new(), 210);
    assert_eq!(p.spawn, Some(Incarnations::default()));
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Spawning));
    pm.status = Some(p.status);
    let p = run(&pm, RUNNING, &all(2, 2, ProcState::Running, 0), 211);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Running));
    assert_eq!(p.status.restarts, 0);
}

#[test]
fn never_policy_fails_with_root_cause_kept() {
    let mut pm = small("");
    let mut states = all(2, 2, ProcState::Running, 0);
    states.insert(2, obs(ProcState::Failed, Some(3), 0));
    let p = run(&pm, RUNNING, &states, 100);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Failed));
    assert!(p.stop);
    let ff = p.status.first_failure.clone().unwrap();
    assert_eq!((ff.rank, ff.host, ff.exit_code), (2, 1, Some(3)));
    assert_eq!(ff.stderr_tail.as_deref(), Some("Traceback: boom"));
    assert!(
        ff.reason.contains("rank 2 exited with code 3"),
        "{}",
        ff.reason
    );
    assert_eq!(p.status.failed, 1);
    // A later failure of another rank keeps the root cause.
    pm.status = Some(p.status);
    states.insert(0, obs(ProcState::Killed, None, 0));
    let p = run(&pm, RUNNING, &states, 105);
    assert_eq!(p.status.first_failure.unwrap().rank, 2);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Failed));
    assert!(!p.stop, "stopped once");
}

#[test]
fn on_failure_restarts_the_rank_in_place_with_backoff_and_limit() {
    let mut pm = small(", restartPolicy: {policy: OnFailure, maxRestarts: 2, backoff: 10s}");
    let mut states = all(2, 2, ProcState::Running, 0);
    states.insert(1, obs(ProcState::Failed, Some(1), 0));
    let p = run(&pm, RUNNING, &states, 100);
    let inc = p.spawn.clone().unwrap();
    assert_eq!((inc.get(1), inc.get(0)), (1, 0));
    assert_eq!(p.status.restarts, 1);
    assert!(conditions::is_true(&p.status.conditions, DEGRADED));
    assert_eq!(
        p.events.iter().map(|e| e.reason).collect::<Vec<_>>(),
        ["ProcFailed", "Restarting"]
    );
    // The restarted rank fails again: backoff 10s before restart 2.
    pm.status = Some(p.status);
    states.insert(1, obs(ProcState::Failed, Some(1), 1));
    let p = run(&pm, RUNNING, &states, 103);
    assert_eq!(p.spawn.unwrap().get(1), 1, "not yet");
    assert_eq!(p.requeue_after, Some(Duration::from_secs(7)));
    let p = run(&pm, RUNNING, &states, 111);
    assert_eq!(p.spawn.unwrap().get(1), 2);
    pm.status = Some(p.status);
    states.insert(1, obs(ProcState::Failed, Some(1), 2));
    let p = run(&pm, RUNNING, &states, 200);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Failed));
    let msg = &conditions::get(&p.status.conditions, FAILED)
        .unwrap()
        .message;
    assert!(msg.contains("restart limit 2"), "{msg}");
}

#[test]
fn permanent_exit_codes_and_rules() {
    let pm = small(
        ", restartPolicy: {policy: OnFailure, rules: [{action: Fail, exitCodes: [42]}, {action: Retry, exitCodes: [127]}]}",
    );
    let mut states = all(2, 2, ProcState::Running, 0);
    states.insert(0, obs(ProcState::Failed, Some(42), 0));
    assert_eq!(
        run(&pm, RUNNING, &states, 1).status.phase,
        Some(ProcMeshPhase::Failed)
    );
    states.insert(0, obs(ProcState::Failed, Some(127), 0));
    assert_eq!(
        run(&pm, RUNNING, &states, 1).status.phase,
        Some(ProcMeshPhase::Spawning),
        "rule overrides the default"
    );
    let plain = small(", restartPolicy: {policy: OnFailure}");
    let p = run(&plain, RUNNING, &states, 1);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Failed));
    assert!(
        conditions::get(&p.status.conditions, FAILED)
            .unwrap()
            .message
            .contains("permanent")
    );
}

#[test]
fn gang_restarts_every_rank_and_survives_operator_restart() {
    let mut pm = small(", restartPolicy: {policy: Gang, maxRestarts: 3}");
    let mut states = all(2, 2, ProcState::Running, 0);
    states.insert(3, obs(ProcState::Failed, Some(1), 0));
    let p = run(&pm, RUNNING, &states, 100);
    let inc = p.spawn.clone().unwrap();
    assert!((0..4).all(|r| inc.get(r) == 1));
    assert_eq!(p.status.restarts, 1);
    pm.status = Some(p.status);
    // The agents now run incarnation 1 everywhere; a fresh reconcile (e.g.
    // after an operator restart) asks for the same incarnations: no restart.
    let states = all(2, 2, ProcState::Running, 1);
    let p = run(&pm, RUNNING, &states, 102);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Running));
    assert!((0..4).all(|r| p.spawn.as_ref().unwrap().get(r) == 1));
    assert_eq!(p.status.restarts, 1);
}

#[test]
fn spawn_timeout_marks_silent_ranks() {
    let mut pm = small(", spawnTimeout: 5s");
    let p = run(&pm, RUNNING, &BTreeMap::new(), 100);
    pm.status = Some(p.status);
    let mut states = BTreeMap::new();
    states.insert(0, obs(ProcState::Running, None, 0));
    let p = run(&pm, RUNNING, &states, 106);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Failed));
    assert_eq!(p.status.failed, 3);
    assert_eq!(p.status.ranks[1].value.state, ProcState::Timeout);
    assert_eq!(p.status.first_failure.unwrap().state, ProcState::Timeout);
}

#[test]
fn all_succeeded_is_succeeded() {
    let pm = small("");
    let p = run(&pm, RUNNING, &all(2, 2, ProcState::Succeeded, 0), 1);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Succeeded));
    assert!(p.spawn.is_none());
}

#[test]
fn procs_of_a_lost_host_are_lost_and_restarted_once() {
    let mut pm = small(", restartPolicy: {policy: OnFailure, maxRestarts: 4}");
    let mut states = all(2, 2, ProcState::Running, 0);
    for r in [2, 3] {
        states.get_mut(&r).unwrap().host = 1;
    }
    // Expired (its agent silent), not evicted yet: Unreachable, which
    // costs nothing (issue 30: a blip shorter than evictionTimeout).
    let expired = BTreeMap::from([(1, HostState::Expired)]);
    let p = run_lost(&pm, Some(WorldPhase::Degraded), &states, &expired, 99);
    assert_eq!(p.status.ranks[1].value.state, ProcState::Unreachable);
    assert_eq!((p.status.failed, p.status.restarts), (0, 0));
    assert!(p.status.first_failure.is_none() && p.status.incidents.is_empty());
    assert!(p.spawn.is_none() && !p.stop);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Running));
    let ready = conditions::get(&p.status.conditions, READY).unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "RanksUnreachable")
    );
    assert!(ready.message.contains("2 unreachable"), "{}", ready.message);
    assert!(conditions::is_true(&p.status.conditions, DEGRADED));
    // Heard again in time: nothing happened.
    let mut back = pm.clone();
    back.status = Some(p.status.clone());
    let p2 = run(&back, RUNNING, &states, 100);
    assert!(conditions::is_true(&p2.status.conditions, READY));
    assert_eq!((p2.status.failed, p2.status.restarts), (0, 0));
    // Evicted instead (its pod going): Lost, a failure.
    pm.status = Some(p.status);
    let lost = BTreeMap::from([(1, HostState::Terminating)]);
    let p = run_lost(&pm, Some(WorldPhase::Degraded), &states, &lost, 100);
    let ff = p.status.first_failure.clone().unwrap();
    assert_eq!((ff.rank, ff.state), (2, ProcState::Lost));
    assert!(ff.reason.contains("host was lost"), "{}", ff.reason);
    // One incident, one restart, however many ranks the host held.
    assert_eq!(p.status.restarts, 1);
    pm.status = Some(p.status);
    // Still lost on the next reconcile: the restarted ranks wait, no recount.
    let p = run_lost(&pm, Some(WorldPhase::Degraded), &states, &lost, 101);
    assert_eq!(p.status.restarts, 1);
    assert_eq!(p.status.ranks[1].value.state, ProcState::Starting);
    assert!(
        p.spawn.is_none(),
        "nothing is sent while the World is not Running"
    );
    // No spawn timeout while the World is down.
    let p = run_lost(&pm, Some(WorldPhase::Degraded), &states, &lost, 1000);
    assert_eq!(p.status.failed, 0);
}

/// Losing a host with more procs than `maxRestarts` is one restart of its
/// ranks under OnFailure (it used to count each rank and give up).
#[test]
fn a_lost_host_is_one_restart_whatever_its_proc_count() {
    let mut pm = small(", restartPolicy: {policy: OnFailure, maxRestarts: 3}");
    pm.spec.per_host = vec![hostmesh_crds::Dim::new("gpu", 4)];
    let mut states = all(2, 4, ProcState::Running, 0);
    for r in 4..8 {
        states.get_mut(&r).unwrap().host = 1;
    }
    let lost = BTreeMap::from([(1, HostState::Failed)]);
    let p = run_lost(&pm, RUNNING, &states, &lost, 100);
    assert_ne!(
        p.status.phase,
        Some(ProcMeshPhase::Failed),
        "{:?}",
        p.status
    );
    assert_eq!(p.status.restarts, 1);
    assert!(!p.stop, "the healthy procs are left alone");
    let inc = p.spawn.expect("the lost ranks are restarted");
    assert_eq!(
        (0..8).map(|r| inc.get(r)).collect::<Vec<_>>(),
        [0, 0, 0, 0, 1, 1, 1, 1]
    );
}

/// A new leader long after the spawn (past spawnTimeout) has heard from no
/// agent yet: the ranks keep their recorded state, nothing times out, and
/// it looks again soon. Once an agent reports, a rank it does not have gets
/// a full spawnTimeout from that report.
#[test]
fn a_new_leader_never_times_out_ranks_it_has_not_heard_from() {
    let mut pm = small("");
    let p = run(&pm, RUNNING, &all(2, 2, ProcState::Running, 0), 100);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Running));
    pm.status = Some(p.status);

    let nobody = BTreeMap::new();
    let none = BTreeMap::new();
    let p = run_reported(&pm, RUNNING, &none, &BTreeMap::new(), &nobody, 1_000);
    assert_eq!(
        p.status.phase,
        Some(ProcMeshPhase::Running),
        "{:?}",
        p.status
    );
    assert_eq!(p.status.running, 4);
    assert!(p.status.first_failure.is_none());
    assert_eq!(p.status, *pm.status.as_ref().unwrap(), "nothing to write");
    assert_eq!(p.requeue_after, Some(Duration::from_secs(1)));

    // Host 0 reports its two procs running; host 1 reports none of the
    // procs status recorded running: its agent lost them, a failure at
    // once (Lost), never a spawn timeout a minute later.
    let mut states = all(1, 2, ProcState::Running, 0);
    let at = |s| Timestamp::from_second(s).unwrap();
    let reported: BTreeMap<Rank, Timestamp> = [(0, at(1_000)), (1, at(1_000))].into();
    let p = run_reported(&pm, RUNNING, &states, &BTreeMap::new(), &reported, 1_001);
    let ff = p
        .status
        .first_failure
        .expect("the lost procs are a failure");
    assert_eq!((ff.rank, ff.state), (2, ProcState::Lost));

    // Host 1 has not reported: its ranks stay as recorded, with no timeout.
    let reported: BTreeMap<Rank, Timestamp> = [(0, at(1_000))].into();
    for r in 2..4 {
        states.remove(&r);
    }
    let p = run_reported(&pm, RUNNING, &states, &BTreeMap::new(), &reported, 5_000);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Running));
    assert!(p.status.first_failure.is_none());
}

/// A Failed mesh is Degraded too: never `NoFailures` beside `Failed=True`.
#[test]
fn a_failed_mesh_is_degraded_not_no_failures() {
    let pm = small(", restartPolicy: {policy: Never}");
    let mut states = all(2, 2, ProcState::Running, 0);
    *states.get_mut(&1).unwrap() = obs(ProcState::Failed, Some(1), 0);
    let p = run(&pm, RUNNING, &states, 100);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Failed));
    let degraded = conditions::get(&p.status.conditions, DEGRADED).unwrap();
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "ProcsFailed")
    );
}

/// A mesh that failed when its host was lost does not show that host's
/// ranks as Starting once the host is replaced (nothing starts them).
#[test]
fn a_failed_mesh_keeps_a_replaced_hosts_ranks_as_recorded() {
    let mut pm = small(", restartPolicy: {policy: Never}");
    let mut states = all(2, 2, ProcState::Running, 0);
    for r in [2, 3] {
        states.get_mut(&r).unwrap().host = 1;
    }
    let lost = BTreeMap::from([(1, HostState::Failed)]);
    let p = run_lost(&pm, Some(WorldPhase::Degraded), &states, &lost, 100);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Failed));
    assert_eq!(p.status.failed, 2);
    pm.status = Some(p.status);
    // The World replaced host 1: its new agent reports nothing for the
    // mesh, and the old reports are gone with the old pod.
    states.retain(|_, o| o.host != 1);
    let p = run(&pm, RUNNING, &states, 200);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Failed));
    assert_eq!(p.status.failed, 2, "{:?}", p.status.ranks);
    assert!(
        p.status
            .ranks
            .iter()
            .all(|r| r.value.state != ProcState::Starting),
        "{:?}",
        p.status.ranks
    );
    assert!(p.spawn.is_none());
}

/// The root cause reads without a table: exit code 127 names the missing
/// program, signals have names, and the command line is on record.
#[test]
fn first_failure_decodes_the_exit_and_records_the_command() {
    let pm = small("");
    let mut states = all(2, 2, ProcState::Running, 0);
    states.insert(1, obs(ProcState::Failed, Some(127), 0));
    let p = run(&pm, RUNNING, &states, 100);
    let ff = p.status.first_failure.unwrap();
    assert!(
        ff.reason
            .contains("rank 1 exited with code 127: command not found: \"python\""),
        "{}",
        ff.reason
    );
    assert_eq!(ff.command.as_deref(), Some("python train.py --lr 1"));
    let mut killed = all(2, 2, ProcState::Running, 0);
    let mut o = obs(ProcState::Killed, None, 0);
    o.signal = Some(11);
    killed.insert(3, o);
    let p = run(&small(""), RUNNING, &killed, 100);
    let ff = p.status.first_failure.unwrap();
    assert!(
        ff.reason.contains("rank 3 killed by signal SIGSEGV (11)"),
        "{}",
        ff.reason
    );
}

/// A host that left the hub takes its reports with it: a rank that status
/// recorded running on it is Lost all the same, and restarted once.
#[test]
fn a_rank_recorded_running_on_a_gone_host_is_lost_without_a_report() {
    let mut pm = small(", restartPolicy: {policy: OnFailure, maxRestarts: 3}");
    let p = run(&pm, RUNNING, &all(2, 2, ProcState::Running, 0), 100);
    pm.status = Some(p.status);
    let mut states = all(2, 2, ProcState::Running, 0);
    states.retain(|r, _| *r < 2);
    let lost = BTreeMap::from([(1, HostState::Terminating)]);
    let reported = BTreeMap::from([(0, Timestamp::UNIX_EPOCH)]);
    let p = run_reported(
        &pm,
        Some(WorldPhase::Degraded),
        &states,
        &lost,
        &reported,
        101,
    );
    let ff = p
        .status
        .first_failure
        .clone()
        .expect("the lost ranks are a failure");
    assert_eq!((ff.rank, ff.state), (2, ProcState::Lost));
    assert_eq!(p.status.restarts, 1);
    pm.status = Some(p.status);
    // The restarted ranks wait for the new host; no second restart.
    let p = run_reported(
        &pm,
        Some(WorldPhase::Degraded),
        &states,
        &lost,
        &reported,
        102,
    );
    assert_eq!(p.status.restarts, 1);
}

/// A failure the agent timed at `at_ms` (ms since the epoch) and the hub
/// received at `seen_ms`.
fn timed(
    state: ProcState,
    code: Option<i32>,
    signal: Option<i32>,
    at_ms: i64,
    seen_ms: i64,
) -> ProcObs {
    ProcObs {
        signal,
        failed_at: Some(Timestamp::from_millisecond(at_ms).unwrap()),
        detected_at: Some(Timestamp::from_millisecond(seen_ms).unwrap()),
        ..obs(state, code, 0)
    }
}

fn run_ms(pm: &ProcMesh, states: &BTreeMap<Rank, ProcObs>, now_ms: i64) -> Plan {
    let reported = (0..2).map(|h| (h, Timestamp::UNIX_EPOCH)).collect();
    plan(&PlanInput {
        pm,
        timings: timings(pm),
        world_phase: RUNNING,
        world_suspended: false,
        hosts: 2,
        extent: "host=2,gpu=2".into(),
        shape: hostmesh_crds::Shape::new(vec![
            hostmesh_crds::Dim::new("host", 2),
            hostmesh_crds::Dim::new("gpu", 2),
        ]),
        states,
        lost_hosts: &BTreeMap::new(),
        reported: &reported,
        last_heard: &BTreeMap::new(),
        now: Timestamp::from_millisecond(now_ms).unwrap(),
        world_ended: None,
        deps: Default::default(),
        host_causes: &BTreeMap::new(),
    })
}

#[test]
fn a_collateral_report_arriving_first_gives_way_to_the_root() {
    for policy in ["Never", "Gang"] {
        let mut pm = small(&format!(
            ", restartPolicy: {{policy: {policy}, maxRestarts: 3}}"
        ));
        // Rank 3 is SIGKILLed at t; 50 ms later ranks 0-2 exit 1, and their
        // reports arrive first.
        let t = 100_000;
        let mut states = all(2, 2, ProcState::Running, 0);
        for r in 0..3 {
            states.insert(r, timed(ProcState::Failed, Some(1), None, t + 50, t + 60));
        }
        let p = run_ms(&pm, &states, t + 70);
        assert_eq!(
            p.status.first_failure.as_ref().unwrap().rank,
            0,
            "{policy}: best known"
        );
        pm.status = Some(p.status);
        // Rank 3's report, delayed 500 ms.
        states.insert(3, timed(ProcState::Killed, None, Some(9), t, t + 560));
        let p = run_ms(&pm, &states, t + 570);
        let s = &p.status;
        let ff = s.first_failure.as_ref().unwrap();
        assert_eq!(
            (ff.rank, ff.signal),
            (3, Some(9)),
            "{policy}: the real root"
        );
        assert_eq!(
            ff.time.0,
            Timestamp::from_millisecond(t).unwrap(),
            "agent time"
        );
        assert!(
            p.events
                .iter()
                .any(|e| e.note.contains("its report came later"))
        );
        let inc = s.incidents.last().unwrap();
        assert_eq!((inc.rank, inc.collateral), (3, 3), "{policy}: {inc:?}");
        assert_eq!(s.incidents.len(), 1, "{policy}: one cascade, one incident");
        if policy == "Never" {
            // The ranks are still shown as they ended: 0-2 collateral of 3.
            assert_eq!(s.collateral, 3);
            assert_eq!(s.failed, 4);
            let caused: Vec<Option<Rank>> = (0..4)
                .map(|r| runs::get(&s.ranks, r).unwrap().caused_by)
                .collect();
            assert_eq!(caused, [Some(3), Some(3), Some(3), None]);
            let failed = conditions::get(&s.conditions, FAILED).unwrap();
            assert!(failed.status == "True");
        }
        // Stable: the next reconcile changes nothing.
        pm.status = Some(p.status.clone());
        let again = run_ms(&pm, &states, t + 900);
        assert_eq!(again.status.first_failure, p.status.first_failure);
        assert_eq!(again.status.incidents, p.status.incidents);
    }
}

#[test]
fn a_late_unrelated_failure_is_not_collateral() {
    let mut pm = small("");
    let t = 100_000;
    let mut states = all(2, 2, ProcState::Running, 0);
    states.insert(1, timed(ProcState::Failed, Some(2), None, t, t + 5));
    // Rank 2 failed a minute later: its own failure.
    states.insert(
        2,
        timed(ProcState::Failed, Some(1), None, t + 60_000, t + 60_005),
    );
    let p = run_ms(&pm, &states, t + 60_010);
    assert_eq!(p.status.first_failure.as_ref().unwrap().rank, 1);
    assert_eq!(p.status.collateral, 0);
    pm.status = Some(p.status);
    // Rank 0, 2 s after rank 1: collateral.
    states.insert(
        0,
        timed(ProcState::Failed, Some(1), None, t + 2_000, t + 2_005),
    );
    let p = run_ms(&pm, &states, t + 60_020);
    assert_eq!(p.status.collateral, 1);
    assert_eq!(runs::get(&p.status.ranks, 0).unwrap().caused_by, Some(1));
    assert_eq!(runs::get(&p.status.ranks, 2).unwrap().caused_by, None);
}

#[test]
fn incidents_have_monotonic_phases_and_report_each_phase_once() {
    let mut pm = small(", restartPolicy: {policy: OnFailure, maxRestarts: 3}");
    let t = 100_000;
    let mut states = all(2, 2, ProcState::Running, 0);
    states.insert(1, timed(ProcState::Killed, None, Some(9), t, t + 20));
    let p = run_ms(&pm, &states, t + 30);
    let names = |p: &Plan| p.recovery.iter().map(|(n, _)| *n).collect::<Vec<_>>();
    // Decided and (in place: the hosts never went) hosts ready at once.
    assert_eq!(names(&p), ["detect", "decide", "pods"]);
    assert_eq!(p.recovery[0].1, Duration::from_millis(20));
    let inc = p.status.incidents[0].clone();
    assert_eq!(
        inc.action,
        Some(hostmesh_crds::incident::IncidentAction::RestartRanks)
    );
    assert!(inc.procs_running_at.is_none());
    pm.status = Some(p.status);
    // Restarting: nothing new.
    states.insert(1, obs(ProcState::Starting, None, 1));
    let p = run_ms(&pm, &states, t + 500);
    assert!(p.recovery.is_empty());
    pm.status = Some(p.status);
    states.insert(1, obs(ProcState::Running, None, 1));
    let p = run_ms(&pm, &states, t + 1_500);
    assert_eq!(names(&p), ["procs", "total"]);
    assert_eq!(p.recovery[1].1, Duration::from_millis(1_500));
    let inc = &p.status.incidents[0];
    let times = [
        Some(inc.failed_at.0),
        Some(inc.detected_at.0),
        inc.decided_at.as_ref().map(|t| t.0),
        inc.pods_ready_at.as_ref().map(|t| t.0),
        inc.procs_running_at.as_ref().map(|t| t.0),
    ];
    assert!(times.iter().all(Option::is_some), "{inc:?}");
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{inc:?}");
    pm.status = Some(p.status);
    let p = run_ms(&pm, &states, t + 2_000);
    assert!(p.recovery.is_empty(), "each phase once");
}

#[test]
fn an_oom_kill_is_named_in_the_root_cause() {
    let pm = small("");
    let t = 100_000;
    let mut states = all(2, 2, ProcState::Running, 0);
    states.insert(
        2,
        ProcObs {
            oom_killed: true,
            stderr_head: Some("Traceback (most recent call last):".into()),
            ..timed(ProcState::Killed, None, Some(9), t, t + 5)
        },
    );
    let p = run_ms(&pm, &states, t + 10);
    let ff = p.status.first_failure.unwrap();
    assert!(ff.oom_killed);
    assert!(ff.reason.contains("OOM-killed"), "{}", ff.reason);
    assert_eq!(
        ff.stderr_head.as_deref(),
        Some("Traceback (most recent call last):")
    );
    assert_eq!(
        runs::get(&p.status.ranks, 2).unwrap().reason.as_deref(),
        Some(crate::controllers::procmesh::exit::OOM_KILLED)
    );
}

#[test]
fn a_lost_host_is_the_root_of_the_exits_that_followed_it() {
    let mut pm = small("");
    let t = 100_000;
    // Host 1 dies (last heard at t-500); its peers on host 0 exit 50 ms
    // after, and their reports come long before the host expires.
    let mut states = all(2, 2, ProcState::Running, 0);
    for r in 0..2 {
        states.insert(r, timed(ProcState::Failed, Some(1), None, t + 50, t + 60));
    }
    let p = run_ms(&pm, &states, t + 70);
    assert_eq!(p.status.first_failure.as_ref().unwrap().rank, 0);
    pm.status = Some(p.status);
    for r in 2..4 {
        states.get_mut(&r).unwrap().host = 1;
    }
    let lost = BTreeMap::from([(1, HostState::Expired)]);
    let heard = BTreeMap::from([(1, Timestamp::from_millisecond(t - 500).unwrap())]);
    let reported = (0..2).map(|h| (h, Timestamp::UNIX_EPOCH)).collect();
    let p = plan(&PlanInput {
        pm: &pm,
        timings: timings(&pm),
        world_phase: RUNNING,
        world_suspended: false,
        hosts: 2,
        extent: "host=2,gpu=2".into(),
        shape: hostmesh_crds::Shape::new(vec![
            hostmesh_crds::Dim::new("host", 2),
            hostmesh_crds::Dim::new("gpu", 2),
        ]),
        states: &states,
        lost_hosts: &lost,
        reported: &reported,
        last_heard: &heard,
        now: Timestamp::from_millisecond(t + 10_000).unwrap(),
        world_ended: None,
        deps: Default::default(),
        host_causes: &BTreeMap::new(),
    });
    let s = &p.status;
    let ff = s.first_failure.as_ref().unwrap();
    assert_eq!((ff.rank, ff.state), (2, ProcState::Lost), "{ff:?}");
    assert_eq!(ff.time.0, Timestamp::from_millisecond(t - 500).unwrap());
    assert_eq!(runs::get(&s.ranks, 0).unwrap().caused_by, Some(2));
    assert_eq!(runs::get(&s.ranks, 1).unwrap().caused_by, Some(2));
    assert_eq!(
        runs::get(&s.ranks, 3).unwrap().caused_by,
        None,
        "lost with the root's host"
    );
    assert_eq!(s.collateral, 2);
}

/// Issue 30: a rank its agent reports alive is never timed out, whatever
/// the clocks say: a restart waiting for the old incarnation (a proc that
/// ignores SIGTERM, stopped within `stopTimeout`) counts nothing more. Once
/// the old incarnation ended, the new one has `stopTimeout` and
/// `spawnTimeout` from the restart.
#[test]
fn a_rank_reported_alive_is_never_timed_out() {
    let mut pm = small(
        ", spawnTimeout: 5s, stopTimeout: 30s, restartPolicy: {policy: OnFailure, maxRestarts: 3}",
    );
    let mut states = all(2, 2, ProcState::Running, 0);
    for r in [2, 3] {
        states.get_mut(&r).unwrap().host = 1;
    }
    let p = run(&pm, RUNNING, &states, 100);
    pm.status = Some(p.status);
    let mut stalled = obs(ProcState::Stalled, None, 0);
    stalled.stderr_tail = None;
    states.insert(1, stalled);
    let p = run(&pm, RUNNING, &states, 101);
    assert_eq!(p.status.restarts, 1);
    assert_eq!(p.spawn.as_ref().unwrap().get(1), 1);
    pm.status = Some(p.status);
    // The old incarnation is still alive long past spawnTimeout (and past
    // stopTimeout: the clocks may say anything): no timeout, no restart.
    for (state, now) in [(ProcState::Stopping, 120), (ProcState::Running, 10_000)] {
        states.insert(1, obs(state, None, 0));
        let p = run(&pm, RUNNING, &states, now);
        assert_eq!(
            (p.status.failed, p.status.restarts),
            (0, 1),
            "{state:?}: {:?}",
            p.status.ranks
        );
        assert_eq!(p.status.ranks[1].value.state, ProcState::Starting);
    }
    // It ended (stopped by the restart at 131): the new incarnation has
    // until 101 + 30 + 5.
    states.insert(1, obs(ProcState::Stopped, None, 0));
    let p = run(&pm, RUNNING, &states, 135);
    assert!(!timed_out(&p, 1), "{:?}", p.events);
    assert_eq!(p.requeue_after, Some(Duration::from_millis(1_100)));
    let p = run(&pm, RUNNING, &states, 137);
    assert!(timed_out(&p, 1), "{:?}", p.events);
}

/// Whether the plan timed `rank` out (a Timeout restarts at once under
/// OnFailure, so its Event says it).
fn timed_out(p: &Plan, rank: Rank) -> bool {
    let want = format!("rank {rank} did not start within spawnTimeout");
    p.events.iter().any(|e| e.note.contains(&want))
}

/// Issue 30: the ranks of a host that is gone (its pod still terminating
/// after a deletion the kubelet noticed late) are never timed out while it
/// is gone, whether the old agent still reports them running or nothing is
/// left; the replacement's agent starts their clock with its first report.
#[test]
fn the_ranks_of_a_gone_host_wait_for_its_replacement() {
    let mut pm = small(", spawnTimeout: 5s, restartPolicy: {policy: OnFailure, maxRestarts: 3}");
    let mut states = all(2, 2, ProcState::Running, 0);
    for r in [2, 3] {
        states.get_mut(&r).unwrap().host = 1;
    }
    let p = run(&pm, RUNNING, &states, 100);
    pm.status = Some(p.status);
    let terminating = BTreeMap::from([(1, HostState::Terminating)]);
    let p = run_lost(&pm, RUNNING, &states, &terminating, 101);
    assert_eq!(p.status.restarts, 1);
    pm.status = Some(p.status);
    // Minutes later the old pod's agent still reports them running.
    let p = run_lost(&pm, RUNNING, &states, &terminating, 1_000);
    assert_eq!((p.status.failed, p.status.restarts), (0, 1));
    // The old pod is gone and its reports with it; no new pod yet.
    for r in [2, 3] {
        states.remove(&r);
    }
    let p = run_lost(&pm, RUNNING, &states, &terminating, 2_000);
    assert_eq!((p.status.failed, p.status.restarts), (0, 1));
    // The replacement's agent reported at 3000: the clock starts there.
    let at = |s| Timestamp::from_second(s).unwrap();
    let reported: BTreeMap<Rank, Timestamp> = [(0, at(0)), (1, at(3_000))].into();
    let none = BTreeMap::new();
    let p = run_reported(&pm, RUNNING, &states, &none, &reported, 3_004);
    assert!(!timed_out(&p, 2), "{:?}", p.events);
    let p = run_reported(&pm, RUNNING, &states, &none, &reported, 3_006);
    assert!(timed_out(&p, 2), "{:?}", p.events);
}

/// Issue 30: whatever an agent reports (a reason naming a 1 MiB command),
/// the status stays small: every text bounded, cut with a marker.
#[test]
fn status_stays_small_whatever_the_agent_reports() {
    let pm = small("");
    let mut states = all(2, 2, ProcState::Running, 0);
    let mut failed = obs(ProcState::Failed, Some(127), 0);
    failed.reason = Some(format!("executable {:?} not found", "x".repeat(1 << 20)));
    failed.stderr_tail = Some("e".repeat(1 << 20));
    states.insert(1, failed);
    let p = run(&pm, RUNNING, &states, 100);
    let ff = p.status.first_failure.as_ref().unwrap();
    assert!(ff.reason.len() <= procmesh::MAX_FIRST_FAILURE_REASON);
    assert!(
        ff.reason.ends_with(procmesh::TRUNCATED),
        "{}",
        &ff.reason[..80]
    );
    let size = serde_json::to_vec(&p.status).unwrap().len();
    assert!(size < 16 * 1024, "{size} bytes of status");
}

#[test]
fn a_succeeded_mesh_stays_succeeded_when_its_world_s_hosts_go() {
    let mut pm = small("");
    let mut states = all(2, 2, ProcState::Succeeded, 0);
    let p = run(&pm, RUNNING, &states, 1);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Succeeded));
    pm.status = Some(p.status);
    // The World finished and deletes its hosts: reports still held for a
    // terminating host are not Lost, and neither are ranks with none.
    let lost = BTreeMap::from([(0, HostState::Terminating), (1, HostState::Pending)]);
    states.retain(|r, _| *r < 2);
    let world_done = Some("World w has finished (Succeeded)".to_string());
    let p = plan(&PlanInput {
        world_ended: world_done,
        ..input_for(&pm, Some(WorldPhase::Succeeded), &states, &lost, 5)
    });
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Succeeded));
    assert_eq!(p.status.failed, 0);
    assert_eq!(p.status.succeeded, 4);
    assert!(!p.stop && p.spawn.is_none());
}

#[test]
fn a_mesh_on_a_world_that_failed_fails_and_stops_its_procs() {
    let pm = small(", restartPolicy: {policy: OnFailure, maxRestarts: 3}");
    let states = all(2, 2, ProcState::Running, 0);
    let why = Some("World w failed: DeadlineExceeded".to_string());
    let p = plan(&PlanInput {
        world_ended: why,
        ..input_for(&pm, Some(WorldPhase::Failed), &states, &BTreeMap::new(), 5)
    });
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Failed));
    assert!(p.stop, "its procs are stopped");
    let failed = conditions::get(&p.status.conditions, FAILED).unwrap();
    assert_eq!(failed.reason, "WorldFinished");
    assert!(
        failed.message.contains("DeadlineExceeded"),
        "{}",
        failed.message
    );
    assert_eq!(p.status.restarts, 0);
}

/// A plan input of `pm` on a 2-host World whose agents reported long ago.
fn input_for<'a>(
    pm: &'a ProcMesh,
    world: Option<WorldPhase>,
    states: &'a BTreeMap<Rank, ProcObs>,
    lost_hosts: &'a BTreeMap<Rank, HostState>,
    now: i64,
) -> PlanInput<'a> {
    static REPORTED: std::sync::LazyLock<BTreeMap<Rank, Timestamp>> =
        std::sync::LazyLock::new(|| (0..2).map(|h| (h, Timestamp::UNIX_EPOCH)).collect());
    static NONE: BTreeMap<Rank, Timestamp> = BTreeMap::new();
    static NO_CAUSES: BTreeMap<Rank, hostmesh_crds::cause::Attribution> = BTreeMap::new();
    PlanInput {
        pm,
        timings: timings(pm),
        world_phase: world,
        world_suspended: world == Some(WorldPhase::Suspended),
        hosts: 2,
        extent: "host=2,gpu=2".into(),
        shape: hostmesh_crds::Shape::new(vec![
            hostmesh_crds::Dim::new("host", 2),
            hostmesh_crds::Dim::new("gpu", 2),
        ]),
        states,
        lost_hosts,
        reported: &REPORTED,
        last_heard: &NONE,
        now: Timestamp::from_second(now).unwrap(),
        world_ended: None,
        deps: Default::default(),
        host_causes: &NO_CAUSES,
    }
}

#[test]
fn a_mesh_past_its_active_deadline_fails_and_stops_its_procs() {
    let mut pm = small(", activeDeadlineSeconds: 30, restartPolicy: {policy: OnFailure}");
    let p = run(&pm, RUNNING, &BTreeMap::new(), 100);
    assert_eq!(
        p.status.start_time,
        Some(Time(Timestamp::from_second(100).unwrap()))
    );
    assert_eq!(p.requeue_after, Some(Duration::from_millis(30_050)));
    pm.status = Some(p.status);
    // A restart keeps the clock.
    let mut states = all(2, 2, ProcState::Running, 0);
    states.get_mut(&1).unwrap().state = ProcState::Failed;
    states.get_mut(&1).unwrap().exit_code = Some(1);
    let p = run(&pm, RUNNING, &states, 110);
    assert_eq!(p.status.restarts, 1);
    assert_eq!(
        p.status.start_time,
        Some(Time(Timestamp::from_second(100).unwrap()))
    );
    pm.status = Some(p.status);
    let p = run(&pm, RUNNING, &all(2, 2, ProcState::Running, 0), 130);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Failed));
    assert!(p.stop);
    let failed = conditions::get(&p.status.conditions, FAILED).unwrap();
    assert_eq!(failed.reason, "DeadlineExceeded");
    pm.status = Some(p.status);
    let p = run(&pm, RUNNING, &all(2, 2, ProcState::Stopped, 0), 131);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Failed));
    assert_eq!(
        conditions::get(&p.status.conditions, FAILED)
            .unwrap()
            .reason,
        "DeadlineExceeded",
        "the reason is kept"
    );
    assert!(!p.stop);
}

#[test]
fn rank_zero_success_stops_the_others_without_counting_failures() {
    let mut pm = small(", successPolicy: {policy: RankZero}, restartPolicy: {policy: OnFailure}");
    let mut states = all(2, 2, ProcState::Running, 0);
    states.get_mut(&0).unwrap().state = ProcState::Succeeded;
    states.get_mut(&0).unwrap().exit_code = Some(0);
    let p = run(&pm, RUNNING, &states, 10);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Succeeded));
    assert!(p.stop, "the other ranks are stopped");
    assert!(p.spawn.is_none());
    assert_eq!((p.status.succeeded, p.status.failed), (1, 0));
    assert_eq!(p.status.ranks[1].value.state, ProcState::Stopping);
    assert_eq!(
        p.status.ranks[1].value.reason.as_deref(),
        Some("SuccessPolicyMet")
    );
    assert_eq!(p.events[0].reason, "Succeeded");
    assert!(
        p.events[0].note.contains("stopping the 3 other ranks"),
        "{}",
        p.events[0].note
    );
    pm.status = Some(p.status);
    // Their ends come in, however they ended: stopped, never failures.
    let mut ended = states.clone();
    // (exit 0 on TERM is still a stop, not a success)
    ended.get_mut(&1).unwrap().state = ProcState::Succeeded;
    ended.get_mut(&1).unwrap().exit_code = Some(0);
    ended.get_mut(&2).unwrap().state = ProcState::Killed;
    ended.get_mut(&2).unwrap().signal = Some(15);
    ended.get_mut(&3).unwrap().state = ProcState::Failed;
    ended.get_mut(&3).unwrap().exit_code = Some(143);
    let p = run(&pm, RUNNING, &ended, 11);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Succeeded));
    assert_eq!(
        (p.status.succeeded, p.status.failed, p.status.running),
        (1, 0, 0)
    );
    assert!(p.status.first_failure.is_none());
    assert_eq!(p.status.restarts, 0);
    assert_eq!(p.status.ranks.len(), 2, "rank 0, then 1-3 Stopped");
    assert_eq!(p.status.ranks[1].value.state, ProcState::Stopped);
    assert!(!p.stop);
}

#[test]
fn any_rank_and_selected_ranks_success_policies() {
    let mut states = all(2, 2, ProcState::Running, 0);
    states.get_mut(&3).unwrap().state = ProcState::Succeeded;
    let any = small(", successPolicy: {policy: AnyRank}");
    let p = run(&any, RUNNING, &states, 10);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Succeeded));
    assert!(
        p.events[0].note.starts_with("rank 3 succeeded"),
        "{}",
        p.events[0].note
    );
    // {host: 1} selects ranks 2 and 3: rank 3 alone is not enough.
    let sel = small(", successPolicy: {dims: {host: 1}}");
    let p = run(&sel, RUNNING, &states, 10);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Running));
    states.get_mut(&2).unwrap().state = ProcState::Succeeded;
    let p = run(&sel, RUNNING, &states, 11);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Succeeded));
    assert!(
        p.events[0]
            .note
            .contains("the 2 ranks with host=1 succeeded"),
        "{}",
        p.events[0].note
    );
    assert_eq!(p.status.ranks[0].value.state, ProcState::Stopping);
    // The default waits for every rank.
    let p = run(&small(""), RUNNING, &states, 11);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Running));
}

#[test]
fn selected_ranks_follow_the_extent() {
    let shape = hostmesh_crds::Shape::new(vec![
        hostmesh_crds::Dim::new("replica", 2),
        hostmesh_crds::Dim::new("host", 2),
        hostmesh_crds::Dim::new("gpu", 2),
    ]);
    let dims = |kv: &[(&str, u32)]| kv.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    assert_eq!(
        selected_ranks(&shape, &dims(&[("replica", 1)])),
        [4, 5, 6, 7]
    );
    assert_eq!(
        selected_ranks(&shape, &dims(&[("host", 0), ("gpu", 1)])),
        [1, 5]
    );
    assert!(selected_ranks(&shape, &dims(&[("node", 0)])).is_empty());
}

#[test]
fn depends_on_waits_then_spawns_and_a_failed_dependency_fails_it() {
    use crate::controllers::procmesh::deps::Deps;
    let mut pm = small(", dependsOn: [{name: fetch}]");
    let waiting =
        Deps::Waiting("waiting for ProcMesh fetch to be Succeeded (it is Running)".into());
    let p = plan(&PlanInput {
        deps: waiting.clone(),
        ..input_for(&pm, RUNNING, &BTreeMap::new(), &BTreeMap::new(), 10)
    });
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Pending));
    assert!(p.spawn.is_none());
    let c = conditions::get(&p.status.conditions, conditions::WAITING).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "DependenciesNotReady")
    );
    assert!(c.message.contains("ProcMesh fetch"), "{}", c.message);
    assert_eq!(p.events[0].reason, "Waiting");
    pm.status = Some(p.status);
    let p = plan(&PlanInput {
        deps: Deps::Met,
        ..input_for(&pm, RUNNING, &BTreeMap::new(), &BTreeMap::new(), 11)
    });
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Spawning));
    assert!(p.spawn.is_some());
    let c = conditions::get(&p.status.conditions, conditions::WAITING).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "DependenciesMet")
    );
    // Once spawned, a dependency's later state does not matter.
    pm.status = Some(p.status);
    let p = plan(&PlanInput {
        deps: waiting,
        ..input_for(&pm, RUNNING, &BTreeMap::new(), &BTreeMap::new(), 12)
    });
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Spawning));
    // A dependency that fails fails a mesh still waiting.
    let fresh = small(", dependsOn: [{name: fetch}]");
    let p = plan(&PlanInput {
        deps: Deps::Failed("dependency ProcMesh fetch failed: rank 0 exited with code 1".into()),
        ..input_for(&fresh, RUNNING, &BTreeMap::new(), &BTreeMap::new(), 10)
    });
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Failed));
    assert!(p.spawn.is_none());
    assert_eq!(
        conditions::get(&p.status.conditions, FAILED)
            .unwrap()
            .reason,
        "DependencyFailed"
    );
}

#[test]
fn a_failed_rank_restarts_the_slice_of_its_scope_as_one_restart() {
    let pm = small(", restartPolicy: {policy: OnFailure, scope: host}");
    let mut states = all(2, 2, ProcState::Running, 0);
    states.get_mut(&1).unwrap().state = ProcState::Failed;
    states.get_mut(&1).unwrap().exit_code = Some(1);
    let p = run(&pm, RUNNING, &states, 10);
    assert_eq!(p.status.restarts, 1);
    let inc = p.spawn.unwrap();
    assert_eq!(
        (0..4).map(|r| inc.get(r)).collect::<Vec<_>>(),
        [1, 1, 0, 0],
        "host 0's ranks restart, host 1's keep running"
    );
    assert!(
        p.events.iter().any(|e| e.reason == "Restarting"
            && e.note
                .contains("restarting the ranks of host=0 (scope host)")),
        "{:?}",
        p.events
    );
}

#[test]
fn rules_restart_without_counting_and_ignore() {
    let mut pm = small(
        ", restartPolicy: {policy: OnFailure, maxRestarts: 1, rules: [\
         {name: lost, action: RestartWithoutCounting, reasons: [HostLost]},\
         {name: done, action: Ignore, exitCodes: [7]}]}",
    );
    let mut states = all(2, 2, ProcState::Running, 0);
    for r in [2, 3] {
        states.get_mut(&r).unwrap().host = 1;
    }
    let lost = BTreeMap::from([(1, HostState::Failed)]);
    for now in [10, 11, 12] {
        let p = run_lost(&pm, RUNNING, &states, &lost, now);
        assert_ne!(p.status.phase, Some(ProcMeshPhase::Failed));
        assert_eq!(p.status.restarts, 0, "a lost host does not burn the budget");
        assert_eq!(p.status.rule_fired.as_ref().unwrap().name, "lost");
        pm.status = Some(p.status);
        for r in [2, 3] {
            let o = states.get_mut(&r).unwrap();
            o.incarnation += 1;
        }
    }
    // Rank 1 exits 7: accepted, no failure, no restart.
    let mut pm = small(
        ", restartPolicy: {policy: OnFailure, maxRestarts: 1, rules: [{name: done, action: Ignore, exitCodes: [7]}]}",
    );
    let mut states = all(2, 2, ProcState::Running, 0);
    states.get_mut(&1).unwrap().state = ProcState::Failed;
    states.get_mut(&1).unwrap().exit_code = Some(7);
    let p = run(&pm, RUNNING, &states, 10);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Running));
    assert_eq!((p.status.failed, p.status.restarts), (0, 0));
    assert!(p.status.first_failure.is_none());
    let r1 = runs::get(&p.status.ranks, 1).unwrap();
    assert_eq!(r1.state, ProcState::Stopped);
    assert!(
        r1.reason
            .as_deref()
            .unwrap()
            .starts_with("ignored (rule done: Ignore)"),
        "{r1:?}"
    );
    pm.status = Some(p.status);
    let p = run(&pm, RUNNING, &states, 11);
    assert!(!p.events.iter().any(|e| e.reason == "RuleFired"), "once");
}

/// Issue 30, item 6: ranks that crashed at the same instant are one
/// incident and one restart, however many passes their reports take to
/// arrive; an unrelated failure well after is its own incident and counts.
#[test]
fn one_crash_reported_over_several_passes_is_one_restart() {
    let mut pm = small(", restartPolicy: {policy: OnFailure, maxRestarts: 5}");
    let t = 100_000;
    let p = run_ms(&pm, &all(2, 2, ProcState::Running, 0), t - 1_000);
    pm.status = Some(p.status);
    // Ranks 0 and 1 first: one restart.
    let mut states = all(2, 2, ProcState::Running, 0);
    for r in 0..2 {
        states.insert(r, timed(ProcState::Failed, Some(1), None, t, t + 5));
    }
    let p = run_ms(&pm, &states, t + 10);
    assert_eq!(p.status.restarts, 1);
    assert_eq!(p.status.incidents.len(), 1);
    pm.status = Some(p.status);
    // Ranks 2 and 3 of the same crash, reported a pass later, while 0 and
    // 1 restart: they restart too, uncounted, in the same incident.
    for r in 0..2 {
        states.insert(r, obs(ProcState::Starting, None, 1));
    }
    for r in 2..4 {
        states.insert(r, timed(ProcState::Failed, Some(1), None, t + 1, t + 900));
    }
    let p = run_ms(&pm, &states, t + 1_000);
    assert_eq!(p.status.restarts, 1, "{:?}", p.status.incidents);
    assert_eq!(p.status.incidents.len(), 1);
    assert!(
        p.spawn
            .as_ref()
            .is_some_and(|i| i.get(2) == 1 && i.get(3) == 1)
    );
    pm.status = Some(p.status);
    // All back; a minute later rank 1 fails on its own: a new incident,
    // counted.
    let mut states: BTreeMap<Rank, ProcObs> = (0..4)
        .map(|r| (r, obs(ProcState::Running, None, 1)))
        .collect();
    let p = run_ms(&pm, &states, t + 2_000);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Running));
    pm.status = Some(p.status);
    states.insert(
        1,
        ProcObs {
            incarnation: 1,
            ..timed(ProcState::Failed, Some(1), None, t + 60_000, t + 60_005)
        },
    );
    let p = run_ms(&pm, &states, t + 60_010);
    assert_eq!(p.status.restarts, 2);
    assert_eq!(p.status.incidents.len(), 2);
}

/// Issue 30, item 7: a host's agent that reports again without the procs
/// it ran (its container or its kubelet restarted, or its pod was replaced
/// between two passes) has lost them: Lost, one counted restart decided in
/// its own incident, nothing more while the new procs start, and a later
/// unrelated failure opens a second incident rooted at its own rank.
#[test]
fn procs_an_agent_no_longer_reports_are_lost_and_restarted_once() {
    let mut pm = small(", restartPolicy: {policy: OnFailure, maxRestarts: 3}");
    let p = run(&pm, RUNNING, &all(2, 2, ProcState::Running, 0), 100);
    pm.status = Some(p.status);
    // Host 1's agent reports again, without ranks 2 and 3.
    let mut states = all(2, 2, ProcState::Running, 0);
    states.retain(|r, _| *r < 2);
    let p = run(&pm, RUNNING, &states, 101);
    let ff = p
        .status
        .first_failure
        .clone()
        .expect("the vanished procs are a failure");
    assert_eq!((ff.rank, ff.state), (2, ProcState::Lost));
    assert!(ff.reason.contains("no longer"), "{ff:?}");
    assert_eq!(p.status.restarts, 1, "one restart for both ranks");
    assert_eq!(p.status.incidents.len(), 1);
    assert!(
        p.status.incidents[0].decided_at.is_some(),
        "decided at once"
    );
    pm.status = Some(p.status);
    // The new procs are being created: nothing more is counted.
    let p = run(&pm, RUNNING, &states, 102);
    assert_eq!(p.status.restarts, 1);
    assert_eq!(
        runs::get(&p.status.ranks, 2).unwrap().state,
        ProcState::Starting
    );
    pm.status = Some(p.status);
    let mut states = all(2, 2, ProcState::Running, 0);
    for r in [2, 3] {
        states.insert(r, obs(ProcState::Running, None, 1));
    }
    let p = run(&pm, RUNNING, &states, 103);
    assert_eq!(p.status.restarts, 1);
    pm.status = Some(p.status);
    // Much later rank 1 is killed: its own incident.
    states.insert(1, obs(ProcState::Failed, Some(137), 0));
    let p = run(&pm, RUNNING, &states, 400);
    assert_eq!(p.status.restarts, 2);
    assert_eq!(p.status.incidents.len(), 2, "{:?}", p.status.incidents);
    assert_eq!(p.status.incidents[1].rank, 1);
}

/// A kubelet restart loses every host's procs at once, but the agents come
/// back one by one: host 1's loss, reported after host 0's restarted procs
/// already run, happened before the restart was decided. It joins that
/// incident and restarts uncounted (incidents invariant 4).
#[test]
fn a_second_hosts_late_report_of_the_same_crash_joins_the_closed_incident() {
    let mut pm = small(", restartPolicy: {policy: OnFailure, maxRestarts: 3}");
    let t0 = 100_000;
    let mut states = all(2, 2, ProcState::Running, 0);
    for r in [2, 3] {
        states.get_mut(&r).unwrap().host = 1;
    }
    let p = run_ms(&pm, &states, t0);
    pm.status = Some(p.status);
    // Host 0's agent is back first: its procs were lost at t0 + 10 ms.
    for r in [0, 1] {
        states.insert(r, timed(ProcState::Lost, None, None, t0 + 10, t0 + 5_000));
    }
    let p = run_ms(&pm, &states, t0 + 5_000);
    assert_eq!(p.status.restarts, 1);
    pm.status = Some(p.status);
    for r in [0, 1] {
        states.insert(r, obs(ProcState::Running, None, 1));
    }
    let p = run_ms(&pm, &states, t0 + 5_010);
    assert!(p.status.incidents[0].closed(), "{:?}", p.status.incidents);
    pm.status = Some(p.status);
    // Host 1's agent, back 20 ms later: lost at t0 + 30 ms.
    for r in [2, 3] {
        let mut o = timed(ProcState::Lost, None, None, t0 + 30, t0 + 5_020);
        o.host = 1;
        states.insert(r, o);
    }
    let p = run_ms(&pm, &states, t0 + 5_020);
    assert_eq!(
        p.status.restarts, 1,
        "the same crash: {:?}",
        p.status.incidents
    );
    assert_eq!(p.status.incidents.len(), 1, "{:?}", p.status.incidents);
    assert_eq!(
        p.spawn.as_ref().map(|s| s.get(2)),
        Some(1),
        "rank 2 restarts"
    );
    pm.status = Some(p.status);
    for r in [2, 3] {
        let mut o = obs(ProcState::Running, None, 1);
        o.host = 1;
        states.insert(r, o);
    }
    let p = run_ms(&pm, &states, t0 + 6_000);
    assert_eq!((p.status.restarts, p.status.running), (1, 4));
    pm.status = Some(p.status);
    // A failure after the decision is its own incident, counted.
    let mut o = timed(ProcState::Failed, Some(1), None, t0 + 9_000, t0 + 9_001);
    o.incarnation = 1;
    states.insert(1, o);
    let p = run_ms(&pm, &states, t0 + 9_001);
    assert_eq!(p.status.restarts, 2);
    assert_eq!(p.status.incidents.len(), 2);
}

/// A rank that ended (exit 0) and that its agent no longer reports (the
/// agent restarted) keeps its recorded end: it is never run again, and is
/// no failure.
#[test]
fn an_ended_rank_its_agent_no_longer_has_stays_ended() {
    let mut pm = small(", restartPolicy: {policy: OnFailure, maxRestarts: 3}");
    let mut states = all(2, 2, ProcState::Running, 0);
    states.insert(1, obs(ProcState::Succeeded, Some(0), 0));
    let p = run(&pm, RUNNING, &states, 100);
    assert_eq!(
        runs::get(&p.status.ranks, 1).unwrap().state,
        ProcState::Succeeded
    );
    pm.status = Some(p.status);
    states.remove(&1);
    let p = run(&pm, RUNNING, &states, 101);
    assert_eq!(
        runs::get(&p.status.ranks, 1).unwrap().state,
        ProcState::Succeeded
    );
    assert_eq!(p.status.restarts, 0);
    assert!(p.status.first_failure.is_none());
}
