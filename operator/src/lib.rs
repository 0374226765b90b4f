//! hostmesh operator: the World and ProcMesh controllers and the supervision
//! hub, wired together by [`run`].
//!
//! Module map: [`controllers`] (the World controller making host pods, the
//! ProcMesh controller placing procs on them, and what both share), [`hub`]
//! (agent connections, heartbeats and host liveness, coalesced status
//! triggers). `run` is composed of small steps ([`connect`],
//! [`controllers::run`]) so metrics, leader election and health endpoints
//! can wrap it. The operability parts: [`metrics`], [`client_metrics`],
//! [`health`], [`leader`] (election), [`telemetry`] (logging), [`ops`] (the
//! `hostmesh operator` process). The embedded cluster, `hostmesh up` and
//! `hostmesh status` live in the `hostmesh-cli` crate.

pub mod client_metrics;
pub mod controllers;
pub mod health;
pub mod hub;
pub mod leader;
pub mod metrics;
pub mod ops;
pub mod telemetry;

use kube::Client;

pub use controllers::ControllerContext;

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
    /// Serve Monarch's `MonarchMesh` (`monarch.pytorch.org/v1alpha1`):
    /// each becomes a World running its Monarch workers (docs/monarch.md).
    /// Leave off where the Monarch operator runs; its CRD must be installed
    /// (`hostmesh crds --monarch-mesh`, or the chart's
    /// `monarch.serveMonarchMesh`).
    #[arg(long, env = "HOSTMESH_SERVE_MONARCH_MESH", default_value_t = false)]
    pub serve_monarch_mesh: bool,
    /// Name reported on Events (the operator pod's name).
    #[arg(long, env = "POD_NAME", default_value = "hostmesh-operator")]
    pub instance: String,
    /// A NetworkPolicy per World (`--network-policy`).
    #[command(flatten)]
    pub network_policy: controllers::world::netpol::NetworkPolicyArgs,
    /// How long the Monarch TLS certificates the operator issues
    /// (`spec.monarch.transport: Tls`) are valid, in seconds (at least an
    /// hour); each is renewed in place with a third of it left.
    #[arg(
        long,
        env = "HOSTMESH_MONARCH_CERT_VALIDITY_SECS",
        default_value_t = DEFAULT_MONARCH_CERT_VALIDITY_SECS,
        value_parser = clap::value_parser!(u64).range(3600..)
    )]
    pub monarch_cert_validity_secs: u64,
}

/// The default of `--monarch-cert-validity-secs`: a year.
pub const DEFAULT_MONARCH_CERT_VALIDITY_SECS: u64 = 365 * 86_400;

impl OperatorArgs {
    /// `--monarch-cert-validity-secs` as a duration.
    pub fn monarch_cert_validity(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.monarch_cert_validity_secs)
    }

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

/// What a reconcile waits for: it returns this as an error so that a
/// finalizer stays on the object, and is retried within a second.
#[derive(Debug, thiserror::Error)]
pub enum Pending {
    /// An earlier reconcile is creating the World's agent Secret.
    #[error("the agent Secret of World {0} is being created")]
    SecretCreating(String),
    /// A World being deleted waits for its ProcMeshes to stop their procs.
    #[error("{count} ProcMeshes of World {world} still stopping")]
    ProcMeshesStopping {
        /// The World.
        world: String,
        /// ProcMeshes not gone yet.
        count: usize,
    },
    /// A ProcMesh being deleted waits for its procs to stop.
    #[error("procs of ProcMesh {0} still stopping")]
    ProcsStopping(String),
    /// A Secret the operator rewrites changed (or went) since it was read.
    #[error("Secret {0} changed while the operator rewrote it")]
    SecretChanged(String),
}

/// Errors of the operator library. Each has a short [`OperatorError::label`] shared
/// by metrics and Events.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The finalizer helper failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<OperatorError>>),
    /// An object lacks a field the operator needs.
    #[error("missing field {0}")]
    MissingField(&'static str),
    /// A reconcile must wait for something before it can go on (retried
    /// soon; not a failure).
    #[error("waiting: {0}")]
    Pending(#[from] Pending),
    /// Serializing an object failed.
    #[error("serialization: {0}")]
    Serde(#[from] serde_json::Error),
    /// Making or reading a certificate of a Monarch World's TLS failed.
    #[error("Monarch TLS: {0}")]
    Tls(String),
}

impl OperatorError {
    /// The error a finalizer wrapper carries, else `self`.
    pub fn root(&self) -> &OperatorError {
        use kube::runtime::finalizer::Error as F;
        match self {
            OperatorError::Finalizer(f) => match f.as_ref() {
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
            OperatorError::Kube(e) => Some(e),
            OperatorError::Finalizer(f) => match f.as_ref() {
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
        if matches!(self.root(), OperatorError::Pending(_)) {
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
            OperatorError::Kube(_) => "kube",
            OperatorError::Finalizer(_) => "finalizer",
            OperatorError::MissingField(_) => "missing_field",
            OperatorError::Pending(_) => "waiting",
            OperatorError::Serde(_) => "serde",
            OperatorError::Tls(_) => "tls",
        }
    }
}

/// Connects to the cluster (kubeconfig or in-cluster), resolving the API
/// server's name without the C library (`hostmesh_net`).
pub async fn connect() -> Result<Client, OperatorError> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    Ok(hostmesh_net::kube_client(config)?)
}

/// `hostmesh operator`: connects, then runs the controllers and the hub
/// until Ctrl-C or SIGTERM.
pub async fn run(args: OperatorArgs) -> Result<(), OperatorError> {
    let client = connect().await?;
    let ctx = ControllerContext::new(client, args, hub::default_connector());
    controllers::run(ctx, shutdown_signal()).await
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
