//! The `--simulate` mode's stand-in for kubelets: it watches the pods of
//! the run's namespace, binds each new one to a Node of its own, gives it
//! a loopback address of its own and, for a host pod, starts a simulated
//! agent there ([`super::sim_agent`]) with the pod's rank and epoch and the
//! World's secret, then reports the pod Running and Ready as a kubelet
//! would. A pod being deleted loses its agent and goes at once. So the
//! operator and the API server run as in production while no process runs
//! per host.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use tokio::sync::Semaphore;

use super::sim_agent::{SimAgent, SimCounters};

/// The Node simulated pods are bound to.
pub(crate) const NODE: &str = "scale-sim-node";
/// Loopback addresses reserved for each shard's pods.
const SHARD_IPS: usize = 1 << 21;

/// Which pods a simulated kubelet serves: host ranks `index` modulo
/// `count`, and (shard 0 alone) every pod that is not a host. Shards are
/// separate processes where one would need more file descriptors than it
/// may open (two per agent: its listener and the operator's connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shard {
    /// This shard.
    pub(crate) index: usize,
    /// How many there are.
    pub(crate) count: usize,
}

impl Shard {
    /// Whether host `rank` (`None`: not a host pod) is this shard's.
    pub(crate) fn owns(&self, rank: Option<usize>) -> bool {
        match rank {
            Some(r) => r % self.count.max(1) == self.index,
            None => self.index == 0,
        }
    }
}
/// Pods handled at once (binding, agent start, status).
const CONCURRENCY: usize = 64;

/// One simulated host.
struct Host {
    rank: usize,
    pod: String,
    agent: Option<SimAgent>,
}

struct Inner {
    client: kube::Client,
    namespace: String,
    shard: Shard,
    hosts: Mutex<HashMap<String, Host>>,
    next_ip: AtomicUsize,
    counters: Arc<SimCounters>,
    limit: Semaphore,
    /// World secrets by Secret name (read once).
    secrets: Mutex<HashMap<String, Vec<u8>>>,
}

/// The simulated kubelet; dropping it stops its watch and every agent.
pub(crate) struct SimKubelet {
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SimKubelet {
    fn drop(&mut self) {
        self.task.abort();
        self.inner
            .hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// The loopback address of the `i`th simulated pod: 127.64.0.0/10, no
/// octet 0 or 255.
fn pod_ip(i: usize) -> Ipv4Addr {
    let a = 64 + (i / (250 * 250)) as u8;
    let b = ((i / 250) % 250) as u8 + 1;
    let c = (i % 250) as u8 + 1;
    Ipv4Addr::new(127, a, b, c)
}

fn env_of<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == key)?
        .value
        .as_deref()
}

impl SimKubelet {
    /// Registers the Node and starts watching the pods of `namespace`.
    pub(crate) async fn start(
        client: kube::Client,
        namespace: &str,
        counters: Arc<SimCounters>,
        shard: Shard,
    ) -> anyhow::Result<SimKubelet> {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": NODE},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "capacity": {"pods": "1000000"}, "allocatable": {"pods": "1000000"}},
        }))?;
        match Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await
        {
            Ok(_) => {}
            // Another shard registered it.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e).context("registering the simulated Node"),
        }
        let inner = Arc::new(Inner {
            client: client.clone(),
            namespace: namespace.to_owned(),
            shard,
            hosts: Mutex::default(),
            next_ip: AtomicUsize::new(shard.index * SHARD_IPS),
            counters,
            limit: Semaphore::new(CONCURRENCY),
            secrets: Mutex::default(),
        });
        let pods: Api<Pod> = Api::namespaced(client, namespace);
        let watch_inner = inner.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher::watcher(pods, watcher::Config::default()).boxed();
            while let Some(ev) = stream.next().await {
                let pod = match ev {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "simulated kubelet: pod watch failed");
                        continue;
                    }
                };
                let inner = watch_inner.clone();
                tokio::spawn(async move {
                    if let Err(e) = inner.on_pod(pod).await {
                        tracing::warn!(error = %e, "simulated kubelet: a pod failed");
                    }
                });
            }
        });
        Ok(SimKubelet { inner, task })
    }

    /// Host agents this shard runs.
    pub(crate) fn agents(&self) -> usize {
        self.inner
            .hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|h| h.agent.is_some())
            .count()
    }

    /// Kills the agent of host `rank`: it goes silent and its pod fails
    /// as a pod whose only container was SIGKILLed (restartPolicy Never).
    pub(crate) async fn kill_agent(&self, rank: usize) -> anyhow::Result<()> {
        let pod = {
            let mut hosts = self.inner.hosts.lock().unwrap_or_else(|e| e.into_inner());
            let h = hosts
                .values_mut()
                .find(|h| h.rank == rank && h.agent.is_some())
                .context("no live simulated agent of that rank")?;
            h.agent = None;
            h.pod.clone()
        };
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let status = serde_json::json!({"status": {
            "phase": "Failed",
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "PodFailed", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "False", "reason": "PodFailed", "lastTransitionTime": now},
            ],
            "containerStatuses": [{"name": "host", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                "state": {"terminated": {"exitCode": 137, "signal": 9, "reason": "Error", "finishedAt": now}}}],
        }});
        Api::<Pod>::namespaced(self.inner.client.clone(), &self.inner.namespace)
            .patch_status(&pod, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        Ok(())
    }

    /// Ends the running proc of rank `rank` on host `host` as killed by
    /// SIGKILL.
    pub(crate) fn kill_proc(&self, host: usize, rank: usize) -> anyhow::Result<()> {
        let hosts = self.inner.hosts.lock().unwrap_or_else(|e| e.into_inner());
        let agent = hosts
            .values()
            .find(|h| h.rank == host)
            .and_then(|h| h.agent.as_ref())
            .context("no live simulated agent of that host")?;
        anyhow::ensure!(
            agent.kill_rank(rank, 9),
            "no running proc of rank {rank} on host {host}"
        );
        Ok(())
    }
}

impl Inner {
    async fn on_pod(self: &Arc<Self>, pod: Pod) -> anyhow::Result<()> {
        let host_rank = env_of(&pod, "HOSTMESH_HOST_RANK").and_then(|r| r.parse().ok());
        if !self.shard.owns(host_rank) {
            return Ok(());
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        if pod.metadata.deletion_timestamp.is_some() {
            let gone = self
                .hosts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&uid);
            if gone.is_some() || pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()) {
                drop(gone);
                let _permit = self.limit.acquire().await?;
                match pods
                    .delete(&name, &DeleteParams::default().grace_period(0))
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            return Ok(());
        }
        let unbound = pod.spec.as_ref().is_none_or(|s| s.node_name.is_none());
        if !unbound {
            return Ok(());
        }
        {
            let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
            if hosts.contains_key(&uid) {
                return Ok(());
            }
            let rank = host_rank.unwrap_or(usize::MAX);
            hosts.insert(
                uid.clone(),
                Host {
                    rank,
                    pod: name.clone(),
                    agent: None,
                },
            );
        }
        let _permit = self.limit.acquire().await?;
        let binding = serde_json::json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": self.namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
        });
        let binding: k8s_openapi::api::core::v1::Binding = serde_json::from_value(binding)?;
        let _: serde_json::Value = pods
            .create_subresource("binding", &name, &PostParams::default(), &binding)
            .await
            .with_context(|| format!("binding {name}"))?;
        let ip = pod_ip(self.next_ip.fetch_add(1, Ordering::Relaxed));
        if let Some(rank) = env_of(&pod, "HOSTMESH_HOST_RANK").and_then(|r| r.parse().ok()) {
            let port: u16 = env_of(&pod, "HOSTMESH_PORT")
                .and_then(|p| p.parse().ok())
                .context("a host pod without HOSTMESH_PORT")?;
            let epoch = env_of(&pod, "HOSTMESH_EPOCH")
                .and_then(|e| e.parse().ok())
                .unwrap_or(0);
            let secret = self.secret_of(&pod).await?;
            let heartbeat = hostmesh_crds::duration::parse_or(
                "HOSTMESH_HEARTBEAT_INTERVAL",
                env_of(&pod, "HOSTMESH_HEARTBEAT_INTERVAL"),
                hostmesh_crds::validate::DEFAULT_HEARTBEAT_INTERVAL,
            )
            .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            let agent = SimAgent::start(
                SocketAddr::new(IpAddr::V4(ip), port),
                rank,
                epoch,
                &secret,
                heartbeat,
                self.counters.clone(),
            )
            .await
            .with_context(|| format!("starting the simulated agent of {name} at {ip}:{port}"))?;
            let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
            match hosts.get_mut(&uid) {
                Some(h) => h.agent = Some(agent),
                // Deleted meanwhile.
                None => return Ok(()),
            }
        }
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let cond =
            |t: &str| serde_json::json!({"type": t, "status": "True", "lastTransitionTime": now});
        let containers: Vec<serde_json::Value> = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .map(|c| {
                serde_json::json!({
                    "name": c.name, "ready": true, "started": true, "restartCount": 0,
                    "image": c.image.clone().unwrap_or_default(), "imageID": "",
                    "state": {"running": {"startedAt": now}},
                })
            })
            .collect();
        let status = serde_json::json!({"status": {
            "phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}],
            "hostIP": "127.0.0.1", "startTime": now,
            "conditions": [cond("PodScheduled"), cond("Initialized"), cond("ContainersReady"), cond("Ready")],
            "containerStatuses": containers,
        }});
        pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .with_context(|| format!("reporting {name} Ready"))?;
        Ok(())
    }

    /// The World secret `pod` takes (its `HOSTMESH_SECRET`), as its agent
    /// derives the key.
    async fn secret_of(&self, pod: &Pod) -> anyhow::Result<Vec<u8>> {
        let name = super::referenced_secrets(pod)
            .into_iter()
            .next()
            .context("a host pod that takes no Secret")?;
        if let Some(k) = self
            .secrets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&name)
        {
            return Ok(k.clone());
        }
        let secret = Api::<Secret>::namespaced(self.client.clone(), &self.namespace)
            .get(&name)
            .await?;
        let token = secret
            .data
            .as_ref()
            .and_then(|d| d.get("token"))
            .context("the agent Secret has no token")?;
        let key = hostmesh_agent::secret_key(&token.0).to_vec();
        self.secrets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, key.clone());
        Ok(key)
    }
}
