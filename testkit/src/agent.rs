//! A real `hostmesh agent` child process for a test or a benchmark, started
//! one way everywhere: [`AgentProcess::builder`] then
//! [`AgentBuilder::spawn`], at an address from [`loopback_ip`].
//!
//! Invariants:
//! 1. [`loopback_ip`] gives this process addresses of its own in 127/8:
//!    the second and third octets come from this process's pid (one
//!    formula, [`pid_octets`]), the fourth is the caller's `n`. Two
//!    processes whose pids differ by less than 25,000 never share an
//!    address, so test binaries running side by side do not collide.
//! 2. The agent runs as `<bin> agent --world <w> --host-rank <r> --listen
//!    <addr> --secret-file <f> --heartbeat-interval <d> --health-port <p>
//!    [--epoch <e>] <extra flags>`, with stdin and stdout null,
//!    `HOSTMESH_SUPERVISOR` removed from its environment (it is no child
//!    of a supervisor), and stderr inherited unless asked to be quiet.
//! 3. A secret given as bytes is written to a file in a temporary
//!    directory that the [`AgentProcess`] owns: it outlives the process.
//! 4. Dropping an [`AgentProcess`] kills the agent and reaps it.
//! 5. With [`AgentBuilder::cgroup_procs`], the agent is in that cgroup
//!    before it runs any code of its own: the child writes its pid to the
//!    file between fork and exec.
//!
//! Errors are `std::io::Error`s naming the binary (or the secret file) and
//! what failed.

use std::ffi::OsString;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The second and third octets of the loopback addresses of the process
/// with `pid`: `100 + pid % 100` and `1 + (pid / 100) % 250`, so distinct
/// for pids less than 25,000 apart (invariant 1).
fn pid_octets(pid: u32) -> (u8, u8) {
    // Both values are below 256 by construction.
    let second = u8::try_from(100 + pid % 100).unwrap_or(u8::MAX);
    let third = u8::try_from(1 + (pid / 100) % 250).unwrap_or(u8::MAX);
    (second, third)
}

/// A loopback IP of this process's own: `127.<from pid>.<from pid>.<n>`
/// (invariant 1). Distinct `n` give distinct addresses.
pub fn loopback_ip(n: u8) -> IpAddr {
    let (second, third) = pid_octets(std::process::id());
    IpAddr::V4(Ipv4Addr::new(127, second, third, n))
}

/// Where the agent's `--secret-file` comes from.
#[derive(Debug, Clone)]
pub enum AgentSecret {
    /// A file that already holds the secret.
    File(PathBuf),
    /// The secret itself: written to a file the [`AgentProcess`] owns.
    Bytes(Vec<u8>),
}

/// How to start a `hostmesh agent`; see [`AgentProcess::builder`].
#[derive(Debug)]
#[must_use = "an AgentBuilder does nothing until spawn"]
pub struct AgentBuilder {
    bin: PathBuf,
    listen: SocketAddr,
    secret: AgentSecret,
    world: String,
    host_rank: usize,
    epoch: Option<String>,
    heartbeat_interval: Duration,
    health_port: u16,
    extra: Vec<OsString>,
    quiet: bool,
    cgroup_procs: Option<PathBuf>,
}

impl AgentBuilder {
    /// The World's name (default `w`).
    pub fn world(mut self, world: impl Into<String>) -> Self {
        self.world = world.into();
        self
    }

    /// The host rank (default 0).
    pub fn host_rank(mut self, rank: usize) -> Self {
        self.host_rank = rank;
        self
    }

    /// The rank epoch (`--epoch`; not passed by default).
    pub fn epoch(mut self, epoch: impl std::fmt::Display) -> Self {
        self.epoch = Some(epoch.to_string());
        self
    }

    /// The heartbeat interval (default 200 ms), passed in milliseconds.
    pub fn heartbeat_interval(mut self, every: Duration) -> Self {
        self.heartbeat_interval = every;
        self
    }

    /// The health endpoint's port (default 0: one the system picks).
    pub fn health_port(mut self, port: u16) -> Self {
        self.health_port = port;
        self
    }

    /// More `hostmesh agent` flags, after the others.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.extra.extend(args.into_iter().map(Into::into));
        self
    }

    /// The agent's stderr goes nowhere (default: inherited).
    pub fn quiet(mut self) -> Self {
        self.quiet = true;
        self
    }

    /// Puts the agent in the cgroup whose `cgroup.procs` file this is
    /// before it runs (invariant 5).
    pub fn cgroup_procs(mut self, file: impl Into<PathBuf>) -> Self {
        self.cgroup_procs = Some(file.into());
        self
    }

    /// Starts the agent.
    pub fn spawn(self) -> std::io::Result<AgentProcess> {
        let named = |what: String| {
            let bin = self.bin.display().to_string();
            move |e: std::io::Error| {
                std::io::Error::new(e.kind(), format!("agent {bin}: {what}: {e}"))
            }
        };
        let (secret_file, secret_dir) = match &self.secret {
            AgentSecret::File(path) => (path.clone(), None),
            AgentSecret::Bytes(bytes) => {
                let dir =
                    tempfile::tempdir().map_err(named("make a directory for the secret".into()))?;
                let file = dir.path().join("token");
                std::fs::write(&file, bytes)
                    .map_err(named(format!("write the secret to {}", file.display())))?;
                (file, Some(dir))
            }
        };
        let mut cmd = Command::new(&self.bin);
        cmd.arg("agent")
            .arg("--world")
            .arg(&self.world)
            .arg("--host-rank")
            .arg(self.host_rank.to_string())
            .arg("--listen")
            .arg(self.listen.to_string())
            .arg("--secret-file")
            .arg(&secret_file)
            .arg("--heartbeat-interval")
            .arg(format!("{}ms", self.heartbeat_interval.as_millis()))
            .arg("--health-port")
            .arg(self.health_port.to_string());
        if let Some(epoch) = &self.epoch {
            cmd.arg("--epoch").arg(epoch);
        }
        cmd.args(&self.extra)
            .env_remove("HOSTMESH_SUPERVISOR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(if self.quiet {
                Stdio::null()
            } else {
                Stdio::inherit()
            });
        if let Some(procs) = &self.cgroup_procs {
            // Opened here, close-on-exec: the child only writes to it.
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(procs)
                .map_err(named(format!("open {}", procs.display())))?;
            // SAFETY: between fork and exec the child only calls getpid and
            // write(2) on a descriptor opened before the fork, with the pid
            // formatted into a buffer on the stack: async-signal-safe system
            // calls, no allocation, no lock.
            unsafe {
                cmd.pre_exec(move || {
                    let mut buf = [0u8; 10];
                    let text = decimal(std::process::id(), &mut buf);
                    (&file).write_all(text)
                });
            }
        }
        let child = cmd.spawn().map_err(named("start".into()))?;
        Ok(AgentProcess {
            child,
            addr: self.listen,
            _secret_dir: secret_dir,
        })
    }
}

/// `n` in decimal, in the end of `buf` (no allocation: for `pre_exec`).
fn decimal(mut n: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        // A digit: below 10.
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// A running `hostmesh agent`, killed and reaped when dropped
/// (invariant 4).
#[derive(Debug)]
pub struct AgentProcess {
    child: Child,
    addr: SocketAddr,
    _secret_dir: Option<tempfile::TempDir>,
}

impl AgentProcess {
    /// How to start an agent of binary `bin` (the `hostmesh` CLI) listening
    /// on `listen` with `secret`; the rest has test defaults (World `w`,
    /// host rank 0, heartbeats every 200 ms, health port 0, no epoch).
    pub fn builder(bin: impl AsRef<Path>, listen: SocketAddr, secret: AgentSecret) -> AgentBuilder {
        AgentBuilder {
            bin: bin.as_ref().to_path_buf(),
            listen,
            secret,
            world: "w".into(),
            host_rank: 0,
            epoch: None,
            heartbeat_interval: Duration::from_millis(200),
            health_port: 0,
            extra: Vec::new(),
            quiet: false,
            cgroup_procs: None,
        }
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The address the agent listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The child process, to signal or wait for it.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_n_give_distinct_loopback_ips() {
        let ips: std::collections::BTreeSet<IpAddr> = (0..=u8::MAX).map(loopback_ip).collect();
        assert_eq!(ips.len(), 256);
        assert!(ips.iter().all(|ip| ip.is_loopback()), "{ips:?}");
    }

    #[test]
    fn pids_less_than_25000_apart_never_share_octets() {
        let base = std::process::id();
        let seen: std::collections::BTreeSet<(u8, u8)> = (0..25_000u32)
            .map(|d| pid_octets(base.wrapping_add(d)))
            .collect();
        assert_eq!(seen.len(), 25_000);
        assert!(
            seen.iter()
                .all(|&(s, t)| s >= 100 && (1..=250).contains(&t))
        );
    }

    #[test]
    fn decimal_writes_any_pid() {
        for n in [0, 7, 10, 4_194_304, u32::MAX] {
            let mut buf = [0u8; 10];
            assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes());
        }
    }

    #[test]
    fn a_missing_binary_is_named_in_the_error() {
        let addr = SocketAddr::new(loopback_ip(1), 0);
        let err = AgentProcess::builder(
            "/nonexistent/hostmesh",
            addr,
            AgentSecret::Bytes(b"s".to_vec()),
        )
        .spawn()
        .expect_err("no such binary");
        assert!(err.to_string().contains("/nonexistent/hostmesh"), "{err}");
    }
}
