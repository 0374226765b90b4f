//! Agent configuration: the `hostmesh agent` flags and their environment
//! variables (docs/architecture.md, "Host pods"), validated into an
//! [`AgentConfig`] at start-up so that a missing or invalid setting fails
//! before anything runs, naming the setting.

use hostmesh_mesh::Rank;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::contract;
use super::error::HostError;

/// `hostmesh agent` arguments (flag or environment variable).
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// World name (required).
    #[arg(long, env = contract::env::WORLD)]
    pub world: Option<String>,
    /// World namespace (informational).
    #[arg(long, env = contract::env::NAMESPACE)]
    pub namespace: Option<String>,
    /// This host's rank in the World (required).
    #[arg(long, env = contract::env::HOST_RANK)]
    pub host_rank: Option<String>,
    /// Address to listen on (downward API `status.podIP`).
    #[arg(long, env = contract::env::POD_IP)]
    pub pod_ip: Option<String>,
    /// Runtime protocol port.
    #[arg(long, env = contract::env::PORT, default_value_t = contract::AGENT_PORT.to_string())]
    pub port: String,
    /// Plain-HTTP health port (`/healthz`, `/readyz`); 0 picks a free port.
    #[arg(long, env = contract::env::HEALTH_PORT, default_value_t = contract::HEALTH_PORT.to_string())]
    pub health_port: String,
    /// Full `ip:port` override of pod-ip/port.
    #[arg(long, env = contract::env::LISTEN)]
    pub listen: Option<String>,
    /// File holding the World's shared secret.
    #[arg(
        long,
        env = contract::env::SECRET_FILE,
        default_value = contract::SECRET_FILE
    )]
    pub secret_file: PathBuf,
    /// The World secret taken from `HOSTMESH_SECRET` (`keys.rs`): wins
    /// over `secret_file`. Never a flag, so it is never on a command line.
    #[arg(skip)]
    pub secret: Option<super::agent::Secret>,
    /// Optional supervisor address the agent dials itself.
    #[arg(long, env = contract::env::SUPERVISOR)]
    pub supervisor: Option<String>,
    /// Heartbeat interval to subscribers (`500ms`, `1s`, `2m`).
    #[arg(long, env = contract::env::HEARTBEAT_INTERVAL, default_value = "1s")]
    pub heartbeat_interval: String,
    /// This host's rank epoch (the operator's; 0: none).
    #[arg(long, env = contract::env::EPOCH, default_value = "0")]
    pub epoch: String,
    /// Fence itself (stop every proc) after this long without a renewal
    /// from the operator; empty: never.
    #[arg(long, env = contract::env::FENCE_TIMEOUT)]
    pub fence_timeout: Option<String>,
    /// Grace between TERM and KILL when fencing (default
    /// [`contract::FENCE_GRACE`], 5s, which the operator counts on).
    #[arg(long, env = contract::env::FENCE_GRACE)]
    pub fence_grace: Option<String>,
    /// Grace period between TERM and KILL when the agent itself is stopped.
    #[arg(long, env = "HOSTMESH_STOP_GRACE", default_value = "10s")]
    pub stop_grace: String,
    /// How many procs are stopped at once on shutdown.
    #[arg(long, env = "HOSTMESH_SHUTDOWN_CONCURRENCY", default_value = "16")]
    pub shutdown_concurrency: String,
    /// Default time a runtime-aware proc has to check in.
    #[arg(long, env = "HOSTMESH_SPAWN_TIMEOUT", default_value = "60s")]
    pub spawn_timeout: String,
    /// Most procs this agent holds (running or ended).
    #[arg(long, env = "HOSTMESH_MAX_PROCS", default_value = "4096")]
    pub max_procs: String,
    /// Lines of stderr kept for an ended proc's status.
    #[arg(long, env = "HOSTMESH_STDERR_TAIL_LINES", default_value = "20")]
    pub stderr_tail_lines: String,
    /// Bytes of stderr kept for an ended proc's status.
    #[arg(long, env = "HOSTMESH_STDERR_TAIL_BYTES", default_value = "4096")]
    pub stderr_tail_bytes: String,
    /// Lines buffered per proc output before lines are dropped (and counted).
    #[arg(long, env = "HOSTMESH_LOG_BUFFER_LINES", default_value = "1024")]
    pub log_buffer_lines: String,
    /// Runtime worker threads: the agent's own work (supervision, output,
    /// the protocol) needs few, whatever the node's core count (a 192-core
    /// node must not give it 192 threads).
    #[arg(long, env = "HOSTMESH_WORKER_THREADS", default_value_t = DEFAULT_WORKER_THREADS)]
    pub worker_threads: usize,
    /// The Monarch worker to run and supervise, as a JSON array of strings
    /// (with `--monarch-port`).
    #[arg(long, env = contract::env::MONARCH_COMMAND)]
    pub monarch_command: Option<String>,
    /// The port the Monarch worker listens on; the host is ready once it does.
    #[arg(long, env = contract::env::MONARCH_PORT)]
    pub monarch_port: Option<String>,
}

/// Validated agent configuration.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// World name.
    pub world: String,
    /// World namespace, if given.
    pub namespace: Option<String>,
    /// This host's rank.
    pub host_rank: Rank,
    /// Runtime protocol listen address.
    pub listen: SocketAddr,
    /// Health listen address.
    pub health: SocketAddr,
    /// Secret file path (read when `secret` is `None`).
    pub secret_file: PathBuf,
    /// The World secret itself, when the agent was given it
    /// (`HOSTMESH_SECRET`).
    pub secret: Option<super::agent::Secret>,
    /// Supervisor to dial, if any.
    pub supervisor: Option<String>,
    /// Heartbeat interval.
    pub heartbeat_interval: Duration,
    /// Proc limits and defaults.
    pub limits: Limits,
    /// The Monarch worker to run, if the host is a Monarch host.
    pub monarch: Option<super::monarch::MonarchWorker>,
    /// Rank epoch and self-fencing.
    pub fence: crate::FencePolicy,
}

impl AgentConfig {
    /// An agent of World `world` on loopback, as tests, benchmarks and
    /// examples run one in their own process: host rank 0, agent and health
    /// ports chosen by the OS on 127.0.0.1, its secret in `secret_file`,
    /// heartbeats every second, no namespace, supervisor or Monarch worker,
    /// default limits and fence policy. Callers change fields as they need.
    pub fn loopback(world: &str, secret_file: PathBuf) -> AgentConfig {
        let loopback = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);
        AgentConfig {
            world: world.into(),
            namespace: None,
            host_rank: 0,
            listen: loopback,
            health: loopback,
            secret_file,
            secret: None,
            supervisor: None,
            heartbeat_interval: Duration::from_secs(1),
            limits: Limits::default(),
            monarch: None,
            fence: Default::default(),
        }
    }
}

/// Limits and defaults of the proc manager.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Grace between TERM and KILL on agent shutdown.
    pub stop_grace: Duration,
    /// Procs stopped at once on shutdown.
    pub shutdown_concurrency: usize,
    /// Default check-in timeout of runtime-aware procs.
    pub spawn_timeout: Duration,
    /// Most procs held.
    pub max_procs: usize,
    /// Stderr tail lines.
    pub stderr_tail_lines: usize,
    /// Stderr tail bytes.
    pub stderr_tail_bytes: usize,
    /// Buffered output lines per proc stream.
    pub log_buffer_lines: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            stop_grace: Duration::from_secs(10),
            shutdown_concurrency: 16,
            spawn_timeout: Duration::from_secs(60),
            max_procs: 4096,
            stderr_tail_lines: 20,
            stderr_tail_bytes: 4096,
            log_buffer_lines: 1024,
        }
    }
}

impl AgentArgs {
    /// Validates every setting; the error names the first bad one.
    pub fn validate(&self) -> Result<AgentConfig, HostError> {
        let world = match self.world.as_deref().map(str::trim) {
            Some(w) if !w.is_empty() => w.to_owned(),
            _ => {
                return Err(HostError::config(
                    "--world (HOSTMESH_WORLD)",
                    "required: the World this host belongs to",
                ));
            }
        };
        let host_rank = match self.host_rank.as_deref() {
            None => {
                return Err(HostError::config(
                    "--host-rank (HOSTMESH_HOST_RANK)",
                    "required: this host's rank in the World",
                ));
            }
            Some(s) => parse_num::<usize>("--host-rank (HOSTMESH_HOST_RANK)", s)?,
        };
        let port = parse_num::<u16>("--port (HOSTMESH_PORT)", &self.port)?;
        let health_port =
            parse_num::<u16>("--health-port (HOSTMESH_HEALTH_PORT)", &self.health_port)?;
        let listen = match (&self.listen, &self.pod_ip) {
            (Some(l), _) => l.trim().parse::<SocketAddr>().map_err(|e| {
                HostError::config(
                    "--listen (HOSTMESH_LISTEN)",
                    format!("{l:?} is not an ip:port address ({e})"),
                )
            })?,
            (None, Some(ip)) => {
                let ip = ip.trim().parse::<IpAddr>().map_err(|e| {
                    HostError::config(
                        "--pod-ip (HOSTMESH_POD_IP)",
                        format!("{ip:?} is not an IP address ({e})"),
                    )
                })?;
                SocketAddr::new(ip, port)
            }
            (None, None) => {
                return Err(HostError::config(
                    "--pod-ip (HOSTMESH_POD_IP)",
                    "required unless --listen is given: the address to serve on",
                ));
            }
        };
        if listen.ip().is_unspecified() {
            return Err(HostError::config(
                "--listen / --pod-ip",
                "must be a concrete address (peers and procs dial it), not 0.0.0.0 or ::",
            ));
        }
        let health = SocketAddr::new(listen.ip(), health_port);
        let supervisor = match self.supervisor.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(s) => Some(supervisor_target(s)?),
        };
        let limits = Limits {
            stop_grace: parse_duration("--stop-grace (HOSTMESH_STOP_GRACE)", &self.stop_grace)?,
            shutdown_concurrency: positive(
                "--shutdown-concurrency (HOSTMESH_SHUTDOWN_CONCURRENCY)",
                &self.shutdown_concurrency,
            )?,
            spawn_timeout: parse_duration(
                "--spawn-timeout (HOSTMESH_SPAWN_TIMEOUT)",
                &self.spawn_timeout,
            )?,
            max_procs: positive("--max-procs (HOSTMESH_MAX_PROCS)", &self.max_procs)?,
            stderr_tail_lines: positive(
                "--stderr-tail-lines (HOSTMESH_STDERR_TAIL_LINES)",
                &self.stderr_tail_lines,
            )?,
            stderr_tail_bytes: positive(
                "--stderr-tail-bytes (HOSTMESH_STDERR_TAIL_BYTES)",
                &self.stderr_tail_bytes,
            )?,
            log_buffer_lines: positive(
                "--log-buffer-lines (HOSTMESH_LOG_BUFFER_LINES)",
                &self.log_buffer_lines,
            )?,
        };
        let heartbeat_interval = parse_duration(
            "--heartbeat-interval (HOSTMESH_HEARTBEAT_INTERVAL)",
            &self.heartbeat_interval,
        )?;
        if heartbeat_interval.is_zero() {
            return Err(HostError::config(
                "--heartbeat-interval (HOSTMESH_HEARTBEAT_INTERVAL)",
                "must be greater than zero",
            ));
        }
        let monarch = super::monarch::MonarchWorker::from_settings(
            self.monarch_command.as_deref(),
            self.monarch_port.as_deref(),
            [listen.port(), health_port],
        )?;
        let fence_timeout = match self.fence_timeout.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(s) => {
                let d = parse_duration("--fence-timeout (HOSTMESH_FENCE_TIMEOUT)", s)?;
                if d.is_zero() {
                    return Err(HostError::config(
                        "--fence-timeout (HOSTMESH_FENCE_TIMEOUT)",
                        "must be greater than zero (leave it unset never to fence)",
                    ));
                }
                Some(d)
            }
        };
        let fence = crate::FencePolicy {
            epoch: parse_num::<u64>("--epoch (HOSTMESH_EPOCH)", &self.epoch)?,
            timeout: fence_timeout,
            grace: match &self.fence_grace {
                Some(s) => parse_duration("--fence-grace (HOSTMESH_FENCE_GRACE)", s)?,
                None => contract::FENCE_GRACE,
            },
        };
        Ok(AgentConfig {
            monarch,
            fence,
            world,
            namespace: self.namespace.clone().filter(|n| !n.is_empty()),
            host_rank,
            listen,
            health,
            secret_file: self.secret_file.clone(),
            secret: self.secret.clone(),
            supervisor,
            heartbeat_interval,
            limits,
        })
    }
}

/// The agent's runtime worker threads unless `--worker-threads` says
/// otherwise.
pub const DEFAULT_WORKER_THREADS: usize = 2;

/// The key a Secret's value stands for: the value with surrounding ASCII
/// whitespace removed (so a value written with a trailing newline works).
/// The agent and whoever dials it (the operator) must both derive the key
/// with this function.
pub fn secret_key(value: &[u8]) -> &[u8] {
    value.trim_ascii()
}

/// Reads the shared secret: [`secret_key`] of the whole file; at least 16
/// bytes.
pub fn read_secret(path: &Path) -> Result<Vec<u8>, HostError> {
    let bytes = std::fs::read(path).map_err(|e| HostError::Secret {
        path: path.to_owned(),
        reason: format!("cannot read it ({e})"),
    })?;
    let trimmed = secret_key(&bytes);
    if trimmed.len() < 16 {
        return Err(HostError::Secret {
            path: path.to_owned(),
            reason: format!(
                "holds {} bytes; a secret needs at least 16 (the operator writes 64 random hex digits)",
                trimmed.len()
            ),
        });
    }
    Ok(trimmed.to_vec())
}

/// `host:port` (or `tcp:host:port`) of a supervisor, as given.
fn supervisor_target(s: &str) -> Result<String, HostError> {
    let t = s.strip_prefix("tcp:").unwrap_or(s);
    let ok = t
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0));
    if !ok {
        return Err(HostError::config(
            "--supervisor (HOSTMESH_SUPERVISOR)",
            format!("{s:?} is not host:port (for example hostmesh-operator.hostmesh:26610)"),
        ));
    }
    Ok(t.to_owned())
}

fn parse_num<T: std::str::FromStr>(setting: &'static str, s: &str) -> Result<T, HostError>
where
    T::Err: std::fmt::Display,
{
    s.trim()
        .parse::<T>()
        .map_err(|e| HostError::config(setting, format!("{s:?} is not a valid number ({e})")))
}

fn positive(setting: &'static str, s: &str) -> Result<usize, HostError> {
    match parse_num::<usize>(setting, s)? {
        0 => Err(HostError::config(setting, "must be at least 1")),
        n => Ok(n),
    }
}

/// Parses `250ms`, `1s`, `1.5s`, `2m`, `1h`; a bare number is seconds.
pub fn parse_duration(setting: &'static str, s: &str) -> Result<Duration, HostError> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        HostError::config(
            setting,
            format!("{s:?} is not a duration; write e.g. 500ms, 1s, 2m"),
        )
    })?;
    let scale = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(HostError::config(
                setting,
                format!("unknown unit {other:?} in {s:?}; use ms, s, m or h"),
            ));
        }
    };
    let secs = value * scale;
    if !secs.is_finite() || secs > 365.0 * 86400.0 {
        return Err(HostError::config(setting, format!("{s:?} is out of range")));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: AgentArgs,
    }

    fn args(extra: &[&str]) -> AgentArgs {
        let mut v = vec!["agent"];
        v.extend_from_slice(extra);
        Cli::try_parse_from(v).expect("parse").args
    }

    #[test]
    fn valid_minimal_config() {
        let c = args(&["--world", "w", "--host-rank", "3", "--pod-ip", "127.0.0.5"])
            .validate()
            .expect("valid");
        assert_eq!(c.host_rank, 3);
        assert_eq!(c.listen, "127.0.0.5:26602".parse().unwrap());
        assert_eq!(c.health, "127.0.0.5:26601".parse().unwrap());
        assert_eq!(c.heartbeat_interval, Duration::from_secs(1));
    }

    #[test]
    fn missing_world_names_it() {
        let e = args(&["--host-rank", "0", "--pod-ip", "127.0.0.2"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("HOSTMESH_WORLD"), "{e}");
    }

    #[test]
    fn bad_rank_and_durations_name_the_setting() {
        let e = args(&["--world", "w", "--host-rank", "x", "--pod-ip", "127.0.0.2"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("--host-rank"), "{e}");
        let e = args(&[
            "--world",
            "w",
            "--host-rank",
            "0",
            "--pod-ip",
            "127.0.0.2",
            "--heartbeat-interval",
            "1 fortnight",
        ])
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("--heartbeat-interval"), "{e}");
        let e = args(&["--world", "w", "--host-rank", "0", "--listen", "0.0.0.0:1"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("--listen"), "{e}");
    }

    #[test]
    fn supervisor_must_be_host_port() {
        let base = ["--world", "w", "--host-rank", "0", "--pod-ip", "127.0.0.2"];
        let with = |sup: &str| {
            let mut v = base.to_vec();
            v.extend_from_slice(&["--supervisor", sup]);
            args(&v).validate()
        };
        assert_eq!(
            with("tcp:127.0.0.1:9000").unwrap().supervisor.as_deref(),
            Some("127.0.0.1:9000")
        );
        assert!(with("op.ns.svc:26610").is_ok());
        let e = with("op.ns.svc").unwrap_err().to_string();
        assert!(e.contains("--supervisor"), "{e}");
    }

    #[test]
    fn fence_settings() {
        let base = ["--world", "w", "--host-rank", "0", "--pod-ip", "127.0.0.2"];
        let c = args(&base).validate().unwrap();
        assert_eq!((c.fence.epoch, c.fence.timeout), (0, None));
        assert_eq!(
            c.fence.grace,
            contract::FENCE_GRACE,
            "the operator counts on it"
        );
        let mut v = base.to_vec();
        v.extend_from_slice(&[
            "--epoch",
            "7",
            "--fence-timeout",
            "70s",
            "--fence-grace",
            "2s",
        ]);
        let c = args(&v).validate().unwrap();
        assert_eq!(c.fence.epoch, 7);
        assert_eq!(c.fence.timeout, Some(Duration::from_secs(70)));
        assert_eq!(c.fence.grace, Duration::from_secs(2));
        for (flag, bad) in [
            ("--epoch", "x1"),
            ("--fence-timeout", "0s"),
            ("--fence-grace", "x"),
        ] {
            let mut v = base.to_vec();
            v.extend_from_slice(&[flag, bad]);
            let e = args(&v).validate().unwrap_err().to_string();
            assert!(e.contains(flag), "{e}");
        }
    }

    #[test]
    fn durations() {
        let d = |s| parse_duration("x", s).unwrap();
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("2"), Duration::from_secs(2));
        assert_eq!(d("1.5s"), Duration::from_millis(1500));
        assert_eq!(d("2m"), Duration::from_secs(120));
        assert!(parse_duration("x", "-1s").is_err());
        assert!(parse_duration("x", "").is_err());
    }

    #[test]
    fn secret_must_be_long_enough() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, "short\n").unwrap();
        assert!(read_secret(&p).unwrap_err().to_string().contains("16"));
        std::fs::write(&p, "0123456789abcdef0123\n").unwrap();
        assert_eq!(read_secret(&p).unwrap(), b"0123456789abcdef0123");
        assert!(read_secret(&dir.path().join("nope")).is_err());
    }
}
