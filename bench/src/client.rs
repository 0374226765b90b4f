//! Suite `client`: a `hostmesh-client` program driving actors on a
//! runtime-aware ProcMesh of 64 ranks (8 hosts of 8 example procs,
//! `hostmesh echo-proc`) on the in-process cluster in a box.
//!
//! - `client_cast_gather_64_p50` / `_p99` (ms): `call_all` of one `Echo`
//!   actor per rank. Baseline: the same gather over one actor in each of
//!   64 procs the bench starts itself on loopback (the runtime alone: as
//!   many processes, no pods, no per-pod network).
//! - `client_kill_to_event_p50_s` / `_p99_s`: a rank's proc SIGKILLed
//!   until the client's `MeshEvent::ProcEnded` for it. Baseline: the same
//!   kills until the rank's failure is in ProcMesh status (polled every
//!   5 ms beside). The mesh restarts the rank (`OnFailure`); the client
//!   waits for `ProcRejoined` and respawns the actor before the next kill.
//!   Target: p99 under 1 s (issue 29).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use hostmesh_agent::echo::Echo;
use hostmesh_cli::devenv::DevEnv;
use hostmesh_client::{ClientOptions, MeshClient, MeshEvent};
use hostmesh_mesh::Region;
use hostmesh_runtime::actor_mesh::ActorMesh;
use hostmesh_runtime::testing::{EchoText, TestActor};

use crate::e2e::{apply, status_of, wait_ready};
use crate::report::emit;
use crate::runtime::{T, scale as quick, start_peer, summarize};

const HOSTS: usize = 8;
const PER_HOST: usize = 8;
const RANKS: usize = HOSTS * PER_HOST;

pub(crate) fn run() -> anyhow::Result<()> {
    crate::e2e::with_dev_env("client", |env| Box::pin(suite(env)))
}

fn manifest() -> String {
    format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {{name: actors}}\nspec:\n  shape: [{{name: host, size: {HOSTS}}}]\n  template:\n    spec:\n      containers:\n      - {{name: host, image: busybox}}\n---\napiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: actors}}\nspec:\n  world: actors\n  perHost: [{{name: gpu, size: {PER_HOST}}}]\n  command: [/hostmesh/bin/hostmesh, echo-proc]\n  runtimeAware: true\n  restartPolicy: {{policy: OnFailure, maxRestarts: 1000, backoff: 0s}}\n"
    )
}

async fn suite(env: &DevEnv) -> anyhow::Result<()> {
    let kube = env.client();
    apply(&kube, &manifest()).await?;
    wait_ready(&kube, "World", "actors").await?;
    wait_ready(&kube, "ProcMesh", "actors").await?;
    let client = MeshClient::connect(
        kube.clone(),
        crate::e2e::NS,
        "actors",
        ClientOptions::default(),
    )
    .await?;
    let mut mesh = client.spawn::<Echo>("echo", &()).await?;

    // Cast and gather over the 64 ranks, and the runtime alone.
    let iters = quick(300);
    let msg = "x".to_string();
    for _ in 0..quick(20) {
        mesh.call_all(client.proc(), &msg, T).await?;
    }
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        let v = mesh.call_all(client.proc(), &msg, T).await?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(v.iter().count() == RANKS, "every rank answered");
    }
    let (p50, p99) = summarize(samples);
    let (base50, base99) = runtime_alone(iters).await?;
    emit("client_cast_gather_64_p50", p50, "ms", Some(base50));
    emit("client_cast_gather_64_p99", p99, "ms", Some(base99));

    // SIGKILL to the client's event, and to status.
    let kills = quick(30).max(2);
    let (mut to_event, mut to_status) = (Vec::new(), Vec::new());
    for k in 0..kills {
        let rank = (k * 7 + 3) % RANKS;
        let (event, status) = kill_one(&kube, &client, rank).await?;
        to_event.push(event);
        to_status.push(status);
        mesh = rejoin(&client, mesh, rank).await?;
    }
    let (e50, e99) = summarize(to_event);
    let (s50, s99) = summarize(to_status);
    emit("client_kill_to_event_p50_s", e50, "s", Some(s50));
    emit("client_kill_to_event_p99_s", e99, "s", Some(s99));
    Ok(())
}

/// The same gather over one actor in each of 64 procs started on
/// loopback.
async fn runtime_alone(iters: usize) -> anyhow::Result<(f64, f64)> {
    let peers = (0..RANKS)
        .map(|_| start_peer(1))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let c = crate::runtime::client().await?;
    let ids = peers
        .iter()
        .map(|p| p.proc.actor("t0", 0))
        .collect::<Result<Vec<_>, _>>()?;
    let region: Region = format!("proc={RANKS}").parse()?;
    let mesh = ActorMesh::<TestActor>::attest("bench", region, ids)?;
    let msg = EchoText("x".into());
    for _ in 0..quick(20) {
        mesh.call_all(&c, &msg, T).await?;
    }
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        mesh.call_all(&c, &msg, T).await?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(summarize(samples))
}

/// SIGKILLs `rank`'s proc; seconds until the client's event and until
/// status shows the failure.
async fn kill_one(
    kube: &kube::Client,
    client: &MeshClient,
    rank: usize,
) -> anyhow::Result<(f64, f64)> {
    let pid = crate::e2e::find_proc_where("actors", "actors", Some(rank))
        .with_context(|| format!("rank {rank}'s proc is not running"))?;
    // Events from before this kill (the last rejoin's) are not this one's.
    while client.next_event(Duration::ZERO).await.is_some() {}
    let before = incarnation(&status_of(kube, "ProcMesh", "actors").await?, rank);
    let start = Instant::now();
    hostmesh_e2e::signal(pid, "KILL")?;
    let status = async {
        loop {
            let s = status_of(kube, "ProcMesh", "actors").await?;
            if !running_at(&s, rank, before) {
                return anyhow::Ok(start.elapsed().as_secs_f64());
            }
            anyhow::ensure!(
                start.elapsed() < crate::e2e::WAIT,
                "rank {rank} never left Running in status: {s}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let event = async {
        loop {
            match client.next_event(crate::e2e::WAIT).await {
                Some(MeshEvent::ProcEnded { rank: r, .. }) if r == rank => {
                    return anyhow::Ok(start.elapsed().as_secs_f64());
                }
                Some(_) => continue,
                None => anyhow::bail!("no ProcEnded event for rank {rank}"),
            }
        }
    };
    let (event, status) = tokio::join!(event, status);
    Ok((event?, status?))
}

/// `rank`'s incarnation in ProcMesh status `s`.
fn incarnation(s: &serde_json::Value, rank: usize) -> u64 {
    in_run(&s["incarnations"], rank).map_or(0, |r| r["incarnation"].as_u64().unwrap_or(0))
}

/// Whether `rank` is still Running as incarnation `inc` in status `s`.
fn running_at(s: &serde_json::Value, rank: usize, inc: u64) -> bool {
    incarnation(s, rank) == inc
        && in_run(&s["ranks"], rank).is_some_and(|r| r["state"] == "Running")
}

/// The run of `runs` (`{start, count, ...}`) that holds `rank`.
fn in_run(runs: &serde_json::Value, rank: usize) -> Option<&serde_json::Value> {
    runs.as_array()?.iter().find(|r| {
        let start = r["start"].as_u64().unwrap_or(0) as usize;
        let count = r["count"].as_u64().unwrap_or(1) as usize;
        (start..start + count).contains(&rank)
    })
}

/// Waits for `rank` to rejoin and puts the actor back on it.
async fn rejoin(
    client: &MeshClient,
    mesh: ActorMesh<Echo>,
    rank: usize,
) -> anyhow::Result<ActorMesh<Echo>> {
    let start = Instant::now();
    loop {
        match client.next_event(crate::e2e::WAIT).await {
            Some(MeshEvent::ProcRejoined { rank: r, .. }) if r == rank => break,
            Some(_) => {}
            None => anyhow::bail!("rank {rank} did not rejoin"),
        }
        anyhow::ensure!(
            start.elapsed() < crate::e2e::WAIT,
            "rank {rank} did not rejoin"
        );
    }
    let mesh = client.respawn(&mesh, "echo", &()).await?;
    let v = mesh.call_all(client.proc(), &"back".to_string(), T).await?;
    anyhow::ensure!(
        v.iter().count() == RANKS,
        "every rank answers after the rejoin"
    );
    Ok(mesh)
}
