//! Shared set-up for the kubelet tests: a real embedded API server and a
//! process kubelet in this process, talking over loopback, plus helpers to
//! create pods and wait for their status (polling, bounded).

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use hostmesh_devcluster::apiserver::ApiServerHandle;
use hostmesh_devcluster::kubelet::{Ipv4Net, Kubelet, KubeletConfig, KubeletHandle};
use hostmesh_testkit::process::gone;
use hostmesh_testkit::{eventually_async, eventually_ok};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::Api;
use kube::api::PostParams;

/// An API server and a kubelet.
pub struct Cluster {
    pub api: Option<ApiServerHandle>,
    pub client: kube::Client,
    pub kubelet: Option<KubeletHandle>,
    pub dir: tempfile::TempDir,
    pub node: String,
    pub block: u8,
    pub config: KubeletConfig,
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "hostmesh_devcluster::kubelet=info".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A kubelet configuration for tests: fast restart back-off, sandboxed pods
/// (the kubelet claims a /24 of the default pod range), the API server's
/// token for the log endpoint.
pub fn test_config(dir: &std::path::Path, node: &str) -> KubeletConfig {
    let mut config = KubeletConfig::new(node, dir.join("kubelet"));
    config.restart_backoff = Duration::from_millis(200);
    config.max_restart_backoff = Duration::from_secs(1);
    config.shutdown_grace = Duration::from_secs(5);
    config.hostmesh_binary = Some("/bin/true".into());
    config
}

impl Cluster {
    /// Starts an API server and a kubelet with [`test_config`].
    pub async fn start(block: u8) -> Cluster {
        Self::start_with(block, |_| {}).await
    }

    /// Like [`Cluster::start`], with `tweak` applied to the configuration.
    pub async fn start_with(block: u8, tweak: impl FnOnce(&mut KubeletConfig)) -> Cluster {
        Self::start_with_client(block, |cfg, _| tweak(cfg)).await
    }

    /// Like [`Cluster::start_with`]; `tweak` also gets the API client.
    pub async fn start_with_client(
        block: u8,
        tweak: impl FnOnce(&mut KubeletConfig, &kube::Client),
    ) -> Cluster {
        init_tracing();
        let dir = tempfile::tempdir().expect("tempdir");
        let (api, client) = hostmesh_testkit::cluster::api_server().await;
        let node = format!("node-{block}");
        let mut config = test_config(dir.path(), &node).for_api_server(&api);
        tweak(&mut config, &client);
        let kubelet = Kubelet::start(client.clone(), config.clone())
            .await
            .expect("kubelet starts");
        Cluster {
            api: Some(api),
            client,
            kubelet: Some(kubelet),
            dir,
            node,
            block,
            config,
        }
    }

    /// Stops the kubelet and starts a new one with the same configuration.
    pub async fn restart_kubelet(&mut self) {
        if let Some(k) = self.kubelet.take() {
            k.shutdown().await.expect("kubelet shutdown");
        }
        let k = Kubelet::start(self.client.clone(), self.config.clone())
            .await
            .expect("kubelet restarts");
        self.kubelet = Some(k);
    }

    /// The Node's `spec.podCIDR` (the kubelet's /24).
    pub async fn pod_cidr(&self) -> Ipv4Net {
        let node = Api::<k8s_openapi::api::core::v1::Node>::all(self.client.clone())
            .get(&self.node)
            .await
            .expect("get node");
        node.spec
            .and_then(|s| s.pod_cidr)
            .expect("the node has a podCIDR")
            .parse()
            .expect("podCIDR parses")
    }

    pub fn kubelet(&self) -> &KubeletHandle {
        self.kubelet.as_ref().expect("kubelet running")
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    /// Creates a pod in `default` from YAML.
    pub async fn create_pod(&self, yaml: &str) -> Pod {
        let pod: Pod = serde_saphyr::from_str(yaml).expect("pod YAML");
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .expect("create pod")
    }

    /// Creates any namespaced object in `default` from YAML.
    pub async fn create<K>(&self, yaml: &str) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
        <K as kube::Resource>::DynamicType: Default,
    {
        let obj: K = serde_saphyr::from_str(yaml).expect("object YAML");
        Api::<K>::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &obj)
            .await
            .expect("create object")
    }

    /// Polls pod `name` until `pred` holds; panics after
    /// [`hostmesh_testkit::PATIENCE`] with the last status seen.
    pub async fn wait_pod(&self, name: &str, what: &str, pred: impl Fn(&Pod) -> bool) -> Pod {
        let pods = self.pods();
        let mut last = None;
        eventually_ok(&format!("pod {name}: {what}"), async || {
            if let Ok(Some(p)) = pods.get_opt(name).await {
                if pred(&p) {
                    return Ok(p);
                }
                last = p.status;
            }
            Err(last.clone())
        })
        .await
    }

    /// Polls until pod `name` no longer exists.
    pub async fn wait_pod_gone(&self, name: &str) {
        let pods = self.pods();
        eventually_async(&format!("pod {name} to be deleted"), async || {
            matches!(pods.get_opt(name).await, Ok(None)).then_some(())
        })
        .await;
    }

    /// Stops the kubelet, then the API server.
    pub async fn stop(mut self) {
        if let Some(k) = self.kubelet.take() {
            k.shutdown().await.expect("kubelet shutdown");
        }
        if let Some(a) = self.api.take() {
            a.shutdown().await;
        }
    }
}

pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

pub fn condition(p: &Pod, type_: &str) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

pub fn container<'a>(p: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    let s = p.status.as_ref()?;
    s.container_statuses
        .iter()
        .flatten()
        .chain(s.init_container_statuses.iter().flatten())
        .find(|c| c.name == name)
}

/// The pid of a running container, from its `process://<pid>` id.
pub fn container_pid(p: &Pod, name: &str) -> Option<u32> {
    let c = container(p, name)?;
    c.state.as_ref()?.running.as_ref()?;
    c.container_id
        .as_deref()?
        .strip_prefix("process://")?
        .parse()
        .ok()
}

/// Polls until every pid in `pids` is gone; panics with the ones alive.
pub async fn wait_pids_gone(pids: &[u32]) {
    eventually_ok("the processes to be gone", async || {
        let alive: Vec<u32> = pids.iter().copied().filter(|p| !gone(*p)).collect();
        if alive.is_empty() { Ok(()) } else { Err(alive) }
    })
    .await;
}

/// Polls until `path` holds a pid (written by a container).
pub async fn read_pid_file(path: &std::path::Path) -> u32 {
    eventually_async(&format!("a pid in {}", path.display()), async || {
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    })
    .await
}

/// The real python3 executable (not a shim), for containers that serve HTTP.
pub fn python() -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("these tests need python3 on PATH");
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_string()
}

impl Cluster {
    /// Stops only the kubelet, keeping the API server until the end of the
    /// call so the Node's final status can be read; then stops the server.
    pub async fn stop_kubelet_only(mut self) -> ApiServerHandle {
        if let Some(k) = self.kubelet.take() {
            k.shutdown().await.expect("kubelet shutdown");
        }
        self.api.take().expect("API server running")
    }
}

/// Runs `test` on a thread of its own in a new network namespace (only
/// `lo`, up) under a tokio runtime whose threads are all made there (a
/// thread keeps the namespace of the thread that made it). The kubelet
/// reads the routes of the namespace it runs in and makes its bridge
/// there, so links the test adds ([`add_link`]) are seen by that kubelet
/// and by nothing else on the machine; they go with the namespace when the
/// test's threads and processes are gone. Needs root (CAP_SYS_ADMIN).
pub fn in_own_netns<F, Fut>(test: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let thread = std::thread::Builder::new()
        .name("own-netns".into())
        .spawn(move || {
            // SAFETY: unshare(2) moves only this thread, which this
            // function made for the purpose, into a new namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                panic!(
                    "cannot make a network namespace (these tests run as root): {}",
                    std::io::Error::last_os_error()
                );
            }
            ip(&["link", "set", "lo", "up"]);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a tokio runtime");
            runtime.block_on(test());
        })
        .expect("spawn the test's thread");
    if let Err(panic) = thread.join() {
        std::panic::resume_unwind(panic);
    }
}

/// Adds link `name` with address `addr` (`10.244.0.1/24`: its /24 becomes
/// a route), up, in the calling thread's network namespace. A bridge, as
/// every kernel that runs sandboxes has them (a dummy link needs a driver
/// some kernels lack).
pub fn add_link(name: &str, addr: &str) {
    ip(&["link", "add", name, "type", "bridge"]);
    ip(&["addr", "add", addr, "dev", name]);
    ip(&["link", "set", name, "up"]);
}

/// Runs iproute2's `ip` with `args` (in the calling thread's network
/// namespace); panics when it fails.
pub fn ip(args: &[&str]) {
    let status = std::process::Command::new("ip")
        .args(args)
        .status()
        .expect("these tests need iproute2's ip");
    assert!(status.success(), "ip {args:?}: {status}");
}
