//! Proc lifecycle on a real host: real processes spawned, signalled and
//! reaped by the proc manager (host::manager invariants 1-4, host::lifecycle
//! invariants 1-4).

mod agent_common;

use std::time::Duration;

use agent_common::{harness, harness_with, req, sh, wait_state};
use hostmesh_agent::protocol::{CreateOutcome, ProcPhase};
use hostmesh_agent::{HostError, Limits};
use hostmesh_testkit::eventually;
use hostmesh_testkit::process::gone;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_code_and_stderr_tail() {
    let h = harness();
    h.manager
        .create_or_update(sh("boom", 0, "echo boom >&2; exit 3"))
        .unwrap();
    let st = wait_state(&h.manager, "boom", "Stopped", |s| s.status.is_terminal()).await;
    match st.status {
        ProcPhase::Stopped {
            exit_code,
            stderr_tail,
        } => {
            assert_eq!(exit_code, 3);
            assert_eq!(stderr_tail, vec!["boom".to_owned()]);
        }
        other => panic!("expected Stopped(3), got {other:?}"),
    }
    assert!(!st.stop_requested);
    eventually("the stderr line forwarded with its rank", || {
        h.stderr.text().contains("[mesh/0] boom\n")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_proc_carries_its_stderr_head_and_the_time_it_ended() {
    let h = harness();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    h.manager
        .create_or_update(sh(
            "trace",
            0,
            "echo 'ValueError: the first line' >&2; i=0; while [ $i -lt 50 ]; do echo noise$i >&2; i=$((i+1)); done; exit 1",
        ))
        .unwrap();
    let st = wait_state(&h.manager, "trace", "ended", |s| s.status.is_terminal()).await;
    let after = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert_eq!(
        st.stderr_head.first().map(String::as_str),
        Some("ValueError: the first line")
    );
    assert!(st.stderr_head.len() <= 10, "{:?}", st.stderr_head);
    let ProcPhase::Stopped { stderr_tail, .. } = &st.status else {
        panic!("{st:?}");
    };
    assert_eq!(stderr_tail.last().map(String::as_str), Some("noise49"));
    assert!(
        !stderr_tail.iter().any(|l| st.stderr_head.contains(l)),
        "the head holds only what the tail lost"
    );
    assert!((before..=after).contains(&st.changed_at_ms), "{st:?}");
    assert!(!st.oom_killed, "exit 1 is no OOM kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_tail_is_bounded() {
    let limits = Limits {
        stderr_tail_lines: 3,
        stderr_tail_bytes: 64,
        ..Limits::default()
    };
    let h = harness_with(limits, None);
    h.manager
        .create_or_update(sh(
            "loud",
            0,
            "i=0; while [ $i -lt 50 ]; do echo line$i >&2; i=$((i+1)); done; exit 1",
        ))
        .unwrap();
    let st = wait_state(&h.manager, "loud", "ended", |s| s.status.is_terminal()).await;
    let ProcPhase::Stopped { stderr_tail, .. } = st.status else {
        panic!("{st:?}");
    };
    assert_eq!(stderr_tail, vec!["line47", "line48", "line49"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_is_reported_as_killed_9() {
    let h = harness();
    h.manager
        .create_or_update(req("sleeper", 1, "sleep", &["60"]))
        .unwrap();
    let st = wait_state(&h.manager, "sleeper", "Ready", |s| {
        matches!(s.status, ProcPhase::Ready { .. })
    })
    .await;
    let pid = st.pid.expect("a ready proc has a pid");
    // SAFETY: signalling a child this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let st = wait_state(&h.manager, "sleeper", "Killed", |s| s.status.is_terminal()).await;
    assert!(
        matches!(
            st.status,
            ProcPhase::Killed {
                signal: 9,
                core_dumped: false,
                ..
            }
        ),
        "{st:?}"
    );
    assert!(!st.stop_requested, "nobody asked for this end");
    eventually("the sleeper reaped", || gone(pid)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sends_term_first() {
    let h = harness();
    h.manager
        .create_or_update(req("polite", 0, "sleep", &["60"]))
        .unwrap();
    wait_state(&h.manager, "polite", "Ready", |s| {
        matches!(s.status, ProcPhase::Ready { .. })
    })
    .await;
    let status = h
        .manager
        .stop("polite", Duration::from_secs(20))
        .await
        .unwrap();
    assert!(
        matches!(status, ProcPhase::Killed { signal: 15, .. }),
        "{status:?}"
    );
    assert!(h.manager.state("polite").unwrap().stop_requested);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term_ignoring_proc_is_killed_after_grace() {
    let h = harness();
    h.manager
        .create_or_update(sh(
            "stubborn",
            2,
            "trap '' TERM; echo trapped; while :; do sleep 1; done",
        ))
        .unwrap();
    eventually("the TERM trap installed", || {
        h.stdout.text().contains("[mesh/2] trapped")
    })
    .await;
    let pid = h.manager.state("stubborn").unwrap().pid.unwrap();
    let status = h
        .manager
        .stop("stubborn", Duration::from_millis(300))
        .await
        .unwrap();
    assert!(
        matches!(status, ProcPhase::Killed { signal: 9, .. }),
        "TERM was ignored, so KILL ends it: {status:?}"
    );
    eventually("the stubborn shell reaped", || gone(pid)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_executable_is_failed_with_reason() {
    let h = harness();
    h.manager
        .create_or_update(req("ghost", 0, "/nonexistent/hostmesh-no-such-binary", &[]))
        .unwrap();
    let st = wait_state(&h.manager, "ghost", "Failed", |s| s.status.is_terminal()).await;
    let ProcPhase::Failed { reason } = st.status else {
        panic!("{st:?}");
    };
    assert!(reason.contains("not found"), "{reason}");
    assert!(reason.contains("hostmesh-no-such-binary"), "{reason}");

    let mut bad_dir = req("lost", 1, "true", &[]);
    bad_dir.spec.working_dir = Some("/nonexistent/dir".into());
    h.manager.create_or_update(bad_dir).unwrap();
    let st = wait_state(&h.manager, "lost", "Failed", |s| s.status.is_terminal()).await;
    assert!(
        matches!(&st.status, ProcPhase::Failed { reason } if reason.contains("working directory")),
        "{st:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_is_idempotent_and_conflicts_are_refused() {
    let h = harness();
    let r = req("idem", 0, "sleep", &["60"]);
    assert_eq!(
        h.manager.create_or_update(r.clone()).unwrap(),
        CreateOutcome::Created
    );
    let first = wait_state(&h.manager, "idem", "Ready", |s| {
        matches!(s.status, ProcPhase::Ready { .. })
    })
    .await;
    assert_eq!(
        h.manager.create_or_update(r.clone()).unwrap(),
        CreateOutcome::Unchanged
    );
    assert_eq!(
        h.manager.state("idem").unwrap().pid,
        first.pid,
        "no second process"
    );

    let mut other = r.clone();
    other.spec.args = vec!["61".into()];
    let e = h.manager.create_or_update(other).unwrap_err();
    assert!(
        matches!(e, HostError::SpecConflict { field: "spec", .. }),
        "{e}"
    );
    let mut moved = r.clone();
    moved.rank = 1;
    assert!(matches!(
        h.manager.create_or_update(moved).unwrap_err(),
        HostError::SpecConflict { field: "rank", .. }
    ));

    let mut again = r.clone();
    again.incarnation = 1;
    assert!(matches!(
        h.manager.create_or_update(again.clone()).unwrap_err(),
        HostError::StillRunning { .. }
    ));
    h.manager
        .stop("idem", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        h.manager.create_or_update(again.clone()).unwrap(),
        CreateOutcome::Restarted
    );
    let second = wait_state(&h.manager, "idem", "Ready again", |s| {
        matches!(s.status, ProcPhase::Ready { .. })
    })
    .await;
    assert_eq!(second.restarts, 1);
    assert_ne!(second.pid, first.pid);
    assert!(!second.stop_requested);
    assert_eq!(
        h.manager.create_or_update(again).unwrap(),
        CreateOutcome::Unchanged
    );
    h.manager.shutdown(Duration::from_secs(10), 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_contract_reaches_the_proc() {
    let h = harness();
    let mut r = sh(
        "env",
        9,
        "echo \"R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK \
         M=$MASTER_ADDR:$MASTER_PORT C=$HOSTMESH_COORD_PROC X=$HOSTMESH_EXTENT \
         N=$HOSTMESH_PROC_NAME P=$HOSTMESH_PROC_MESH A=$HOSTMESH_AGENT_ADDR U=$USERVAR \
         H=${HOSTMESH_HOST_RANK:-unset}\"",
    );
    r.spec.env = vec![("USERVAR".into(), "yes".into())];
    h.manager.create_or_update(r).unwrap();
    wait_state(&h.manager, "env", "ended", |s| s.status.is_terminal()).await;
    eventually("the env line", || h.stdout.text().contains("[mesh/9] R=")).await;
    let out = h.stdout.text();
    assert!(
        out.contains(
            "[mesh/9] R=9 W=64 L=9 LW=64 G=0 M=127.0.0.1:29500 C=9 X=host=1,proc=64 \
             N=env P=mesh A=127.0.0.1:26603 U=yes H=unset\n"
        ),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_name_the_field() {
    let h = harness();
    let e = h
        .manager
        .create_or_update(req("far", 64, "true", &[]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank") && e.contains("outside"), "{e}");
    let e = h
        .manager
        .create_or_update(req("bad name", 0, "true", &[]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("name"), "{e}");
    let e = h
        .manager
        .create_or_update(req("empty", 0, "", &[]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("spec.command"), "{e}");
    assert!(matches!(
        h.manager.state("never-created"),
        Err(HostError::NoSuchProc { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flooding_proc_does_not_block_others() {
    let limits = Limits {
        log_buffer_lines: 16,
        ..Limits::default()
    };
    // A slow output makes the flood overflow its queue.
    let h = harness_with(limits, Some(Duration::from_millis(2)));
    h.manager
        .create_or_update(req("flood", 0, "yes", &["flood"]))
        .unwrap();
    eventually("flood lines dropped", || h.manager.dropped_log_lines() > 0).await;
    h.manager
        .create_or_update(sh("quiet", 1, "echo marker-from-quiet"))
        .unwrap();
    eventually("the quiet proc's line forwarded", || {
        h.stdout.text().contains("[mesh/1] marker-from-quiet\n")
    })
    .await;
    let st = wait_state(&h.manager, "quiet", "ended", |s| s.status.is_terminal()).await;
    assert!(matches!(st.status, ProcPhase::Stopped { exit_code: 0, .. }));
    eventually("a gap line in the output", || {
        h.stdout.text().contains("lines dropped")
    })
    .await;
    h.manager.shutdown(Duration::from_secs(10), 4).await;
    assert!(h.manager.state("flood").unwrap().status.is_terminal());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_aware_proc_times_out_without_check_in() {
    let h = harness();
    let mut r = req("silent", 0, "sleep", &["60"]);
    r.spec.runtime_aware = true;
    r.spec.spawn_timeout_ms = Some(300);
    h.manager.create_or_update(r).unwrap();
    let st = wait_state(&h.manager, "silent", "Timeout", |s| s.status.is_terminal()).await;
    assert_eq!(st.status, ProcPhase::Timeout { after_ms: 300 });
    eventually("the silent proc reaped", || gone(st.pid.unwrap())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_aware_proc_is_starting_until_it_checks_in() {
    let h = harness();
    let mut r = req("chatty", 0, "sleep", &["60"]);
    r.spec.runtime_aware = true;
    h.manager.create_or_update(r).unwrap();
    let st = wait_state(&h.manager, "chatty", "spawned", |s| s.pid.is_some()).await;
    assert_eq!(st.status, ProcPhase::Starting);
    h.manager
        .check_in("chatty", "127.0.0.1:40000".into())
        .unwrap();
    let st = wait_state(&h.manager, "chatty", "Ready", |s| {
        matches!(s.status, ProcPhase::Ready { .. })
    })
    .await;
    assert_eq!(
        st.status,
        ProcPhase::Ready {
            pid: st.pid.unwrap(),
            addr: Some("127.0.0.1:40000".into())
        }
    );
    h.manager.shutdown(Duration::from_secs(10), 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_everything_and_refuses_new_procs() {
    let h = harness();
    let mut events = h.manager.subscribe();
    for i in 0..6 {
        h.manager
            .create_or_update(req(&format!("p{i}"), i, "sleep", &["60"]))
            .unwrap();
    }
    for i in 0..6 {
        wait_state(&h.manager, &format!("p{i}"), "Ready", |s| {
            matches!(s.status, ProcPhase::Ready { .. })
        })
        .await;
    }
    h.manager.shutdown(Duration::from_secs(10), 2).await;
    let (_, states) = h.manager.snapshot();
    assert_eq!(states.len(), 6);
    for s in &states {
        assert!(s.status.is_terminal() && s.stop_requested, "{s:?}");
        assert!(gone(s.pid.unwrap()));
    }
    assert!(matches!(
        h.manager.create_or_update(req("late", 7, "true", &[])),
        Err(HostError::ShuttingDown)
    ));
    // Every change was pushed, in sequence order, ending in the final state.
    let mut last_seq = 0;
    let mut seen = 0;
    while let Ok(ev) = events.try_recv() {
        assert!(ev.state.seq > last_seq);
        last_seq = ev.state.seq;
        seen += 1;
    }
    // Starting, Ready, Stopping, final: four changes per proc.
    assert_eq!(seen, 6 * 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn procs_get_default_sigpipe() {
    let h = harness();
    // With SIGPIPE ignored, `yes` would complain about a broken pipe.
    h.manager
        .create_or_update(sh("pipe", 0, "yes | head -n 1 > /dev/null"))
        .unwrap();
    let st = wait_state(&h.manager, "pipe", "ended", |s| s.status.is_terminal()).await;
    assert_eq!(
        st.status,
        ProcPhase::Stopped {
            exit_code: 0,
            stderr_tail: vec![]
        }
    );
}
