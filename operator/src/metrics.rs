//! The operator's Prometheus metrics: one [`Metrics`] value, shared by the
//! controllers, the supervision hub and the status writer through an `Arc`,
//! and encoded in the OpenMetrics text format for `/metrics` (see `health`).
//!
//! Invariants:
//! 1. Every metric name starts with `hostmesh_`; label values are bounded
//!    sets (controller names, error labels, phases, write outcomes), never
//!    object names, so cardinality does not grow with the number of Worlds.
//! 2. Recording never blocks on I/O and never fails: a metrics call is safe
//!    on any hot path.
//! 3. `hostmesh_worlds{phase}` always lists every phase it has ever seen
//!    (the known phases from the start), set to zero when no World has it.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// World phases pre-registered in `hostmesh_worlds` (DESIGN.md, API).
pub const WORLD_PHASES: [&str; 8] = [
    "Pending",
    "Creating",
    "Running",
    "Degraded",
    "Failed",
    "Succeeded",
    "Suspended",
    "Terminating",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    controller: String,
    error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusWriteLabels {
    kind: String,
    outcome: String,
}

/// What happened to one status write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusWriteOutcome {
    /// The API server accepted the write.
    Applied,
    /// The write lost an optimistic-concurrency race (HTTP 409).
    Conflict,
    /// The API server or the connection returned another error.
    Error,
    /// The write was coalesced into a later one or found unchanged.
    Coalesced,
    /// The write was dropped: queue full, timed out, or this replica is not
    /// the leader.
    Dropped,
}

impl StatusWriteOutcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Conflict => "conflict",
            Self::Error => "error",
            Self::Coalesced => "coalesced",
            Self::Dropped => "dropped",
        }
    }
}

/// All operator metrics, registered in one registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ControllerLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    durations: Family<ControllerLabels, Histogram>,
    worlds: Family<PhaseLabels, Gauge>,
    seen_phases: Mutex<BTreeSet<String>>,
    heartbeat_lag: Histogram,
    status_writes: Family<StatusWriteLabels, Counter>,
    api_requests: Family<VerbLabels, Counter>,
    leader: Gauge,
    heartbeats: Counter,
    agent_pushes: Counter,
    hub_triggers: Family<KindLabels, Counter>,
    recovery: Family<PhaseLabels, Histogram>,
    failures: Family<FailureLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    kind: String,
    cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabels {
    verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

fn recovery_histogram() -> Histogram {
    // 10 ms .. ~22 min: a proc restart takes well under a second, a host
    // replacement minutes.
    Histogram::new(exponential_buckets(0.01, 2.0, 18))
}

fn reconcile_histogram() -> Histogram {
    // 1 ms .. ~33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("hostmesh");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconcile runs, by controller",
            reconciles.clone(),
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Failed reconcile runs, by controller and error label",
            errors.clone(),
        );
        let durations = Family::<ControllerLabels, Histogram>::new_with_constructor(
            reconcile_histogram as fn() -> Histogram,
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Reconcile run duration, by controller",
            prometheus_client::registry::Unit::Seconds,
            durations.clone(),
        );
        let worlds = Family::<PhaseLabels, Gauge>::default();
        registry.register("worlds", "Worlds by phase", worlds.clone());
        // 5 ms .. ~41 s: heartbeats come every second; lag beyond the health
        // timeout is what expires hosts.
        let heartbeat_lag = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        registry.register_with_unit(
            "heartbeat_lag",
            "Time between consecutive agent heartbeats seen by the supervision hub",
            prometheus_client::registry::Unit::Seconds,
            heartbeat_lag.clone(),
        );
        let heartbeats = Counter::default();
        registry.register(
            "heartbeats",
            "Agent heartbeats received by the supervision hub",
            heartbeats.clone(),
        );
        let agent_pushes = Counter::default();
        registry.register(
            "agent_pushes",
            "Messages from agents handled by the supervision hub (heartbeats and proc state changes)",
            agent_pushes.clone(),
        );
        let hub_triggers = Family::<KindLabels, Counter>::default();
        registry.register(
            "hub_triggers",
            "Coalesced reconcile requests the supervision hub sent, by kind",
            hub_triggers.clone(),
        );
        let status_writes = Family::<StatusWriteLabels, Counter>::default();
        registry.register(
            "status_writes",
            "Status subresource writes, by kind and outcome",
            status_writes.clone(),
        );
        let api_requests = Family::<VerbLabels, Counter>::default();
        registry.register(
            "api_requests",
            "Requests the operator sent to the API server, by verb (get, list, watch, create, patch, update, delete)",
            api_requests.clone(),
        );
        let leader = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
        registry.register(
            "leader",
            "1 when this replica holds the leader lease (or runs without leader election), else 0",
            leader.clone(),
        );
        let recovery = Family::<PhaseLabels, Histogram>::new_with_constructor(
            recovery_histogram as fn() -> Histogram,
        );
        registry.register_with_unit(
            "recovery",
            "ProcMesh incident phase durations (status.incidents): detect (failure to report), decide (report to policy action), pods (action to hosts ready), procs (hosts ready to procs running), total",
            prometheus_client::registry::Unit::Seconds,
            recovery.clone(),
        );
        let failures = Family::<FailureLabels, Counter>::default();
        registry.register(
            "failures",
            "Failures by kind (World: a host that failed or went; ProcMesh: an incident's root) and cause (Infrastructure, User, Unknown; status firstFailure.cause)",
            failures.clone(),
        );
        let metrics = Self {
            registry,
            recovery,
            failures,
            reconciles,
            errors,
            durations,
            worlds,
            seen_phases: Mutex::new(WORLD_PHASES.iter().map(|p| (*p).to_owned()).collect()),
            heartbeat_lag,
            status_writes,
            api_requests,
            leader,
            heartbeats,
            agent_pushes,
            hub_triggers,
        };
        for phase in WORLD_PHASES {
            metrics.worlds.get_or_create(&phase_labels(phase)).set(0);
        }
        for kind in ["World", "ProcMesh"] {
            for cause in hostmesh_crds::cause::FailureCause::ALL {
                let _ = metrics.failures.get_or_create(&failure_labels(kind, cause));
            }
        }
        metrics
    }

    /// Counts one reconcile of `controller` (`world`, `procmesh`) and returns
    /// a timer that records its duration when dropped.
    pub fn reconcile(&self, controller: &str) -> ReconcileTimer<'_> {
        let labels = ControllerLabels {
            controller: controller.to_owned(),
        };
        self.reconciles.get_or_create(&labels).inc();
        ReconcileTimer {
            metrics: self,
            labels: Some(labels),
            start: Instant::now(),
        }
    }

    /// Counts one failed reconcile; `error` is the error's short label (a
    /// bounded set, the same label used for Events).
    pub fn reconcile_error(&self, controller: &str, error: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                controller: controller.to_owned(),
                error: error.to_owned(),
            })
            .inc();
    }

    /// Sets the number of Worlds in each phase. Phases seen before but absent
    /// from `counts` are set to zero (invariant 3).
    pub fn set_worlds_by_phase<'a>(&self, counts: impl IntoIterator<Item = (&'a str, i64)>) {
        let mut seen = self
            .seen_phases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut given = BTreeSet::new();
        for (phase, count) in counts {
            self.worlds.get_or_create(&phase_labels(phase)).set(count);
            given.insert(phase.to_owned());
            seen.insert(phase.to_owned());
        }
        for phase in seen.iter().filter(|p| !given.contains(*p)) {
            self.worlds.get_or_create(&phase_labels(phase)).set(0);
        }
    }

    /// Records one heartbeat and the time since the previous one from the
    /// same agent (`None` for an agent's first heartbeat).
    pub fn observe_heartbeat(&self, lag: Option<Duration>) {
        self.heartbeats.inc();
        if let Some(lag) = lag {
            self.heartbeat_lag.observe(lag.as_secs_f64());
        }
    }

    /// Adds hub activity since the last call: agent pushes handled and
    /// reconcile triggers sent for Worlds and ProcMeshes.
    pub fn add_hub_activity(&self, pushes: u64, world_triggers: u64, mesh_triggers: u64) {
        self.agent_pushes.inc_by(pushes);
        for (kind, n) in [("World", world_triggers), ("ProcMesh", mesh_triggers)] {
            if n > 0 {
                self.hub_triggers
                    .get_or_create(&KindLabels { kind: kind.into() })
                    .inc_by(n);
            }
        }
    }

    /// Counts one status write of `kind` (`World`, `ProcMesh`).
    pub fn status_write(&self, kind: &str, outcome: StatusWriteOutcome) {
        self.status_writes
            .get_or_create(&StatusWriteLabels {
                kind: kind.to_owned(),
                outcome: outcome.as_str().to_owned(),
            })
            .inc();
    }

    /// Counts one request to the API server (`verb` as Kubernetes names
    /// it: `get`, `list`, `watch`, `create`, `patch`, `update`, `delete`).
    pub fn api_request(&self, verb: &'static str) {
        self.api_requests
            .get_or_create(&VerbLabels {
                verb: verb.to_owned(),
            })
            .inc();
    }

    /// Records one completed recovery phase of a ProcMesh incident
    /// (`detect`, `decide`, `pods`, `procs`, `total`).
    pub fn observe_recovery(&self, phase: &str, took: Duration) {
        self.recovery
            .get_or_create(&phase_labels(phase))
            .observe(took.as_secs_f64());
    }

    /// Counts one failure of a `kind` (`World`, `ProcMesh`) object by its
    /// cause.
    pub fn failure(&self, kind: &str, cause: hostmesh_crds::cause::FailureCause) {
        self.failures
            .get_or_create(&failure_labels(kind, cause))
            .inc();
    }

    /// Records whether this replica is the leader.
    pub fn set_leader(&self, is_leader: bool) {
        self.leader.set(i64::from(is_leader));
    }

    /// Encodes every metric in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

fn failure_labels(kind: &str, cause: hostmesh_crds::cause::FailureCause) -> FailureLabels {
    FailureLabels {
        kind: kind.to_owned(),
        cause: cause.as_str().to_owned(),
    }
}

fn phase_labels(phase: &str) -> PhaseLabels {
    PhaseLabels {
        phase: phase.to_owned(),
    }
}

/// Records a reconcile's duration when dropped (so early returns and `?`
/// are timed too).
#[derive(Debug)]
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    labels: Option<ControllerLabels>,
    start: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        if let Some(labels) = self.labels.take() {
            self.metrics
                .durations
                .get_or_create(&labels)
                .observe(self.start.elapsed().as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Returns the value of the sample line starting with `prefix` followed
    /// by a space.
    fn sample(text: &str, prefix: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix)?.strip_prefix(' '))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn reconciles_errors_and_durations_are_counted_per_controller() {
        let m = Metrics::new();
        {
            let _t = m.reconcile("world");
        }
        {
            let _t = m.reconcile("world");
            m.reconcile_error("world", "kube_api");
        }
        drop(m.reconcile("procmesh"));
        let text = m.encode();
        assert_eq!(
            sample(&text, "hostmesh_reconciles_total{controller=\"world\"}"),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, "hostmesh_reconciles_total{controller=\"procmesh\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "hostmesh_reconcile_errors_total{controller=\"world\",error=\"kube_api\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "hostmesh_reconcile_duration_seconds_count{controller=\"world\"}"
            ),
            Some(2.0),
            "{text}"
        );
        assert!(text.contains("# TYPE hostmesh_reconcile_duration_seconds histogram"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn worlds_by_phase_lists_known_phases_and_zeroes_missing_ones() {
        let m = Metrics::new();
        let text = m.encode();
        for phase in WORLD_PHASES {
            assert_eq!(
                sample(&text, &format!("hostmesh_worlds{{phase=\"{phase}\"}}")),
                Some(0.0),
                "{phase} in {text}"
            );
        }
        m.set_worlds_by_phase([("Running", 3), ("Degraded", 1)]);
        m.set_worlds_by_phase([("Running", 4)]);
        let text = m.encode();
        assert_eq!(
            sample(&text, "hostmesh_worlds{phase=\"Running\"}"),
            Some(4.0)
        );
        assert_eq!(
            sample(&text, "hostmesh_worlds{phase=\"Degraded\"}"),
            Some(0.0)
        );
    }

    #[test]
    fn recovery_phases_are_a_histogram_per_phase() {
        let m = Metrics::new();
        m.observe_recovery("detect", Duration::from_millis(20));
        m.observe_recovery("total", Duration::from_secs(3));
        m.observe_recovery("total", Duration::from_secs(5));
        let text = m.encode();
        assert!(
            text.contains("# TYPE hostmesh_recovery_seconds histogram"),
            "{text}"
        );
        assert_eq!(
            sample(&text, "hostmesh_recovery_seconds_count{phase=\"total\"}"),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, "hostmesh_recovery_seconds_sum{phase=\"total\"}"),
            Some(8.0)
        );
        assert_eq!(
            sample(&text, "hostmesh_recovery_seconds_count{phase=\"detect\"}"),
            Some(1.0)
        );
    }

    #[test]
    fn heartbeats_status_writes_and_leader_are_recorded() {
        let m = Metrics::new();
        m.observe_heartbeat(None);
        m.observe_heartbeat(Some(Duration::from_millis(1200)));
        m.status_write("World", StatusWriteOutcome::Applied);
        m.status_write("World", StatusWriteOutcome::Applied);
        m.status_write("ProcMesh", StatusWriteOutcome::Conflict);
        m.set_leader(true);
        m.add_hub_activity(5, 2, 0);
        m.add_hub_activity(1, 0, 3);
        let text = m.encode();
        assert_eq!(sample(&text, "hostmesh_agent_pushes_total"), Some(6.0));
        assert_eq!(
            sample(&text, "hostmesh_hub_triggers_total{kind=\"World\"}"),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, "hostmesh_hub_triggers_total{kind=\"ProcMesh\"}"),
            Some(3.0)
        );
        assert_eq!(sample(&text, "hostmesh_heartbeats_total"), Some(2.0));
        assert_eq!(
            sample(&text, "hostmesh_heartbeat_lag_seconds_count"),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "hostmesh_heartbeat_lag_seconds_sum"),
            Some(1.2)
        );
        assert_eq!(
            sample(
                &text,
                "hostmesh_status_writes_total{kind=\"World\",outcome=\"applied\"}"
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                "hostmesh_status_writes_total{kind=\"ProcMesh\",outcome=\"conflict\"}"
            ),
            Some(1.0)
        );
        assert_eq!(sample(&text, "hostmesh_leader"), Some(1.0));
        m.set_leader(false);
        assert_eq!(sample(&m.encode(), "hostmesh_leader"), Some(0.0));
    }

    #[test]
    fn every_metric_has_the_hostmesh_prefix() {
        let m = Metrics::new();
        drop(m.reconcile("world"));
        for line in m.encode().lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("hostmesh_"), "{line}");
        }
    }
}
