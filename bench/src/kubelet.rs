//! Suite `kubelet`: what pod sandboxes cost the process kubelet.
//!
//! - `pod_start_sandbox_s`: one pod created until its container runs, with
//!   a network and UTS namespace, veth and `/etc` files of its own (median
//!   of [`REPS`]). Baseline: the same pod with `--pod-network=host`.
//! - `pods_start_20_sandbox_s`: 20 pods created at once until every
//!   container runs. Baseline: the same with `--pod-network=host`.
//!
//! Each mode runs on its own embedded API server and kubelet, one after the
//! other, in this process. The sandbox mode needs root.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hostmesh_devcluster::kubelet::{Kubelet, KubeletConfig, PodNetwork};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use crate::report::emit;

const REPS: usize = 10;
const BATCH: usize = 20;
const WAIT: Duration = Duration::from_secs(120);

pub(crate) fn run() -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let sandbox = measure(PodNetwork::Sandbox).await?;
        let host = measure(PodNetwork::Host).await?;
        emit("pod_start_sandbox_s", sandbox.0, "s", Some(host.0));
        emit("pods_start_20_sandbox_s", sandbox.1, "s", Some(host.1));
        Ok(())
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// (median single-pod start, batch start) in seconds with `network`.
async fn measure(network: PodNetwork) -> anyhow::Result<(f64, f64)> {
    let dir = tempfile::tempdir()?;
    let api = hostmesh_devcluster::apiserver::ApiServer::start(Default::default()).await?;
    let client = api.client()?;
    let mut config =
        KubeletConfig::new("bench-node", dir.path().join("kubelet")).for_api_server(&api);
    if network == PodNetwork::Host {
        config = config.host_network(240);
    }
    let kubelet = Kubelet::start(client.clone(), config)
        .await
        .with_context(|| format!("starting a kubelet with --pod-network={network:?}"))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let outcome = async {
        let mut single = Vec::new();
        for rep in 0..REPS {
            let start = Instant::now();
            create(&pods, &format!("single-{rep}")).await?;
            wait_running(&pods, 1).await?;
            single.push(start.elapsed().as_secs_f64());
            delete_all(&pods).await?;
        }
        let start = Instant::now();
        for i in 0..BATCH {
            create(&pods, &format!("batch-{i}")).await?;
        }
        wait_running(&pods, BATCH).await?;
        let batch = start.elapsed().as_secs_f64();
        delete_all(&pods).await?;
        anyhow::Ok((median(single), batch))
    }
    .await;
    kubelet.shutdown().await?;
    api.shutdown().await;
    outcome
}

async fn create(pods: &Api<Pod>, name: &str) -> anyhow::Result<()> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "600"]}],
        },
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    Ok(())
}

/// Waits until `n` pods have a running container.
async fn wait_running(pods: &Api<Pod>, n: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        let list = pods.list(&ListParams::default()).await?;
        let running = list
            .items
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                    })
            })
            .count();
        if running >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("only {running} of {n} pods running after {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn delete_all(pods: &Api<Pod>) -> anyhow::Result<()> {
    pods.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    let deadline = Instant::now() + WAIT;
    while !pods.list(&ListParams::default()).await?.items.is_empty() {
        if Instant::now() > deadline {
            bail!("pods still there after {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
