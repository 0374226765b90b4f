//! Running a command in a running container for `exec`: the container's
//! environment, user and groups and working directory, inside its mount,
//! network and UTS namespaces, with pipes or a pseudo-terminal.
//!
//! Invariants:
//! 1. The command leads its own process group, registered in the kubelet's
//!    groups while it runs; when the command ends, or the client goes away,
//!    the whole group is killed and reaped, and only then is the outcome
//!    reported: nothing it started outlives the session.
//! 2. A process forked from a namespace thread (`netns`) keeps that thread
//!    alive until it is reaped: the parent-death signal fires when the
//!    forking thread exits.
//! 3. Output is forwarded until the pipes or the terminal report the end,
//!    so nothing the command wrote before exiting is lost.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::process::Stdio;

use bytes::Bytes;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::streams::channel::{ExecOutcome, STDERR, STDOUT, TermSize};

use super::super::process::{self, Launch, Namespace, Output};
use super::super::shared::{ExecTarget, Shared, lock};
use super::netns;

/// How long a terminal session waits for the client's first size.
const FIRST_SIZE: std::time::Duration = std::time::Duration::from_secs(2);

/// What an exec session connects to the command.
pub(crate) struct ExecIo {
    /// Data for the command's stdin (none: stdin is `/dev/null`); the
    /// channel's end closes stdin.
    pub(crate) stdin: Option<mpsc::Receiver<Bytes>>,
    /// Output as (channel, bytes); channel is `STDOUT` or `STDERR`.
    pub(crate) out: mpsc::Sender<(u8, Bytes)>,
    /// Whether the client reads stdout.
    pub(crate) stdout: bool,
    /// Whether the client reads stderr (never with a terminal).
    pub(crate) stderr: bool,
    /// Terminal sizes (with a terminal).
    pub(crate) resize: Option<mpsc::Receiver<TermSize>>,
}

/// Keeps a namespace thread alive until dropped (invariant 2).
struct Keeper(#[allow(dead_code, reason = "held, never read")] Option<std::sync::mpsc::Sender<()>>);

fn spawn_in(
    target: &ExecTarget,
    launch: Launch,
    output: Output,
) -> std::io::Result<(tokio::process::Child, Keeper)> {
    let namespaces = netns::to_enter(target.pid)?;
    let join = Namespace::JoinOf(target.pid);
    if namespaces.is_empty() {
        return Ok((process::spawn(&launch, output, join)?, Keeper(None)));
    }
    let runtime = tokio::runtime::Handle::current();
    let (tx, rx) = std::sync::mpsc::channel();
    let (keep_tx, keep_rx) = std::sync::mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("exec-netns".into())
        .spawn(move || {
            let r = netns::enter(&namespaces).and_then(|()| {
                let _rt = runtime.enter();
                process::spawn(&launch, output, join)
            });
            let ok = r.is_ok();
            let _ = tx.send(r);
            if ok {
                // Until the session drops its keeper (after the reap).
                let _ = keep_rx.recv();
            }
        })?;
    let child = rx
        .recv()
        .map_err(|_| std::io::Error::other("the namespace thread ended early"))??;
    Ok((child, Keeper(Some(keep_tx))))
}

struct Pty {
    master: AsyncFd<OwnedFd>,
    slave: std::fs::File,
}

fn open_pty() -> std::io::Result<Pty> {
    // SAFETY: plain libc calls on a descriptor we own; results are checked.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if m < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let master = OwnedFd::from_raw_fd(m);
        if libc::grantpt(m) != 0 || libc::unlockpt(m) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut name = [0 as libc::c_char; 128];
        if libc::ptsname_r(m, name.as_mut_ptr(), name.len()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let path = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_string_lossy()
            .into_owned();
        let slave = std::fs::File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(&path)?;
        let flags = libc::fcntl(m, libc::F_GETFL);
        if flags < 0 || libc::fcntl(m, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `master` is an open descriptor owned by the AsyncFd
        // from here on; nothing else closes it while registered.
        let master = AsyncFd::register(master).map_err(std::io::Error::from)?;
        Ok(Pty { master, slave })
    }
}

fn set_size(master: &AsyncFd<OwnedFd>, size: TermSize) {
    let ws = libc::winsize {
        ws_row: size.height,
        ws_col: size.width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer.
    unsafe {
        libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws);
    }
}

async fn pump<R: AsyncRead + Unpin>(mut r: R, channel: u8, out: mpsc::Sender<(u8, Bytes)>) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if out
                    .send((channel, Bytes::copy_from_slice(&buf[..n])))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

async fn read_master(master: &AsyncFd<OwnedFd>, out: &mpsc::Sender<(u8, Bytes)>) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let Ok(mut guard) = master.readable().await else {
            return;
        };
        let r = guard.try_io(|fd| {
            // SAFETY: read(2) into a buffer we own.
            let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match r {
            Err(_would_block) => continue,
            // EIO: every slave descriptor is closed.
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => {
                if out
                    .send((STDOUT, Bytes::copy_from_slice(&buf[..n])))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

async fn write_master(master: &AsyncFd<OwnedFd>, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        let mut guard = master.writable().await?;
        match guard.try_io(|fd| {
            // SAFETY: write(2) from a buffer we own.
            let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        }) {
            Err(_would_block) => continue,
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) => return Err(e),
        }
    }
    Ok(())
}

/// Runs `command` in `target`'s container until it ends or `gone` fires.
pub(crate) async fn run(
    shared: &Shared,
    target: &ExecTarget,
    command: &[String],
    tty: bool,
    io: ExecIo,
    gone: CancellationToken,
) -> ExecOutcome {
    let Some((program, args)) = command.split_first() else {
        return ExecOutcome::Error(
            "you must specify at least one command for the container".into(),
        );
    };
    let launch = Launch {
        program: program.clone(),
        args: args.to_vec(),
        env: target.launch.env.clone(),
        working_dir: target.launch.working_dir.clone(),
        mounts: Vec::new(),
        identity: target.launch.identity.clone(),
        image_program: false,
        // The session thread entered the container's own namespaces
        // (`netns::to_enter`), which may be nested in the pod's.
        pod_ns: None,
    };
    let ExecIo {
        stdin,
        out,
        stdout,
        stderr,
        mut resize,
    } = io;
    let pty = if tty {
        match open_pty() {
            Ok(p) => {
                // The client sends its terminal's size first thing: wait
                // for it (briefly), so the command starts with that size.
                if let Some(r) = resize.as_mut()
                    && let Ok(Some(size)) = tokio::time::timeout(FIRST_SIZE, r.recv()).await
                {
                    set_size(&p.master, size);
                }
                Some(p)
            }
            Err(e) => return ExecOutcome::Error(format!("cannot allocate a terminal: {e}")),
        }
    } else {
        None
    };
    let output = match &pty {
        Some(p) => {
            let dup = |f: &std::fs::File| f.try_clone().map(Stdio::from);
            match (dup(&p.slave), dup(&p.slave), dup(&p.slave)) {
                (Ok(a), Ok(b), Ok(c)) => Output::Streams {
                    stdin: a,
                    stdout: b,
                    stderr: c,
                    controlling_tty: true,
                },
                _ => return ExecOutcome::Error("cannot set up the terminal".into()),
            }
        }
        None => Output::Streams {
            stdin: if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            },
            stdout: if stdout {
                Stdio::piped()
            } else {
                Stdio::null()
            },
            stderr: if stderr {
                Stdio::piped()
            } else {
                Stdio::null()
            },
            controlling_tty: false,
        },
    };
    // Register the group under the lock (as container starts do), so a
    // kubelet shutdown sees it.
    let groups = shared.groups.clone();
    let spawned = {
        let mut g = lock(&groups);
        let r = spawn_in(target, launch, output);
        if let Ok((child, _)) = &r
            && let Some(pid) = child.id()
        {
            g.insert(pid as i32);
        }
        r
    };
    let (mut child, keeper) = match spawned {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return ExecOutcome::Error(format!(
                "error executing command in container: exec: {program:?}: executable file not found in $PATH"
            ));
        }
        Err(e) => {
            return ExecOutcome::Error(format!(
                "error executing command in container: {program:?}: {e}"
            ));
        }
    };
    let pgid = child.id().map(|p| p as i32).unwrap_or_default();
    let mut tasks = tokio::task::JoinSet::new();
    match pty {
        Some(p) => {
            drop(p.slave);
            let master = std::sync::Arc::new(p.master);
            let m = master.clone();
            let o = out.clone();
            tasks.spawn(async move { read_master(&m, &o).await });
            let m = master.clone();
            let mut stdin = stdin;
            let mut resize = resize;
            // Input and sizes end with the session; they are aborted below.
            let input = tokio::spawn(async move {
                loop {
                    tokio::select! {
                        Some(size) = async { resize.as_mut()?.recv().await }, if resize.is_some() => set_size(&m, size),
                        data = async { stdin.as_mut()?.recv().await }, if stdin.is_some() => match data {
                            Some(d) => {
                                if write_master(&m, &d).await.is_err() {
                                    return;
                                }
                            }
                            // End of input: a terminal's end-of-file character.
                            None => {
                                stdin = None;
                                let _ = write_master(&m, &[4]).await;
                            }
                        },
                        else => return,
                    }
                }
            });
            let outcome = wait(&mut child, pgid, &gone).await;
            input.abort();
            let _ = input.await;
            finish(shared, pgid, tasks).await;
            drop(master);
            drop(keeper);
            outcome
        }
        None => {
            if let Some(r) = child.stdout.take() {
                tasks.spawn(pump(r, STDOUT, out.clone()));
            }
            if let Some(r) = child.stderr.take() {
                tasks.spawn(pump(r, STDERR, out.clone()));
            }
            let input = match (child.stdin.take(), stdin) {
                (Some(mut w), Some(mut rx)) => Some(tokio::spawn(async move {
                    while let Some(d) = rx.recv().await {
                        if w.write_all(&d).await.is_err() {
                            return;
                        }
                    }
                    let _ = w.shutdown().await;
                })),
                _ => None,
            };
            let outcome = wait(&mut child, pgid, &gone).await;
            if let Some(i) = input {
                i.abort();
                let _ = i.await;
            }
            finish(shared, pgid, tasks).await;
            drop(keeper);
            outcome
        }
    }
}

async fn wait(
    child: &mut tokio::process::Child,
    pgid: i32,
    gone: &CancellationToken,
) -> ExecOutcome {
    use std::os::unix::process::ExitStatusExt as _;
    let status = tokio::select! {
        s = child.wait() => s,
        _ = gone.cancelled() => {
            process::signal_group(pgid, libc::SIGKILL);
            child.wait().await
        }
    };
    match status {
        Ok(s) => ExecOutcome::Exited(s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))),
        Err(e) => ExecOutcome::Error(format!("cannot wait for the command: {e}")),
    }
}

/// Kills what is left of the group, then lets the output readers drain
/// (invariants 1 and 3).
async fn finish(shared: &Shared, pgid: i32, mut tasks: tokio::task::JoinSet<()>) {
    process::signal_group(pgid, libc::SIGKILL);
    lock(&shared.groups).remove(&pgid);
    let drained = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}
