//! The host's Monarch worker (a World with `spec.monarch`, docs/monarch.md):
//! the agent starts it at start-up as the proc
//! [`MONARCH_WORKER_PROC`](super::contract::MONARCH_WORKER_PROC), supervised
//! like every proc (its own process group, stderr tail, exit decoding), and
//! watches its port.
//!
//! Invariants:
//! 1. The worker's environment is the container's (minus `HOSTMESH_*`): no
//!    proc contract variables, so it starts without an address book and
//!    sees exactly the `MONARCH_*` variables the pod carries.
//! 2. The worker is `Starting` (with its pid and start time) until it
//!    listens on its port; listening is its check-in, which makes it
//!    `Ready` with address `tcp://<pod IP>:<port>`. Both reach subscribers
//!    as pushes at once (the proc manager's invariant 2).
//! 3. `/readyz` is true only while the worker listens: false before, and
//!    false for good once it has exited. The agent never restarts it: an
//!    exit is a host failure the operator acts on.
//! 4. Listening is read from the namespace's socket tables, never probed
//!    by connecting (see `listen`), and read again every [`RECHECK`] once it
//!    listens: a worker that closes its socket but runs on leaves the host
//!    not ready until it listens again (the proc itself stays `Ready`; only
//!    its end is a host failure).

use std::net::IpAddr;
use std::time::Duration;

use super::contract::MONARCH_WORKER_PROC;
use super::error::HostError;
use super::health::Readiness;
use super::listen;
use super::manager::ProcManager;
use super::protocol::{CreateOrUpdate, Dim, ProcPhase, ProcSpec};

/// How often the socket tables are read while the worker does not listen.
const POLL: Duration = Duration::from_millis(100);
/// How often the socket tables are read again once the worker listens.
const RECHECK: Duration = Duration::from_secs(1);
/// A spawn timeout no worker reaches: a worker that never listens is left
/// running and reported, not killed (the host just stays not Ready).
const NEVER: Duration = Duration::from_secs(10 * 365 * 86_400);

/// The worker the agent runs (`HOSTMESH_MONARCH_COMMAND`,
/// `HOSTMESH_MONARCH_PORT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonarchWorker {
    /// Program and arguments.
    pub command: Vec<String>,
    /// The port it listens on.
    pub port: u16,
}

impl MonarchWorker {
    /// Parses the two settings; both or neither must be given, and the port
    /// must be none of the agent's own.
    pub(crate) fn from_settings(
        command: Option<&str>,
        port: Option<&str>,
        agent_ports: [u16; 2],
    ) -> Result<Option<Self>, HostError> {
        const CMD: &str = "--monarch-command (HOSTMESH_MONARCH_COMMAND)";
        const PORT: &str = "--monarch-port (HOSTMESH_MONARCH_PORT)";
        let (command, port) = match (command.map(str::trim), port.map(str::trim)) {
            (None | Some(""), None | Some("")) => return Ok(None),
            (Some(c), Some(p)) if !c.is_empty() && !p.is_empty() => (c, p),
            _ => {
                return Err(HostError::config(
                    CMD,
                    "goes with --monarch-port (HOSTMESH_MONARCH_PORT); set both or neither",
                ));
            }
        };
        let command: Vec<String> = serde_json::from_str(command).map_err(|e| {
            HostError::config(
                CMD,
                format!("is not a JSON array of strings ({e}), e.g. [\"python\", \"-u\", \"-c\", \"...\"]"),
            )
        })?;
        if command.first().is_none_or(|c| c.trim().is_empty()) {
            return Err(HostError::config(
                CMD,
                "is empty; give the program first, e.g. [\"python\", \"worker.py\"]",
            ));
        }
        let port: u16 = port
            .parse()
            .map_err(|e| HostError::config(PORT, format!("{port:?} is not a port number ({e})")))?;
        if port == 0 || agent_ports.contains(&port) {
            return Err(HostError::config(
                PORT,
                format!(
                    "{port} is not a port the worker can have (the agent uses {} and {}); use e.g. 26600",
                    agent_ports[0], agent_ports[1]
                ),
            ));
        }
        Ok(Some(MonarchWorker { command, port }))
    }

    /// The worker's proc request (invariant 1: no contract variables are
    /// added to it; see [`ProcManager::create_host_proc`]).
    fn request(&self, host_rank: usize) -> CreateOrUpdate {
        let mut spec = ProcSpec::command(self.command[0].clone(), &[]);
        spec.args = self.command[1..].to_vec();
        spec.proc_mesh = "monarch".to_owned();
        spec.extent = vec![Dim::new(
            "host",
            u32::try_from(host_rank + 1).unwrap_or(u32::MAX),
        )];
        spec.per_host_dims = 0;
        // Invariant 2: listening is the check-in.
        spec.runtime_aware = true;
        spec.spawn_timeout_ms = Some(NEVER.as_millis() as u64);
        CreateOrUpdate {
            name: MONARCH_WORKER_PROC.to_owned(),
            rank: host_rank,
            spec,
            incarnation: 0,
        }
    }
}

/// Starts the worker and the task watching its port (invariants 2-4);
/// `readiness` stays false until it listens.
pub(crate) fn start(
    manager: &ProcManager,
    worker: &MonarchWorker,
    pod_ip: IpAddr,
    readiness: Readiness,
) -> Result<(), HostError> {
    readiness.set_worker_listening(false);
    manager.create_host_proc(worker.request(manager.identity().host_rank))?;
    let addr = match pod_ip {
        IpAddr::V6(ip) => format!("tcp://[{ip}]:{}", worker.port),
        IpAddr::V4(ip) => format!("tcp://{ip}:{}", worker.port),
    };
    tracing::info!(command = ?worker.command, port = worker.port, "monarch worker started");
    tokio::spawn(watch(manager.clone(), worker.port, addr, readiness));
    Ok(())
}

/// Waits for the worker to listen, then for it to end.
async fn watch(manager: ProcManager, port: u16, addr: String, readiness: Readiness) {
    let mut warned = false;
    let mut listening = false;
    let mut events = manager.subscribe();
    // One interval for the whole watch: proc events in between do not
    // postpone the next reading of the socket tables.
    let mut recheck = tokio::time::interval(RECHECK);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        match manager.state(MONARCH_WORKER_PROC).map(|s| s.status) {
            Ok(ProcPhase::Starting) => match listen::listening(port) {
                Ok(true) => {
                    tracing::info!(port, "monarch worker listens");
                    let _ = manager.check_in(MONARCH_WORKER_PROC, addr.clone());
                    readiness.set_worker_listening(true);
                    listening = true;
                }
                Ok(false) => {}
                Err(e) if !warned => {
                    warned = true;
                    tracing::warn!(error = %e, "cannot read the socket tables; the host stays not ready");
                }
                Err(_) => {}
            },
            Ok(ProcPhase::Ready { .. }) => {
                // Listening: wait for the next change of any proc, and read
                // the socket tables again now and then (invariant 4).
                tokio::select! {
                    r = events.recv() => {
                        if r.is_err() {
                            events = manager.subscribe();
                        }
                    }
                    _ = recheck.tick() => {
                        if let Ok(now) = listen::listening(port)
                            && now != listening
                        {
                            listening = now;
                            if now {
                                tracing::info!(port, "monarch worker listens again; this host is ready");
                            } else {
                                tracing::warn!(port, "monarch worker runs but no longer listens; this host is not ready");
                            }
                            readiness.set_worker_listening(now);
                        }
                    }
                }
                continue;
            }
            Ok(s) if s.is_terminal() => {
                readiness.set_worker_listening(false);
                tracing::warn!(status = ?s, "monarch worker ended; this host is not ready any more");
                return;
            }
            Ok(_) => {}
            Err(_) => return,
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::contract;

    const PORTS: [u16; 2] = [contract::AGENT_PORT, contract::HEALTH_PORT];

    #[test]
    fn settings_parse_and_name_the_problem() {
        assert_eq!(
            MonarchWorker::from_settings(None, None, PORTS).unwrap(),
            None
        );
        let w = MonarchWorker::from_settings(Some(r#"["python","-c","x"]"#), Some("26600"), PORTS)
            .unwrap()
            .unwrap();
        assert_eq!(w.command, ["python", "-c", "x"]);
        assert_eq!(w.port, 26600);
        for (cmd, port, needle) in [
            (Some("[\"p\"]"), None, "set both"),
            (Some("python"), Some("1"), "JSON array"),
            (Some("[]"), Some("1"), "is empty"),
            (Some("[\"p\"]"), Some("x"), "not a port"),
            (Some("[\"p\"]"), Some("26602"), "26602"),
            (Some("[\"p\"]"), Some("26601"), "26601"),
        ] {
            let e = MonarchWorker::from_settings(cmd, port, PORTS)
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{e}");
            assert!(e.contains("HOSTMESH_MONARCH"), "{e}");
        }
    }

    #[test]
    fn the_request_passes_validation_on_any_host() {
        let w = MonarchWorker {
            command: vec!["python".into()],
            port: 26600,
        };
        for rank in [0, 3] {
            let req = w.request(rank);
            super::super::env::validate(&req, rank).unwrap();
            assert_eq!(req.name, MONARCH_WORKER_PROC);
        }
    }
}
