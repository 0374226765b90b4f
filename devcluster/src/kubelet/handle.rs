//! Starting and stopping the kubelet: [`Kubelet::start`] registers the Node
//! and spawns the node and pod loops; [`KubeletHandle`] stops them, reads
//! container logs, and (when dropped without `shutdown`) kills every process
//! the kubelet started and deletes the pod bridge.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::config::{KubeletArgs, KubeletConfig};
use super::error::{KubeletError, Result};
use super::ipam::IpPool;
use super::logs;
use super::net::{NodeNetwork, PodNetwork, PodRange};
use super::node;
use super::pods;
use super::process;
use super::shared::{Shared, lock};

/// The process kubelet.
#[derive(Debug)]
pub struct Kubelet;

impl Kubelet {
    /// Registers the Node (Ready) and starts running the pods bound to it.
    /// `data_dir` and `data_dir/pods` are made private (0700, refused when
    /// another user owns them); leftovers of an earlier run in
    /// `data_dir/pods` (a kubelet killed with SIGKILL) are removed.
    pub async fn start(client: kube::Client, config: KubeletConfig) -> Result<KubeletHandle> {
        let images = config.validate()?;
        let lock_file = lock_data_dir(&config.data_dir)?;
        let pods_dir = config.data_dir.join("pods");
        crate::private_dir::remove(&pods_dir)
            .map_err(|e| KubeletError::io("cannot clear", &pods_dir, e))?;
        private(&pods_dir)?;
        let groups = Arc::new(Mutex::new(BTreeSet::new()));
        let (network, ips) = match config.pod_network {
            PodNetwork::Sandbox => {
                let net =
                    NodeNetwork::start(config.pod_ip_range, config.ip_claims_dir.clone()).await?;
                // The /24 is the node's alone: no per-address claims.
                let ips = IpPool::new(net.subnet, &[net.gateway], None);
                (Some(net), ips)
            }
            PodNetwork::Host => (
                None,
                IpPool::new(
                    config
                        .pod_ip_range
                        .unwrap_or_else(super::config::default_host_pod_range),
                    &[Ipv4Addr::LOCALHOST],
                    config.ip_claims_dir.clone(),
                ),
            ),
        };
        let devices = Mutex::new(super::devices::Devices::new(config.gpu_capacity));
        let agent_copy = images
            .lookup(super::HOSTMESH_IMAGE_PATTERN.trim_end_matches('*'))
            .and_then(|e| super::agent_copy::AgentCopy::make(&config.data_dir, &e.program));
        let shared = Arc::new(Shared {
            agent_copy,
            devices,
            device_changes: tokio::sync::watch::Sender::new(0),
            client,
            ips: Mutex::new(ips),
            network,
            api_service: tokio::sync::Mutex::new(None),
            config,
            images,
            groups: groups.clone(),
            pods: Mutex::new(Default::default()),
            shutdown: CancellationToken::new(),
            log_port: Mutex::new(0),
            stream_limits: Default::default(),
            log_cuts: Default::default(),
            started_at: k8s_openapi::jiff::Timestamp::now(),
        });
        let listener = match bind_and_register(&shared).await {
            Ok(l) => l,
            Err(e) => {
                if let Some(net) = &shared.network {
                    net.stop().await;
                }
                return Err(e);
            }
        };
        let log_port = *lock(&shared.log_port);
        let log_port = listener.as_ref().map(|_| log_port);
        if let Some(listener) = listener {
            tokio::spawn(logs::serve(shared.clone(), listener));
        }
        node::renew_lease(&shared)
            .await
            .unwrap_or_else(|e| tracing::warn!(error = %e, "first lease renewal failed"));
        let heartbeat = tokio::spawn(node::heartbeat(shared.clone()));
        let pod_loop = tokio::spawn(pods::run(shared.clone()));
        tokio::spawn(super::logrotate::run(shared.clone()));
        tokio::spawn(super::devices::watch_health_file(shared.clone()));
        tracing::info!(node = %shared.config.node_name, "process kubelet started");
        Ok(KubeletHandle {
            shared,
            groups,
            log_port,
            _lock_file: lock_file,
            tasks: Some((heartbeat, pod_loop)),
        })
    }
}

/// A running kubelet.
pub struct KubeletHandle {
    shared: Arc<Shared>,
    groups: Arc<Mutex<BTreeSet<i32>>>,
    log_port: Option<u16>,
    _lock_file: std::fs::File,
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

    /// The last `tail_lines` lines (all with `None`) of a container's
    /// output (stdout and stderr) in its current run.
    pub fn logs(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        tail_lines: Option<usize>,
    ) -> Result<String> {
        logs::read_log(&self.shared, namespace, pod, container, false, tail_lines)
            .map(|(_, text)| text)
    }

    /// Like [`KubeletHandle::logs`], for the run before the last restart.
    pub fn previous_logs(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        tail_lines: Option<usize>,
    ) -> Result<String> {
        logs::read_log(&self.shared, namespace, pod, container, true, tail_lines)
            .map(|(_, text)| text)
    }

    /// The node's pod bridge and the file that claims its /24 (sandbox
    /// network with a claims directory), for [`delete_dead_bridge`] after
    /// this process is killed.
    pub fn pod_bridge(&self) -> Option<PodBridge> {
        let net = self.shared.network.as_ref()?;
        Some(PodBridge {
            name: net.bridge.clone(),
            claim: net.claim_path.clone()?,
        })
    }

    /// The pod range of the sandbox network and why it is that one (given,
    /// or picked because nothing on the machine overlaps it; its `Display`
    /// says so in a sentence); `None` with `--pod-network=host`.
    pub fn pod_range(&self) -> Option<&PodRange> {
        self.shared.network.as_ref().map(|net| &net.pod_range)
    }

    /// The port of the log endpoint the API server's `pods/log` proxy uses,
    /// when a log token is configured.
    pub fn log_port(&self) -> Option<u16> {
        self.log_port
    }

    /// Stops every pod's processes (SIGTERM, grace, SIGKILL), removes every
    /// pod directory (volumes, tokens, logs), marks the Node not ready and
    /// waits until everything is gone.
    pub async fn shutdown(mut self) -> Result<()> {
        self.shared.shutdown.cancel();
        if let Some((heartbeat, pod_loop)) = self.tasks.take() {
            let _ = pod_loop.await;
            let _ = heartbeat.await;
        }
        kill_all(&self.groups);
        remove_pod_dirs(&self.shared);
        if let Some(net) = &self.shared.network {
            net.stop().await;
        }
        // Best effort, bounded: the API server may already be gone.
        match tokio::time::timeout(
            std::time::Duration::from_secs(5),
            node::post_stopped(&self.shared),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot mark the node stopped"),
            Err(_) => tracing::warn!("marking the node stopped timed out"),
        }
        tracing::info!(node = %self.shared.config.node_name, "process kubelet stopped");
        Ok(())
    }
}

/// A kubelet's pod bridge, as another process may clean it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodBridge {
    /// The bridge's name (`hmbr<a.b.c>`).
    pub name: String,
    /// The file whose lock claims the bridge's /24.
    pub claim: std::path::PathBuf,
}

/// Deletes the bridge of a kubelet that was killed (SIGKILL leaves no
/// chance to), once no kubelet holds its /24's claim; true when deleted.
/// A kubelet that took the /24 since keeps its bridge.
pub async fn delete_dead_bridge(bridge: &PodBridge) -> Result<bool> {
    super::net::delete_unclaimed(&bridge.name, &bridge.claim).await
}

/// Binds the log endpoint (publishing its port) and registers the Node.
async fn bind_and_register(shared: &Shared) -> Result<Option<tokio::net::TcpListener>> {
    let listener = logs::bind(shared).await?;
    let log_port = match &listener {
        Some(l) => Some(
            l.local_addr()
                .map_err(|e| KubeletError::io("cannot read the log endpoint address", "socket", e))?
                .port(),
        ),
        None => None,
    };
    *lock(&shared.log_port) = log_port.unwrap_or(0);
    register_with_retries(shared).await?;
    Ok(listener)
}

/// The embedded cluster DNS server, fed from the API server of `client`,
/// for sandboxed pods' `10.96.0.10` (`None`, with a warning, when it
/// cannot start: pods then have no resolver).
pub fn cluster_dns(client: &kube::Client) -> Option<Arc<dyn super::net::ClusterDns>> {
    match crate::dns::ClusterDns::start(client, crate::dns::DnsConfig::default()) {
        Ok(dns) => Some(Arc::new(dns)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the cluster DNS; pods get no resolver");
            None
        }
    }
}

/// Registers the Node, retrying for about half a minute while the API server
/// cannot be reached (it may still be starting); an answer from the server
/// that refuses the Node is final.
async fn register_with_retries(shared: &Shared) -> Result<()> {
    let mut delay = std::time::Duration::from_millis(200);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match node::register(shared).await {
            Ok(()) => return Ok(()),
            Err(
                e @ KubeletError::Api {
                    source: kube::Error::Api(_),
                    ..
                },
            ) => return Err(e),
            Err(e) if tokio::time::Instant::now() + delay < deadline => {
                tracing::warn!(error = %e, "cannot register the node yet; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(3));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Takes an exclusive lock on `data_dir/kubelet.lock` for the kubelet's
/// lifetime, so two kubelets never share (and clear) one data directory.
fn lock_data_dir(dir: &std::path::Path) -> Result<std::fs::File> {
    private(dir)?;
    let path = dir.join("kubelet.lock");
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| KubeletError::io("cannot open", &path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(KubeletError::Config(format!(
            "data directory {} is used by another kubelet; give each kubelet its own --data-dir",
            dir.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(KubeletError::io("cannot lock", &path, e)),
    }
}

/// Makes `dir` private (0700, ours), as a kubelet error.
pub(crate) fn private(dir: &std::path::Path) -> Result<()> {
    crate::private_dir::ensure(dir).map_err(|e| match e {
        crate::private_dir::PrivateDirError::Io {
            action,
            path,
            source,
        } => KubeletError::Io {
            action,
            path,
            source,
        },
        e @ crate::private_dir::PrivateDirError::NotOurs { .. } => {
            KubeletError::Config(e.to_string())
        }
    })
}

/// Removes `data_dir/pods` (every pod's volumes, tokens and logs) once the
/// pods' processes are gone.
fn remove_pod_dirs(shared: &Shared) {
    let dir = shared.config.data_dir.join("pods");
    if let Err(e) = crate::private_dir::remove(&dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot remove the pod directories");
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
            remove_pod_dirs(&self.shared);
            // The bridge outlives the process otherwise; the pods' sandboxes
            // go with their descriptors. A thread of its own: this may run
            // inside (or outside) a runtime.
            if let Some(net) = &self.shared.network {
                std::thread::scope(|s| {
                    s.spawn(|| {
                        match tokio::runtime::Builder::new_current_thread()
                            .enable_io()
                            .build()
                        {
                            Ok(rt) => rt.block_on(net.stop()),
                            Err(e) => tracing::warn!(error = %e, "cannot delete the pod bridge"),
                        }
                    });
                });
            }
        }
    }
}

/// `hostmesh kubelet`: runs the kubelet described by `args` until Ctrl-C or
/// SIGTERM, then stops every pod's processes.
pub async fn run(args: KubeletArgs) -> Result<()> {
    let mut config = args.to_config()?;
    if args.data_dir.is_none()
        && let Some(root) = config.data_dir.parent()
    {
        // The default lives in the shared temp directory: its root must be
        // ours too, or its owner could swap our directory for another.
        private(root)?;
    }
    let kube_config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                KubeletError::Kubeconfig {
                    path: Some(path.clone()),
                    message: e.to_string(),
                }
            })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| KubeletError::Kubeconfig {
                    path: Some(path.clone()),
                    message: e.to_string(),
                })?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| KubeletError::Kubeconfig {
                path: None,
                message: e.to_string(),
            })?,
    };
    // The API server proxies `pods/log` with its own bearer token; the
    // embedded one uses the token it issued to us.
    if config.log_token.is_none() {
        config.log_token = serde_json::to_value(&kube_config.auth_info)
            .ok()
            .and_then(|v| v.get("token").and_then(|t| t.as_str()).map(str::to_string));
    }
    if config.kubernetes_service.is_none() {
        let url = &kube_config.cluster_url;
        if let Some(host) = url.host() {
            let port = url
                .port_u16()
                .unwrap_or(if url.scheme_str() == Some("http") {
                    80
                } else {
                    443
                });
            config.kubernetes_service = Some((host.trim_matches(['[', ']']).to_string(), port));
        }
    }
    if args.node_ip.is_none()
        && let Some((host, port)) = &config.kubernetes_service
        && let Some(ip) = local_ip_towards(host, *port).await
    {
        config.node_ip = ip;
    }
    config.advertise_hostname = hostname_reaches(&config.node_name, config.node_ip).await;
    let client =
        hostmesh_net::kube_client(kube_config).map_err(|e| KubeletError::api("build client", e))?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| KubeletError::io("cannot watch SIGTERM", "signal", e))?;
    if config.pod_network == PodNetwork::Sandbox && config.cluster_dns.is_none() {
        config.cluster_dns = cluster_dns(&client);
    }
    let handle = Kubelet::start(client, config).await?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("Ctrl-C: stopping"),
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
    }
    handle.shutdown().await
}

/// The address this machine uses to reach `host:port` (the API server), when
/// that is not loopback: where the API server can reach this kubelet. No
/// packet is sent (a UDP socket is only connected).
async fn local_ip_towards(host: &str, port: u16) -> Option<Ipv4Addr> {
    let target = hostmesh_net::lookup_host(&format!("{host}:{port}"))
        .await
        .ok()?
        .into_iter()
        .find(|a| a.is_ipv4())?;
    if target.ip().is_loopback() {
        return None;
    }
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect(target).ok()?;
    match socket.local_addr().ok()?.ip() {
        std::net::IpAddr::V4(ip) if !ip.is_unspecified() => Some(ip),
        _ => None,
    }
}

/// Whether the node name resolves to `node_ip` (then the Node may publish
/// it as its `Hostname` address, which API servers try first by default).
/// A kubelet on loopback (the embedded cluster) always publishes it.
async fn hostname_reaches(name: &str, node_ip: Ipv4Addr) -> bool {
    if node_ip.is_loopback() {
        return true;
    }
    let resolves = hostmesh_net::lookup_host(&format!("{name}:0"))
        .await
        .map(|addrs| {
            addrs
                .iter()
                .any(|a| a.ip() == std::net::IpAddr::V4(node_ip))
        })
        .unwrap_or(false);
    if !resolves {
        tracing::info!(node = %name, %node_ip, "the node name does not resolve to the node IP: the Node publishes only its InternalIP");
    }
    resolves
}
