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
        states,
        lost_hosts,
        reported,
        last_heard: &BTreeMap::new(),
        now: Timestamp::from_second(now).unwrap(),
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
    pm.status = Some(p.status);
    let p = run(&pm, Some(WorldPhase::Creating), &BTreeMap::new(), 200);
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
    let lost = BTreeMap::from([(1, HostState::Expired)]);
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

    // Host 0 reports its two procs running; host 1 reports none of them.
    let mut states = all(1, 2, ProcState::Running, 0);
    let at = |s| Timestamp::from_second(s).unwrap();
    let reported: BTreeMap<Rank, Timestamp> = [(0, at(1_000)), (1, at(1_000))].into();
    let p = run_reported(&pm, RUNNING, &states, &BTreeMap::new(), &reported, 1_001);
    assert_eq!(p.status.phase, Some(ProcMeshPhase::Spawning));
    assert!(p.status.first_failure.is_none(), "{:?}", p.status);
    assert_eq!(p.requeue_after, Some(Duration::from_millis(59_100)));
    let p = run_reported(&pm, RUNNING, &states, &BTreeMap::new(), &reported, 1_060);
    assert_eq!(p.status.first_failure.as_ref().map(|f| f.rank), Some(2));
    assert_eq!(p.status.first_failure.unwrap().state, ProcState::Timeout);

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
        states,
        lost_hosts: &BTreeMap::new(),
        reported: &reported,
        last_heard: &BTreeMap::new(),
        now: Timestamp::from_millisecond(now_ms).unwrap(),
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
        states: &states,
        lost_hosts: &lost,
        reported: &reported,
        last_heard: &heard,
        now: Timestamp::from_millisecond(t + 10_000).unwrap(),
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
