//! Shared set-up for the EndpointSlice controller and cluster DNS tests: the
//! embedded API server with the controller-manager running, and pods created
//! as plain objects whose status (pod IP, Ready) the test writes through the
//! status subresource, as a kubelet would. No kubelet, no processes.

#![allow(dead_code, unreachable_pub)]

use hostmesh_devcluster::apiserver::ApiServerHandle;
use hostmesh_devcluster::controllers::{self, ControllersHandle};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

/// An API server and the controllers.
pub struct Env {
    pub api: ApiServerHandle,
    pub client: kube::Client,
    pub controllers: Option<ControllersHandle>,
}

impl Env {
    pub async fn start() -> Env {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "hostmesh_devcluster=info,hickory_server=warn".into()),
            )
            .with_test_writer()
            .try_init();
        let (api, client) = hostmesh_testkit::cluster::api_server().await;
        let controllers = Some(controllers::start(client.clone()));
        Env {
            api,
            client,
            controllers,
        }
    }

    /// Creates the object `yaml` describes (in `default` unless it says).
    pub async fn create<K>(&self, yaml: &str) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        let obj: K = serde_saphyr::from_str(yaml).expect("test yaml");
        let ns = obj
            .meta()
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        Api::<K>::namespaced(self.client.clone(), &ns)
            .create(&PostParams::default(), &obj)
            .await
            .expect("create")
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    /// Creates pod `name` in `default` with labels `app: <app>`, hostname
    /// and subdomain when `subdomain` is given, a container port `rpc`
    /// 26600, then reports `ip` and Ready as its status.
    pub async fn pod(&self, name: &str, app: &str, subdomain: Option<&str>, ip: &str) -> Pod {
        let host = subdomain
            .map(|s| format!("\n  hostname: {name}\n  subdomain: {s}"))
            .unwrap_or_default();
        self.create::<Pod>(&format!(
            "metadata: {{name: {name}, labels: {{app: {app}}}}}
spec:{host}
  containers:
  - name: main
    image: busybox
    ports: [{{name: rpc, containerPort: 26600}}]
"
        ))
        .await;
        self.set_status(name, ip, true).await
    }

    /// Writes the pod's status as a kubelet would: Running, `ip`, Ready.
    pub async fn set_status(&self, name: &str, ip: &str, ready: bool) -> Pod {
        let ready = if ready { "True" } else { "False" };
        self.pods()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "phase": "Running",
                    "podIP": ip,
                    "podIPs": [{"ip": ip}],
                    "conditions": [{"type": "Ready", "status": ready}],
                }})),
            )
            .await
            .expect("patch pod status")
    }
}
