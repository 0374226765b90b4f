//! Scenario `churn` (issue 30): workers create and delete Worlds with a
//! ProcMesh each, as a busy team does, and the cluster must end clean.
//!
//! [`WORKERS`] workers each create [`PER_WORKER`] Worlds of one host with a
//! ProcMesh of one proc, and delete them in one of three ways, in turn: the
//! ProcMesh and the World together; the World alone, at once (before the
//! operator's first reconcile of it: the leak of ProcMeshes); the
//! World alone once its proc runs.
//!
//! What must hold: no World, ProcMesh, host pod, agent Secret or agent
//! process of the churn is left; and the API server gives its memory back:
//! its RSS after the churn (once its watch window, shortened to
//! [`WATCH_WINDOW`], has passed) is within [`RSS_SLACK_MIB`] of what it
//! was before the churn. Figures: the API server's RSS before, at its
//! peak, and after (MiB), and the seconds the churn took.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hostmesh_e2e::{Env, EnvOptions, world_yaml};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams};

use super::Timing;
use super::fixture::{BOUND, WORLD};

/// Concurrent workers.
pub(crate) const WORKERS: usize = 8;

/// Worlds each worker creates and deletes.
pub(crate) const PER_WORKER: usize = 9;

/// The API server's watch window in this scenario (5 minutes by
/// default): events of deleted objects must leave the history, and the
/// memory with them, within a run.
pub(crate) const WATCH_WINDOW: Duration = Duration::from_secs(20);

/// How much RSS the churn may leave behind.
pub(crate) const RSS_SLACK_MIB: f64 = 48.0;

fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

fn mesh_yaml(name: &str) -> String {
    format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: ProcMesh\nmetadata: {{name: {name}}}\nspec:\n  world: {name}\n  command: [sleep, '600']\n  restartPolicy: {{policy: OnFailure, maxRestarts: 3, backoff: 1s}}\n"
    )
}

/// One worker: its Worlds one after the other.
async fn worker(env: &Env, w: usize) -> anyhow::Result<()> {
    for i in 0..PER_WORKER {
        let name = format!("c{w}-{i}");
        env.apply(&world_yaml(&name, &[("host", 1)], WORLD)).await?;
        env.apply(&mesh_yaml(&name)).await?;
        match (w + i) % 3 {
            0 => {
                env.delete("ProcMesh", &name).await?;
                env.delete("World", &name).await?;
            }
            1 => env.delete("World", &name).await?,
            _ => {
                let api = env.hostmesh_api("ProcMesh");
                let running =
                    hostmesh_testkit::wait::poll(BOUND, async || match api.get_opt(&name).await {
                        Ok(Some(o)) if o.data["status"]["running"] == 1 => Ok(()),
                        _ => Err(()),
                    })
                    .await;
                if running.is_err() {
                    bail!("ProcMesh {name} never ran its proc in {BOUND:?}");
                }
                env.delete("World", &name).await?;
            }
        }
    }
    Ok(())
}

/// What of the churn is still there, in words; empty when nothing is.
async fn leftovers(env: &Env) -> anyhow::Result<Vec<String>> {
    let mut left = Vec::new();
    for kind in ["World", "ProcMesh"] {
        for o in env
            .hostmesh_api(kind)
            .list(&ListParams::default())
            .await?
            .items
        {
            left.push(format!("{kind} {}", o.metadata.name.unwrap_or_default()));
        }
    }
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    for p in pods.list(&ListParams::default()).await?.items {
        left.push(format!("pod {}", p.metadata.name.unwrap_or_default()));
    }
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.namespace);
    for s in secrets.list(&ListParams::default()).await?.items {
        let name = s.metadata.name.unwrap_or_default();
        if name.starts_with('c') && name.contains("-agent") {
            left.push(format!("secret {name}"));
        }
    }
    for w in 0..WORKERS {
        for i in 0..PER_WORKER {
            let agents = env.agent_pids(&format!("c{w}-{i}"), 0);
            if !agents.is_empty() {
                left.push(format!("agent of c{w}-{i}: pids {agents:?}"));
            }
        }
    }
    Ok(left)
}

/// One run.
pub(crate) async fn churn(run: &str) -> anyhow::Result<Timing> {
    let options = EnvOptions {
        apiserver_args: vec![
            "--watch-window".into(),
            format!("{}s", WATCH_WINDOW.as_secs()),
        ],
        ..EnvOptions::default()
    };
    let env = Env::start_with_options(run, options).await?;
    let pid = env.apiserver_pid().context("no embedded API server")?;
    // A baseline with the cluster up and idle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rss_mib(pid).context("reading the API server's RSS")?;
    let peak = std::sync::Mutex::new(before);
    let t0 = Instant::now();
    let sample = async {
        loop {
            if let Some(r) = rss_mib(pid) {
                let mut p = peak.lock().unwrap_or_else(|e| e.into_inner());
                *p = p.max(r);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let work = futures::future::try_join_all((0..WORKERS).map(|w| worker(&env, w)));
    let done = tokio::select! {
        r = work => r,
        () = sample => unreachable!("the sampler never ends"),
    };
    done?;
    let churn_s = t0.elapsed().as_secs_f64();
    // Everything goes (each World's deletion, owner references, orphans).
    let mut left = Vec::new();
    let clean = hostmesh_testkit::wait::poll(BOUND, async || {
        left = leftovers(&env).await.map_err(|_| ())?;
        left.is_empty().then_some(()).ok_or(())
    })
    .await;
    // Memory: once the watch window (and a sweep) passed.
    tokio::time::sleep(WATCH_WINDOW + Duration::from_secs(12)).await;
    let after = rss_mib(pid).context("reading the API server's RSS")?;
    let peak = *peak.lock().unwrap_or_else(|e| e.into_inner());
    let mut timing = Timing {
        extra: vec![
            ("apiserver_rss_before_mib", before, "MiB"),
            ("apiserver_rss_peak_mib", peak, "MiB"),
            ("apiserver_rss_after_mib", after, "MiB"),
        ],
        figures: vec![("churn_s", churn_s, "s")],
        ..Timing::default()
    };
    let mut problems = Vec::new();
    if clean.is_err() {
        problems.push(format!("left after {BOUND:?}: {}", left.join(", ")));
    }
    if after > before + RSS_SLACK_MIB {
        problems.push(format!(
            "the API server kept its memory: RSS {before:.0} MiB before, {peak:.0} MiB at the peak, {after:.0} MiB after (at most {RSS_SLACK_MIB} MiB more)"
        ));
    }
    if !problems.is_empty() {
        timing.failure = Some(problems.join("; "));
    }
    Ok(timing)
}
