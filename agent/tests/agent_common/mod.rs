//! Helpers shared by the agent integration tests: a proc manager whose
//! output is captured, spec builders and bounded polling.

#![allow(dead_code, unreachable_pub)]

pub mod child;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hostmesh_agent::protocol::{CreateOrUpdate, ProcReport, ProcSpec};
use hostmesh_agent::{AgentIdentity, Limits, LogHub, ProcManager};
use hostmesh_testkit::eventually_ok;

/// Output captured from a [`LogHub`].
#[derive(Clone, Default)]
pub struct Captured(pub Arc<Mutex<Vec<u8>>>);

impl Captured {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// A writer into a [`Captured`], optionally slow (to make queues overflow).
pub struct CaptureWriter {
    pub buf: Captured,
    pub delay: Option<Duration>,
}

impl Write for CaptureWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if let Some(d) = self.delay {
            std::thread::sleep(d);
        }
        self.buf.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub struct Harness {
    pub manager: ProcManager,
    pub stdout: Captured,
    pub stderr: Captured,
}

pub fn identity(host_rank: usize) -> AgentIdentity {
    AgentIdentity {
        world: "testworld".into(),
        host_rank,
        addr: "127.0.0.1:26602".parse().unwrap(),
        desk: "127.0.0.1:26603".parse().unwrap(),
        issuer: hostmesh_agent::keys::IssuerCell::new(hostmesh_runtime::Issuer::from_runtime_key(
            hostmesh_agent::keys::runtime_key(b"0123456789abcdef").bytes(),
        )),
    }
}

/// A manager for host 0 capturing output, with a small log buffer and an
/// optional write delay.
pub fn harness_with(limits: Limits, delay: Option<Duration>) -> Harness {
    let stdout = Captured::default();
    let stderr = Captured::default();
    let out = LogHub::start(
        "test-out",
        limits.log_buffer_lines,
        Box::new(CaptureWriter {
            buf: stdout.clone(),
            delay,
        }),
    )
    .unwrap();
    let err = LogHub::start(
        "test-err",
        limits.log_buffer_lines,
        Box::new(CaptureWriter {
            buf: stderr.clone(),
            delay: None,
        }),
    )
    .unwrap();
    let manager = ProcManager::new(identity(0), limits, out, err).unwrap();
    Harness {
        manager,
        stdout,
        stderr,
    }
}

pub fn harness() -> Harness {
    harness_with(Limits::default(), None)
}

/// A request for rank `rank` of a one-host mesh of `per_host` procs.
pub fn req(name: &str, rank: usize, command: &str, args: &[&str]) -> CreateOrUpdate {
    let mut spec = ProcSpec::command(command, args);
    spec.proc_mesh = "mesh".into();
    spec.extent = vec![
        hostmesh_agent::protocol::Dim::new("host", 1),
        hostmesh_agent::protocol::Dim::new("proc", 64),
    ];
    CreateOrUpdate {
        name: name.into(),
        rank,
        spec,
        incarnation: 0,
    }
}

pub fn sh(name: &str, rank: usize, script: &str) -> CreateOrUpdate {
    req(name, rank, "sh", &["-c", script])
}

/// Polls the proc's state until `pred` holds; panics with the last state
/// after the patience bound.
pub async fn wait_state(
    m: &ProcManager,
    name: &str,
    what: &str,
    pred: impl Fn(&ProcReport) -> bool,
) -> ProcReport {
    eventually_ok(&format!("proc {name} to become {what}"), async || {
        let st = m.state(name).unwrap();
        if pred(&st) { Ok(st) } else { Err(st) }
    })
    .await
}
