//! Starting and signalling container processes.
//!
//! Invariants:
//! 1. Every container process leads its own session and process group, so a
//!    signal to the group reaches everything it started.
//! 2. Every container process gets SIGKILL when the kubelet thread that
//!    started it dies (parent-death signal), so a crashed kubelet leaves no
//!    container leader behind.
//! 3. With mounts, the process runs in its own mount namespace whose mounts
//!    are private: the bind mounts of one container are invisible to the host
//!    and to every other container.
//! 4. Nothing that allocates runs between `fork` and `exec`: every string the
//!    child needs is prepared before the fork.
//! 5. Every mount source is opened (`O_PATH`, in the new mount namespace)
//!    before the first mount and bound from `/proc/self/fd/N`, so a mount
//!    over a directory holding later sources (an `emptyDir` at `/tmp` while
//!    the kubelet's data lives under `/tmp`) does not hide them.
//! 6. An image's program (`Launch::image_program`) belongs to the image, not
//!    to the container's filesystem: the kubelet opens it before the fork,
//!    with its own credentials, and the child executes that descriptor
//!    (`execveat(AT_EMPTY_PATH)`). Neither a mount over its directory nor a
//!    non-root user who cannot enter the directories above it (a checkout
//!    under a 0700 home) hides it. A program the kubelet cannot open fails
//!    the start with its path and the OS error.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use std::sync::Arc;

use super::net::PodNamespaces;
use super::volumes::Mount;

/// What to run for one container (or one exec probe). Its `Debug` output
/// names the environment variables but not their values (they can hold
/// secrets).
#[derive(Clone)]
pub(crate) struct Launch {
    /// Program: a path, or a name looked up in `PATH`.
    pub(crate) program: String,
    /// Arguments after the program.
    pub(crate) args: Vec<String>,
    /// The complete environment.
    pub(crate) env: Vec<(String, String)>,
    /// Working directory inside the container.
    pub(crate) working_dir: Option<PathBuf>,
    /// Bind mounts; empty means no mount namespace of its own.
    pub(crate) mounts: Vec<Mount>,
    /// User and groups to run as (`securityContext`); `None`: the kubelet's.
    pub(crate) identity: Option<Identity>,
    /// `program` is the image's (from the image table), not a command
    /// resolved in the container's filesystem (invariant 6).
    pub(crate) image_program: bool,
    /// The pod's network and UTS namespaces to join (invariant 7); `None`:
    /// the kubelet's own (`--pod-network=host`, `hostNetwork` pods).
    pub(crate) pod_ns: Option<Arc<PodNamespaces>>,
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("working_dir", &self.working_dir)
            .field("mounts", &self.mounts)
            .field("identity", &self.identity)
            .field("image_program", &self.image_program)
            .field("pod_ns", &self.pod_ns.is_some())
            .finish()
    }
}

/// A process identity: user, primary group, supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    /// User id.
    pub(crate) uid: u32,
    /// Primary group id.
    pub(crate) gid: u32,
    /// Supplementary groups.
    pub(crate) groups: Vec<u32>,
}

/// Where a launched process's output goes.
pub(crate) enum Output {
    /// Appended to this log file (stdout and stderr together).
    Log(PathBuf),
    /// Captured through pipes (exec probes).
    Piped,
    /// Given streams (`kubectl exec`); with `controlling_tty`, stdin is a
    /// terminal that becomes the session's controlling terminal.
    Streams {
        /// Standard input.
        stdin: Stdio,
        /// Standard output.
        stdout: Stdio,
        /// Standard error.
        stderr: Stdio,
        /// Make stdin the controlling terminal (`TIOCSCTTY`).
        controlling_tty: bool,
    },
}

/// Mount namespace to run in.
pub(crate) enum Namespace {
    /// A new private one with the launch's mounts.
    New,
    /// The one of this (running) process, for exec probes.
    JoinOf(i32),
}

struct ChildSetup {
    parent: libc::pid_t,
    /// The pod's network and UTS namespaces (invariant 7).
    pod_ns: Option<(OwnedFd, OwnedFd)>,
    ctty: bool,
    unshare: bool,
    join: Option<OwnedFd>,
    mounts: Vec<(CString, CString, bool)>,
    identity: Option<(libc::uid_t, libc::gid_t, Vec<libc::gid_t>)>,
    cwd: Option<CString>,
    exec: Option<ExecFd>,
}

/// An image's program opened by the kubelet, with `argv` and `envp` laid
/// out before the fork (invariants 4 and 6). The pointer arrays are kept as
/// addresses so the setup can move into the child's closure; they point
/// into `strings`, which lives as long as they do.
struct ExecFd {
    fd: OwnedFd,
    strings: Vec<CString>,
    argv: Vec<usize>,
    envp: Vec<usize>,
}

impl ExecFd {
    fn new(program: &str, launch: &Launch) -> std::io::Result<ExecFd> {
        let path = cstring(Path::new(program))?;
        // SAFETY: open(2) on a NUL-terminated path; the result is checked.
        let raw = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if raw < 0 {
            let e = std::io::Error::last_os_error();
            return Err(std::io::Error::new(
                e.kind(),
                format!("cannot open the image's program {program}: {e}"),
            ));
        }
        // SAFETY: `raw` is a descriptor open(2) just returned, owned by nobody else.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        let nul = |s: &str| {
            CString::new(s).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{s:?} contains a NUL byte"),
                )
            })
        };
        let mut strings = vec![path];
        for a in &launch.args {
            strings.push(nul(a)?);
        }
        let argc = strings.len();
        for (k, v) in &launch.env {
            strings.push(nul(&format!("{k}={v}"))?);
        }
        let addr = |c: &CString| c.as_ptr() as usize;
        let mut argv: Vec<usize> = strings[..argc].iter().map(addr).collect();
        argv.push(0);
        let mut envp: Vec<usize> = strings[argc..].iter().map(addr).collect();
        envp.push(0);
        Ok(ExecFd {
            fd,
            strings,
            argv,
            envp,
        })
    }

    /// Executes the program; returns only on failure.
    ///
    /// # Safety
    /// Called in the child between fork and exec; makes one system call.
    unsafe fn exec(&self) -> std::io::Error {
        debug_assert!(!self.strings.is_empty());
        // SAFETY: `argv` and `envp` are NULL-terminated arrays of pointers
        // into `self.strings`, alive for this call; the descriptor is open.
        unsafe {
            libc::syscall(
                libc::SYS_execveat,
                self.fd.as_raw_fd(),
                c"".as_ptr(),
                self.argv.as_ptr(),
                self.envp.as_ptr(),
                libc::AT_EMPTY_PATH,
            );
        }
        std::io::Error::last_os_error()
    }
}

/// Most volume mounts of one container (the child keeps their file
/// descriptors in a fixed array: no allocation after the fork).
const MAX_MOUNTS: usize = 128;

/// Writes `/proc/self/fd/<fd>` and a NUL into `buf` without allocating.
fn proc_fd_path(fd: libc::c_int, buf: &mut [u8; 32]) {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 12];
    let mut n = fd.unsigned_abs();
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 || len == digits.len() {
            break;
        }
    }
    for (i, d) in digits[..len].iter().rev().enumerate() {
        buf[PREFIX.len() + i] = *d;
    }
    buf[PREFIX.len() + len] = 0;
}

fn cstring(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} contains a NUL byte", p.display()),
        )
    })
}

fn check(ret: libc::c_int) -> std::io::Result<()> {
    if ret == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl ChildSetup {
    /// Runs in the child between fork and exec: only async-signal-safe calls.
    fn apply(&self) -> std::io::Result<()> {
        // SAFETY: plain system calls on data prepared before the fork; none
        // of them allocates or takes a lock.
        unsafe {
            check(libc::setsid())?;
            if let Some((net, uts)) = &self.pod_ns {
                check(libc::setns(net.as_raw_fd(), libc::CLONE_NEWNET))?;
                check(libc::setns(uts.as_raw_fd(), libc::CLONE_NEWUTS))?;
            }
            if self.ctty {
                check(libc::ioctl(0, libc::TIOCSCTTY, 0))?;
            }
            if let Some(fd) = &self.join {
                check(libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNS))?;
            }
            if self.unshare {
                check(libc::unshare(libc::CLONE_NEWNS))?;
                check(libc::mount(
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                // Invariant 5: open every source before mounting anything.
                let mut fds = [-1 as libc::c_int; MAX_MOUNTS];
                for ((source, _, _), fd) in self.mounts.iter().zip(fds.iter_mut()) {
                    *fd = libc::open(source.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                    check(*fd)?;
                }
                for ((_, target, read_only), fd) in self.mounts.iter().zip(fds) {
                    let mut path = [0u8; 32];
                    proc_fd_path(fd, &mut path);
                    check(libc::mount(
                        path.as_ptr().cast(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ))?;
                    if *read_only {
                        check(libc::mount(
                            std::ptr::null(),
                            target.as_ptr(),
                            std::ptr::null(),
                            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                            std::ptr::null(),
                        ))?;
                    }
                }
            }
            // Credentials change after the mounts (which need root) and before
            // the parent-death signal (a credential change clears it).
            if let Some((uid, gid, groups)) = &self.identity {
                check(libc::setgroups(groups.len(), groups.as_ptr()))?;
                check(libc::setgid(*gid))?;
                check(libc::setuid(*uid))?;
            }
            check(libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ))?;
            if libc::getppid() != self.parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            if let Some(cwd) = &self.cwd {
                check(libc::chdir(cwd.as_ptr()))?;
            }
            if let Some(exec) = &self.exec {
                let e = exec.exec();
                // A script needs its descriptor after exec (it is
                // close-on-exec): run it by path instead, as before.
                if e.raw_os_error() != Some(libc::ENOENT) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

/// Starts `launch`. The caller owns the child and must reap it.
pub(crate) fn spawn(
    launch: &Launch,
    output: Output,
    ns: Namespace,
) -> std::io::Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new(&launch.program);
    cmd.args(&launch.args)
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)));
    cmd.stdin(Stdio::null());
    let mut ctty = false;
    match output {
        Output::Log(path) => {
            let file = File::options().create(true).append(true).open(&path)?;
            cmd.stderr(file.try_clone()?);
            cmd.stdout(file);
        }
        Output::Piped => {
            cmd.stdout(Stdio::piped());
            cmd.stderr(Stdio::piped());
        }
        Output::Streams {
            stdin,
            stdout,
            stderr,
            controlling_tty,
        } => {
            cmd.stdin(stdin).stdout(stdout).stderr(stderr);
            ctty = controlling_tty;
        }
    }
    let join = match ns {
        // Without root there are no container mount namespaces to join.
        Namespace::JoinOf(pid) if is_root() => {
            Some(OwnedFd::from(File::open(format!("/proc/{pid}/ns/mnt"))?))
        }
        Namespace::JoinOf(_) => None,
        Namespace::New => None,
    };
    let unshare = matches!(ns, Namespace::New) && !launch.mounts.is_empty();
    if launch.mounts.len() > MAX_MOUNTS {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("more than {MAX_MOUNTS} volume mounts in one container"),
        ));
    }
    let mounts = launch
        .mounts
        .iter()
        .map(|m| Ok((cstring(&m.source)?, cstring(&m.target)?, m.read_only)))
        .collect::<std::io::Result<Vec<_>>>()?;
    let pod_ns = match &launch.pod_ns {
        Some(ns) => Some((ns.net.try_clone()?, ns.uts.try_clone()?)),
        None => None,
    };
    let setup = ChildSetup {
        parent: std::process::id() as libc::pid_t,
        pod_ns,
        ctty,
        unshare,
        join,
        mounts,
        identity: launch
            .identity
            .as_ref()
            .map(|i| (i.uid, i.gid, i.groups.clone())),
        cwd: launch.working_dir.as_deref().map(cstring).transpose()?,
        exec: if launch.image_program && launch.program.starts_with('/') {
            Some(ExecFd::new(&launch.program, launch)?)
        } else {
            None
        },
    };
    // SAFETY: `ChildSetup::apply` only makes async-signal-safe system calls
    // on memory prepared before the fork (invariant 4).
    unsafe {
        cmd.pre_exec(move || setup.apply());
    }
    cmd.kill_on_drop(false);
    cmd.spawn()
}

/// True when the kubelet runs as root (it can then make mount namespaces).
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Sends `signal` to the process group `pgid`; false when the group is gone.
pub(crate) fn signal_group(pgid: i32, signal: i32) -> bool {
    if pgid <= 1 {
        return false;
    }
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
    unsafe { libc::kill(-pgid, signal) == 0 }
}

/// True while any process of group `pgid` exists (zombies included).
#[cfg(test)]
pub(crate) fn group_alive(pgid: i32) -> bool {
    signal_group(pgid, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `l` in a new mount namespace with its output logged under
    /// `dir`; asserts it succeeded and returns what it printed.
    async fn run_ok(l: &Launch, dir: &std::path::Path) -> String {
        let log = dir.join("log");
        let status = spawn(l, Output::Log(log.clone()), Namespace::New)
            .unwrap()
            .wait()
            .await
            .unwrap();
        let out = std::fs::read_to_string(&log).unwrap();
        assert!(status.success(), "{out}");
        out
    }

    fn launch(program: &str, args: &[&str]) -> Launch {
        Launch {
            program: program.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("X".into(), "42".into()),
            ],
            working_dir: None,
            mounts: vec![],
            identity: None,
            image_program: false,
            pod_ns: None,
        }
    }

    #[tokio::test]
    async fn runs_in_own_group_with_only_the_given_env() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("log");
        let mut l = launch(
            "sh",
            &[
                "-c",
                "echo X=$X HOME=${HOME:-unset}; cut -d' ' -f5 /proc/$$/stat; exit 7",
            ],
        );
        l.working_dir = Some(tmp.path().to_path_buf());
        let mut child = spawn(&l, Output::Log(log.clone()), Namespace::New).unwrap();
        let pid = child.id().unwrap();
        let status = child.wait().await.unwrap();
        assert_eq!(status.code(), Some(7));
        let out = std::fs::read_to_string(&log).unwrap();
        assert!(out.contains("X=42 HOME=unset"), "{out}");
        assert!(
            out.contains(&format!("\n{pid}\n")),
            "pgid should equal pid {pid}: {out}"
        );
    }

    #[tokio::test]
    async fn bind_mounts_are_private_to_the_container() {
        if !is_root() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().join("vol");
        let target = tmp.path().join("target");
        std::fs::create_dir_all(&vol).unwrap();
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(vol.join("f"), "inside").unwrap();
        let mut l = launch("sh", &["-c", "cat f && ! touch g 2>/dev/null"]);
        l.working_dir = Some(target.clone());
        l.mounts = vec![Mount {
            source: vol.clone(),
            target: target.clone(),
            read_only: true,
        }];
        let out = run_ok(&l, tmp.path()).await;
        assert_eq!(out, "inside");
        assert!(!target.join("f").exists(), "the mount leaked to the host");
    }

    #[test]
    fn proc_fd_paths_are_written_without_allocating() {
        for (fd, want) in [
            (0, "/proc/self/fd/0"),
            (7, "/proc/self/fd/7"),
            (1234567890, "/proc/self/fd/1234567890"),
        ] {
            let mut buf = [0xffu8; 32];
            proc_fd_path(fd, &mut buf);
            let end = buf.iter().position(|b| *b == 0).unwrap();
            assert_eq!(std::str::from_utf8(&buf[..end]).unwrap(), want);
        }
    }

    #[tokio::test]
    async fn a_mount_does_not_hide_the_sources_of_later_mounts() {
        if !is_root() {
            return;
        }
        // Invariant 5: the first mount covers the directory that holds the
        // second mount's source (an emptyDir at /tmp over the kubelet's data).
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let empty = tmp.path().join("empty");
        let later = data.join("vol");
        let target = tmp.path().join("t");
        for d in [&data, &empty, &later, &target] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(later.join("f"), "still here").unwrap();
        let mut l = launch("sh", &["-c", "cat f && ! ls ../data/vol"]);
        l.working_dir = Some(target.clone());
        l.mounts = vec![
            Mount {
                source: empty,
                target: data,
                read_only: false,
            },
            Mount {
                source: later,
                target: target.clone(),
                read_only: true,
            },
        ];
        let out = run_ok(&l, tmp.path()).await;
        assert!(out.starts_with("still here"), "{out}");
    }

    /// Invariant 6: an image's program in a directory its user cannot
    /// enter, with a volume mounted over that directory, still runs; the
    /// same path as a container command does not.
    #[tokio::test]
    async fn an_image_program_runs_from_a_closed_directory_under_a_mount() {
        use std::os::unix::fs::PermissionsExt as _;
        if !is_root() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let closed = tmp.path().join("closed");
        let bin = closed.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let prog = bin.join("prog");
        std::fs::copy("/bin/echo", &prog).unwrap();
        let empty = tmp.path().join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let mut l = launch(prog.to_str().unwrap(), &["from", "the", "image"]);
        l.image_program = true;
        l.identity = Some(Identity {
            uid: 65534,
            gid: 65534,
            groups: vec![],
        });
        l.mounts = vec![Mount {
            source: empty,
            target: bin.clone(),
            read_only: true,
        }];
        let out = run_ok(&l, tmp.path()).await;
        assert_eq!(out.trim(), "from the image");

        l.image_program = false;
        let err = spawn(&l, Output::Piped, Namespace::New).expect_err("hidden from the user");
        assert!(
            matches!(err.raw_os_error(), Some(libc::EACCES) | Some(libc::ENOENT)),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_missing_image_program_is_named_in_the_error() {
        let mut l = launch("/nonexistent/hostmesh-test/prog", &[]);
        l.image_program = true;
        let err = spawn(&l, Output::Piped, Namespace::New).expect_err("no such program");
        let msg = err.to_string();
        assert!(
            msg.contains("/nonexistent/hostmesh-test/prog") && msg.contains("No such file"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn runs_as_the_requested_user_after_mounting() {
        if !is_root() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().join("vol");
        let target = tmp.path().join("target");
        std::fs::create_dir_all(&vol).unwrap();
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(vol.join("f"), "data").unwrap();
        let mut l = launch("sh", &["-c", "echo $(id -u):$(id -g):$(id -G) $(cat f)"]);
        l.working_dir = Some(target.clone());
        l.mounts = vec![Mount {
            source: vol,
            target,
            read_only: true,
        }];
        l.identity = Some(Identity {
            uid: 65534,
            gid: 65534,
            groups: vec![65534, 2000],
        });
        let out = run_ok(&l, tmp.path()).await;
        assert_eq!(out.trim(), "65534:65534:65534 2000 data");
    }

    #[tokio::test]
    async fn group_signal_reaches_grandchildren() {
        let tmp = tempfile::tempdir().unwrap();
        let pidfile = tmp.path().join("pid");
        let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
        let mut child = spawn(
            &launch("sh", &["-c", &script]),
            Output::Piped,
            Namespace::New,
        )
        .unwrap();
        let pgid = child.id().unwrap() as i32;
        let mut grandchild = None;
        for _ in 0..500 {
            if let Ok(text) = std::fs::read_to_string(&pidfile)
                && let Ok(pid) = text.trim().parse::<i32>()
            {
                grandchild = Some(pid);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let grandchild = grandchild.expect("grandchild pid");
        assert!(group_alive(pgid));
        assert!(signal_group(pgid, libc::SIGKILL));
        child.wait().await.unwrap();
        let mut gone = false;
        for _ in 0..500 {
            let stat =
                std::fs::read_to_string(format!("/proc/{grandchild}/stat")).unwrap_or_default();
            if stat.is_empty() || stat.contains(") Z ") {
                gone = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(gone, "grandchild {grandchild} survived the group kill");
    }
}
