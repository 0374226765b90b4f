//! The life of one proc incarnation: spawn, forward output, wait for a
//! check-in (runtime-aware procs), obey stop requests, reap, and report the
//! final status.
//!
//! Invariants:
//! 1. The child is always reaped, whatever happens (the task awaits it on
//!    every path after a successful spawn).
//! 2. A stop is TERM to the process group, then KILL to the group once the
//!    grace has passed; the final status is what the process really did.
//! 3. After the main process ends, the rest of its process group is killed,
//!    and so is every other descendant the agent can tell is the proc's
//!    (`descendants.rs`: its subtree, and the daemons the agent adopted that
//!    name it), so nothing it started outlives it; a stop sends the TERM
//!    to those outside the group too (never twice to the group: a process
//!    its TERM trap just started must live to finish it), and the KILL to
//!    all of them.
//! 4. The final status carries the stderr tail, read up to end of file (or
//!    for at most [`TAIL_WAIT`] when something else holds the pipe open),
//!    and the head of stderr the tail lost.
//! 5. A proc that dies of SIGKILL it was not sent by the agent while its
//!    cgroup's OOM-kill count rose is reported `oom_killed` ([`super::oom`]).
//! 6. With stall detection, a Ready proc's stall is reported when it starts
//!    and when it ends (`stall.rs`); an ended proc is never stalled.

use std::os::unix::process::ExitStatusExt as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::descendants;
use super::logs::{self, Tail};
use super::manager::Inner;
use super::oom::OomCounter;
use super::protocol::{CreateOrUpdate, ProcPhase, duration_ms};
use super::spawn::{self, ProcChild, SpawnRequest};
use super::stall::{self, OutputProgress, ProgressFile, StallChange, StallWatch};

/// Longest wait for a proc's stderr to reach end of file after it exited.
const TAIL_WAIT: Duration = Duration::from_secs(1);

/// A request to a running proc's task.
#[derive(Debug)]
pub(crate) enum Control {
    /// Stop with this grace; whether the end was asked for (false: the
    /// fence stops it, a failure).
    Stop(Duration, bool),
    /// A runtime-aware proc checked in from this address.
    CheckIn(String),
}

/// Runs one incarnation to its end.
pub(crate) async fn run(
    inner: Arc<Inner>,
    req: CreateOrUpdate,
    mut env: Vec<(String, String)>,
    mut ctl: mpsc::Receiver<Control>,
    ended: watch::Sender<bool>,
) {
    let name = req.name.clone();
    let inc = req.incarnation;
    let spec = &req.spec;
    // Live until its end is swept: what it leaves behind later is killed
    // at the next reap (descendants invariant 5).
    let _live = descendants::Live::new(&name);
    let (progress, progress_file) = stall_signals(&name, inc, spec, &mut env);
    let spawned =
        match SpawnRequest::prepare(&spec.command, &spec.args, &env, spec.working_dir.as_deref()) {
            Ok(req) => inner
                .spawner
                .spawn(req)
                .await
                .map_err(|e| spawn::spawn_failure(&spec.command, &e)),
            Err(reason) => Err(reason),
        };
    let mut child = match spawned {
        Ok(c) => c,
        Err(reason) => {
            tracing::warn!(proc = %name, %reason, "proc failed to start");
            inner.update(&name, inc, |s| s.status = ProcPhase::Failed { reason });
            inner.detach(&name, inc);
            let _ = ended.send(true);
            return;
        }
    };
    let pid = child.id();
    let oom = OomCounter::of_pid(pid);
    let oom_before = oom.count();
    let prefix = format!("[{}/{}] ", spec.proc_mesh, req.rank);
    let tail = Arc::new(Mutex::new(Tail::new(
        inner.limits.stderr_tail_lines,
        inner.limits.stderr_tail_bytes,
    )));
    let out_pump = child.stdout.take().map(|out| {
        tokio::spawn(logs::pump(
            out,
            inner.stdout.source(prefix.clone()),
            None,
            progress.clone(),
        ))
    });
    let err_pump = child.stderr.take().map(|err| {
        tokio::spawn(logs::pump(
            err,
            inner.stderr.source(prefix),
            Some(tail.clone()),
            progress.clone(),
        ))
    });
    let mut stall = match (spec.stall_timeout_ms, progress) {
        (Some(ms), Some(p)) => Some(StallWatch::new(
            Duration::from_millis(ms),
            p,
            progress_file,
            pid,
        )),
        _ => None,
    };
    let mut stall_tick = tokio::time::interval(stall::check_every(Duration::from_millis(
        spec.stall_timeout_ms.unwrap_or(1000),
    )));
    stall_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let spawn_timeout = spec
        .spawn_timeout_ms
        .map(Duration::from_millis)
        .unwrap_or(inner.limits.spawn_timeout);
    inner.update(&name, inc, |s| {
        s.pid = Some(pid);
        if !spec.runtime_aware {
            s.status = ProcPhase::Ready { pid, addr: None };
        }
    });

    let deadline = tokio::time::Instant::now() + spawn_timeout;
    let mut awaiting_check_in = spec.runtime_aware;
    let mut timed_out = false;
    let mut stopped = false;
    let exit = loop {
        tokio::select! {
            status = child.wait() => break status,
            c = ctl.recv() => match c {
                Some(Control::Stop(grace, requested)) => {
                    stopped = true;
                    break stop(&inner, &name, inc, pid, &mut child, grace, requested).await
                }
                Some(Control::CheckIn(addr)) => {
                    awaiting_check_in = false;
                    inner.update(&name, inc, |s| s.status = ProcPhase::Ready { pid, addr: Some(addr) });
                }
                // The manager never drops the sender while the task runs;
                // if it did, keep waiting for the process.
                None => break child.wait().await,
            },
            _ = stall_tick.tick(), if stall.is_some() && !awaiting_check_in => {
                if let Some(change) = stall.as_mut().and_then(|w| w.check(std::time::Instant::now())) {
                    report_stall(&inner, &name, inc, change);
                }
            }
            () = tokio::time::sleep_until(deadline), if awaiting_check_in => {
                tracing::warn!(proc = %name, timeout = ?spawn_timeout, "runtime-aware proc never checked in; stopping it");
                timed_out = true;
                stopped = true;
                break stop(&inner, &name, inc, pid, &mut child, inner.limits.stop_grace, true).await;
            }
        }
    };
    // When it ended: the report below waits for the pipes to drain.
    let ended_at = super::manager::now_ms();
    inner.detach(&name, inc);
    // Invariant 3: sweep what the proc left in its group and elsewhere
    // (its main process is reaped: only what the agent adopted).
    spawn::signal_group(pid, libc::SIGKILL);
    let swept = descendants::signal_proc(None, &name, libc::SIGKILL);
    if swept > 0 {
        tracing::info!(proc = %name, processes = swept, "killed what the proc left running");
    }
    // Drain both pipes (bounded: a grandchild may hold them open) so the
    // proc's last lines reach the agent's output and the stderr tail before
    // its end is reported, and before a shutting-down agent closes its output.
    for p in [out_pump, err_pump].into_iter().flatten() {
        let _ = tokio::time::timeout(TAIL_WAIT, p).await;
    }
    let (stderr_tail, stderr_head) = {
        let t = tail.lock().unwrap_or_else(|p| p.into_inner());
        (t.lines(), t.head())
    };
    let oom_killed = !stopped
        && matches!(&exit, Ok(st) if st.signal() == Some(libc::SIGKILL))
        && matches!((oom_before, oom.count()), (Some(a), Some(b)) if b > a);
    if oom_killed {
        tracing::warn!(proc = %name, "proc was OOM-killed (its cgroup's oom_kill count rose)");
    }
    let status = match exit {
        _ if timed_out => ProcPhase::Timeout {
            after_ms: duration_ms(spawn_timeout),
        },
        Ok(st) => match (st.code(), st.signal()) {
            (Some(code), _) => ProcPhase::Stopped {
                exit_code: code,
                stderr_tail,
            },
            (None, Some(signal)) => ProcPhase::Killed {
                signal,
                core_dumped: st.core_dumped(),
                stderr_tail,
            },
            (None, None) => ProcPhase::Failed {
                reason: format!("unrecognised exit status {st}"),
            },
        },
        Err(e) => ProcPhase::Failed {
            reason: format!("cannot wait for the process: {e}"),
        },
    };
    drop(stall);
    inner.update(&name, inc, |s| {
        s.status = status;
        s.stall = None;
        s.changed_at_ms = ended_at;
        s.stderr_head = stderr_head;
        s.oom_killed = oom_killed;
    });
    let _ = ended.send(true);
}

/// The progress tracker (and file, added to `env` as
/// `HOSTMESH_PROGRESS_FILE`) of a proc with stall detection; nothing
/// without. A pattern the agent cannot compile, or a file it cannot
/// create, is logged and leaves that signal out (the API validated both).
fn stall_signals(
    name: &str,
    inc: u32,
    spec: &crate::protocol::ProcSpec,
    env: &mut Vec<(String, String)>,
) -> (Option<Arc<OutputProgress>>, Option<ProgressFile>) {
    if spec.stall_timeout_ms.is_none() {
        return (None, None);
    }
    let pattern = spec
        .progress_pattern
        .as_deref()
        .and_then(|p| match stall::pattern(p) {
            Ok(re) => Some(re),
            Err(e) => {
                tracing::warn!(proc = %name, error = %e, "progress pattern does not compile; every line counts");
                None
            }
        });
    let file = match ProgressFile::create(&stall::progress_dir(), name, inc) {
        Ok(f) => {
            env.push((
                crate::env::PROGRESS_FILE_VAR.to_owned(),
                f.path().display().to_string(),
            ));
            Some(f)
        }
        Err(e) => {
            tracing::warn!(proc = %name, error = %e, dir = %stall::progress_dir().display(), "cannot create the progress file; HOSTMESH_PROGRESS_FILE not set");
            None
        }
    };
    (Some(OutputProgress::new(pattern)), file)
}

fn report_stall(inner: &Inner, name: &str, inc: u32, change: StallChange) {
    match change {
        StallChange::Started(s) => {
            tracing::warn!(proc = %name, after_ms = s.after_ms, cpu_ms = ?s.cpu_ms, "proc stalled: no progress");
            inner.update(name, inc, |st| st.stall = Some(s));
        }
        StallChange::Ended => {
            tracing::info!(proc = %name, "proc made progress again; stall over");
            inner.update(name, inc, |st| st.stall = None);
        }
    }
}

/// Invariant 2: TERM, grace, KILL; returns how the process ended.
async fn stop(
    inner: &Inner,
    name: &str,
    inc: u32,
    pid: u32,
    child: &mut ProcChild,
    grace: Duration,
    requested: bool,
) -> std::io::Result<std::process::ExitStatus> {
    inner.update(name, inc, |s| {
        s.stop_requested |= requested;
        s.status = ProcPhase::Stopping { pid };
    });
    spawn::signal_group(pid, libc::SIGTERM);
    descendants::signal_proc_outside_group(pid, name, libc::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            tracing::info!(proc = %name, ?grace, "proc outlived its grace period; killing it");
            // Before the group: the main process is not reaped yet.
            descendants::signal_proc(Some(pid), name, libc::SIGKILL);
            spawn::signal_group(pid, libc::SIGKILL);
            child.wait().await
        }
    }
}
