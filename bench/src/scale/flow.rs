//! One run of the scale suite, in order: the cluster and the idle
//! figures, the World, the ProcMesh, steady state (memory, request rate,
//! status size), proc kills, an agent kill, then the World's deletion and
//! the bare-pod baseline.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};

use super::cluster::Cluster;
use super::shards::SimFleet;
use super::sim_agent::SimCounters;
use super::{KILLS, STEADY, ScaleArgs};
use crate::report::emit;

macro_rules! progress {
    ($($t:tt)*) => { crate::report::progress(&format!($($t)*)) };
}

const NS: &str = "scale";
const WORLD: &str = "scale";
const MESH: &str = "scale-procs";
/// The one-host World (and its ProcMesh) the idle figures are taken with.
const WARMUP: &str = "scale-warmup";
const WARMUP_MESH: &str = "scale-warmup-procs";
/// Longest wait for anything but the World's and ProcMesh's first Ready.
const WAIT: Duration = Duration::from_secs(600);

/// A World of `hosts` busybox hosts, sized as docs/operations.md
/// ("Sizing") says: above 2,000 hosts a heartbeat every second per 2,000
/// hosts and a `healthTimeout` of six of them.
fn world_yaml(name: &str, hosts: usize) -> String {
    let sizing = if hosts > 2_000 {
        let beat = hosts.div_ceil(2_000);
        format!(
            "  agent: {{heartbeatInterval: {beat}s}}\n  healthTimeout: {}s\n",
            (beat * 6).max(10)
        )
    } else {
        String::new()
    };
    format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {{name: {name}}}\nspec:\n  shape: [{{name: host, size: {hosts}}}]\n{sizing}  template:\n    spec:\n      containers:\n      - {{name: host, image: busybox}}\n"
    )
}

fn mesh_yaml(name: &str, world: &str, per_host: usize) -> String {
    format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: {name}}}\nspec:\n  world: {world}\n  perHost: [{{name: gpu, size: {per_host}}}]\n  command: [sleep, '100000']\n  restartPolicy: {{policy: OnFailure, maxRestarts: 1000, backoff: 100ms}}\n"
    )
}

fn api(client: &kube::Client, kind: &str) -> Api<DynamicObject> {
    let gvk = kube::core::GroupVersionKind::gvk("hostmesh.dev", "v1alpha1", kind);
    let plural = if kind == "World" {
        "worlds"
    } else {
        "procmeshes"
    };
    let ar = kube::discovery::ApiResource::from_gvk_with_plural(&gvk, plural);
    Api::namespaced_with(client.clone(), NS, &ar)
}

async fn apply(client: &kube::Client, yaml: &str) -> anyhow::Result<()> {
    let objects = hostmesh_cli::manifest::parse("scale", yaml)?;
    hostmesh_cli::manifest::apply_all(client, &objects, NS, "hostmesh-bench").await?;
    Ok(())
}

async fn status_of(
    client: &kube::Client,
    kind: &str,
    name: &str,
) -> anyhow::Result<serde_json::Value> {
    Ok(api(client, kind)
        .get(name)
        .await?
        .data
        .get("status")
        .cloned()
        .unwrap_or_default())
}

fn ready(status: &serde_json::Value) -> bool {
    hostmesh_e2e::condition_true(status, "Ready")
}

/// Polls `kind/name`'s status every `every` until `done`, for at most
/// `bound`; says how far it got every 15 s.
async fn wait_status(
    client: &kube::Client,
    kind: &str,
    name: &str,
    every: Duration,
    bound: Duration,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> anyhow::Result<serde_json::Value> {
    let start = Instant::now();
    let mut said = Instant::now();
    loop {
        let s = status_of(client, kind, name).await?;
        if done(&s) {
            return Ok(s);
        }
        if start.elapsed() > bound {
            bail!(
                "{kind} {name}: {what} not reached after {bound:?}: {}",
                brief(&s)
            );
        }
        if said.elapsed() > Duration::from_secs(15) {
            said = Instant::now();
            progress!(
                "scale: {kind} {name} after {:.0} s: {}",
                start.elapsed().as_secs_f64(),
                brief(&s)
            );
        }
        tokio::time::sleep(every).await;
    }
}

/// The phase and counts of a status, for progress lines.
fn brief(s: &serde_json::Value) -> String {
    format!(
        "phase {} ready {}/{} running {} failed {} restarts {}",
        s["phase"], s["readyHosts"], s["desiredHosts"], s["running"], s["failed"], s["restarts"]
    )
}

fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v[i.min(v.len() - 1)]
}

/// Runs the suite once (see the module doc of [`super`]).
pub(crate) async fn run(args: &ScaleArgs, bin: PathBuf, dir: PathBuf) -> anyhow::Result<()> {
    let hosts = args.hosts;
    let per_host = args.procs_per_host;
    let prefix = if args.simulate { "scale_sim" } else { "scale" };
    let name = |n: &str| format!("{prefix}_{n}");
    let mut cluster = Cluster::start(bin, dir, !args.simulate).await?;
    let client = cluster.client.clone();
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NS}}))?;
    Api::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let counters = Arc::new(SimCounters::default());
    let sim = if args.simulate {
        Some(
            SimFleet::start(
                client.clone(),
                &cluster.kubeconfig,
                NS,
                counters.clone(),
                hosts,
                args.shards,
            )
            .await?,
        )
    } else {
        let nodes = args.nodes.unwrap_or(hosts.div_ceil(100)).max(1);
        cluster.start_kubelets(nodes).await?;
        None
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.start_operator().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    progress!(
        "scale: cold RSS (no World yet): operator {} B, API server {} B, kubelets {} B",
        cluster.operator()?.rss()?,
        cluster.apiserver.rss()?,
        cluster.kubelets_rss()?
    );
    // The idle figures, with a World of one host and its ProcMesh running:
    // what a host costs is the RSS a World grows by per host beyond its
    // first, not the code and connections the first World pages in.
    let (op_idle, api_idle, kubelet_idle) = warm_idle(&cluster, per_host, args).await?;
    progress!(
        "scale: idle RSS (a World of one host): operator {op_idle} B, API server {api_idle} B, kubelets {kubelet_idle} B"
    );

    // The World.
    let books_before = counters.book_entries.load(Ordering::Relaxed);
    let start = Instant::now();
    apply(&client, &world_yaml(WORLD, hosts)).await?;
    wait_status(
        &client,
        "World",
        WORLD,
        Duration::from_millis(200),
        args.ready_timeout,
        "Ready",
        ready,
    )
    .await?;
    let world_s = start.elapsed().as_secs_f64();
    progress!("scale: World Ready in {world_s:.2} s");
    let books = counters.book_entries.load(Ordering::Relaxed) - books_before;

    // The ProcMesh.
    let start = Instant::now();
    apply(&client, &mesh_yaml(MESH, WORLD, per_host)).await?;
    let ranks = hosts * per_host;
    wait_status(
        &client,
        "ProcMesh",
        MESH,
        Duration::from_millis(100),
        args.ready_timeout,
        "Ready",
        ready,
    )
    .await?;
    let mesh_s = start.elapsed().as_secs_f64();
    progress!("scale: ProcMesh of {ranks} ranks Ready in {mesh_s:.2} s");

    // Steady state.
    let requests = "hostmesh_api_requests_total";
    let r0 = cluster.operator_counter(requests).await?;
    let cpu0 = super::cluster::cpu_seconds(cluster.operator()?.pid())?;
    let t0 = Instant::now();
    tokio::time::sleep(STEADY).await;
    let r1 = cluster.operator_counter(requests).await?;
    let op_cpu = (super::cluster::cpu_seconds(cluster.operator()?.pid())? - cpu0)
        / t0.elapsed().as_secs_f64();
    let rate = match (r0, r1) {
        (Some(a), Some(b)) => Some((b - a) / t0.elapsed().as_secs_f64()),
        _ => None,
    };
    let op_rss = cluster.operator()?.rss()?;
    let api_rss = cluster.apiserver.rss()?;
    let kubelet_rss = cluster.kubelets_rss()?;
    let mut status_max = 0;
    for (kind, n) in [("World", WORLD), ("ProcMesh", MESH)] {
        status_max = status_max.max(serde_json::to_vec(&status_of(&client, kind, n).await?)?.len());
    }

    // Proc kills, each on another host, each after the last recovered.
    let mut kills = Vec::new();
    for k in 0..KILLS {
        let host = (k * hosts / KILLS + 1) % hosts;
        let rank = host * per_host + k % per_host;
        kills.push(kill_proc(&client, sim.as_ref(), host, rank, ranks).await?);
    }
    progress!("scale: proc kill to status: {kills:?}");

    // An agent kill: until the World is Ready again with every host ready
    // and the victim's host replaced (a new pod).
    let victim = hosts / 2;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let victim_pod = format!("{WORLD}-host-{victim}");
    let uid_before = pods_api.get(&victim_pod).await?.metadata.uid;
    let start = Instant::now();
    match &sim {
        Some(sim) => sim.kill_agent(victim).await?,
        None => {
            let pids = agent_pids(victim);
            anyhow::ensure!(!pids.is_empty(), "no agent process of host {victim}");
            for pid in pids {
                hostmesh_e2e::signal(pid, "KILL")?;
            }
        }
    }
    // The World not Ready, or (a window shorter than a poll) the victim's
    // pod already gone or replaced, is the kill noticed; then Ready again
    // with every host ready on the victim's new pod.
    let mut detect = None;
    loop {
        let s = status_of(&client, "World", WORLD).await?;
        let pod = pods_api.get_opt(&victim_pod).await?;
        let replaced = pod.as_ref().is_some_and(|p| p.metadata.uid != uid_before);
        let gone = pod
            .as_ref()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some() || replaced);
        if detect.is_none() && (!ready(&s) || gone) {
            detect = Some(start.elapsed().as_secs_f64());
        }
        if detect.is_some() && replaced && ready(&s) && s["readyHosts"] == s["desiredHosts"] {
            break;
        }
        anyhow::ensure!(
            start.elapsed() < WAIT,
            "World not Ready again with host {victim} replaced after {WAIT:?}: {}",
            brief(&s)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let agent_kill_detect_s = detect.unwrap_or_default();
    let agent_kill_s = start.elapsed().as_secs_f64();
    progress!(
        "scale: agent kill: World not Ready after {agent_kill_detect_s:.2} s, Ready again after {agent_kill_s:.2} s"
    );

    let fenced = fenced_agents(&cluster.operator_log());

    // The World goes; then the same pods, bare.
    let pods = host_pods(&client).await?;
    let secrets = super::fresh_secrets(&client, NS, &pods).await?;
    api(&client, "ProcMesh")
        .delete(MESH, &DeleteParams::default())
        .await?;
    api(&client, "World")
        .delete(WORLD, &DeleteParams::default())
        .await?;
    wait_gone(&client, WORLD).await?;
    let base = bare_pods_ready(&client, pods, secrets, args.ready_timeout).await?;
    progress!("scale: bare pods Ready in {base:.2} s");

    emit(&name("world_ready_s"), world_s, "s", Some(base));
    emit(&name("procmesh_ready_s"), mesh_s, "s", None);
    emit(
        &name("proc_kill_to_status_s"),
        quantile(kills.clone(), 0.99),
        "s",
        None,
    );
    emit(
        &name("proc_kill_to_status_p50_s"),
        quantile(kills, 0.5),
        "s",
        None,
    );
    emit(
        &name("agent_kill_not_ready_s"),
        agent_kill_detect_s,
        "s",
        None,
    );
    emit(&name("agent_kill_recovered_s"), agent_kill_s, "s", None);
    emit(&name("agents_fenced"), fenced as f64, "agents", Some(0.0));
    // Per host beyond the idle figures' one (see `warm_idle`).
    let per = |now: u64, idle: u64, n: usize| {
        now.saturating_sub(idle) as f64 / n.saturating_sub(1).max(1) as f64
    };
    emit(&name("operator_rss_bytes"), op_rss as f64, "B", None);
    emit(
        &name("operator_rss_per_host_bytes"),
        per(op_rss, op_idle, hosts),
        "B",
        Some(64.0 * 1024.0),
    );
    emit(&name("apiserver_rss_bytes"), api_rss as f64, "B", None);
    emit(
        &name("apiserver_rss_per_host_bytes"),
        per(api_rss, api_idle, hosts),
        "B",
        Some(256.0 * 1024.0),
    );
    if sim.is_none() {
        emit(&name("kubelet_rss_bytes"), kubelet_rss as f64, "B", None);
        emit(
            &name("kubelet_rss_per_pod_bytes"),
            per(kubelet_rss, kubelet_idle, hosts),
            "B",
            Some(1024.0 * 1024.0),
        );
    }
    if let Some(rate) = rate {
        emit(&name("operator_api_requests"), rate, "req/s", None);
    }
    emit(&name("operator_cpu_cores"), op_cpu, "cores", None);
    emit(&name("status_bytes_max"), status_max as f64, "B", None);
    if let Some(sim) = &sim {
        // This process's shard counts its own agents' entries.
        emit(
            &name("book_entries_per_agent_per_host"),
            books as f64 / (sim.local_agents().max(1) * hosts) as f64,
            "entries",
            None,
        );
    }
    drop(sim);
    cluster.shutdown();
    Ok(())
}

/// SIGKILLs proc `rank` (on `host`) and returns the seconds until the
/// ProcMesh's incidents show it; then waits until every rank runs again.
async fn kill_proc(
    client: &kube::Client,
    sim: Option<&SimFleet>,
    host: usize,
    rank: usize,
    ranks: usize,
) -> anyhow::Result<f64> {
    let shows = |s: &serde_json::Value| {
        s["incidents"]
            .as_array()
            .is_some_and(|is| is.iter().any(|i| i["rank"].as_u64() == Some(rank as u64)))
    };
    anyhow::ensure!(
        !shows(&status_of(client, "ProcMesh", MESH).await?),
        "rank {rank} already has an incident"
    );
    let start = match sim {
        Some(sim) => {
            let start = Instant::now();
            sim.kill_proc(host, rank)?;
            start
        }
        None => {
            let r = rank.to_string();
            let pids = hostmesh_e2e::find_pids(|e| {
                e.get("HOSTMESH_PROC_MESH").map(String::as_str) == Some(MESH)
                    && e.get("RANK") == Some(&r)
            });
            let pid = *pids
                .first()
                .with_context(|| format!("no process of rank {rank}"))?;
            let start = Instant::now();
            hostmesh_e2e::signal(pid, "KILL")?;
            start
        }
    };
    wait_status(
        client,
        "ProcMesh",
        MESH,
        Duration::from_millis(5),
        WAIT,
        "the kill in incidents",
        shows,
    )
    .await?;
    let secs = start.elapsed().as_secs_f64();
    wait_status(
        client,
        "ProcMesh",
        MESH,
        Duration::from_millis(100),
        WAIT,
        "every rank running again",
        |s| s["running"].as_u64() == Some(ranks as u64) && ready(s),
    )
    .await?;
    Ok(secs)
}

/// The RSS of the operator, the API server and the kubelets while a World
/// of one host and a ProcMesh on it run (then both are deleted, and gone
/// before this returns).
async fn warm_idle(
    cluster: &Cluster,
    per_host: usize,
    args: &ScaleArgs,
) -> anyhow::Result<(u64, u64, u64)> {
    let client = &cluster.client;
    for (kind, name, yaml) in [
        ("World", WARMUP, world_yaml(WARMUP, 1)),
        (
            "ProcMesh",
            WARMUP_MESH,
            mesh_yaml(WARMUP_MESH, WARMUP, per_host),
        ),
    ] {
        apply(client, &yaml).await?;
        wait_status(
            client,
            kind,
            name,
            Duration::from_millis(200),
            args.ready_timeout,
            "Ready",
            ready,
        )
        .await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = (
        cluster.operator()?.rss()?,
        cluster.apiserver.rss()?,
        cluster.kubelets_rss()?,
    );
    api(client, "ProcMesh")
        .delete(WARMUP_MESH, &DeleteParams::default())
        .await?;
    api(client, "World")
        .delete(WARMUP, &DeleteParams::default())
        .await?;
    wait_gone(client, WARMUP).await?;
    Ok(idle)
}

/// The agent processes of host `rank`.
fn agent_pids(rank: usize) -> Vec<i32> {
    let r = rank.to_string();
    hostmesh_e2e::find_pids(|e| {
        e.get("HOSTMESH_WORLD").map(String::as_str) == Some(WORLD)
            && e.get("HOSTMESH_HOST_RANK") == Some(&r)
            && !e.contains_key("HOSTMESH_PROC_MESH")
    })
}

/// Distinct host ranks the operator logged as fenced.
fn fenced_agents(log: &str) -> usize {
    let ranks: std::collections::BTreeSet<&str> = log
        .lines()
        .filter(|l| l.contains("fenced itself"))
        .filter_map(|l| {
            let at = l.find("rank=")? + 5;
            l[at..].split_whitespace().next()
        })
        .collect();
    ranks.len()
}

async fn host_pods(client: &kube::Client) -> anyhow::Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    Ok(pods
        .list(&ListParams::default().labels(&format!("hostmesh.dev/world={WORLD}")))
        .await?
        .items)
}

/// Waits until World `world` and every pod of the namespace are gone.
async fn wait_gone(client: &kube::Client, world: &str) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let start = Instant::now();
    loop {
        let left = api(client, "World").get_opt(world).await?.is_some()
            || !pods.list(&ListParams::default()).await?.items.is_empty();
        if !left {
            return Ok(());
        }
        if start.elapsed() > WAIT {
            bail!("World {world} and its pods not gone after {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Creates `secrets`, then `pods` again as plain pods (same spec, no owner,
/// no operator), and returns the seconds from the first create until all
/// are Ready; deletes them afterwards.
async fn bare_pods_ready(
    client: &kube::Client,
    pods: Vec<Pod>,
    secrets: Vec<Secret>,
    bound: Duration,
) -> anyhow::Result<f64> {
    let secret_api: Api<Secret> = Api::namespaced(client.clone(), NS);
    for s in &secrets {
        secret_api.create(&PostParams::default(), s).await?;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let n = pods.len();
    let start = Instant::now();
    for p in pods {
        let name = format!("bare-{}", p.metadata.name.clone().unwrap_or_default());
        let mut spec = p.spec.context("pod without spec")?;
        spec.node_name = None;
        let mut fresh = Pod::default();
        fresh.metadata.name = Some(name);
        fresh.metadata.labels = p.metadata.labels;
        if let Some(l) = fresh.metadata.labels.as_mut() {
            // Not the World's pods: the operator must not adopt or count them.
            l.retain(|k, _| !k.starts_with("hostmesh.dev/"));
        }
        fresh.spec = Some(spec);
        api.create(&PostParams::default(), &fresh).await?;
    }
    let mut said = Instant::now();
    loop {
        let list = api.list(&ListParams::default()).await?;
        let ready = list
            .items
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        if ready == n {
            break;
        }
        if start.elapsed() > bound {
            bail!("bare pods: {ready}/{n} Ready after {bound:?}");
        }
        if said.elapsed() > Duration::from_secs(15) {
            said = Instant::now();
            progress!("scale: bare pods: {ready}/{n} Ready");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    api.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default(),
    )
    .await?;
    for s in &secrets {
        let _ = secret_api
            .delete(
                s.metadata.name.as_deref().unwrap_or_default(),
                &DeleteParams::default(),
            )
            .await;
    }
    Ok(secs)
}
