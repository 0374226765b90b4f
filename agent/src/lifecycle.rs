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
//!    so nothing it started outlives it inside the group.
//! 4. The final status carries the stderr tail, read up to end of file (or
//!    for at most [`TAIL_WAIT`] when something else holds the pipe open),
//!    and the head of stderr the tail lost.
//! 5. A proc that dies of SIGKILL it was not sent by the agent while its
//!    cgroup's OOM-kill count rose is reported `oom_killed` ([`super::oom`]).

use std::os::unix::process::ExitStatusExt as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::logs::{self, Tail};
use super::manager::Inner;
use super::oom::OomCounter;
use super::protocol::{CreateOrUpdate, ProcPhase, duration_ms};
use super::spawn::{self, ProcChild, SpawnRequest};

/// Longest wait for a proc's stderr to reach end of file after it exited.
const TAIL_WAIT: Duration = Duration::from_secs(1);

/// A request to a running proc's task.
#[derive(Debug)]
pub(crate) enum Control {
    /// Stop with this grace.
    Stop(Duration),
    /// A runtime-aware proc checked in from this address.
    CheckIn(String),
}

/// Runs one incarnation to its end.
pub(crate) async fn run(
    inner: Arc<Inner>,
    req: CreateOrUpdate,
    env: Vec<(String, String)>,
    mut ctl: mpsc::Receiver<Control>,
    ended: watch::Sender<bool>,
) {
    let name = req.name.clone();
    let inc = req.incarnation;
    let spec = &req.spec;
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
    let out_pump = child
        .stdout
        .take()
        .map(|out| tokio::spawn(logs::pump(out, inner.stdout.source(prefix.clone()), None)));
    let err_pump = child.stderr.take().map(|err| {
        tokio::spawn(logs::pump(
            err,
            inner.stderr.source(prefix),
            Some(tail.clone()),
        ))
    });

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
                Some(Control::Stop(grace)) => {
                    stopped = true;
                    break stop(&inner, &name, inc, pid, &mut child, grace).await
                }
                Some(Control::CheckIn(addr)) => {
                    awaiting_check_in = false;
                    inner.update(&name, inc, |s| s.status = ProcPhase::Ready { pid, addr: Some(addr) });
                }
                // The manager never drops the sender while the task runs;
                // if it did, keep waiting for the process.
                None => break child.wait().await,
            },
            () = tokio::time::sleep_until(deadline), if awaiting_check_in => {
                tracing::warn!(proc = %name, timeout = ?spawn_timeout, "runtime-aware proc never checked in; stopping it");
                timed_out = true;
                stopped = true;
                break stop(&inner, &name, inc, pid, &mut child, inner.limits.stop_grace).await;
            }
        }
    };
    // When it ended: the report below waits for the pipes to drain.
    let ended_at = super::manager::now_ms();
    inner.detach(&name, inc);
    // Invariant 3: sweep what the proc left in its group.
    spawn::signal_group(pid, libc::SIGKILL);
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
    inner.update(&name, inc, |s| {
        s.status = status;
        s.changed_at_ms = ended_at;
        s.stderr_head = stderr_head;
        s.oom_killed = oom_killed;
    });
    let _ = ended.send(true);
}

/// Invariant 2: TERM, grace, KILL; returns how the process ended.
async fn stop(
    inner: &Inner,
    name: &str,
    inc: u32,
    pid: u32,
    child: &mut ProcChild,
    grace: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    inner.update(name, inc, |s| {
        s.stop_requested = true;
        s.status = ProcPhase::Stopping { pid };
    });
    spawn::signal_group(pid, libc::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            tracing::info!(proc = %name, ?grace, "proc outlived its grace period; killing it");
            spawn::signal_group(pid, libc::SIGKILL);
            child.wait().await
        }
    }
}
