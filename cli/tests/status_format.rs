//! `hostmesh status` formatting, from YAML objects as the API server returns
//! them (status.rs invariants 1-3).

use hostmesh_cli::status::{MAX_RUNS_SHOWN, Target, format_procmesh, format_world, parse_target};
use hostmesh_crds::{ProcMesh, World};
use k8s_openapi::jiff::Timestamp;

fn now() -> Timestamp {
    "2026-01-01T12:00:00Z".parse().expect("timestamp")
}

const WORLD: &str = r#"
apiVersion: hostmesh.dev/v1alpha1
kind: World
metadata: {name: trainer, namespace: ml, generation: 2}
spec:
  shape: [{name: replica, size: 2}, {name: host, size: 2}]
  template: {spec: {containers: [{name: host, image: trainer:1}]}}
status:
  phase: Degraded
  ready: 3/4
  readyHosts: 3
  desiredHosts: 4
  restarts: 1
  observedGeneration: 2
  degradedSince: "2026-01-01T11:58:00Z"
  hosts:
  - {start: 0, count: 3, state: Ready}
  - {start: 3, count: 1, state: Starting, reason: ImagePullBackOff}
  conditions:
  - {type: Ready, status: "False", reason: HostsNotReady, message: "3/4 hosts ready", lastTransitionTime: "2026-01-01T11:58:00Z"}
  - {type: Degraded, status: "True", reason: HostFailed, message: "host 3 failed", lastTransitionTime: "2026-01-01T11:59:30Z"}
"#;

const PROCMESH: &str = r#"
apiVersion: hostmesh.dev/v1alpha1
kind: ProcMesh
metadata: {name: train, namespace: ml, generation: 3}
spec:
  world: trainer
  perHost: [{name: gpu, size: 2}]
  command: [python, train.py]
status:
  phase: Failed
  extent: replica=2,host=2,gpu=2
  running: 6
  succeeded: 0
  failed: 2
  restarts: 0
  observedGeneration: 2
  firstFailure:
    rank: 5
    host: 2
    time: "2026-01-01T11:57:00Z"
    state: Failed
    reason: exited with code 3
    exitCode: 3
    command: "python train.py --shard 5"
    cause: User
    evidence: {reason: PythonTraceback, message: "Python traceback: ValueError: bad shard"}
    stderrTail: "loading\nTraceback (most recent call last):\n\u001b[31mValueError: bad shard\u001b[0m\n"
  ranks:
  - {start: 0, count: 5, state: Running}
  - {start: 5, count: 1, state: Failed, exitCode: 3, reason: exited with code 3}
  - {start: 6, count: 1, state: Killed, signal: 9}
  - {start: 7, count: 1, state: Running}
  conditions:
  - {type: Failed, status: "True", reason: ProcFailed, message: "rank 5 exited with code 3", lastTransitionTime: "2026-01-01T11:57:00Z"}
"#;

#[test]
fn world_view_shows_phase_ready_runs_conditions_and_procmeshes() {
    let world: World = serde_saphyr::from_str(WORLD).expect("world yaml");
    let pm: ProcMesh = serde_saphyr::from_str(PROCMESH).expect("procmesh yaml");
    let text = format_world(&world, &[pm], now());
    let expect = [
        "World ml/trainer: Degraded",
        "  shape      replica=2,host=2 (4 hosts)",
        "  ready      3/4 hosts",
        "  restarts   1",
        "  degraded   for 2m",
    ];
    for line in expect {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(text.contains("  RANKS  STATE     REASON\n"), "{text}");
    assert!(text.contains("  0-2    Ready\n"), "{text}");
    assert!(
        text.contains("  3      Starting  ImagePullBackOff\n"),
        "{text}"
    );
    assert!(
        text.contains("Ready     False   HostsNotReady  2m     3/4 hosts ready"),
        "{text}"
    );
    assert!(
        text.contains("Degraded  True    HostFailed     30s    host 3 failed"),
        "{text}"
    );
    assert!(
        text.contains("train  Failed  6        2       rank 5: exited with code 3"),
        "{text}"
    );
    assert!(!text.contains("not caught up"), "{text}");
}

#[test]
fn procmesh_view_names_the_first_failure_with_a_clean_stderr_tail() {
    let pm: ProcMesh = serde_saphyr::from_str(PROCMESH).expect("procmesh yaml");
    let text = format_procmesh(&pm, now());
    assert!(text.starts_with("ProcMesh ml/train: Failed\n"), "{text}");
    assert!(
        text.contains("  extent     replica=2,host=2,gpu=2\n"),
        "{text}"
    );
    assert!(
        text.contains("  procs      6 running, 0 succeeded, 2 failed\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "First failure: rank 5 on host 2 (trainer-host-2), Failed, exit code 3, 3m ago"
        ),
        "{text}"
    );
    assert!(text.contains("  reason: exited with code 3\n"), "{text}");
    assert!(
        text.contains("  cause: User (PythonTraceback: Python traceback: ValueError: bad shard)\n"),
        "{text}"
    );
    assert!(
        text.contains("  command: python train.py --shard 5\n"),
        "{text}"
    );
    assert!(
        text.contains("    | Traceback (most recent call last):\n"),
        "{text}"
    );
    assert!(text.contains("[31mValueError: bad shard [0m"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "escape characters must be removed: {text:?}"
    );
    assert!(
        text.contains("  5      Failed (exit 3)   exited with code 3\n"),
        "{text}"
    );
    assert!(text.contains("  6      Killed (SIGKILL)\n"), "{text}");
    assert!(
        text.contains("status describes generation 2; the spec is at 3"),
        "{text}"
    );
}

#[test]
fn output_is_bounded_for_huge_meshes() {
    let mut pm: ProcMesh = serde_saphyr::from_str(PROCMESH).expect("procmesh yaml");
    let status = pm.status.as_mut().expect("status");
    let runs: String = (0..1000)
        .map(|i| {
            let state = if i % 2 == 0 { "Running" } else { "Lost" };
            format!("- {{start: {i}, count: 1, state: {state}}}\n")
        })
        .collect();
    status.ranks = serde_saphyr::from_str(&runs).expect("runs");
    status.ranks_truncated = true;
    let text = format_procmesh(&pm, now());
    assert!(text.lines().count() < MAX_RUNS_SHOWN + 40, "{text}");
    assert!(
        text.contains(&format!("... {} more runs", 1000 - MAX_RUNS_SHOWN)),
        "{text}"
    );
    assert!(text.contains("prefix of the ranks only"), "{text}");
}

/// A Monarch World's worker settings and its first failure, decoded.
#[test]
fn world_view_shows_monarch_and_the_first_failure() {
    let yaml = WORLD
        .replace(
            "  template:",
            "  monarch: {port: 27000}\n  template:",
        )
        .replace(
            "  restarts: 1\n",
            "  restarts: 1\n  firstFailure: {rank: 3, pod: trainer-host-3, time: \"2026-01-01T11:59:00Z\", reason: \"monarch worker (pid 7) killed by signal SIGKILL (9)\", signal: 9, command: \"python -u -c x\", stderrTail: \"a\\nb\"}\n",
        );
    let world: World = serde_saphyr::from_str(&yaml).expect("world yaml");
    let text = format_world(&world, &[], now());
    for want in [
        "  monarch    mesh trainer, worker port 27000",
        "First failure: host 3 (trainer-host-3), signal 9 (SIGKILL), 60s ago",
        "  reason: monarch worker (pid 7) killed by signal SIGKILL (9)",
        "  command: python -u -c x",
        "    | a\n    | b",
    ] {
        assert!(text.contains(want), "{want:?} in:\n{text}");
    }
}

#[test]
fn a_world_without_status_is_shown_as_unknown() {
    let mut world: World = serde_saphyr::from_str(WORLD).expect("world yaml");
    world.status = None;
    let text = format_world(&world, &[], now());
    assert!(text.starts_with("World ml/trainer: Unknown\n"), "{text}");
    assert!(text.contains("(none reported yet)"), "{text}");
    assert!(text.contains("(none yet)"), "{text}");
    assert!(!text.contains("ProcMeshes:"), "{text}");
}

#[test]
fn targets_parse_and_bad_ones_explain_the_form() {
    assert_eq!(
        parse_target("world/a").ok(),
        Some(Target::World("a".into()))
    );
    assert_eq!(
        parse_target("Worlds/a").ok(),
        Some(Target::World("a".into()))
    );
    assert_eq!(
        parse_target("pm/b").ok(),
        Some(Target::ProcMesh("b".into()))
    );
    assert_eq!(
        parse_target("procmeshes.hostmesh.dev/b").ok(),
        Some(Target::ProcMesh("b".into()))
    );
    assert_eq!(
        parse_target("monarchmesh/m").ok(),
        Some(Target::MonarchMesh("m".into()))
    );
    for bad in ["trainer", "pod/x", "world/", "world/a/b"] {
        let msg = parse_target(bad).expect_err(bad).to_string();
        assert!(msg.contains("KIND/NAME"), "{msg}");
        assert!(msg.contains("world/trainer"), "{msg}");
    }
}

#[test]
fn procmesh_view_counts_collateral_and_shows_the_last_incidents() {
    let mut pm: ProcMesh = serde_saphyr::from_str(PROCMESH).expect("procmesh yaml");
    let extra: hostmesh_crds::ProcMeshStatus = serde_saphyr::from_str(
        r#"
failed: 8
collateral: 7
firstFailure:
  rank: 5
  host: 2
  time: "2026-01-01T11:57:00.250000Z"
  state: Killed
  signal: 9
  oomKilled: true
  reason: "rank 5 was OOM-killed"
  stderrHead: "Traceback: the first line"
  stderrTail: "noise 40"
ranks:
- {start: 0, count: 5, state: Failed, exitCode: 1, causedBy: 5}
- {start: 5, count: 1, state: Killed, signal: 9, reason: OOMKilled}
incidents:
- failedAt: "2026-01-01T11:50:00.000000Z"
  detectedAt: "2026-01-01T11:50:00.020000Z"
  decidedAt: "2026-01-01T11:50:00.030000Z"
  podsReadyAt: "2026-01-01T11:50:00.030000Z"
  procsRunningAt: "2026-01-01T11:50:01.530000Z"
  action: RestartRanks
  rank: 2
  rootCause: "rank 2 exited with code 3"
- failedAt: "2026-01-01T11:57:00.250000Z"
  detectedAt: "2026-01-01T11:57:00.760000Z"
  decidedAt: "2026-01-01T11:57:00.770000Z"
  action: GaveUp
  rank: 5
  rootCause: "rank 5 was OOM-killed"
  collateral: 7
"#,
    )
    .expect("status yaml");
    let status = pm.status.as_mut().expect("status");
    status.failed = extra.failed;
    status.collateral = extra.collateral;
    status.first_failure = extra.first_failure;
    status.ranks = extra.ranks;
    status.incidents = extra.incidents;
    let text = format_procmesh(&pm, now());
    assert!(
        text.contains("6 running, 0 succeeded, 8 failed (1 independent, 7 collateral)"),
        "{text}"
    );
    assert!(text.contains("  OOM-killed"), "{text}");
    assert!(
        text.contains("stderr (first lines):\n    | Traceback: the first line"),
        "{text}"
    );
    assert!(
        text.contains("Failed (exit 1) collateral of rank 5"),
        "{text}"
    );
    let newest = text.find("11:57:00.250").expect("the newest incident");
    let older = text.find("11:50:00.000").expect("the older incident");
    assert!(newest < older, "newest first: {text}");
    assert!(text.contains("510ms"), "detect of the newest: {text}");
    assert!(text.contains("1500ms"), "procs of the older: {text}");
    assert!(text.contains("GaveUp"), "{text}");
    assert!(
        text.contains("rank 5 was OOM-killed (+7 collateral)"),
        "{text}"
    );
}
