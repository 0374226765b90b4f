//! Stall detection on real procs (host::stall invariants 1-3,
//! host::lifecycle invariant 5): a hung proc is stalled, a busy printer
//! and a proc touching its progress file are not, a progress pattern
//! counts only matching lines, and a stall ends when output resumes.

mod agent_common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use agent_common::{Harness, harness, sh, wait_state};
use hostmesh_agent::protocol::CreateOrUpdate;
use hostmesh_testkit::PATIENCE;

fn with_stall(mut req: CreateOrUpdate, timeout_ms: u64, pattern: Option<&str>) -> CreateOrUpdate {
    req.spec.stall_timeout_ms = Some(timeout_ms);
    req.spec.progress_pattern = pattern.map(str::to_owned);
    req
}

/// Watches state changes until `stalled` (a proc name) is stalled and has
/// stayed so for `window` while the others ran; returns every proc that
/// was ever reported stalled.
async fn stalled_procs_until(h: &Harness, stalled: &str, window: Duration) -> HashSet<String> {
    let mut events = h.manager.subscribe();
    let mut seen = HashSet::new();
    for s in h.manager.snapshot().1 {
        if s.stall.is_some() {
            seen.insert(s.name);
        }
    }
    let start = Instant::now();
    let mut since: Option<Instant> = None;
    loop {
        assert!(start.elapsed() < PATIENCE, "{stalled} never stalled");
        if since.is_none() && seen.contains(stalled) {
            since = Some(Instant::now());
        }
        if since.is_some_and(|t| t.elapsed() >= window) {
            return seen;
        }
        if let Ok(Ok(ev)) = tokio::time::timeout(Duration::from_millis(200), events.recv()).await
            && ev.state.stall.is_some()
        {
            seen.insert(ev.state.name);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_proc_stalls_while_busy_and_beaconing_procs_do_not() {
    let h = harness();
    let m = &h.manager;
    m.create_or_update(with_stall(
        sh("hung", 0, "echo start; sleep 600"),
        1000,
        None,
    ))
    .unwrap();
    m.create_or_update(with_stall(
        sh("busy", 1, "while :; do echo tick; sleep 0.2; done"),
        1000,
        None,
    ))
    .unwrap();
    m.create_or_update(with_stall(
        sh(
            "beacon",
            2,
            "while :; do touch \"$HOSTMESH_PROGRESS_FILE\"; sleep 0.2; done",
        ),
        1000,
        None,
    ))
    .unwrap();
    // Lines that do not match the pattern are no progress; matching ones are.
    m.create_or_update(with_stall(
        sh("chatty", 3, "while :; do echo loading; sleep 0.2; done"),
        1000,
        Some("^step [0-9]+"),
    ))
    .unwrap();
    m.create_or_update(with_stall(
        sh(
            "stepping",
            4,
            "i=0; while :; do echo \"step $i\"; i=$((i+1)); sleep 0.2; done",
        ),
        1000,
        Some("^step [0-9]+"),
    ))
    .unwrap();
    let seen = stalled_procs_until(&h, "hung", Duration::from_secs(3)).await;
    // Within 3 s of the hung proc's stall (three timeouts), the chatty one
    // stalled too, and no proc with progress ever did.
    let expected: HashSet<String> = ["hung", "chatty"].map(String::from).into();
    assert_eq!(seen, expected, "only procs without progress stall");
    let hung = m.state("hung").unwrap();
    let stall = hung.stall.expect("still stalled");
    assert_eq!(stall.after_ms, 1000);
    // A sleeping shell uses (almost) no CPU: it reads as blocked.
    let cpu = stall.cpu_ms.expect("/proc/<pid>/stat is readable");
    assert!(cpu < 500, "a blocked proc used {cpu} ms of CPU");
    for name in ["hung", "busy", "beacon", "chatty", "stepping"] {
        m.stop(name, Duration::from_secs(5)).await.unwrap();
    }
    let ended = m.state("hung").unwrap();
    assert!(
        ended.stall.is_none(),
        "an ended proc is not stalled: {ended:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_ends_when_output_resumes() {
    let h = harness();
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let script = format!(
        "echo start; while [ ! -e {go} ]; do sleep 0.1; done; echo resumed; sleep 600",
        go = go.display()
    );
    h.manager
        .create_or_update(with_stall(sh("waits", 0, &script), 1000, None))
        .unwrap();
    wait_state(&h.manager, "waits", "stalled", |s| s.stall.is_some()).await;
    std::fs::write(&go, b"").unwrap();
    wait_state(&h.manager, "waits", "no longer stalled", |s| {
        s.stall.is_none() && !s.status.is_terminal()
    })
    .await;
    assert!(h.stdout.text().contains("[mesh/0] resumed\n"));
    h.manager
        .stop("waits", Duration::from_secs(5))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_stall_timeout_nothing_is_watched() {
    let h = harness();
    h.manager
        .create_or_update(sh(
            "plain",
            0,
            "echo \"file=${HOSTMESH_PROGRESS_FILE:-none}\"; sleep 600",
        ))
        .unwrap();
    agent_common::wait_state(&h.manager, "plain", "running", |s| s.pid.is_some()).await;
    hostmesh_testkit::eventually("the proc printed its env", || {
        h.stdout.text().contains("file=none")
    })
    .await;
    h.manager
        .stop("plain", Duration::from_secs(5))
        .await
        .unwrap();
}

#[test]
fn a_bad_progress_pattern_or_a_zero_timeout_is_refused_naming_the_field() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let h = harness();
        let err = h
            .manager
            .create_or_update(with_stall(sh("bad", 0, "true"), 1000, Some("step (")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("spec.progress_pattern"), "{err}");
        let err = h
            .manager
            .create_or_update(with_stall(sh("zero", 1, "true"), 0, None))
            .unwrap_err()
            .to_string();
        assert!(err.contains("spec.stall_timeout_ms"), "{err}");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unmatched_lines_is_no_progress_and_a_matching_flood_is() {
    let h = harness();
    let m = &h.manager;
    m.create_or_update(with_stall(
        sh("flood", 0, "while :; do echo loading; done"),
        1000,
        Some("^step"),
    ))
    .unwrap();
    m.create_or_update(with_stall(
        sh("steps", 1, "while :; do echo step; done"),
        1000,
        Some("^step"),
    ))
    .unwrap();
    let seen = stalled_procs_until(&h, "flood", Duration::from_secs(2)).await;
    assert_eq!(seen, HashSet::from(["flood".to_owned()]), "{seen:?}");
    for name in ["flood", "steps"] {
        m.stop(name, Duration::from_secs(5)).await.unwrap();
    }
}
