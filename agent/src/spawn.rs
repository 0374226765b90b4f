//! Starting, signalling and reaping the OS processes of procs.
//!
//! Procs are started the way `posix_spawn` starts processes (a
//! `clone(CLONE_VM | CLONE_VFORK)` child that only makes system calls, then
//! `execve`), not with `fork`: fork copies the agent's page tables for every
//! proc, which made spawning much slower than a bare spawn. The child sets
//! what `posix_spawn` cannot: the parent-death signal.
//!
//! Invariants:
//! 1. Every proc runs in its own process group (pgid = its pid), so a signal
//!    to the group reaches everything it started that stayed in the group.
//! 2. Every proc has a parent-death signal (SIGKILL). Linux fires it when the
//!    *thread* that spawned exits, so all spawns happen on one dedicated
//!    spawner thread that lives as long as the [`Spawner`]; and a child whose
//!    parent died before the signal was armed exits at once.
//! 3. Between clone and exec the child runs with all signals blocked and
//!    every caught signal reset to its default, so no handler of the agent
//!    ever runs in the child (which shares the agent's memory until exec).
//! 4. The agent's own `HOSTMESH_*` settings are not inherited; the contract
//!    variables replace them.
//! 5. Every spawned process is reaped exactly once, by [`ProcChild::wait`]
//!    (through a pidfd; a thread blocked in `waitpid` where pidfds are
//!    missing), and is in `descendants::DIRECT` from its clone until then,
//!    so the agent's reaper of adopted orphans never takes its status.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::ExitStatus;

use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use super::clone::{Raw, raw_spawn};

/// Everything a spawn needs, prepared (allocated) before the clone.
#[derive(Debug)]
pub(crate) struct SpawnRequest {
    pub(super) program: CString,
    pub(super) argv: Vec<CString>,
    pub(super) envp: Vec<CString>,
    pub(super) cwd: Option<CString>,
}

impl SpawnRequest {
    /// Resolves `program` (on the proc's `PATH` when it has no `/`) and
    /// builds argv and the environment: the agent's, minus `HOSTMESH_*`,
    /// then `env` (later entries win). The error is a readable reason.
    pub(crate) fn prepare(
        program: &str,
        args: &[String],
        env: &[(String, String)],
        working_dir: Option<&str>,
    ) -> Result<Self, String> {
        let mut vars: Vec<(Vec<u8>, Vec<u8>)> = std::env::vars_os()
            .filter(|(k, _)| !k.as_bytes().starts_with(b"HOSTMESH_"))
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        for (k, v) in env {
            vars.retain(|(ek, _)| ek.as_slice() != k.as_bytes());
            vars.push((k.as_bytes().to_vec(), v.as_bytes().to_vec()));
        }
        if let Some(dir) = working_dir
            && !Path::new(dir).is_dir()
        {
            return Err(format!("working directory {dir:?} does not exist"));
        }
        let path = vars
            .iter()
            .find(|(k, _)| k.as_slice() == b"PATH")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| b"/usr/local/bin:/usr/bin:/bin".to_vec());
        let resolved = resolve(program, &path, working_dir)?;
        let cstr = |b: &[u8], what: &str| {
            CString::new(b).map_err(|_| format!("{what} contains a NUL byte"))
        };
        let mut argv = vec![cstr(program.as_bytes(), "spec.command")?];
        for a in args {
            argv.push(cstr(a.as_bytes(), "spec.args")?);
        }
        let envp = vars
            .iter()
            .map(|(k, v)| {
                let mut kv = k.clone();
                kv.push(b'=');
                kv.extend_from_slice(v);
                cstr(&kv, "spec.env")
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SpawnRequest {
            program: cstr(resolved.as_os_str().as_bytes(), "spec.command")?,
            argv,
            envp,
            cwd: working_dir
                .map(|d| cstr(d.as_bytes(), "spec.working_dir"))
                .transpose()?,
        })
    }
}

/// The executable `program` names: itself when it has a `/`, else the first
/// executable file named so on `path`.
fn resolve(
    program: &str,
    path: &[u8],
    working_dir: Option<&str>,
) -> Result<std::path::PathBuf, String> {
    let executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt as _;
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = match working_dir {
            Some(d) if !program.starts_with('/') => Path::new(d).join(program),
            _ => Path::new(program).to_owned(),
        };
        if !p.exists() {
            return Err(format!(
                "executable {program:?} not found (check spec.command)"
            ));
        }
        if !executable(&p) {
            return Err(format!(
                "executable {program:?} cannot be run (not an executable file or permission denied)"
            ));
        }
        return Ok(Path::new(program).to_owned());
    }
    for dir in path.split(|b| *b == b':') {
        let dir = if dir.is_empty() { b".".as_slice() } else { dir };
        let candidate = Path::new(OsStr::from_bytes(dir)).join(program);
        if executable(&candidate) {
            return Ok(candidate);
        }
    }
    Err(format!(
        "executable {program:?} not found on PATH {:?} (check spec.command and PATH)",
        String::from_utf8_lossy(path)
    ))
}

/// A running proc's process: its pid, output pipes and exit.
#[derive(Debug)]
pub(crate) struct ProcChild {
    pid: u32,
    /// Its stdout (read end).
    pub(crate) stdout: Option<pipe::Receiver>,
    /// Its stderr (read end).
    pub(crate) stderr: Option<pipe::Receiver>,
    exit: Exit,
    status: Option<ExitStatus>,
}

#[derive(Debug)]
enum Exit {
    PidFd(AsyncFd<OwnedFd>),
    Thread(Option<oneshot::Receiver<io::Result<ExitStatus>>>),
}

impl ProcChild {
    /// The process id.
    pub(crate) fn id(&self) -> u32 {
        self.pid
    }

    /// Waits for the process to end and reaps it (invariant 5). Cancel-safe.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(st) = self.status {
            return Ok(st);
        }
        let pid = self.pid as libc::pid_t;
        let st = match &mut self.exit {
            Exit::PidFd(fd) => loop {
                let mut guard = fd.readable().await?;
                if let Some(st) = try_reap(pid)? {
                    break st;
                }
                guard.clear_ready();
            },
            Exit::Thread(rx) => match rx.as_mut() {
                Some(r) => {
                    let st = r
                        .await
                        .map_err(|_| io::Error::other("the reaper thread stopped"))??;
                    *rx = None;
                    st
                }
                None => return Err(io::Error::other("process already reaped")),
            },
        };
        self.status = Some(st);
        super::descendants::direct().remove(&pid);
        Ok(st)
    }
}

fn try_reap(pid: libc::pid_t) -> io::Result<Option<ExitStatus>> {
    let mut status = 0;
    // SAFETY: waitpid on our own child with a valid out pointer.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    match r {
        0 => Ok(None),
        r if r == pid => Ok(Some(ExitStatus::from_raw(status))),
        _ => Err(io::Error::last_os_error()),
    }
}

pub(super) fn blocking_reap(pid: libc::pid_t) -> io::Result<ExitStatus> {
    loop {
        let mut status = 0;
        // SAFETY: as in try_reap, blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok(ExitStatus::from_raw(status));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

type Job = (SpawnRequest, oneshot::Sender<io::Result<Raw>>);

/// Spawns procs on one long-lived thread (invariant 2).
#[derive(Debug, Clone)]
pub(crate) struct Spawner {
    tx: std::sync::mpsc::Sender<Job>,
}

impl Spawner {
    /// Starts the spawner thread.
    pub(crate) fn start() -> io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("hostmesh-spawner".into())
            .spawn(move || {
                while let Ok((req, reply)) = rx.recv() {
                    // Registered before it can exit (invariant 5).
                    let result = {
                        let mut direct = super::descendants::direct();
                        let result = raw_spawn(&req);
                        if let Ok(raw) = &result {
                            direct.insert(raw.pid);
                        }
                        result
                    };
                    if let Err(Ok(raw)) = reply.send(result) {
                        // The requester is gone: do not leave the process
                        // behind.
                        signal_group(raw.pid as u32, libc::SIGKILL);
                        let _ = blocking_reap(raw.pid);
                        super::descendants::direct().remove(&raw.pid);
                    }
                }
            })?;
        Ok(Spawner { tx })
    }

    /// Spawns `req`; must be called inside a tokio runtime.
    pub(crate) async fn spawn(&self, req: SpawnRequest) -> io::Result<ProcChild> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send((req, reply))
            .map_err(|_| io::Error::other("the spawner thread has stopped"))?;
        let raw = rx
            .await
            .map_err(|_| io::Error::other("the spawner thread has stopped"))??;
        let pid = raw.pid;
        let exit = match pidfd_open(pid) {
            // SAFETY: the OwnedFd is a valid pidfd owned by the AsyncFd for
            // its whole life.
            Ok(fd) => Exit::PidFd(unsafe {
                AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            }?),
            Err(_) => {
                let (tx, rx) = oneshot::channel();
                std::thread::Builder::new()
                    .name("hostmesh-reaper".into())
                    .spawn(move || {
                        let _ = tx.send(blocking_reap(pid));
                    })?;
                Exit::Thread(Some(rx))
            }
        };
        Ok(ProcChild {
            pid: pid as u32,
            stdout: Some(pipe::Receiver::from_owned_fd(raw.stdout)?),
            stderr: Some(pipe::Receiver::from_owned_fd(raw.stderr)?),
            exit,
            status: None,
        })
    }
}

fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
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
pub(crate) fn spawn_failure(program: &str, err: &io::Error) -> String {
    format!("cannot start {program:?}: {err}")
}
