//! Leader election with a `coordination.k8s.io/v1` Lease, so two or more
//! operator replicas are safe: exactly one writes, the others stand by with
//! warm caches and take over when the leader's lease expires.
//!
//! The decision logic ([`decide`], [`should_step_down`]) is pure; [`LeaderElector`]
//! runs it in a loop against the API server.
//!
//! Invariants:
//! 1. A replica becomes leader only through a write that carried the
//!    resourceVersion it read (optimistic concurrency): of two racing
//!    candidates, the API server lets exactly one win (409 for the other).
//! 2. Expiry of another holder's lease is judged on this replica's monotonic
//!    clock, from the moment it last saw the lease record change, never from
//!    `renewTime` (clocks of two nodes may disagree).
//! 3. A leader that has not renewed for `renewDeadline` (< `leaseDuration`)
//!    publishes `is_leader = false` before any standby can consider the lease
//!    expired, and its controllers stop writing.
//! 4. On shutdown a leader releases the lease (empty holder, 1 s duration),
//!    so a standby takes over at its next retry instead of waiting a full
//!    `leaseDuration`.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::metrics::Metrics;

/// Errors from configuring leader election.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// A timing flag is inconsistent with another.
    #[error("invalid leader election timing: {0}")]
    Timing(String),
    /// A required setting is missing.
    #[error("leader election needs {field}: {fix}")]
    Missing {
        /// The flag that is missing.
        field: &'static str,
        /// How to provide it.
        fix: &'static str,
    },
}

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
                tracing::info!(lease = %config.name, namespace = %config.namespace, identity = %config.identity, "leader election enabled");
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
        let config = LeaseConfig {
            name: self.leader_elect_lease.clone(),
            namespace,
            identity,
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        };
        config.validate()?;
        Ok(Some(config))
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

/// This replica's role, as published on the role channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Has not yet read the Lease.
    Starting,
    /// Holds the Lease: controllers may write.
    Leader,
    /// Another replica (or nobody, while acquiring) holds the Lease; this
    /// replica keeps its caches warm and is ready to take over.
    Standby {
        /// The current holder, when known.
        holder: Option<String>,
    },
}

/// The parts of a Lease the decision looks at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// `holderIdentity`; `None` or empty means released.
    pub holder: Option<String>,
    /// `leaseDurationSeconds`.
    pub duration_seconds: Option<i32>,
    /// `renewTime`, as written (compared for change, never for expiry).
    pub renew_time: Option<Timestamp>,
    /// `leaseTransitions`.
    pub transitions: i32,
}

impl LeaseRecord {
    /// Extracts the record from a Lease.
    pub fn from_lease(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            duration_seconds: spec.lease_duration_seconds,
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }
}

/// What to do with the Lease now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The lease is free or expired: take it (a new transition).
    Acquire,
    /// This replica holds the lease: renew it.
    Renew,
    /// Another replica holds a live lease: wait at most `remaining`.
    Wait {
        /// The holder.
        holder: String,
        /// Time until the lease expires by our clock.
        remaining: Duration,
    },
}

/// Decides from the last seen record, when it was first seen in this form
/// (`observed_at`, invariant 2), and this replica's identity.
pub fn decide(
    record: &LeaseRecord,
    observed_at: Instant,
    now: Instant,
    me: &str,
    default_duration: Duration,
) -> Decision {
    let Some(holder) = record.holder.as_deref() else {
        return Decision::Acquire;
    };
    if holder == me {
        return Decision::Renew;
    }
    let duration = record
        .duration_seconds
        .filter(|s| *s > 0)
        .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)))
        .unwrap_or(default_duration);
    let expires = observed_at + duration;
    if now >= expires {
        Decision::Acquire
    } else {
        Decision::Wait {
            holder: holder.to_owned(),
            remaining: expires - now,
        }
    }
}

/// Whether a leader whose last successful renewal was at `last_renew` must
/// step down (invariant 3).
pub fn should_step_down(last_renew: Instant, now: Instant, renew_deadline: Duration) -> bool {
    now.saturating_duration_since(last_renew) >= renew_deadline
}

/// Builds the Lease spec to write when acquiring or renewing.
pub fn next_spec(
    previous: Option<&LeaseSpec>,
    me: &str,
    lease_duration: Duration,
    now: Timestamp,
) -> LeaseSpec {
    let existed = previous.is_some();
    let previous = previous.cloned().unwrap_or_default();
    let held_by_me = previous.holder_identity.as_deref() == Some(me);
    let seconds = i32::try_from(lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
    LeaseSpec {
        holder_identity: Some(me.to_owned()),
        lease_duration_seconds: Some(seconds),
        acquire_time: if held_by_me {
            previous.acquire_time.clone()
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        // A new holder is a transition, also after a release (as client-go
        // counts); a lease created just now starts at 0.
        lease_transitions: Some(if held_by_me || !existed {
            previous.lease_transitions.unwrap_or(0)
        } else {
            previous.lease_transitions.unwrap_or(0).saturating_add(1)
        }),
        ..previous
    }
}

/// Handle to a running election: the `is_leader` and role channels.
#[derive(Debug, Clone)]
pub struct LeaderHandle {
    is_leader: watch::Receiver<bool>,
    role: watch::Receiver<Role>,
}

impl LeaderHandle {
    /// A handle for a replica that runs without election: always leader.
    pub fn always_leader() -> Self {
        let (_tx, is_leader) = watch::channel(true);
        let (_rtx, role) = watch::channel(Role::Leader);
        Self { is_leader, role }
    }

    /// Whether this replica may write now.
    pub fn is_leader(&self) -> bool {
        *self.is_leader.borrow()
    }

    /// A channel that changes when leadership is gained or lost.
    pub fn is_leader_channel(&self) -> watch::Receiver<bool> {
        self.is_leader.clone()
    }

    /// A channel of the detailed role (for readiness).
    pub fn role_channel(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }
}

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
        let result = match previous {
            Some(mut lease) => {
                // Keeps metadata.resourceVersion: the write fails with 409 if
                // anyone wrote since we read (invariant 1).
                lease.spec = Some(spec);
                tokio::time::timeout(timeout, self.api.replace(&self.config.name, &pp, &lease))
                    .await
            }
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        namespace: Some(self.config.namespace.clone()),
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

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(15);

    fn held_by(holder: &str) -> LeaseRecord {
        LeaseRecord {
            holder: Some(holder.into()),
            duration_seconds: Some(15),
            renew_time: Some(Timestamp::UNIX_EPOCH),
            transitions: 0,
        }
    }

    fn config() -> LeaseConfig {
        LeaseConfig {
            name: "hostmesh-operator".into(),
            namespace: "hostmesh-system".into(),
            identity: "a".into(),
            lease_duration: LEASE,
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    #[test]
    fn free_lease_is_acquired_at_once() {
        let t = Instant::now();
        assert_eq!(
            decide(&LeaseRecord::default(), t, t, "a", LEASE),
            Decision::Acquire
        );
    }

    #[test]
    fn own_lease_is_renewed() {
        let t = Instant::now();
        assert_eq!(decide(&held_by("a"), t, t, "a", LEASE), Decision::Renew);
    }

    #[test]
    fn live_lease_of_another_is_waited_for_until_expiry_on_our_clock() {
        let seen = Instant::now();
        let rec = held_by("b");
        assert_eq!(
            decide(&rec, seen, seen + Duration::from_secs(5), "a", LEASE),
            Decision::Wait {
                holder: "b".into(),
                remaining: Duration::from_secs(10)
            }
        );
        // Exactly at expiry, the lease can be taken.
        assert_eq!(
            decide(&rec, seen, seen + LEASE, "a", LEASE),
            Decision::Acquire
        );
    }

    #[test]
    fn lease_duration_from_the_record_wins_over_ours() {
        let seen = Instant::now();
        let mut rec = held_by("b");
        rec.duration_seconds = Some(1);
        assert_eq!(
            decide(&rec, seen, seen + Duration::from_secs(1), "a", LEASE),
            Decision::Acquire
        );
        rec.duration_seconds = Some(0);
        assert!(matches!(
            decide(&rec, seen, seen + Duration::from_secs(1), "a", LEASE),
            Decision::Wait { .. }
        ));
    }

    #[test]
    fn leader_steps_down_at_the_renew_deadline_before_the_lease_expires() {
        let c = config();
        let renewed = Instant::now();
        assert!(!should_step_down(
            renewed,
            renewed + Duration::from_secs(9),
            c.renew_deadline
        ));
        assert!(should_step_down(
            renewed,
            renewed + c.renew_deadline,
            c.renew_deadline
        ));
        // Invariant 3: a standby that saw the same renewal at the same time
        // cannot take over before the leader has stepped down.
        let standby_takeover = renewed + c.lease_duration;
        assert!(should_step_down(
            renewed,
            standby_takeover,
            c.renew_deadline
        ));
    }

    #[test]
    fn next_spec_counts_transitions_only_when_the_holder_changes() {
        let now = Timestamp::from_second(1_000).expect("valid");
        let first = next_spec(None, "a", LEASE, now);
        assert_eq!(first.holder_identity.as_deref(), Some("a"));
        assert_eq!(first.lease_duration_seconds, Some(15));
        assert_eq!(first.lease_transitions, Some(0));
        assert_eq!(first.acquire_time, Some(MicroTime(now)));

        let later = Timestamp::from_second(1_002).expect("valid");
        let renewed = next_spec(Some(&first), "a", LEASE, later);
        assert_eq!(renewed.lease_transitions, Some(0));
        assert_eq!(renewed.acquire_time, Some(MicroTime(now)), "kept on renew");
        assert_eq!(renewed.renew_time, Some(MicroTime(later)));

        let taken = next_spec(Some(&renewed), "b", LEASE, later);
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
        assert_eq!(taken.lease_transitions, Some(1));
        assert_eq!(taken.acquire_time, Some(MicroTime(later)));

        let released = LeaseSpec {
            holder_identity: None,
            ..taken
        };
        let after_release = next_spec(Some(&released), "a", LEASE, later);
        assert_eq!(after_release.lease_transitions, Some(2));
    }

    #[test]
    fn timing_rules_are_checked_with_the_flag_names() {
        assert!(config().validate().is_ok());
        let mut c = config();
        c.renew_deadline = LEASE;
        let msg = c.validate().expect_err("deadline too long").to_string();
        assert!(msg.contains("--leader-elect-renew-deadline"), "{msg}");
        let mut c = config();
        c.retry_period = Duration::from_secs(10);
        let msg = c.validate().expect_err("retry too long").to_string();
        assert!(msg.contains("--leader-elect-retry-period"), "{msg}");
        let mut c = config();
        c.lease_duration = Duration::from_millis(500);
        c.renew_deadline = Duration::from_millis(400);
        c.retry_period = Duration::from_millis(100);
        let msg = c.validate().expect_err("sub-second lease").to_string();
        assert!(msg.contains("at least 1s"), "{msg}");
    }

    #[test]
    fn durations_parse_with_units_and_reject_garbage() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("15"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(
            parse_duration("1d")
                .expect_err("unit")
                .contains("use ms, s, m or h")
        );
        assert!(
            parse_duration("s")
                .expect_err("no number")
                .contains("`15s`")
        );
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn election_off_needs_no_namespace_and_on_resolves_identity() {
        let args = LeaderElectionArgs {
            leader_elect: false,
            leader_elect_lease: "hostmesh-operator".into(),
            leader_elect_namespace: None,
            leader_elect_identity: None,
            leader_elect_lease_duration: LEASE,
            leader_elect_renew_deadline: Duration::from_secs(10),
            leader_elect_retry_period: Duration::from_secs(2),
        };
        assert_eq!(args.config().expect("off"), None);
        let on = LeaderElectionArgs {
            leader_elect: true,
            leader_elect_namespace: Some("ops".into()),
            ..args
        };
        let c = on.config().expect("valid").expect("on");
        assert_eq!(c.namespace, "ops");
        assert!(!c.identity.is_empty());
    }

    #[test]
    fn always_leader_handle_reports_leader() {
        let h = LeaderHandle::always_leader();
        assert!(h.is_leader());
        assert_eq!(*h.role_channel().borrow(), Role::Leader);
    }
}
