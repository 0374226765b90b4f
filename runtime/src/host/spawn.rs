//! Starting and signalling OS processes for procs.
//!
//! Invariants:
//! 1. Every proc runs in its own process group (pgid = its pid), so a signal
//!    to the group reaches everything it started that stayed in the group.
//! 2. Every proc has a parent-death signal (SIGKILL). Linux fires it when the
//!    *thread* that forked exits, so all forks happen on one dedicated
//!    spawner thread that lives as long as the [`Spawner`]; and a child whose
//!    parent died before the signal was armed kills itself at once.
//! 3. The agent's own `HOSTMESH_*` settings are not inherited; the contract
//!    variables replace them.

use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::Stdio;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

struct Job {
    cmd: Command,
    reply: oneshot::Sender<io::Result<Child>>,
}

/// Forks procs on one long-lived thread (invariant 2).
#[derive(Debug, Clone)]
pub(crate) struct Spawner {
    tx: std::sync::mpsc::Sender<Job>,
}

impl Spawner {
    /// Starts the spawner thread, bound to the current tokio runtime.
    pub(crate) fn start() -> io::Result<Self> {
        let handle = tokio::runtime::Handle::current();
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("hostmesh-spawner".into())
            .spawn(move || {
                let _rt = handle.enter();
                while let Ok(mut job) = rx.recv() {
                    let result = job.cmd.spawn();
                    // The requester may have gone; the child is then reaped
                    // by tokio's orphan queue when dropped.
                    let _ = job.reply.send(result);
                }
            })?;
        Ok(Spawner { tx })
    }

    /// Spawns `cmd` on the spawner thread.
    pub(crate) async fn spawn(&self, cmd: Command) -> io::Result<Child> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job { cmd, reply })
            .map_err(|_| io::Error::other("the spawner thread has stopped"))?;
        rx.await
            .map_err(|_| io::Error::other("the spawner thread has stopped"))?
    }
}

/// Builds the command for a proc: arguments, environment, working
/// directory, pipes, process group and parent-death signal.
pub(crate) fn command(
    program: &str,
    args: &[String],
    env: &[(String, String)],
    working_dir: Option<&str>,
) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HOSTMESH_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    if let Some(dir) = working_dir {
        cmd.current_dir(dir);
    }
    let parent = std::process::id();
    let arm = move || -> io::Result<()> {
        // SAFETY: prctl and getppid are async-signal-safe and touch no
        // memory of the parent.
        unsafe {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() as u32 != parent {
                // The agent died between fork and prctl.
                libc::_exit(137);
            }
        }
        Ok(())
    };
    // SAFETY: the closure only makes async-signal-safe calls (see `arm`).
    unsafe {
        cmd.as_std_mut().pre_exec(arm);
    }
    cmd
}

/// Sends `signal` to the process group `pgid`; a group that no longer
/// exists is not an error.
pub(crate) fn signal_group(pgid: u32, signal: i32) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    if pgid <= 1 {
        return;
    }
    // SAFETY: killpg has no memory effects; a stale group yields ESRCH.
    let rc = unsafe { libc::killpg(pgid, signal) };
    if rc != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ESRCH) {
            tracing::warn!(pgid, signal, error = %err, "cannot signal process group");
        }
    }
}

/// A readable reason for a failed spawn.
pub(crate) fn spawn_failure(program: &str, working_dir: Option<&str>, err: &io::Error) -> String {
    match err.kind() {
        io::ErrorKind::NotFound
            if working_dir.is_some_and(|d| !std::path::Path::new(d).is_dir()) =>
        {
            format!(
                "working directory {:?} does not exist",
                working_dir.unwrap_or_default()
            )
        }
        io::ErrorKind::NotFound => {
            format!("executable {program:?} not found (check spec.command and PATH): {err}")
        }
        io::ErrorKind::PermissionDenied => {
            format!("executable {program:?} cannot be run (permission denied): {err}")
        }
        _ => format!("cannot start {program:?}: {err}"),
    }
}
