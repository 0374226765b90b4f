//! OOM kills reported as such, with a real `hostmesh agent` process placed
//! in a memory cgroup of its own with a small limit: a proc that eats memory
//! is killed by the kernel's OOM killer, and the agent's report says
//! `oom_killed` (SIGKILL while the cgroup's `oom_kill` count rose).
//!
//! The cgroup is cgroup v2 (`memory.max`) where the memory controller is
//! there, else v1 (`memory.limit_in_bytes`), made under this test process's
//! own memory cgroup. Where neither can be made (no memory controller, no
//! permission), the test says exactly why and does nothing else.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hostmesh_crds::procmesh::ProcState;
use hostmesh_operator::hub::protocol::{Dim, ProcSpec};
use hostmesh_operator::hub::{
    CreateOrUpdate, Hub, Liveness, WorldAgents, WorldKey, default_connector, proc_name,
};
use hostmesh_testkit::agent::{AgentProcess, AgentSecret, loopback_ip};
use hostmesh_testkit::{eventually_async, eventually_ok};
use tokio::sync::mpsc;

/// The memory limit of the agent's cgroup: room for the agent, not for a
/// proc that grows without bound.
const LIMIT: u64 = 96 * 1024 * 1024;

/// A memory cgroup made for this test, removed on drop.
struct Cgroup {
    dir: PathBuf,
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn own_path(controller_line: impl Fn(&str, &str) -> bool) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut p = l.splitn(3, ':');
        let (h, c, path) = (p.next()?, p.next()?, p.next()?);
        controller_line(h, c).then(|| path.trim_start_matches('/').to_string())
    })
}

/// Makes a memory cgroup limited to [`LIMIT`], or says why it cannot.
fn make_cgroup() -> Result<Cgroup, String> {
    let name = format!("hostmesh-oom-test-{}", std::process::id());
    let mut why = Vec::new();
    // cgroup v2: the unified hierarchy, if its memory controller is enabled.
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let root = Path::new(root);
        let Ok(controllers) = std::fs::read_to_string(root.join("cgroup.controllers")) else {
            continue;
        };
        let Some(path) = own_path(|h, c| h == "0" && c.is_empty()) else {
            continue;
        };
        let parent = root.join(&path);
        let enabled =
            std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
        if !controllers.split_whitespace().any(|c| c == "memory") {
            why.push(format!(
                "cgroup v2 at {} has no memory controller (cgroup.controllers: {:?})",
                root.display(),
                controllers.trim()
            ));
            continue;
        }
        if !enabled.split_whitespace().any(|c| c == "memory") {
            why.push(format!(
                "cgroup v2 {} does not delegate memory to its children",
                parent.display()
            ));
            continue;
        }
        let dir = parent.join(&name);
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                let cg = Cgroup { dir };
                std::fs::write(cg.dir.join("memory.max"), LIMIT.to_string())
                    .map_err(|e| format!("writing memory.max: {e}"))?;
                let _ = std::fs::write(cg.dir.join("memory.swap.max"), "0");
                return Ok(cg);
            }
            Err(e) => why.push(format!("cannot create {}: {e}", dir.display())),
        }
    }
    // cgroup v1: the memory hierarchy.
    match own_path(|_, c| c.split(',').any(|c| c == "memory")) {
        Some(path) => {
            let dir = Path::new("/sys/fs/cgroup/memory").join(path).join(&name);
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    let cg = Cgroup { dir };
                    std::fs::write(cg.dir.join("memory.limit_in_bytes"), LIMIT.to_string())
                        .map_err(|e| format!("writing memory.limit_in_bytes: {e}"))?;
                    // No swap to escape into, where swap accounting exists.
                    let _ = std::fs::write(
                        cg.dir.join("memory.memsw.limit_in_bytes"),
                        LIMIT.to_string(),
                    );
                    return Ok(cg);
                }
                Err(e) => why.push(format!("cannot create {}: {e}", dir.display())),
            }
        }
        None => why.push("no cgroup v1 memory hierarchy in /proc/self/cgroup".into()),
    }
    Err(why.join("; "))
}

fn wk() -> WorldKey {
    WorldKey {
        namespace: "ns".into(),
        name: "w".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proc_killed_by_the_oom_killer_is_reported_oom_killed() {
    let cg = match make_cgroup() {
        Ok(cg) => cg,
        Err(why) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("SKIPPED: no memory cgroup with a limit can be made here: {why}");
            }
            return;
        }
    };
    let secret = b"0123456789abcdef0123456789abcdef";
    let addr = SocketAddr::new(loopback_ip(9), 26602);
    // In its cgroup before it runs: all it starts is limited too.
    let agent = AgentProcess::builder(
        env!("CARGO_BIN_EXE_hostmesh"),
        addr,
        AgentSecret::Bytes(secret.to_vec()),
    )
    .cgroup_procs(cg.dir.join("cgroup.procs"))
    .spawn()
    .expect("hostmesh agent starts in its cgroup");

    let hub = Hub::new(default_connector());
    let (tw, _rw) = mpsc::unbounded_channel();
    let (tm, _rm) = mpsc::unbounded_channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(hub.clone().run(tw, tm, async move {
        let _ = stopped.await;
    }));
    let agents = WorldAgents {
        secret: Arc::from(&secret[..]),
        previous: None,
        trust: None,
        health_timeout: Duration::from_secs(10),
        heartbeat_interval: hostmesh_crds::validate::DEFAULT_HEARTBEAT_INTERVAL,
        hosts: BTreeMap::from([(0, ("pod-0".to_string(), addr))]),
        epochs: BTreeMap::new(),
    };
    eventually_async("agent heartbeats", async || {
        let h = hub.clone();
        let a = agents.clone();
        tokio::spawn(async move { h.sync_world(&wk(), a).await });
        (hub.liveness(&wk(), 0, "pod-0") == Liveness::Alive).then_some(())
    })
    .await;
    // `tail` keeps a line that never ends in memory: it grows until the
    // OOM killer takes it.
    let mut spec = ProcSpec::command("sh", &["-c", "echo eating memory >&2; exec tail /dev/zero"]);
    spec.proc_mesh = "pm".into();
    spec.extent = vec![Dim::new("host", 1), Dim::new("gpu", 1)];
    let req = CreateOrUpdate {
        name: proc_name("pm.oom", 0),
        rank: 0,
        spec,
        incarnation: 0,
    };
    eventually_ok("the proc created", async || {
        hub.ensure_procs(&wk(), 0, vec![req.clone()], Duration::from_secs(1))
            .await
    })
    .await;
    let obs = eventually_async("the proc ended", async || {
        let o = hub.proc_states(&wk(), "pm.oom").get(&0)?.clone();
        o.state.is_failure().then_some(o)
    })
    .await;
    assert_eq!(
        (obs.state, obs.signal),
        (ProcState::Killed, Some(9)),
        "{obs:?}"
    );
    assert!(
        obs.oom_killed,
        "SIGKILL with the cgroup's oom_kill count up: {obs:?}"
    );
    let _ = stop.send(());
    drop(agent);
    // The cgroup can go once its processes have.
    let _ = eventually_async("the cgroup empty", async || {
        std::fs::read_to_string(cg.dir.join("cgroup.procs"))
            .ok()
            .filter(|p| p.trim().is_empty())
    })
    .await;
}
