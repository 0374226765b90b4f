//! The clone-based spawn behind `spawn.rs`: a `clone(CLONE_VM |
//! CLONE_VFORK)` child, as `posix_spawn` makes, that sets the process group
//! and the parent-death signal, wires stdin to /dev/null and stdout/stderr to
//! pipes, enters the working directory and execs. `fork` is not used: it
//! copies the agent's page tables for every proc.
//!
//! Invariants:
//! 1. The calling thread is suspended until the child exec'd or exited
//!    (CLONE_VFORK), so everything the child reads lives on the caller's
//!    stack or heap for the child's whole pre-exec life.
//! 2. Between clone and exec the child makes only system calls, runs with
//!    every signal blocked and every caught signal reset to its default, so
//!    no handler of the agent ever runs in the child; SIGPIPE is reset too,
//!    so procs see the default disposition although the agent ignores it.
//! 3. A failure before exec is reported through shared memory (errno and
//!    stage); the child is reaped before the error is returned.

use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use super::spawn::{SpawnRequest, blocking_reap};

/// Size of the stack the clone child runs on.
const CHILD_STACK: usize = 64 * 1024;

/// Where the child failed before it ran the program.
const STAGE_CHDIR: i32 = 1;
const STAGE_EXEC: i32 = 2;
const STAGE_SETUP: i32 = 3;

/// What the spawner thread hands back: plain descriptors, registered with
/// the runtime by the caller.
pub(super) struct Raw {
    pub(super) pid: libc::pid_t,
    pub(super) stdout: OwnedFd,
    pub(super) stderr: OwnedFd,
}

fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// What the clone child reads (it shares the parent's memory until exec).
struct ChildArgs {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    fds: [RawFd; 3],
    parent: libc::pid_t,
    mask: libc::sigset_t,
    errno: AtomicI32,
    stage: AtomicI32,
}

/// Spawns `req` (invariants 1-3).
pub(super) fn raw_spawn(req: &SpawnRequest) -> io::Result<Raw> {
    let (out_r, out_w) = pipe_pair()?;
    let (err_r, err_w) = pipe_pair()?;
    let devnull = std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    let argv: Vec<*const libc::c_char> = req
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const libc::c_char> = req
        .envp
        .iter()
        .map(|e| e.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let mut stack = vec![0u8; CHILD_STACK];
    // SAFETY: sigset_t is plain data; sigfillset/pthread_sigmask initialise
    // and fill it.
    let (mut all, mut old) = unsafe {
        (
            std::mem::zeroed::<libc::sigset_t>(),
            std::mem::zeroed::<libc::sigset_t>(),
        )
    };
    // SAFETY: valid sigset pointers.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    let args = ChildArgs {
        program: req.program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: req.cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
        fds: [devnull.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
        parent: std::process::id() as libc::pid_t,
        mask: old,
        errno: AtomicI32::new(0),
        stage: AtomicI32::new(0),
    };
    // The stack grows down: pass its 16-byte aligned top.
    let top = {
        let end = stack.as_mut_ptr() as usize + CHILD_STACK;
        (end & !15) as *mut libc::c_void
    };
    // SAFETY: CLONE_VM | CLONE_VFORK suspends this thread until the child
    // has exec'd or exited, so `args`, the vectors it points into and the
    // stack outlive every use by the child; the child makes only system
    // calls (invariant 3).
    let pid = unsafe {
        libc::clone(
            child_main,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            &args as *const ChildArgs as *mut libc::c_void,
        )
    };
    let clone_err = io::Error::last_os_error();
    // SAFETY: restores the mask saved above.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
    drop(stack);
    if pid < 0 {
        return Err(clone_err);
    }
    let errno = args.errno.load(Ordering::SeqCst);
    if errno != 0 {
        let _ = blocking_reap(pid);
        let e = io::Error::from_raw_os_error(errno);
        let what = match args.stage.load(Ordering::SeqCst) {
            STAGE_CHDIR => "cannot enter the working directory",
            STAGE_EXEC => "cannot execute the program",
            _ => "cannot set up the process",
        };
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    drop((out_w, err_w, devnull));
    Ok(Raw {
        pid,
        stdout: out_r,
        stderr: err_r,
    })
}

/// The clone child: only system calls until exec (invariant 3).
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points at the parent's ChildArgs, alive while the parent
    // is suspended (CLONE_VFORK); all calls below are plain system calls.
    unsafe {
        let a = &*(arg as *const ChildArgs);
        let fail = |stage: i32| -> ! {
            a.errno.store(*libc::__errno_location(), Ordering::SeqCst);
            a.stage.store(stage, Ordering::SeqCst);
            libc::_exit(127)
        };
        // Reset every caught signal to its default. Ignored ones stay
        // ignored (exec keeps them), except SIGPIPE, which the Rust runtime
        // ignores for itself, not for the programs it starts (as std does).
        for sig in 1..libc::SIGRTMAX() {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && (old.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE)
                && old.sa_sigaction != libc::SIG_DFL
            {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        if libc::setpgid(0, 0) != 0 {
            fail(STAGE_SETUP);
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            fail(STAGE_SETUP);
        }
        if libc::getppid() != a.parent {
            // The agent died before the signal was armed.
            libc::_exit(137);
        }
        for (target, fd) in a.fds.iter().enumerate() {
            let target = target as RawFd;
            if *fd == target {
                // Same slot: just keep it open across exec.
                let flags = libc::fcntl(*fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(*fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) != 0 {
                    fail(STAGE_SETUP);
                }
            } else if libc::dup2(*fd, target) < 0 {
                fail(STAGE_SETUP);
            }
        }
        if !a.cwd.is_null() && libc::chdir(a.cwd) != 0 {
            fail(STAGE_CHDIR);
        }
        libc::sigprocmask(libc::SIG_SETMASK, &a.mask, std::ptr::null_mut());
        libc::execve(a.program, a.argv, a.envp);
        fail(STAGE_EXEC)
    }
}
