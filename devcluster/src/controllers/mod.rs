//! A minimal controller-manager for the cluster in a box: the Deployment,
//! ReplicaSet and EndpointSlice controllers (kube-rs `Controller`s), so that
//! charts and manifests with Deployments run on the embedded API server and
//! the process kubelet, `kubectl rollout status` / `helm --wait` see
//! Kubernetes' status fields, and Services get the EndpointSlices the
//! cluster DNS reads. See `docs/controllers.md`.
//!
//! Invariants:
//! 1. Deployment -> ReplicaSet -> Pod links are controller ownerReferences,
//!    so deletion cascades through the API server's garbage collector; these
//!    controllers never delete an object they do not own.
//! 2. Every reconcile reads the children from the API server (not a cache)
//!    and writes `status` through the status subresource.
//! 3. [`ControllersHandle::shutdown`] stops every controller; in-flight
//!    reconciles finish first.

mod deployment;
pub mod endpoints;
pub mod endpointslice;
mod replicaset;
pub mod rollout;

pub(crate) use replicaset::selector_matches;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use hostmesh_net::watch::WatchBackoff;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// A Kubernetes call failed (retried with back-off).
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The object is invalid; the message names the field and the fix.
    #[error("{0}")]
    Invalid(String),
    /// The kubeconfig could not be loaded.
    #[error("kubeconfig: {0}")]
    Config(String),
}

/// State shared by the reconcilers.
pub(crate) struct Ctx {
    pub(crate) client: kube::Client,
}

/// The running controllers.
pub struct ControllersHandle {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl ControllersHandle {
    /// Stops the controllers and waits (at most 10 s) for them to finish.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            if tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .is_err()
            {
                warn!("a controller did not stop within 10s");
            }
        }
    }
}

/// Starts the Deployment, ReplicaSet and EndpointSlice controllers on
/// `client`, watching every namespace.
pub fn start(client: kube::Client) -> ControllersHandle {
    let (stop, stop_rx) = watch::channel(false);
    let ctx = Arc::new(Ctx {
        client: client.clone(),
    });
    let stopped = move |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let wc = watcher::Config::default().any_semantic();
    let deployments = Controller::new(Api::<Deployment>::all(client.clone()), wc.clone())
        .trigger_backoff(WatchBackoff::default())
        .owns(Api::<ReplicaSet>::all(client.clone()), wc.clone())
        .graceful_shutdown_on(stopped(stop_rx.clone()))
        .run(
            deployment::reconcile,
            error_policy::<Deployment>,
            ctx.clone(),
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "deployment controller");
            }
        });
    let replicasets = Controller::new(Api::<ReplicaSet>::all(client.clone()), wc.clone())
        .trigger_backoff(WatchBackoff::default())
        .owns(Api::<Pod>::all(client.clone()), wc.clone())
        .graceful_shutdown_on(stopped(stop_rx.clone()))
        .run(
            replicaset::reconcile,
            error_policy::<ReplicaSet>,
            ctx.clone(),
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "replicaset controller");
            }
        });
    // Bounded back-offs: relisted within seconds of an API server restart
    // (`hostmesh_net::watch`), not after kube-rs' default 30 s.
    let services = Controller::new(Api::<Service>::all(client.clone()), wc.clone())
        .trigger_backoff(WatchBackoff::default());
    let service_cache = services.store();
    let endpointslices = services
        .owns(Api::<EndpointSlice>::all(client.clone()), wc.clone())
        .owns(Api::<Endpoints>::all(client.clone()), wc.clone())
        .watches(Api::<Pod>::all(client), wc, move |pod| {
            endpointslice::services_selecting(&service_cache, &pod)
        })
        .graceful_shutdown_on(stopped(stop_rx))
        .run(endpointslice::reconcile, error_policy::<Service>, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "endpointslice controller");
            }
        });
    info!("deployment, replicaset and endpointslice controllers started");
    ControllersHandle {
        stop,
        tasks: vec![
            tokio::spawn(deployments),
            tokio::spawn(replicasets),
            tokio::spawn(endpointslices),
        ],
    }
}

fn error_policy<K>(_obj: Arc<K>, e: &ControllerError, _ctx: Arc<Ctx>) -> Action {
    match e {
        // An invalid object waits for a change, with a slow retry in case
        // the problem was elsewhere (e.g. a name taken by another owner).
        ControllerError::Invalid(msg) => {
            warn!(error = %msg, "invalid object");
            Action::requeue(Duration::from_secs(60))
        }
        e => {
            warn!(error = %e, "reconcile failed; retrying");
            Action::requeue(Duration::from_secs(2))
        }
    }
}

/// `hostmesh controller-manager`.
#[derive(Debug, Clone, clap::Args)]
pub struct ControllerManagerArgs {
    /// Kubeconfig of the cluster; without it, in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// Runs the controllers until SIGINT or SIGTERM.
pub async fn run(args: ControllerManagerArgs) -> Result<(), ControllerError> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| ControllerError::Config(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| ControllerError::Config(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| ControllerError::Config(format!("set KUBECONFIG or --kubeconfig: {e}")))?,
    };
    let client = hostmesh_net::kube_client(config).map_err(ControllerError::Kube)?;
    let handle = start(client);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| ControllerError::Config(format!("cannot watch SIGTERM: {e}")))?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    info!("stopping controllers");
    handle.shutdown().await;
    Ok(())
}
