//! Starting and stopping the kubelet: [`Kubelet::start`] registers the Node
//! and spawns the node and pod loops; [`KubeletHandle`] stops them, reads
//! container logs, and (when dropped without `shutdown`) kills every process
//! the kubelet started.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::config::{KubeletArgs, KubeletConfig};
use super::error::{KubeletError, Result};
use super::ipam::IpPool;
use super::node;
use super::pods;
use super::process;
use super::shared::{Shared, lock};

/// The process kubelet.
#[derive(Debug)]
pub struct Kubelet;

impl Kubelet {
    /// Registers the Node (Ready) and starts running the pods bound to it.
    /// Leftovers of an earlier run in `data_dir/pods` are removed.
    pub async fn start(client: kube::Client, config: KubeletConfig) -> Result<KubeletHandle> {
        let images = config.validate()?;
        let pods_dir = config.data_dir.join("pods");
        if pods_dir.exists() {
            std::fs::remove_dir_all(&pods_dir)
                .map_err(|e| KubeletError::io("cannot clear", &pods_dir, e))?;
        }
        std::fs::create_dir_all(&pods_dir)
            .map_err(|e| KubeletError::io("cannot create", &pods_dir, e))?;
        let groups = Arc::new(Mutex::new(BTreeSet::new()));
        let shared = Arc::new(Shared {
            client,
            ips: Mutex::new(IpPool::new(config.pod_ip_block)),
            config,
            images,
            groups: groups.clone(),
            pods: Mutex::new(Default::default()),
            shutdown: CancellationToken::new(),
        });
        node::register(&shared).await?;
        node::renew_lease(&shared)
            .await
            .unwrap_or_else(|e| tracing::warn!(error = %e, "first lease renewal failed"));
        let heartbeat = tokio::spawn(node::heartbeat(shared.clone()));
        let pod_loop = tokio::spawn(pods::run(shared.clone()));
        tracing::info!(node = %shared.config.node_name, "process kubelet started");
        Ok(KubeletHandle {
            shared,
            groups,
            tasks: Some((heartbeat, pod_loop)),
        })
    }
}

/// A running kubelet.
pub struct KubeletHandle {
    shared: Arc<Shared>,
    groups: Arc<Mutex<BTreeSet<i32>>>,
    tasks: Option<(JoinHandle<()>, JoinHandle<()>)>,
}

impl std::fmt::Debug for KubeletHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletHandle")
            .field("node", &self.shared.config.node_name)
            .finish_non_exhaustive()
    }
}

impl KubeletHandle {
    /// The Node's name.
    pub fn node_name(&self) -> &str {
        &self.shared.config.node_name
    }

    /// The Node's IP (the pods' `hostIP`).
    pub fn node_ip(&self) -> Ipv4Addr {
        self.shared.config.node_ip
    }

    /// The last `tail_lines` lines (all with `None`) of a container's output
    /// (stdout and stderr, across restarts).
    pub fn logs(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        tail_lines: Option<usize>,
    ) -> Result<String> {
        let entry = lock(&self.shared.pods)
            .get(&(namespace.to_string(), pod.to_string()))
            .cloned()
            .ok_or_else(|| {
                KubeletError::NotFound(format!("pod {namespace}/{pod} is not on this node"))
            })?;
        if container.is_empty() || container.contains('/') {
            return Err(KubeletError::NotFound(format!(
                "container {container:?} of pod {namespace}/{pod}"
            )));
        }
        let path = entry.dir.join("logs").join(format!("{container}.log"));
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(KubeletError::NotFound(format!(
                    "container {container:?} of pod {namespace}/{pod} has not started"
                )));
            }
            Err(e) => return Err(KubeletError::io("cannot read log", path, e)),
        };
        let text = String::from_utf8_lossy(&bytes).into_owned();
        Ok(match tail_lines {
            None => text,
            Some(n) => tail(&text, n),
        })
    }

    /// Stops every pod's processes (SIGTERM, grace, SIGKILL), marks the Node
    /// not ready and waits until everything is gone.
    pub async fn shutdown(mut self) -> Result<()> {
        self.shared.shutdown.cancel();
        if let Some((heartbeat, pod_loop)) = self.tasks.take() {
            let _ = pod_loop.await;
            let _ = heartbeat.await;
        }
        kill_all(&self.groups);
        if let Err(e) = node::post_stopped(&self.shared).await {
            tracing::warn!(error = %e, "cannot mark the node stopped");
        }
        tracing::info!(node = %self.shared.config.node_name, "process kubelet stopped");
        Ok(())
    }
}

fn kill_all(groups: &Mutex<BTreeSet<i32>>) {
    let mut groups = lock(groups);
    for pgid in groups.iter() {
        process::signal_group(*pgid, libc::SIGKILL);
    }
    groups.clear();
}

impl Drop for KubeletHandle {
    fn drop(&mut self) {
        if self.tasks.is_some() {
            self.shared.shutdown.cancel();
            kill_all(&self.groups);
        }
    }
}

/// The last `n` lines of `text`.
pub(crate) fn tail(text: &str, n: usize) -> String {
    if n == 0 {
        return String::new();
    }
    let trimmed = text.strip_suffix('\n').unwrap_or(text);
    let start = trimmed
        .rmatch_indices('\n')
        .nth(n - 1)
        .map(|(i, _)| i + 1)
        .unwrap_or(0);
    text[start..].to_string()
}

/// `hostmesh kubelet`: runs the kubelet described by `args` until Ctrl-C or
/// SIGTERM, then stops every pod's processes.
pub async fn run(args: KubeletArgs) -> Result<()> {
    let config = args.to_config()?;
    let client = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                KubeletError::Kubeconfig {
                    path: Some(path.clone()),
                    message: e.to_string(),
                }
            })?;
            let cfg = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| KubeletError::Kubeconfig {
                    path: Some(path.clone()),
                    message: e.to_string(),
                })?;
            kube::Client::try_from(cfg)
        }
        None => {
            let cfg = kube::Config::infer()
                .await
                .map_err(|e| KubeletError::Kubeconfig {
                    path: None,
                    message: e.to_string(),
                })?;
            kube::Client::try_from(cfg)
        }
    }
    .map_err(|e| KubeletError::api("build client", e))?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| KubeletError::io("cannot watch SIGTERM", "signal", e))?;
    let handle = Kubelet::start(client, config).await?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("Ctrl-C: stopping"),
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
    }
    handle.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::tail;

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(tail("a\nb\nc", 2), "b\nc");
        assert_eq!(tail("a\nb\n", 5), "a\nb\n");
        assert_eq!(tail("a\n", 0), "");
    }
}
