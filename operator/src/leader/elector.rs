//! The Lease loop of one replica (invariants 1, 3, 4 and 5 of the module).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{
    Decision, LeaderHandle, LeaseConfig, LeaseRecord, Role, decide, next_owners, next_spec,
    should_step_down,
};
use crate::metrics::Metrics;

/// Runs the Lease loop of one replica.
#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    is_leader: watch::Sender<bool>,
    role: watch::Sender<Role>,
    metrics: Option<std::sync::Arc<Metrics>>,
}

/// Internal loop state.
#[derive(Debug, Default)]
struct Observed {
    record: Option<(LeaseRecord, Instant)>,
    last_renew: Option<Instant>,
}

impl LeaderElector {
    /// Creates an elector and the handle its controllers watch.
    pub fn new(client: kube::Client, config: LeaseConfig) -> (Self, LeaderHandle) {
        let api = Api::namespaced(client, &config.namespace);
        let (is_leader, is_leader_rx) = watch::channel(false);
        let (role, role_rx) = watch::channel(Role::Starting);
        (
            Self {
                api,
                config,
                is_leader,
                role,
                metrics: None,
            },
            LeaderHandle {
                is_leader: is_leader_rx,
                role: role_rx,
            },
        )
    }

    /// Also records leadership in `hostmesh_leader`.
    pub fn with_metrics(mut self, metrics: std::sync::Arc<Metrics>) -> Self {
        metrics.set_leader(false);
        self.metrics = Some(metrics);
        self
    }

    /// Runs until `shutdown` resolves, then releases the lease if held.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut observed = Observed::default();
        loop {
            let wait = self.step(&mut observed).await;
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
        if observed.last_renew.is_some() {
            self.release().await;
        }
        self.set_role(Role::Standby { holder: None });
    }

    /// One attempt; returns how long to wait before the next.
    async fn step(&self, observed: &mut Observed) -> Duration {
        let retry = self.config.retry_period;
        let timeout = self.request_timeout(observed);
        let got = tokio::time::timeout(timeout, self.api.get_opt(&self.config.name)).await;
        let lease = match got {
            Ok(Ok(lease)) => lease,
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.config.name, error = %e, "cannot read the leader lease");
                return self.after_failure(observed);
            }
            Err(_) => {
                tracing::warn!(lease = %self.config.name, "reading the leader lease timed out");
                return self.after_failure(observed);
            }
        };
        let now = Instant::now();
        let Some(lease) = lease else {
            return self.write(None, observed).await.unwrap_or(retry);
        };
        let record = LeaseRecord::from_lease(&lease);
        let observed_at = match &observed.record {
            Some((prev, at)) if *prev == record => *at,
            _ => now,
        };
        observed.record = Some((record.clone(), observed_at));
        match decide(
            &record,
            observed_at,
            now,
            &self.config.identity,
            self.config.lease_duration,
        ) {
            Decision::Acquire | Decision::Renew => {
                self.write(Some(lease), observed).await.unwrap_or(retry)
            }
            Decision::Wait { holder, remaining } => {
                if observed.last_renew.take().is_some() {
                    tracing::warn!(holder = %holder, "another replica holds the leader lease; stepping down");
                }
                self.set_role(Role::Standby {
                    holder: Some(holder),
                });
                retry.min(remaining.max(Duration::from_millis(10)))
            }
        }
    }

    /// Creates (`previous` is `None`) or replaces the Lease with this replica
    /// as holder. Returns the wait before the next step, or `None` on a lost
    /// race (retry at the normal period).
    async fn write(&self, previous: Option<Lease>, observed: &mut Observed) -> Option<Duration> {
        let now = Timestamp::now();
        let spec = next_spec(
            previous.as_ref().and_then(|l| l.spec.as_ref()),
            &self.config.identity,
            self.config.lease_duration,
            now,
        );
        let timeout = self.request_timeout(observed);
        let pp = PostParams::default();
        let owner = self.config.owner.as_ref();
        let result = match previous {
            Some(mut lease) => {
                // Keeps metadata.resourceVersion: the write fails with 409 if
                // anyone wrote since we read (invariant 1).
                lease.spec = Some(spec);
                // The holder and its Pod as owner change in one write
                // (invariant 5).
                lease.metadata.owner_references =
                    next_owners(lease.metadata.owner_references.as_deref(), owner);
                tokio::time::timeout(timeout, self.api.replace(&self.config.name, &pp, &lease))
                    .await
            }
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        owner_references: next_owners(None, owner),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                tokio::time::timeout(timeout, self.api.create(&pp, &lease)).await
            }
        };
        match result {
            Ok(Ok(written)) => {
                if observed.last_renew.is_none() {
                    tracing::info!(lease = %self.config.name, identity = %self.config.identity, "became leader");
                }
                observed.last_renew = Some(Instant::now());
                observed.record = Some((LeaseRecord::from_lease(&written), Instant::now()));
                self.set_role(Role::Leader);
                Some(self.config.retry_period)
            }
            Ok(Err(kube::Error::Api(status))) if status.code == 409 => {
                tracing::debug!(lease = %self.config.name, "lost a leader lease race");
                Some(self.after_failure(observed))
            }
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.config.name, error = %e, "cannot write the leader lease");
                Some(self.after_failure(observed))
            }
            Err(_) => {
                tracing::warn!(lease = %self.config.name, "writing the leader lease timed out");
                Some(self.after_failure(observed))
            }
        }
    }

    /// After a failed read or write: a leader past its renew deadline steps
    /// down (invariant 3). Returns the wait before the next attempt.
    fn after_failure(&self, observed: &mut Observed) -> Duration {
        let retry = self.config.retry_period;
        // A replica that never read the lease stays `Starting` (not ready).
        let Some(last) = observed.last_renew else {
            return retry;
        };
        let now = Instant::now();
        if should_step_down(last, now, self.config.renew_deadline) {
            tracing::warn!(lease = %self.config.name, "could not renew the leader lease within the renew deadline; stepping down");
            observed.last_renew = None;
            let holder = observed.record.as_ref().and_then(|(r, _)| r.holder.clone());
            self.set_role(Role::Standby { holder });
            retry
        } else {
            // Wake up in time to step down at the deadline.
            retry.min((last + self.config.renew_deadline).saturating_duration_since(now))
        }
    }

    /// A request must not outlive the leader's renew deadline.
    fn request_timeout(&self, observed: &Observed) -> Duration {
        let base = self.config.retry_period.max(Duration::from_secs(1));
        match observed.last_renew {
            Some(last) => base
                .min((last + self.config.renew_deadline).saturating_duration_since(Instant::now()))
                .max(Duration::from_millis(50)),
            None => base,
        }
    }

    fn set_role(&self, role: Role) {
        let leader = role == Role::Leader;
        if let Some(m) = &self.metrics {
            m.set_leader(leader);
        }
        self.is_leader.send_if_modified(|v| {
            let changed = *v != leader;
            *v = leader;
            changed
        });
        self.role.send_if_modified(|r| {
            let changed = *r != role;
            *r = role;
            changed
        });
    }

    /// Gives the lease up (invariant 4). Publishes `is_leader = false` first.
    async fn release(&self) {
        let _ = self.is_leader.send(false);
        if let Some(m) = &self.metrics {
            m.set_leader(false);
        }
        let timeout = self.config.retry_period.max(Duration::from_secs(1));
        let Ok(Ok(Some(mut lease))) =
            tokio::time::timeout(timeout, self.api.get_opt(&self.config.name)).await
        else {
            return;
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        lease.spec = Some(spec);
        match tokio::time::timeout(
            timeout,
            self.api
                .replace(&self.config.name, &PostParams::default(), &lease),
        )
        .await
        {
            Ok(Ok(_)) => tracing::info!(lease = %self.config.name, "released the leader lease"),
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.config.name, error = %e, "cannot release the leader lease")
            }
            Err(_) => {
                tracing::warn!(lease = %self.config.name, "releasing the leader lease timed out")
            }
        }
    }
}
