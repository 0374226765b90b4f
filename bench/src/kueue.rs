//! `kueue` suite: time from a Kueue admission to the World Ready, at 16 and
//! 64 hosts, against the same World created without Kueue (the baseline:
//! from its creation to Ready). The real World controller runs against the
//! embedded API server with Kueue's published Workload CRD; simulated
//! agents answer through the hub, the suite plays the kubelet (pod status)
//! and Kueue (the admission, as Kueue's scheduler writes it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hostmesh_crds::{ProcMesh, World};
use hostmesh_devcluster::apiserver::{ApiServer, ApiServerConfig};
use hostmesh_e2e::inproc::{Controllers, operator_args};
use hostmesh_operator::hub::sim::{SimConnector, connector};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Client, CustomResourceExt as _};
use serde_json::json;

use crate::report::emit;

const NS: &str = "bench";
/// Every wait of the suite gives up after this long.
const LIMIT: Duration = Duration::from_secs(300);

pub(crate) fn run() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(suite())
}

async fn suite() -> anyhow::Result<()> {
    let server = ApiServer::start(ApiServerConfig::default()).await?;
    let client = server.client()?;
    install(&client).await?;
    let sim = Arc::new(SimConnector::default());
    let controllers =
        Controllers::start(client.clone(), operator_args(NS, "bench"), connector(&sim));
    for (i, hosts) in [16u32, 64].into_iter().enumerate() {
        let plain = to_ready(&client, &format!("plain{hosts}"), hosts, false, 2 * i as u8).await?;
        let queued = to_ready(
            &client,
            &format!("queued{hosts}"),
            hosts,
            true,
            2 * i as u8 + 1,
        )
        .await?;
        emit(
            &format!("kueue_admission_to_ready_{hosts}_hosts_s"),
            queued.as_secs_f64(),
            "s",
            Some(plain.as_secs_f64()),
        );
    }
    controllers.stop().await;
    server.shutdown().await;
    Ok(())
}

async fn install(client: &Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [World::crd(), ProcMesh::crd()] {
        crds.create(&PostParams::default(), &crd).await?;
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../operator/tests/data/kueue/kueue.x-k8s.io_workloads.yaml"
    );
    let text = std::fs::read_to_string(path)?;
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&text)?;
    crds.create(&PostParams::default(), &crd).await?;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let worlds: Api<World> = Api::namespaced(client.clone(), NS);
    let wls = workloads(client);
    wait("the CRDs to serve", || async {
        Ok((worlds.list(&ListParams::default()).await.is_ok()
            && wls.list(&ListParams::default()).await.is_ok())
        .then_some(()))
    })
    .await
}

fn workloads(client: &Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload"),
        "workloads",
    );
    Api::namespaced_with(client.clone(), NS, &ar)
}

/// Polls `f` every 20 ms until it yields, for at most [`LIMIT`].
async fn wait<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let start = Instant::now();
    while start.elapsed() < LIMIT {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("timed out waiting for {what}")
}

/// Creates World `name` with `hosts` hosts and returns the time from its
/// start (creation, or the admission when `queued`) to Ready. Pod IPs come
/// from `127.20.<block>.0/24`.
async fn to_ready(
    client: &Client,
    name: &str,
    hosts: u32,
    queued: bool,
    block: u8,
) -> anyhow::Result<Duration> {
    let labels = if queued {
        json!({"kueue.x-k8s.io/queue-name": "bench"})
    } else {
        json!({})
    };
    let world: World = serde_json::from_value(json!({
        "apiVersion": "hostmesh.dev/v1alpha1", "kind": "World",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"hosts": hosts, "template": {"spec": {"containers": [{"name": "host", "image": "busybox"}]}}},
    }))?;
    let worlds: Api<World> = Api::namespaced(client.clone(), NS);
    let mut start = Instant::now();
    worlds.create(&PostParams::default(), &world).await?;
    if queued {
        let wls = workloads(client);
        let wl = wait("the Workload", || async {
            let l = wls.list(&ListParams::default()).await?;
            Ok(l.items.into_iter().find(|w| {
                w.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.name == name)
            }))
        })
        .await?;
        let wl_name = wl.metadata.name.unwrap_or_default();
        let cond = |t: &str, r: &str| json!({"type": t, "status": "True", "reason": r, "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"});
        let status = json!({"status": {
            "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "hosts", "count": hosts}]},
            "conditions": [cond("QuotaReserved", "QuotaReserved"), cond("Admitted", "Admitted")],
        }});
        start = Instant::now();
        wls.patch_status(&wl_name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let lp = ListParams::default().labels(&format!("hostmesh.dev/world={name}"));
    let mut ready = std::collections::BTreeSet::new();
    while start.elapsed() < LIMIT {
        for p in pods.list(&lp).await?.items {
            let pod = p.metadata.name.unwrap_or_default();
            if ready.contains(&pod) {
                continue;
            }
            let rank: u32 = pod
                .rsplit('-')
                .next()
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            let status = json!({"status": {
                "phase": "Running",
                "podIP": format!("127.20.{block}.{}", rank + 1),
                "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
            }});
            pods.patch_status(&pod, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
            ready.insert(pod);
        }
        let phase = worlds.get(name).await?.status.and_then(|s| s.phase);
        if phase == Some(hostmesh_crds::world::WorldPhase::Running) {
            return Ok(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("World {name}: not Ready within {LIMIT:?}")
}
