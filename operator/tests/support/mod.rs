//! What the operator's controller suites share: the embedded API server
//! with the hostmesh CRDs, the real controllers against it (started by
//! `hostmesh_e2e::inproc`) with simulated agents behind the hub (the suite
//! plays the kubelet by writing pod status, the agents through
//! [`SimConnector`]).
#![allow(dead_code)]

use std::sync::Arc;

use hostmesh_crds::{ProcMesh, World};
use hostmesh_devcluster::apiserver::ApiServerHandle;
use hostmesh_e2e::inproc::{Controllers, operator_args};
use hostmesh_operator::hub::sim::{SimConnector, connector};
use hostmesh_operator::{ControllerContext, OperatorArgs};
use hostmesh_testkit::eventually_async;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};

pub(crate) const NS: &str = "ctl";

pub(crate) struct Cluster {
    pub(crate) server: Option<ApiServerHandle>,
    pub(crate) client: Client,
    pub(crate) sim: Arc<SimConnector>,
    pub(crate) ctx: Arc<ControllerContext>,
    controllers: Option<Controllers>,
}

impl Cluster {
    pub(crate) async fn start() -> Cluster {
        Cluster::start_with(SimConnector::default()).await
    }

    pub(crate) async fn start_with(sim: SimConnector) -> Cluster {
        Cluster::start_inner(sim, false).await
    }

    /// A cluster whose operator also serves Monarch's `MonarchMesh`
    /// (`--serve-monarch-mesh`, its CRD installed).
    pub(crate) async fn start_serving_monarch_mesh() -> Cluster {
        Cluster::start_inner(SimConnector::default(), true).await
    }

    async fn start_inner(sim: SimConnector, serve_monarch_mesh: bool) -> Cluster {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("hostmesh_operator=info")
                }),
            )
            .try_init();
        let (server, client) = hostmesh_testkit::cluster::crd_server_with_namespace(NS).await;
        if serve_monarch_mesh {
            hostmesh_testkit::cluster::install_monarch_mesh_crd(&client).await;
        }
        let sim = Arc::new(sim);
        let args = OperatorArgs {
            serve_monarch_mesh,
            ..operator_args(NS, "test")
        };
        let controllers = Controllers::start(client.clone(), args, connector(&sim));
        Cluster {
            server: Some(server),
            client,
            sim,
            ctx: controllers.ctx.clone(),
            controllers: Some(controllers),
        }
    }

    /// Stops the operator and starts a fresh one (new hub, new caches)
    /// against the same API server and agents.
    pub(crate) async fn restart_operator(&mut self) {
        self.stop_operator().await;
        self.start_operator();
    }

    /// Stops the operator; nothing reconciles until `start_operator`.
    pub(crate) async fn stop_operator(&mut self) {
        if let Some(c) = self.controllers.take() {
            c.stop().await;
        }
    }

    /// Starts an operator with the arguments the last one had.
    pub(crate) fn start_operator(&mut self) {
        let args = self.ctx.args.clone();
        let controllers = Controllers::start(self.client.clone(), args, connector(&self.sim));
        self.ctx = controllers.ctx.clone();
        self.controllers = Some(controllers);
    }

    pub(crate) async fn shutdown(mut self) {
        if let Some(c) = self.controllers.take() {
            c.stop().await;
        }
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
    }

    pub(crate) fn api<K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>>(
        &self,
    ) -> Api<K>
    where
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), NS)
    }

    pub(crate) async fn apply_yaml(&self, yaml: &str) {
        let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        let name = v["metadata"]["name"].as_str().unwrap().to_string();
        let pp = PatchParams::apply("test").force();
        match v["kind"].as_str().unwrap() {
            "World" => {
                self.api::<World>()
                    .patch(&name, &pp, &Patch::Apply(&v))
                    .await
                    .unwrap();
            }
            "ProcMesh" => {
                self.api::<ProcMesh>()
                    .patch(&name, &pp, &Patch::Apply(&v))
                    .await
                    .unwrap();
            }
            k => panic!("unexpected kind {k}"),
        }
    }

    /// Plays the kubelet: pod `name` runs at `ip` and is Ready.
    pub(crate) async fn pod_ready(&self, name: &str, ip: &str) {
        let status = serde_json::json!({"status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
        }});
        self.api::<Pod>()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }
}

pub(crate) fn cond(
    conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    t: &str,
) -> Option<(String, String)> {
    conds
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| (c.status.clone(), c.message.clone()))
}

pub(crate) const WORLD: &str = "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {name: w, namespace: ctl}\n\
spec:\n  shape: [{name: host, size: 2}]\n  template:\n    metadata: {labels: {team: t}}\n    spec:\n      containers: [{name: host, image: busybox}]\n";

pub(crate) async fn running_world(c: &Cluster) {
    running_world_from(c, WORLD).await;
}

/// Applies World `w` from `yaml`, plays the kubelet for its two pods and
/// waits until it is Running.
pub(crate) async fn running_world_from(c: &Cluster, yaml: &str) {
    c.apply_yaml(yaml).await;
    let pods = c.api::<Pod>();
    eventually_async("two host pods", || async {
        let l = pods
            .list(&ListParams::default().labels("hostmesh.dev/world=w"))
            .await
            .ok()?;
        (l.items.len() == 2).then_some(())
    })
    .await;
    c.pod_ready("w-host-0", "127.0.9.1").await;
    c.pod_ready("w-host-1", "127.0.9.2").await;
    let worlds = c.api::<World>();
    eventually_async("World Running", || async {
        let s = worlds.get("w").await.ok()?.status?;
        (s.phase == Some(hostmesh_crds::world::WorldPhase::Running)).then_some(())
    })
    .await;
}
