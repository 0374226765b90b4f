//! Leader election flags and their validated form.

use std::time::Duration;

use super::{LeaderElector, LeaderError, LeaderHandle, OwnerPod};
use crate::metrics::Metrics;

/// Leader election flags (flatten into the operator's `clap::Args`).
#[derive(Debug, Clone, clap::Args)]
pub struct LeaderElectionArgs {
    /// Elect a leader through a Lease so that several replicas can run.
    #[arg(long, env = "HOSTMESH_LEADER_ELECT", default_value_t = false)]
    pub leader_elect: bool,
    /// Name of the Lease object.
    #[arg(
        long,
        env = "HOSTMESH_LEADER_ELECT_LEASE",
        default_value = "hostmesh-operator"
    )]
    pub leader_elect_lease: String,
    /// Namespace of the Lease (defaults to the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub leader_elect_namespace: Option<String>,
    /// This replica's identity in the Lease (defaults to the pod name, else the
    /// host name plus a random suffix).
    #[arg(long, env = "POD_NAME")]
    pub leader_elect_identity: Option<String>,
    /// How long a lease is valid without renewal (`15s`, `1m`).
    #[arg(long, env = "HOSTMESH_LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long a leader keeps trying to renew before it steps down.
    #[arg(long, env = "HOSTMESH_LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often candidates and the leader try to acquire or renew.
    #[arg(long, env = "HOSTMESH_LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// Name of the Pod this replica runs in (downward API `metadata.name`).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Namespace of the Pod this replica runs in (downward API
    /// `metadata.namespace`; default: the service account's namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// UID of the Pod this replica runs in (downward API `metadata.uid`).
    /// With it the leader names its Pod as the Lease's owner, so the Lease
    /// is garbage-collected once that Pod is gone (`helm uninstall`).
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,
}

impl LeaderElectionArgs {
    /// Starts election as configured: with `--leader-elect`, spawns the
    /// Lease loop (stopped by `shutdown`, releasing the lease) and returns
    /// its handle and task; without, returns [`LeaderHandle::always_leader`].
    pub fn start(
        &self,
        client: kube::Client,
        metrics: std::sync::Arc<Metrics>,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(LeaderHandle, Option<tokio::task::JoinHandle<()>>), LeaderError> {
        match self.config()? {
            None => {
                metrics.set_leader(true);
                Ok((LeaderHandle::always_leader(), None))
            }
            Some(config) => {
                tracing::info!(
                    lease = %config.name,
                    namespace = %config.namespace,
                    identity = %config.identity,
                    owner_pod = config.owner.as_ref().map_or("none (not in a Pod)", |o| o.name.as_str()),
                    "leader election enabled"
                );
                let (elector, handle) = LeaderElector::new(client, config);
                let task = tokio::spawn(elector.with_metrics(metrics).run(shutdown));
                Ok((handle, Some(task)))
            }
        }
    }
}

/// Validated leader election settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This replica's holder identity.
    pub identity: String,
    /// `leaseDurationSeconds` written to the Lease.
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long steps down.
    pub renew_deadline: Duration,
    /// Time between attempts.
    pub retry_period: Duration,
    /// The Pod this replica runs in, named as the Lease's owner while this
    /// replica holds it (module invariant 5); `None` outside a Pod.
    pub owner: Option<OwnerPod>,
}

impl LeaseConfig {
    /// Checks the timing rules: `leaseDuration > renewDeadline > retryPeriod`,
    /// all at least one second for the duration (the Lease stores seconds).
    pub fn validate(&self) -> Result<(), LeaderError> {
        if self.lease_duration < Duration::from_secs(1) {
            return Err(LeaderError::Timing(
                "--leader-elect-lease-duration must be at least 1s (the Lease stores whole seconds)"
                    .into(),
            ));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(LeaderError::Timing(format!(
                "--leader-elect-renew-deadline ({:?}) must be shorter than --leader-elect-lease-duration ({:?}) so a leader steps down before a standby takes over",
                self.renew_deadline, self.lease_duration
            )));
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err(LeaderError::Timing(format!(
                "--leader-elect-retry-period ({:?}) must be positive and shorter than --leader-elect-renew-deadline ({:?})",
                self.retry_period, self.renew_deadline
            )));
        }
        if self.name.is_empty() {
            return Err(LeaderError::Missing {
                field: "--leader-elect-lease",
                fix: "give the Lease a name",
            });
        }
        Ok(())
    }
}

impl LeaderElectionArgs {
    /// Resolves defaults and validates; `Ok(None)` when election is off.
    pub fn config(&self) -> Result<Option<LeaseConfig>, LeaderError> {
        if !self.leader_elect {
            return Ok(None);
        }
        let namespace = match &self.leader_elect_namespace {
            Some(ns) if !ns.is_empty() => ns.clone(),
            _ => std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .ok_or(LeaderError::Missing {
                    field: "--leader-elect-namespace",
                    fix: "set it, or POD_NAMESPACE through the downward API",
                })?,
        };
        let identity = match &self.leader_elect_identity {
            Some(id) if !id.is_empty() => id.clone(),
            _ => default_identity(),
        };
        let owner = self.owner_pod(&namespace)?;
        let config = LeaseConfig {
            name: self.leader_elect_lease.clone(),
            namespace,
            identity,
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
            owner,
        };
        config.validate()?;
        Ok(Some(config))
    }
}

impl LeaderElectionArgs {
    /// The Pod to name as the Lease's owner: with `--pod-uid`, the Pod
    /// `--pod-name` (required with it), when it lives in the Lease's
    /// namespace. A namespaced owner must be in its dependent's namespace
    /// (the garbage collector treats one elsewhere as absent and would
    /// delete the Lease at once), so a Lease elsewhere gets no owner.
    fn owner_pod(&self, lease_namespace: &str) -> Result<Option<OwnerPod>, LeaderError> {
        let Some(uid) = self.pod_uid.as_deref().filter(|u| !u.is_empty()) else {
            return Ok(None);
        };
        let name = self
            .pod_name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or(LeaderError::Missing {
                field: "--pod-name",
                fix: "set it, or POD_NAME through the downward API (metadata.name), next to POD_UID",
            })?;
        let pod_namespace = match &self.pod_namespace {
            Some(ns) if !ns.is_empty() => Some(ns.clone()),
            _ => std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty()),
        };
        if pod_namespace.as_deref() != Some(lease_namespace) {
            tracing::info!(
                pod = %name,
                pod_namespace = pod_namespace.as_deref().unwrap_or("unknown"),
                lease_namespace,
                "the leader Lease is not in this Pod's namespace: it gets no owner and stays after the Pod is gone"
            );
            return Ok(None);
        }
        Ok(Some(OwnerPod {
            name,
            uid: uid.to_owned(),
        }))
    }
}

/// Parses a duration flag: `500ms`, `15s`, `2m`, `1h`, or bare seconds.
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    let v = value.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (digits, unit) = v.split_at(split);
    let n: u64 = digits.parse().map_err(|_| {
        format!("invalid duration {value:?}: use a whole number with a unit, such as `15s`, `500ms` or `2m`")
    })?;
    let d = match unit {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        other => {
            return Err(format!(
                "invalid duration {value:?}: unknown unit {other:?}; use ms, s, m or h"
            ));
        }
    };
    Ok(d)
}

const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "hostmesh".to_owned()
    } else {
        host
    };
    format!("{host}_{:08x}", rand::random::<u32>())
}
