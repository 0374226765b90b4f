//! hostmesh operator: the World and ProcMesh controllers and the supervision
//! hub, wired together by [`run`].
//!
//! Module map: [`world`] (host pods from a World), [`procmesh`] (procs on
//! those hosts), [`hub`] (agent connections, heartbeats, coalesced status
//! triggers), [`context`] (what reconciles share). `run` is composed of
//! small steps ([`connect`], [`controllers`]) so metrics, leader election and
//! health endpoints can wrap it. The operability parts: [`metrics`],
//! [`health`], [`leader`] (election), [`telemetry`] (logging), [`status`]
//! (`hostmesh status`); [`manifest`] applies user manifests (`hostmesh up`).

pub mod client_metrics;
pub mod context;
pub mod health;
pub mod hub;
pub mod leader;
pub mod metrics;
pub mod ops;
pub mod procmesh;
pub mod telemetry;
pub mod world;
pub mod writes;

use std::sync::Arc;

use futures::FutureExt as _;
use kube::Client;
use tokio::sync::mpsc;
use tracing::info;

pub use context::Context;

/// Field manager for every server-side apply.
pub const FIELD_MANAGER: &str = "hostmesh-operator";

/// `hostmesh operator` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct OperatorArgs {
    /// Image with the `hostmesh` binary, used by the host pods' init
    /// container.
    #[arg(long, env = "HOSTMESH_AGENT_IMAGE", default_value = concat!("ghcr.io/hostmesh/hostmesh:", env!("CARGO_PKG_VERSION")))]
    pub agent_image: String,
    /// Watch only these namespaces, comma-separated (default: all).
    #[arg(long, env = "HOSTMESH_WATCH_NAMESPACES", value_delimiter = ',')]
    pub watch_namespaces: Vec<String>,
    /// Reconciles running at once per controller.
    #[arg(long, default_value_t = 16)]
    pub concurrency: u16,
    /// Name reported on Events (the operator pod's name).
    #[arg(long, env = "POD_NAME", default_value = "hostmesh-operator")]
    pub instance: String,
}

impl OperatorArgs {
    /// The namespaces to watch: `[None]` for all, else one entry each.
    pub fn namespaces(&self) -> Vec<Option<String>> {
        let mut list: Vec<String> = self
            .watch_namespaces
            .iter()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        list.sort();
        list.dedup();
        if list.is_empty() {
            vec![None]
        } else {
            list.into_iter().map(Some).collect()
        }
    }
}

/// Errors of the operator library. Each has a short [`Error::label`] shared
/// by metrics and Events.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The finalizer helper failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// An object lacks a field the operator needs.
    #[error("missing field {0}")]
    MissingField(&'static str),
    /// Talking to an agent failed.
    #[error("agent: {0}")]
    Agent(String),
    /// Waiting for something before continuing (retried soon).
    #[error("waiting: {0}")]
    Waiting(String),
    /// Serializing an object failed.
    #[error("serialization: {0}")]
    Serde(#[from] serde_json::Error),
}

impl Error {
    /// The error a finalizer wrapper carries, else `self`.
    pub fn root(&self) -> &Error {
        use kube::runtime::finalizer::Error as F;
        match self {
            Error::Finalizer(f) => match f.as_ref() {
                F::ApplyFailed(e) | F::CleanupFailed(e) => e.root(),
                _ => self,
            },
            _ => self,
        }
    }

    /// HTTP status and message of a Kubernetes API error, however wrapped.
    pub fn api_status(&self) -> Option<(u16, &str)> {
        use kube::runtime::finalizer::Error as F;
        let kube_err = match self.root() {
            Error::Kube(e) => Some(e),
            Error::Finalizer(f) => match f.as_ref() {
                F::AddFinalizer(e) | F::RemoveFinalizer(e) => Some(e),
                _ => None,
            },
            _ => None,
        };
        match kube_err {
            Some(kube::Error::Api(s)) => Some((s.code, s.message.as_str())),
            _ => None,
        }
    }

    /// Whether this is an expected, transient condition rather than a
    /// failure worth a warning: waiting on something, an object already gone
    /// (404), a write based on a stale read (409, or 422 from a failed
    /// resourceVersion `test` in a status patch).
    pub fn is_transient(&self) -> bool {
        if matches!(self.root(), Error::Waiting(_)) {
            return true;
        }
        match self.api_status() {
            Some((404 | 409, _)) => true,
            Some((422, msg)) => msg.contains("/metadata/resourceVersion"),
            _ => false,
        }
    }

    /// A short label for metrics and Events.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Finalizer(_) => "finalizer",
            Error::MissingField(_) => "missing_field",
            Error::Agent(_) => "agent",
            Error::Waiting(_) => "waiting",
            Error::Serde(_) => "serde",
        }
    }
}

/// Connects to the cluster (kubeconfig or in-cluster), resolving the API
/// server's name without the C library (`hostmesh_net`).
pub async fn connect() -> Result<Client, Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    Ok(hostmesh_net::kube_client(config)?)
}

/// Runs both controllers (one pair per watched namespace) and the hub
/// until `shutdown` resolves.
pub async fn controllers(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let shutdown = shutdown.shared();
    let (tw, rw) = mpsc::unbounded_channel();
    let (tm, rm) = mpsc::unbounded_channel();
    let hub = tokio::spawn(ctx.hub.clone().run(tw, tm, shutdown.clone()));
    let namespaces = ctx.args.namespaces();
    let (world_routes, world_rx) = routes(&namespaces);
    let (mesh_routes, mesh_rx) = routes(&namespaces);
    tokio::spawn(route(rw, world_routes));
    tokio::spawn(route(rm, mesh_routes));
    let mut runs = Vec::new();
    for ((ns, wrx), mrx) in namespaces.into_iter().zip(world_rx).zip(mesh_rx) {
        runs.push(world::controller(ctx.clone(), ns.clone(), wrx, shutdown.clone()).boxed());
        runs.push(procmesh::controller(ctx.clone(), ns, mrx, shutdown.clone()).boxed());
    }
    futures::future::join_all(runs).await;
    hub.abort();
    info!("controllers stopped");
    Ok(())
}

type Routes = Vec<(Option<String>, mpsc::UnboundedSender<hub::WorldKey>)>;

fn routes(namespaces: &[Option<String>]) -> (Routes, Vec<mpsc::UnboundedReceiver<hub::WorldKey>>) {
    namespaces
        .iter()
        .map(|ns| {
            let (tx, rx) = mpsc::unbounded_channel();
            ((ns.clone(), tx), rx)
        })
        .unzip()
}

/// Forwards hub triggers to the controller watching the object's namespace.
async fn route(mut rx: mpsc::UnboundedReceiver<hub::WorldKey>, routes: Routes) {
    while let Some(key) = rx.recv().await {
        let target = routes
            .iter()
            .find(|(ns, _)| ns.as_deref().is_none_or(|n| n == key.namespace));
        if let Some((_, tx)) = target {
            let _ = tx.send(key);
        }
    }
}

/// `hostmesh operator`: connects, then runs the controllers and the hub
/// until Ctrl-C or SIGTERM.
pub async fn run(args: OperatorArgs) -> Result<(), Error> {
    let client = connect().await?;
    let ctx = Context::new(client, args, hub::default_connector());
    controllers(ctx, shutdown_signal()).await
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: OperatorArgs,
    }

    #[test]
    fn watch_namespaces_parse_from_the_chart_value() {
        let all = Cli::parse_from(["x", "--watch-namespaces", ""]).args;
        assert_eq!(all.namespaces(), [None]);
        let some = Cli::parse_from(["x", "--watch-namespaces", "b,a, b"]).args;
        assert_eq!(
            some.namespaces(),
            [Some("a".to_string()), Some("b".to_string())]
        );
        assert!(some.agent_image.starts_with("ghcr.io/hostmesh/hostmesh:"));
    }
}
