//! The operator and agents in this process, for suites that run the real
//! controllers against an embedded API server with no kubelet (the suite
//! writes pod status itself): [`operator_args`], [`Controllers`] (the
//! World and ProcMesh controllers on a task), [`WorldAgents`] (real
//! `hostmesh agent` processes for a World's host pods). An in-process
//! agent's config on loopback is `hostmesh_agent::AgentConfig::loopback`.
//!
//! Invariants:
//! 1. [`Controllers::stop`] is bounded: it waits at most [`STOP_BOUND`]
//!    for the controllers to end.
//! 2. [`WorldAgents::start`] marks a host pod Running and Ready at its
//!    agent's address only after that agent is spawned with the pod's
//!    rank epoch; each of its waits gives up after the caller's bound with
//!    an error naming what it waited for.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use hostmesh_operator::hub::AgentConnector;
use hostmesh_operator::{ControllerContext, OperatorArgs};
use hostmesh_testkit::agent::{AgentProcess, AgentSecret, loopback_ip};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, Patch, PatchParams};

/// How long [`Controllers::stop`] waits for the controllers to end.
pub const STOP_BOUND: Duration = Duration::from_secs(10);

/// Operator arguments for a suite's in-process controllers: watching only
/// `namespace`, instance `instance` (agent image `agent:<instance>`),
/// concurrency 4, no MonarchMesh, no NetworkPolicies. Callers change fields as they need.
pub fn operator_args(namespace: &str, instance: &str) -> OperatorArgs {
    OperatorArgs {
        agent_image: format!("agent:{instance}"),
        watch_namespaces: vec![namespace.into()],
        concurrency: 4,
        instance: instance.into(),
        serve_monarch_mesh: false,
        network_policy: Default::default(),
        monarch_cert_validity_secs: hostmesh_operator::DEFAULT_MONARCH_CERT_VALIDITY_SECS,
    }
}

/// The real World and ProcMesh controllers (and hub) running on a task
/// until [`Controllers::stop`].
pub struct Controllers {
    /// The context they run with (its hub, args and client).
    pub ctx: Arc<ControllerContext>,
    stop: tokio::sync::oneshot::Sender<()>,
    run: tokio::task::JoinHandle<()>,
}

impl Controllers {
    /// Starts the controllers against `client` with `args`, reaching
    /// agents through `connector`.
    pub fn start(
        client: kube::Client,
        args: OperatorArgs,
        connector: Arc<dyn AgentConnector>,
    ) -> Controllers {
        let ctx = ControllerContext::new(client, args, connector);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn({
            let ctx = ctx.clone();
            async move {
                let _ = hostmesh_operator::controllers::run(ctx, async move {
                    let _ = stopped.await;
                })
                .await;
            }
        });
        Controllers { ctx, stop, run }
    }

    /// Tells the controllers to stop and waits for them, at most
    /// [`STOP_BOUND`] (invariant 1).
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(STOP_BOUND, self.run).await;
    }
}

/// Real `hostmesh agent` processes for the host pods of a World whose
/// shape is one dimension named `host`, with the suite playing the kubelet
/// for those pods ([`WorldAgents::start`]).
pub struct WorldAgents<'a> {
    /// A client for the cluster the controllers run against.
    pub client: &'a kube::Client,
    /// The World's namespace.
    pub namespace: &'a str,
    /// The World's name.
    pub world: &'a str,
    /// How many host pods (ranks `0..hosts`).
    pub hosts: hostmesh_crds::Rank,
    /// The `hostmesh` binary the agents run.
    pub bin: &'a Path,
    /// Silence the agents' stderr.
    pub quiet: bool,
    /// How long each wait may take.
    pub bound: Duration,
}

impl WorldAgents<'_> {
    /// Waits for the World's agent Secret and writes its token to
    /// `dir/token`; then, for each rank, waits for pod
    /// `<world>-host-<rank>`, spawns an agent at `loopback_ip(rank + 1)` on
    /// the World's default port with that pod's rank epoch (the operator
    /// refuses, and fences, an agent of another one), and marks the pod
    /// Running and Ready at that address (invariant 2). The agents stop
    /// when the returned processes drop.
    pub async fn start(&self, dir: &Path) -> anyhow::Result<Vec<AgentProcess>> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), self.namespace);
        let secret = format!("{}-agent", self.world);
        let token = self
            .until("the World's agent Secret", async || {
                let s = secrets.get_opt(&secret).await.ok()??;
                Some(s.data?.get("token")?.0.clone())
            })
            .await?;
        let secret_file = dir.join("token");
        std::fs::write(&secret_file, &token)
            .with_context(|| format!("writing {}", secret_file.display()))?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.namespace);
        let mut agents = Vec::new();
        for rank in 0..self.hosts {
            let n = u8::try_from(rank + 1).context("at most 255 hosts")?;
            let addr = SocketAddr::new(loopback_ip(n), hostmesh_crds::world::DEFAULT_PORT);
            let pod = format!("{}-host-{rank}", self.world);
            let created = self
                .until(&format!("pod {pod}"), async || {
                    pods.get_opt(&pod).await.ok()?
                })
                .await?;
            let epoch = hostmesh_operator::controllers::world::fencing::pod_epoch(&created);
            let mut builder =
                AgentProcess::builder(self.bin, addr, AgentSecret::File(secret_file.clone()))
                    .host_rank(rank)
                    .epoch(epoch);
            if self.quiet {
                builder = builder.quiet();
            }
            agents.push(builder.spawn()?);
            let status = serde_json::json!({"status": {
                "phase": "Running",
                "podIP": addr.ip().to_string(),
                "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
            }});
            pods.patch_status(&pod, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .with_context(|| format!("marking pod {pod} Ready"))?;
        }
        Ok(agents)
    }

    /// Polls `get` until it yields, for at most `self.bound`.
    async fn until<T>(
        &self,
        what: &str,
        mut get: impl AsyncFnMut() -> Option<T>,
    ) -> anyhow::Result<T> {
        hostmesh_testkit::poll(self.bound, async || get().await.ok_or(()))
            .await
            .map_err(|()| anyhow::anyhow!("{what}: not reached in {:?}", self.bound))
    }
}
