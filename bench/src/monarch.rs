//! Suite `monarch`: Monarch on a hostmesh World against the hostmesh
//! runtime, side by side in one run on this machine (docs/monarch.md).
//!
//! An e2e cluster runs World `bench` of 2 Monarch hosts; a plain Monarch
//! client (`bench/monarch_bench.py`, `KubernetesJob` defaults) runs in a pod
//! and spawns 2 procs per host with one actor each.
//!
//! - `monarch_call_rtt_p50/p99_us`: one Monarch actor call (`call_one`),
//!   pod to pod. Baseline: a hostmesh runtime actor call (8 bytes) to a
//!   proc in another process on loopback.
//! - `monarch_cast_gather_4_p50/p99_ms`: a Monarch call to all 4 actors,
//!   gathered. Baseline: the hostmesh runtime's `call_all` over 4 actors in
//!   2 processes.
//! - `monarch_kill_to_status_s`: SIGKILL of host 1's worker until the World's
//!   `status.firstFailure` names it (baseline null).
//! - `monarch_kill_to_client_error_s`: the same kill until the Monarch
//!   client's call fails (each call bounded by 60 s, so 60 s means Monarch
//!   itself never noticed). Baseline: `monarch_kill_to_status_s`.
//!
//! Monarch's side crosses the pods' bridge; the runtime's stays on
//! loopback, so the baselines flatter the runtime by the bridge's cost.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use hostmesh_e2e::{Env, condition_true, eventually, monarch, signal};
use hostmesh_mesh::Region;
use hostmesh_runtime::ActorRef;
use hostmesh_runtime::actor_mesh::ActorMesh;
use hostmesh_runtime::testing::{EchoText, TestActor};

use crate::report::emit;
use crate::runtime::{T, call_rtt, client, start_peer, summarize};

const WORLD: &str = "bench";
const HOSTS: u32 = 2;
const CLIENT: &str = "monarch-bench";

/// Calls per measurement (`HOSTMESH_BENCH_QUICK=1`: a smoke run).
fn calls() -> usize {
    if std::env::var_os("HOSTMESH_BENCH_QUICK").is_some() {
        20
    } else {
        1000
    }
}

pub(crate) fn run() -> anyhow::Result<()> {
    let python = hostmesh_testkit::monarch::VENV
        .python()
        .map_err(anyhow::Error::msg)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (rtt, cast) = runtime_side().await?;
        monarch_side(&python, rtt, cast).await
    })
}

/// The hostmesh runtime's call RTT (p50, p99 in us) and cast-plus-gather
/// over 4 actors in 2 processes (p50, p99 in ms).
async fn runtime_side() -> anyhow::Result<((f64, f64), (f64, f64))> {
    let one = start_peer(1)?;
    let c = client().await?;
    let t0: ActorRef<TestActor> = ActorRef::attest(one.proc.actor("t0", 0)?);
    let rtt = call_rtt(&c, &t0, 8, calls()).await?;
    drop(one);
    let peers = [start_peer(2)?, start_peer(2)?];
    let mut ids = Vec::new();
    for p in &peers {
        for i in 0..2 {
            ids.push(p.proc.actor(format!("t{i}"), 0)?);
        }
    }
    let region: Region = "proc=2,actor=2".parse()?;
    let mesh = ActorMesh::<TestActor>::attest("bench", region, ids)?;
    for _ in 0..calls() / 10 {
        mesh.call_all(&c, &EchoText("x".into()), T).await?;
    }
    let mut samples = Vec::new();
    for _ in 0..calls() {
        let t = Instant::now();
        mesh.call_all(&c, &EchoText("x".into()), T).await?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok((rtt, summarize(samples)))
}

fn json_line(out: &str, key: &str) -> Option<serde_json::Value> {
    out.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.get(key).is_some())
}

async fn monarch_side(
    python: &std::path::Path,
    rtt: (f64, f64),
    cast: (f64, f64),
) -> anyhow::Result<()> {
    let env = Env::start("bench-monarch").await?;
    env.apply(&monarch::world(WORLD, HOSTS, python, "")).await?;
    env.wait_for("World", WORLD, "Ready", |s| condition_true(s, "Ready"))
        .await?;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("monarch_bench.py");
    let args = [
        env.namespace.clone(),
        WORLD.into(),
        HOSTS.to_string(),
        calls().to_string(),
    ];
    env.kubectl_apply(
        CLIENT,
        &monarch::client_pod(&env, CLIENT, python, &script, &args)?,
    )?;
    eventually("the Monarch client's measurements", || {
        env.pod_logs(CLIENT).contains("READY_FOR_KILL") || env.pod_phase(CLIENT) == "Failed"
    })
    .await
    .with_context(|| env.pod_logs(CLIENT))?;
    let out = env.pod_logs(CLIENT);
    let m = json_line(&out, "call_rtt_p50_us").with_context(|| out.clone())?;
    let f = |k: &str| m[k].as_f64().unwrap_or(f64::NAN);
    emit(
        "monarch_call_rtt_p50_us",
        f("call_rtt_p50_us"),
        "us",
        Some(rtt.0),
    );
    emit(
        "monarch_call_rtt_p99_us",
        f("call_rtt_p99_us"),
        "us",
        Some(rtt.1),
    );
    emit(
        "monarch_cast_gather_4_p50_ms",
        f("cast_gather_p50_ms"),
        "ms",
        Some(cast.0),
    );
    emit(
        "monarch_cast_gather_4_p99_ms",
        f("cast_gather_p99_ms"),
        "ms",
        Some(cast.1),
    );

    let pid = env.monarch_worker_pid(WORLD, 1)?;
    let killed_at = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
    let killed = Instant::now();
    signal(pid, "KILL")?;
    env.wait_for("World", WORLD, "firstFailure of host 1", |s| {
        s["firstFailure"]["rank"].as_u64() == Some(1)
    })
    .await?;
    let to_status = killed.elapsed().as_secs_f64();
    emit("monarch_kill_to_status_s", to_status, "s", None);
    eventually("the Monarch client's error", || {
        json_line(&env.pod_logs(CLIENT), "error_at").is_some()
    })
    .await?;
    let err = json_line(&env.pod_logs(CLIENT), "error_at").unwrap_or_default();
    let to_error = err["error_at"].as_f64().map_or(f64::NAN, |t| t - killed_at);
    emit(
        "monarch_kill_to_client_error_s",
        to_error,
        "s",
        Some(to_status),
    );
    // What Monarch said goes to stderr; stdout carries only the JSON lines.
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "monarch: the client's error: {}", err["error"]);
    Ok(())
}
