//! `hostmesh operator` with its operability around the controllers: logging
//! ([`telemetry`](crate::telemetry)), the `/metrics` `/healthz` `/readyz`
//! endpoint ([`health`](crate::health)), and leader election
//! ([`leader`](crate::leader)).
//!
//! Invariants:
//! 1. Controllers run only while this replica leads: they start when it
//!    gains the Lease and are stopped when it loses it (client-go's
//!    OnStartedLeading / OnStoppedLeading), so a standby never writes.
//! 2. Shutdown order: the controllers stop first, then the Lease is released
//!    (a successor cannot start while this replica still writes), then the
//!    HTTP endpoint closes.
//! 3. `hostmesh_worlds{phase}` is reported by the leader only (a standby
//!    reports zeros), so summing over replicas counts each World once.
//! 4. Stopping the controllers (leadership lost, or shutdown) takes at most
//!    [`CONTROLLER_STOP_GRACE`]: in-flight reconciles may finish within it,
//!    then the controllers are cancelled, so a standby never keeps writing.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use hostmesh_crds::World;
use kube::Api;
use kube::api::ListParams;
use tokio::sync::{oneshot, watch};
use tracing::{info, warn};

use crate::health::{self, HealthArgs, HealthState};
use crate::leader::{LeaderElectionArgs, LeaderHandle};
use crate::metrics::Metrics;
use crate::telemetry::{self, TelemetryArgs};
use crate::{ControllerContext, OperatorArgs, hub};

/// How often the leader recounts Worlds by phase.
pub const PHASE_GAUGE_INTERVAL: Duration = Duration::from_secs(15);
/// How long stopping controllers may take (in-flight reconciles finish)
/// before they are cancelled.
pub const CONTROLLER_STOP_GRACE: Duration = Duration::from_secs(10);
/// Bound on each shutdown step after the controllers stopped.
const SHUTDOWN_STEP: Duration = Duration::from_secs(10);

/// Errors of `hostmesh operator` outside the controllers.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// Logging could not be set up.
    #[error(transparent)]
    Telemetry(#[from] telemetry::TelemetryError),
    /// Leader election is misconfigured.
    #[error(transparent)]
    Leader(#[from] crate::leader::LeaderError),
    /// The HTTP endpoint could not start.
    #[error(transparent)]
    Health(#[from] health::HealthError),
    /// The controllers failed.
    #[error(transparent)]
    Operator(#[from] crate::OperatorError),
    /// `--network-policy` lacks what the policies need.
    #[error(transparent)]
    NetworkPolicy(#[from] crate::controllers::world::netpol::NetworkPolicyConfigError),
    /// No kubeconfig or in-cluster configuration, or a bad one.
    #[error("cannot configure the Kubernetes client: {0}; set KUBECONFIG or run in a pod")]
    Connect(String),
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// All arguments of `hostmesh operator`.
#[derive(Debug, Clone, clap::Args)]
pub struct OperatorCommand {
    /// Controller settings.
    #[command(flatten)]
    pub args: OperatorArgs,
    /// Logging.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
    /// Metrics and health endpoint.
    #[command(flatten)]
    pub health: HealthArgs,
    /// Leader election.
    #[command(flatten)]
    pub leader: LeaderElectionArgs,
}

/// Sets up logging, then runs the operator until Ctrl-C or SIGTERM.
pub fn run_blocking(cmd: OperatorCommand) -> Result<(), OpsError> {
    telemetry::init(&cmd.telemetry)?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("hostmesh-operator")
        .build()
        .map_err(OpsError::Runtime)?
        .block_on(run(cmd, crate::shutdown_signal()))
}

/// Connects (kubeconfig or in-cluster), binds `--http-addr`, and runs the
/// operator until `shutdown` resolves.
pub async fn run(
    cmd: OperatorCommand,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), OpsError> {
    // Configuration errors first, before any network (they name the flag).
    cmd.leader.config()?;
    cmd.args.network_policy.peer()?;
    let metrics = Arc::new(Metrics::new());
    let config = kube::Config::infer()
        .await
        .map_err(|e| OpsError::Connect(e.to_string()))?;
    let client = crate::client_metrics::client(config, metrics.clone())
        .map_err(|e| OpsError::Connect(e.to_string()))?;
    let listener = health::bind(cmd.health.http_addr).await?;
    run_with(cmd, client, metrics, listener, shutdown).await
}

/// Runs the operator with a given client, metrics and HTTP listener until
/// `shutdown` resolves (invariants 1-3). Build the client with
/// [`client_metrics::client`](crate::client_metrics::client) to count status
/// writes.
pub async fn run_with(
    cmd: OperatorCommand,
    client: kube::Client,
    metrics: Arc<Metrics>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), OpsError> {
    let shutdown = shutdown.boxed().shared();

    let (elector_stop, elector_stop_rx) = oneshot::channel::<()>();
    let (leader, elector) = cmd.leader.start(client.clone(), metrics.clone(), async {
        let _ = elector_stop_rx.await;
    })?;
    let role = cmd.leader.leader_elect.then(|| leader.role_channel());
    let state = Arc::new(HealthState::new(metrics.clone(), role));
    let (http_stop, http_stop_rx) = oneshot::channel::<()>();
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics, /healthz and /readyz");
    }
    let http = tokio::spawn(health::serve(listener, state.clone(), async {
        let _ = http_stop_rx.await;
    }));
    state.set_controllers_started(true);

    let gauge = tokio::spawn(world_phase_gauge(
        client.clone(),
        cmd.args.namespaces(),
        leader.clone(),
        metrics.clone(),
    ));
    let result = lead_while_leader(
        cmd.args.clone(),
        client,
        leader.clone(),
        metrics.clone(),
        shutdown,
    )
    .await;

    // Invariant 2.
    state.set_controllers_started(false);
    gauge.abort();
    let _ = elector_stop.send(());
    if let Some(task) = elector
        && tokio::time::timeout(SHUTDOWN_STEP, task).await.is_err()
    {
        warn!("leader election did not stop in time");
    }
    let _ = http_stop.send(());
    if tokio::time::timeout(SHUTDOWN_STEP + health::SHUTDOWN_GRACE, http)
        .await
        .is_err()
    {
        warn!("the HTTP endpoint did not stop in time");
    }
    info!("operator stopped");
    result
}

/// Runs the controllers each time this replica gains leadership, until
/// `shutdown` (invariant 1).
async fn lead_while_leader(
    args: OperatorArgs,
    client: kube::Client,
    leader: LeaderHandle,
    metrics: Arc<Metrics>,
    shutdown: futures::future::Shared<futures::future::BoxFuture<'static, ()>>,
) -> Result<(), OpsError> {
    let mut is_leader = leader.is_leader_channel();
    loop {
        tokio::select! {
            () = shutdown.clone() => return Ok(()),
            gained = wait_for(&mut is_leader, true) => if !gained {
                // The elector ended (only at shutdown).
                shutdown.clone().await;
                return Ok(());
            },
        }
        info!("leading: starting the controllers");
        let ctx = ControllerContext::with_metrics(
            client.clone(),
            args.clone(),
            hub::default_connector(),
            metrics.clone(),
        );
        let mut rx = leader.is_leader_channel();
        let lost = async move {
            if !wait_for(&mut rx, false).await {
                // Without election (or after the elector ended) leadership
                // is never lost.
                std::future::pending::<()>().await;
            }
        };
        let sd = shutdown.clone();
        let (stopped_tx, mut stopped_rx) = watch::channel(false);
        let stop = async move {
            tokio::select! {
                () = sd => {}
                () = lost => {}
            }
            let _ = stopped_tx.send(true);
        };
        ctx.hub.set_metrics(metrics.clone());
        let sampler = tokio::spawn(sample_hub(ctx.hub.clone(), metrics.clone()));
        // Invariant 4: a stop is bounded even if a reconcile hangs; the
        // controllers' future is dropped (cancelled) at the end of this block.
        let result = {
            let controllers = crate::controllers::run(ctx, stop);
            tokio::pin!(controllers);
            tokio::select! {
                result = &mut controllers => result,
                () = async {
                    let _ = stopped_rx.changed().await;
                    tokio::time::sleep(CONTROLLER_STOP_GRACE).await;
                } => {
                    warn!(
                        grace = ?CONTROLLER_STOP_GRACE,
                        "controllers did not stop within the grace period; cancelling them"
                    );
                    Ok(())
                }
            }
        };
        sampler.abort();
        result?;
        if shutdown.peek().is_some() {
            return Ok(());
        }
        warn!("lost leadership: controllers stopped, standing by");
    }
}

/// Copies the hub's counters into the metrics every second (one hub per
/// leadership term, so deltas start from zero).
async fn sample_hub(hub: Arc<hub::Hub>, metrics: Arc<Metrics>) {
    let mut last = hub::HubStats::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let now = hub.stats();
        metrics.add_hub_activity(
            now.pushes.saturating_sub(last.pushes),
            now.world_triggers.saturating_sub(last.world_triggers),
            now.mesh_triggers.saturating_sub(last.mesh_triggers),
        );
        last = now;
    }
}

/// Waits until the channel holds `value`; false when the sender is gone
/// first.
async fn wait_for(rx: &mut watch::Receiver<bool>, value: bool) -> bool {
    rx.wait_for(|v| *v == value).await.is_ok()
}

/// Counts Worlds by phase every [`PHASE_GAUGE_INTERVAL`] while leading
/// (invariant 3).
async fn world_phase_gauge(
    client: kube::Client,
    namespaces: Vec<Option<String>>,
    leader: LeaderHandle,
    metrics: Arc<Metrics>,
) {
    let mut tick = tokio::time::interval(PHASE_GAUGE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !leader.is_leader() {
            metrics.set_worlds_by_phase(std::iter::empty());
            continue;
        }
        let mut counts: std::collections::BTreeMap<&'static str, i64> = Default::default();
        let mut complete = true;
        for ns in &namespaces {
            let api: Api<World> = match ns {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            };
            match api.list(&ListParams::default()).await {
                Ok(list) => {
                    for w in list.items {
                        let phase = w
                            .status
                            .and_then(|s| s.phase)
                            .map_or("Pending", |p| p.as_str());
                        *counts.entry(phase).or_default() += 1;
                    }
                }
                Err(e) => {
                    warn!(error = %e, "cannot list Worlds for the phase gauge");
                    complete = false;
                }
            }
        }
        if complete {
            metrics.set_worlds_by_phase(counts);
        }
    }
}
