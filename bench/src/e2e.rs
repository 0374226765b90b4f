//! Suite `e2e`: the whole product on the in-process cluster in a box.
//!
//! - `world_ready_{4,16,64}_s`: apply a World until its Ready condition.
//!   Baseline: the same host pods (as the operator built them) created
//!   directly, until every pod is Ready: the kubelet's own start time.
//! - `procmesh_ready_64_s`: a ProcMesh of one proc per host on the 64-host
//!   World until Ready; same baseline as `world_ready_64_s`.
//! - `proc_kill_to_status_s`: a proc SIGKILLed until its rank shows Killed in
//!   ProcMesh status (target at most 1 s; baseline null).

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hostmesh_cli::devenv::DevEnv;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};

use crate::report::emit;

pub(crate) const NS: &str = "default";
pub(crate) const WAIT: Duration = Duration::from_secs(300);

pub(crate) fn run() -> anyhow::Result<()> {
    with_dev_env("e2e", |env| Box::pin(suite(env)))
}

/// Runs `suite` on a cluster in a box started for it (its data under
/// `hostmesh-bench-<tag>-<pid>` in the temporary directory), and tears the
/// cluster down after it, also on Ctrl-C or SIGTERM.
pub(crate) fn with_dev_env<F>(tag: &str, suite: F) -> anyhow::Result<()>
where
    F: for<'e> FnOnce(
        &'e DevEnv,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = anyhow::Result<()>> + 'e>,
    >,
{
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let dir = std::env::temp_dir().join(format!("hostmesh-bench-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        // The agent image maps to the `hostmesh` binary built beside this one.
        let hostmesh = std::env::current_exe()?.with_file_name("hostmesh");
        anyhow::ensure!(
            hostmesh.exists(),
            "{} is missing: build it with `cargo build --release --bin hostmesh`",
            hostmesh.display()
        );
        let env = DevEnv::start(&dir, hostmesh).await?;
        // Ctrl-C or SIGTERM still tears the cluster down: its pods are this
        // process's children.
        let outcome = tokio::select! {
            r = suite(&env) => r,
            () = hostmesh_operator::shutdown_signal() => Err(anyhow::anyhow!("interrupted")),
        };
        env.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
        outcome
    })
}

/// Runs of each measurement; the median is reported (host readiness is
/// probed once a second, so a single run is quantized to about a second).
const REPS: usize = 3;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

async fn suite(env: &DevEnv) -> anyhow::Result<()> {
    let client = env.client();
    for hosts in [4u32, 16, 64] {
        let (mut world, mut procmesh, mut base) = (Vec::new(), Vec::new(), Vec::new());
        for rep in 0..REPS {
            let name = format!("bench{hosts}-{rep}");
            let start = Instant::now();
            apply(&client, &world_yaml(&name, hosts)).await?;
            wait_ready(&client, "World", &name).await?;
            world.push(start.elapsed().as_secs_f64());
            if hosts == 64 {
                let mesh = format!("{name}-procs");
                let start = Instant::now();
                apply(&client, &mesh_yaml(&mesh, &name)).await?;
                wait_ready(&client, "ProcMesh", &mesh).await?;
                procmesh.push(start.elapsed().as_secs_f64());
            }
            // The baseline runs copies of the same pods (and of the agent
            // Secret they mount) on the cluster the World has left, so both
            // measure on an idle node.
            let pods = host_pods(&client, &name).await?;
            let secrets = crate::scale::fresh_secrets(&client, NS, &pods).await?;
            if hosts == 64 {
                api(&client, "ProcMesh")
                    .delete(&format!("{name}-procs"), &DeleteParams::default())
                    .await?;
            }
            delete_world(&client, &name).await?;
            base.push(bare_pods_ready(&client, pods, secrets).await?);
        }
        let base = median(base);
        emit(
            &format!("world_ready_{hosts}_s"),
            median(world),
            "s",
            Some(base),
        );
        if !procmesh.is_empty() {
            emit("procmesh_ready_64_s", median(procmesh), "s", Some(base));
        }
    }
    let mut kill = Vec::new();
    for rep in 0..REPS {
        kill.push(proc_kill_to_status(&client, &format!("kill-{rep}")).await?);
    }
    emit("proc_kill_to_status_s", median(kill), "s", None);
    Ok(())
}

fn world_yaml(name: &str, hosts: u32) -> String {
    format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {{name: {name}}}\nspec:\n  shape: [{{name: host, size: {hosts}}}]\n  template:\n    spec:\n      containers:\n      - {{name: host, image: busybox}}\n"
    )
}

fn mesh_yaml(name: &str, world: &str) -> String {
    format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: {name}}}\nspec:\n  world: {world}\n  perHost: [{{name: gpu, size: 1}}]\n  command: [sleep, '600']\n  restartPolicy: {{policy: Never}}\n"
    )
}

pub(crate) async fn apply(client: &kube::Client, yaml: &str) -> anyhow::Result<()> {
    let objects = hostmesh_cli::manifest::parse("bench", yaml)?;
    hostmesh_cli::manifest::apply_all(client, &objects, NS, "hostmesh-bench").await?;
    Ok(())
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

pub(crate) async fn status_of(
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
    status["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

pub(crate) async fn wait_ready(
    client: &kube::Client,
    kind: &str,
    name: &str,
) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let s = status_of(client, kind, name).await?;
        if ready(&s) {
            return Ok(());
        }
        if start.elapsed() > WAIT {
            bail!("{kind} {name} not Ready after {WAIT:?}: {s}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn host_pods(client: &kube::Client, world: &str) -> anyhow::Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    Ok(pods
        .list(&ListParams::default().labels(&format!("hostmesh.dev/world={world}")))
        .await?
        .items)
}

async fn delete_world(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    api(client, "World")
        .delete(name, &DeleteParams::default())
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let start = Instant::now();
    while start.elapsed() < WAIT {
        let left = api(client, "World").get_opt(name).await?.is_some()
            || !pods.list(&ListParams::default()).await?.items.is_empty();
        if !left {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("World {name} and its pods not gone after {WAIT:?}")
}

/// Creates `secrets`, then `pods` again as plain pods (same spec, no owner,
/// no operator), and returns the seconds from the first pod create until all
/// are Ready; deletes them all afterwards.
async fn bare_pods_ready(
    client: &kube::Client,
    pods: Vec<Pod>,
    secrets: Vec<Secret>,
) -> anyhow::Result<f64> {
    let secret_api: Api<Secret> = Api::namespaced(client.clone(), NS);
    for s in &secrets {
        secret_api.create(&PostParams::default(), s).await?;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut names = Vec::new();
    let start = Instant::now();
    for p in pods {
        let name = format!("bare-{}", p.metadata.name.clone().unwrap_or_default());
        let mut spec = p.spec.context("pod without spec")?;
        spec.node_name = None;
        let mut fresh = Pod::default();
        fresh.metadata.name = Some(name.clone());
        fresh.metadata.labels = p.metadata.labels;
        if let Some(l) = fresh.metadata.labels.as_mut() {
            // Not the World's pods: the operator must not adopt or count them.
            l.retain(|k, _| !k.starts_with("hostmesh.dev/"));
        }
        fresh.spec = Some(spec);
        api.create(&PostParams::default(), &fresh).await?;
        names.push(name);
    }
    loop {
        let list = api.list(&ListParams::default()).await?;
        let ready = list
            .items
            .iter()
            .filter(|p| names.contains(p.metadata.name.as_ref().unwrap_or(&String::new())))
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        if ready == names.len() {
            break;
        }
        if start.elapsed() > WAIT {
            bail!("bare pods: {ready}/{} Ready after {WAIT:?}", names.len());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    for n in &names {
        api.delete(n, &DeleteParams::default().grace_period(0))
            .await?;
    }
    let deadline = Instant::now() + WAIT;
    while !api.list(&ListParams::default()).await?.items.is_empty() {
        if Instant::now() > deadline {
            bail!("bare pods not gone after {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for s in &secrets {
        secret_api
            .delete(
                s.metadata.name.as_deref().unwrap_or_default(),
                &DeleteParams::default(),
            )
            .await?;
    }
    Ok(secs)
}

/// SIGKILLs the one proc of a one-host ProcMesh and measures until its rank
/// shows Killed in status.
async fn proc_kill_to_status(client: &kube::Client, world: &str) -> anyhow::Result<f64> {
    apply(client, &world_yaml(world, 1)).await?;
    wait_ready(client, "World", world).await?;
    let victim = format!("{world}-victim");
    apply(client, &mesh_yaml(&victim, world)).await?;
    wait_ready(client, "ProcMesh", &victim).await?;
    let pid = find_proc(world, &victim).context("the victim proc is not running")?;
    let start = Instant::now();
    hostmesh_e2e::signal(pid, "KILL")?;
    loop {
        let s = status_of(client, "ProcMesh", &victim).await?;
        let killed = s["ranks"]
            .as_array()
            .is_some_and(|runs| runs.iter().any(|r| r["state"] == "Killed"));
        if killed {
            break;
        }
        if start.elapsed() > WAIT {
            bail!("rank 0 not Killed in status after {WAIT:?}: {s}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    api(client, "ProcMesh")
        .delete(&victim, &DeleteParams::default())
        .await?;
    delete_world(client, world).await?;
    Ok(secs)
}

/// PID of the proc of ProcMesh `mesh` in World `world` (scans `/proc`).
fn find_proc(world: &str, mesh: &str) -> Option<i32> {
    find_proc_where(world, mesh, None)
}

/// PID of the proc of ProcMesh `mesh` in World `world`, of `rank` when
/// given (its `RANK`), found by its environment in `/proc`.
pub(crate) fn find_proc_where(world: &str, mesh: &str, rank: Option<usize>) -> Option<i32> {
    let want_world = format!("HOSTMESH_WORLD={world}");
    let want_mesh = format!("HOSTMESH_PROC_MESH={mesh}");
    let want_rank = rank.map(|r| format!("RANK={r}"));
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_string_lossy().parse().ok()?;
        let env = std::fs::read(e.path().join("environ")).ok()?;
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        let has = |w: &str| vars.contains(&w.as_bytes());
        (has(&want_world) && has(&want_mesh) && want_rank.as_deref().is_none_or(has)).then_some(pid)
    })
}
