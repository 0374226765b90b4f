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

pub mod context;
pub mod health;
pub mod hub;
pub mod leader;
pub mod manifest;
pub mod metrics;
pub mod procmesh;
pub mod status;
pub mod telemetry;
pub mod world;

use std::sync::Arc;

use futures::FutureExt as _;
use kube::Client;
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
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "HOSTMESH_WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Reconciles running at once per controller.
    #[arg(long, default_value_t = 16)]
    pub concurrency: u16,
    /// Name reported on Events (the operator pod's name).
    #[arg(long, env = "POD_NAME", default_value = "hostmesh-operator")]
    pub instance: String,
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

/// Connects to the cluster (kubeconfig or in-cluster).
pub async fn connect() -> Result<Client, Error> {
    Ok(Client::try_default().await?)
}

/// Runs both controllers and the hub until `shutdown` resolves.
pub async fn controllers(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let shutdown = shutdown.shared();
    let (tw, rw) = tokio::sync::mpsc::unbounded_channel();
    let (tm, rm) = tokio::sync::mpsc::unbounded_channel();
    let hub = tokio::spawn(ctx.hub.clone().run(tw, tm, shutdown.clone()));
    let worlds = world::controller(ctx.clone(), rw, shutdown.clone());
    let meshes = procmesh::controller(ctx.clone(), rm, shutdown.clone());
    futures::join!(worlds, meshes);
    hub.abort();
    info!("controllers stopped");
    Ok(())
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
