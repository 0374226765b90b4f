//! The in-process operator the `diagnosis` suite's causal and incident
//! scenarios run: the embedded API server with the CRDs, namespace [`NS`],
//! and the real World and ProcMesh controllers over a given agent
//! connector (real agents through a delaying connector, or simulated ones).
//!
//! Invariants:
//! 1. [`Operator::stop`] stops the controllers (bounded) and the API
//!    server; every wait here is bounded by [`BOUND`].
//! 2. [`Operator::play_kubelet`] only marks pods of [`NS`] Ready that are
//!    neither deleting nor Failed, each with an IP of its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use hostmesh_devcluster::apiserver::ApiServerHandle;
use hostmesh_e2e::inproc::{Controllers, operator_args};
use hostmesh_operator::hub::AgentConnector;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};

/// The namespace of every object.
pub(crate) const NS: &str = "diag";

/// How long any single wait may take.
pub(crate) const BOUND: Duration = Duration::from_secs(120);

/// The API server and the controllers running on it.
pub(crate) struct Operator {
    server: ApiServerHandle,
    pub(crate) client: kube::Client,
    controllers: Controllers,
}

impl Operator {
    /// Starts the API server and the controllers over `connector`.
    pub(crate) async fn start(connector: Arc<dyn AgentConnector>) -> Operator {
        let (server, client) = hostmesh_testkit::cluster::crd_server_with_namespace(NS).await;
        let controllers = Controllers::start(client.clone(), operator_args(NS, "bench"), connector);
        Operator {
            server,
            client,
            controllers,
        }
    }

    /// Stops the controllers, then the API server (invariant 1).
    pub(crate) async fn stop(self) {
        self.controllers.stop().await;
        self.server.shutdown().await;
    }

    /// Server-side applies a World or ProcMesh manifest.
    pub(crate) async fn apply(&self, yaml: &str) -> anyhow::Result<()> {
        let v: serde_json::Value = serde_saphyr::from_str(yaml)?;
        let name = v["metadata"]["name"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("manifest without metadata.name"))?
            .to_string();
        let ar = match v["kind"].as_str() {
            Some("World") => kube::api::ApiResource::erase::<hostmesh_crds::World>(&()),
            Some("ProcMesh") => kube::api::ApiResource::erase::<hostmesh_crds::ProcMesh>(&()),
            other => bail!("unexpected kind {other:?}"),
        };
        Api::<kube::api::DynamicObject>::namespaced_with(self.client.clone(), NS, &ar)
            .patch(
                &name,
                &PatchParams::apply("bench").force(),
                &Patch::Apply(&v),
            )
            .await?;
        Ok(())
    }

    /// Polls `get` every 50 ms until it yields, failing after [`BOUND`]
    /// naming `what`.
    pub(crate) async fn until<T, F>(
        &self,
        what: &str,
        mut get: impl FnMut() -> F,
    ) -> anyhow::Result<T>
    where
        F: std::future::Future<Output = Option<T>>,
    {
        let start = Instant::now();
        while start.elapsed() < BOUND {
            if let Some(v) = get().await {
                return Ok(v);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("{what}: not reached in {BOUND:?}")
    }

    /// Plays the kubelet for simulated agents until the returned sender is
    /// dropped or fires (invariant 2): every 100 ms, each pod that is not
    /// Ready is made Running and Ready at a fresh loopback IP.
    pub(crate) fn play_kubelet(&self) -> tokio::sync::oneshot::Sender<()> {
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NS);
        tokio::spawn(async move {
            let mut next_ip = 0u32;
            loop {
                tokio::select! {
                    _ = &mut rx => return,
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
                let Ok(list) = pods.list(&ListParams::default()).await else {
                    continue;
                };
                for p in list.items {
                    let ready = p.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .as_deref()
                            .unwrap_or_default()
                            .iter()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                    });
                    let failed =
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed");
                    if ready || failed || p.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    let Some(name) = p.metadata.name else {
                        continue;
                    };
                    next_ip += 1;
                    let ip = format!("127.2.{}.{}", next_ip / 250, next_ip % 250 + 1);
                    let status = serde_json::json!({"status": {
                        "phase": "Running",
                        "podIP": ip,
                        "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
                    }});
                    let _ = pods
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await;
                }
            }
        });
        tx
    }
}
