//! The cluster in a box as one value: the embedded API server, the process
//! kubelet, the Deployment/ReplicaSet controllers and the operator, started in this process in that order and
//! stopped in the reverse order. `hostmesh up` is built on it.
//!
//! Invariants:
//! 1. The CRDs are installed and Established before the operator starts
//!    (Monarch's MonarchMesh CRD too when it is served).
//! 2. [`DevEnv::shutdown`] deletes every MonarchMesh and World first (so procs stop through
//!    the agents, gracefully), then stops the operator, then the workload
//!    controllers, then the kubelet
//!    (which ends every process it started), then the API server.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hostmesh_devcluster::apiserver::{ApiServer, ApiServerConfig, ApiServerHandle};
use hostmesh_devcluster::controllers::ControllersHandle;
use hostmesh_devcluster::kubelet::{Kubelet, KubeletConfig, KubeletHandle, PodNetwork};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::warn;

/// Why the cluster in a box could not start.
#[derive(Debug, thiserror::Error)]
pub enum DevEnvError {
    /// The API server did not start.
    #[error("API server: {0}")]
    ApiServer(#[from] hostmesh_devcluster::apiserver::ApiServerError),
    /// The kubelet did not start.
    #[error("kubelet: {0}")]
    Kubelet(#[from] hostmesh_devcluster::kubelet::KubeletError),
    /// Installing the CRDs failed.
    #[error("installing CRDs: {0}")]
    Crds(String),
    /// A Kubernetes call failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// A running cluster in a box.
pub struct DevEnv {
    apiserver: ApiServerHandle,
    kubelet: KubeletHandle,
    workloads: ControllersHandle,
    client: kube::Client,
    kubeconfig: PathBuf,
    operator_stop: oneshot::Sender<()>,
    operator: JoinHandle<()>,
}

impl DevEnv {
    /// Starts everything with its files under `data_dir`; the hostmesh agent
    /// image maps to `hostmesh_binary` (the `hostmesh` executable).
    pub async fn start(data_dir: &Path, hostmesh_binary: PathBuf) -> Result<DevEnv, DevEnvError> {
        Self::start_with(data_dir, hostmesh_binary, PodNetwork::Sandbox, false).await
    }

    /// Like [`DevEnv::start`], with pods networked as `pod_network` says,
    /// and Monarch's MonarchMesh served when `serve_monarch_mesh`.
    pub async fn start_with(
        data_dir: &Path,
        hostmesh_binary: PathBuf,
        pod_network: PodNetwork,
        serve_monarch_mesh: bool,
    ) -> Result<DevEnv, DevEnvError> {
        let kubeconfig = data_dir.join("kubeconfig");
        let config = ApiServerConfig {
            kubeconfig: Some(kubeconfig.clone()),
            data_dir: None,
            ..ApiServerConfig::default()
        };
        let apiserver = ApiServer::start(config).await?;
        let client = apiserver.client()?;
        let mut args = default_operator_args();
        args.serve_monarch_mesh |= serve_monarch_mesh;
        install_crds(&client, args.serve_monarch_mesh).await?;
        let mut kconfig =
            KubeletConfig::new("hostmesh-dev", data_dir.join("kubelet")).for_api_server(&apiserver);
        kconfig.hostmesh_binary = Some(hostmesh_binary);
        if pod_network == PodNetwork::Host {
            kconfig = kconfig.host_network(0);
        } else {
            kconfig.cluster_dns = hostmesh_devcluster::kubelet::cluster_dns(&client);
        }
        let kubelet = Kubelet::start(client.clone(), kconfig).await?;
        let workloads = hostmesh_devcluster::controllers::start(client.clone());
        let (operator_stop, stop_rx) = oneshot::channel();
        let ctx = hostmesh_operator::ControllerContext::new(
            client.clone(),
            args,
            hostmesh_operator::hub::default_connector(),
        );
        let operator = tokio::spawn(async move {
            let stop = async move {
                let _ = stop_rx.await;
            };
            if let Err(e) = hostmesh_operator::controllers::run(ctx, stop).await {
                warn!(error = %e, "operator stopped with an error");
            }
        });
        Ok(DevEnv {
            apiserver,
            kubelet,
            workloads,
            client,
            kubeconfig,
            operator_stop,
            operator,
        })
    }

    /// A client for the embedded API server.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The kubeconfig file for kubectl.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The kubelet's pod range and why it is that one (sandbox network).
    pub fn pod_range(&self) -> Option<&hostmesh_devcluster::kubelet::PodRange> {
        self.kubelet.pod_range()
    }

    /// The kubelet's pod bridge (sandbox network), for clean-up after a
    /// kill.
    pub fn pod_bridge(&self) -> Option<hostmesh_devcluster::kubelet::PodBridge> {
        self.kubelet.pod_bridge()
    }

    /// Stops everything (invariant 2).
    pub async fn shutdown(self) {
        delete_monarch_meshes(&self.client).await;
        delete_worlds(&self.client).await;
        let _ = self.operator_stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.operator).await;
        self.workloads.shutdown().await;
        if let Err(e) = self.kubelet.shutdown().await {
            warn!(error = %e, "kubelet shutdown");
        }
        self.apiserver.shutdown().await;
    }
}

/// Applies both CRDs (and the MonarchMesh CRD when `monarch_mesh`) and
/// waits until they are Established.
pub async fn install_crds(client: &kube::Client, monarch_mesh: bool) -> Result<(), DevEnvError> {
    let yaml = hostmesh_crds::crd_yaml().map_err(|e| DevEnvError::Crds(e.to_string()))?;
    let mut crds: Vec<CustomResourceDefinition> =
        serde_saphyr::from_multiple(&yaml).map_err(|e| DevEnvError::Crds(e.to_string()))?;
    if monarch_mesh {
        crds.push(hostmesh_crds::monarchmesh::crd());
    }
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(hostmesh_operator::FIELD_MANAGER).force();
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(crd)).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        loop {
            let c = api.get(&name).await?;
            let established = c
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if Instant::now() > deadline {
                return Err(DevEnvError::Crds(format!("{name} is not Established")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// Deletes every MonarchMesh (when the kind is served), so that the
/// MonarchMesh controller does not make their Worlds again while
/// [`delete_worlds`] waits for them to go.
async fn delete_monarch_meshes(client: &kube::Client) {
    use hostmesh_crds::monarchmesh::MonarchMesh;
    let api: Api<MonarchMesh> = Api::all(client.clone());
    let Ok(list) = api.list(&ListParams::default()).await else {
        return;
    };
    for m in &list.items {
        let (Some(ns), Some(name)) = (&m.metadata.namespace, &m.metadata.name) else {
            continue;
        };
        let api: Api<MonarchMesh> = Api::namespaced(client.clone(), ns);
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

/// Deletes every World and waits (bounded) until they are gone.
async fn delete_worlds(client: &kube::Client) {
    let api: Api<hostmesh_crds::World> = Api::all(client.clone());
    let Ok(list) = api.list(&ListParams::default()).await else {
        return;
    };
    for w in &list.items {
        let (Some(ns), Some(name)) = (&w.metadata.namespace, &w.metadata.name) else {
            continue;
        };
        let api: Api<hostmesh_crds::World> = Api::namespaced(client.clone(), ns);
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match api.list(&ListParams::default()).await {
            Ok(l) if l.items.is_empty() => return,
            Err(_) => return,
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    warn!("Worlds still present after 30s; stopping anyway");
}

/// The operator's arguments with every default (and environment) applied.
fn default_operator_args() -> hostmesh_operator::OperatorArgs {
    #[derive(clap::Parser)]
    struct Defaults {
        #[command(flatten)]
        args: hostmesh_operator::OperatorArgs,
    }
    <Defaults as clap::Parser>::parse_from(["hostmesh-up"]).args
}
