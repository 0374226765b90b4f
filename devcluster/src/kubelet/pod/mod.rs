//! One worker per pod bound to this node: it prepares the pod's volumes,
//! runs its init containers in order and then its containers, restarts them
//! per `restartPolicy` with back-off, runs their probes, writes the pod's
//! status, and finishes the pod's deletion.
//!
//! Invariants:
//! 1. The worker is the only writer of its pod's status.
//! 2. Every started process group is registered in `Shared::groups` before
//!    the worker can lose track of it, and removed only after the group was
//!    sent SIGKILL following the leader's exit.
//! 3. Stopping a pod sends SIGTERM to every container's group, waits at most
//!    the grace period, then sends SIGKILL; containers are not restarted
//!    while the pod stops.
//! 4. The pod's IP is released only after all its processes are gone and
//!    its sandbox is torn down; the sandbox exists before the first
//!    container starts.
//! 5. A pod that was already Succeeded or Failed when the worker took it is
//!    left untouched (no processes, no status writes) until it is deleted.
//! 6. Ephemeral containers (`kubectl debug`) get a slot when they appear in
//!    the spec and start once, in the pod's sandbox, whether or not the
//!    init containers are done; they are never restarted, never probed,
//!    never ready, and count for neither the phase nor readiness. One that
//!    already ended before the kubelet (re)started is not started again.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodCondition, Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::env::{
    Lookups, PodFacts, TokenSpec, referenced_objects, resolve_env, token_key, token_specs,
};
use super::error::{KubeletError, Result};
use super::events;
use super::launch;
use super::logrotate;
use super::logs;
use super::net::{ApiService, Sandbox};
use super::probe::{self, ProbeSpec};
use super::process::{self, Launch, Namespace, Output};
use super::shared::{ExecTarget, PodEntry, Shared, lock, pod_key};
use super::status::{ContainerRun, Ctr, StatusInput, pod_status, qos_class};
use super::volumes::{create_mount_targets, prepare_volumes};

mod exit;
mod sandbox;
mod start;

/// What the pod loop tells a worker.
#[derive(Debug, Clone)]
pub(crate) enum Update {
    /// The latest version of the pod.
    Pod(Box<Pod>),
    /// The pod is no longer in the API server.
    Gone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProbeKind {
    Startup,
    Readiness,
    Liveness,
}

enum Event {
    Exited {
        init: bool,
        idx: usize,
        run_id: u64,
        status: std::process::ExitStatus,
    },
    Probed {
        idx: usize,
        run_id: u64,
        kind: ProbeKind,
        result: Result<(), String>,
    },
}

struct ProbeState {
    spec: ProbeSpec,
    next_at: Instant,
    successes: u32,
    failures: u32,
    in_flight: bool,
}

struct Slot {
    ctr: Ctr,
    field: String,
    init: bool,
    /// An ephemeral container (invariant 6).
    ephemeral: bool,
    run_id: u64,
    pgid: Option<i32>,
    started: Option<Instant>,
    next_start: Option<Instant>,
    backoff: Duration,
    ever_started: bool,
    startup: Option<ProbeState>,
    readiness: Option<ProbeState>,
    liveness: Option<ProbeState>,
}

const RETRY: Duration = Duration::from_secs(2);
/// Longest wait for one API call from a pod worker.
const API_TIMEOUT: Duration = Duration::from_secs(10);

/// Bounds one API call, so a hung API server cannot hold a pod worker (and
/// with it the kubelet's shutdown) for long.
async fn bounded<T>(
    action: impl Fn() -> String,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(KubeletError::api(action(), e)),
        Err(_) => Err(KubeletError::ApiTimeout {
            action: action(),
            timeout: API_TIMEOUT,
        }),
    }
}
const KILL_WAIT: Duration = Duration::from_secs(10);

/// Runs the worker for `pod` until the pod is deleted or the kubelet stops.
pub(crate) async fn run(shared: Arc<Shared>, pod: Pod, updates: watch::Receiver<Update>) {
    let mut worker = match Worker::new(shared.clone(), pod) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "cannot take pod");
            return;
        }
    };
    worker.sync_ephemeral();
    worker.main_loop(updates).await;
    worker.cleanup().await;
}

struct Worker {
    shared: Arc<Shared>,
    pod: Pod,
    ns: String,
    name: String,
    uid: String,
    dir: PathBuf,
    ip: Ipv4Addr,
    owns_ip: bool,
    /// The pod gets a sandbox (sandbox network, not `hostNetwork`, not inert).
    sandboxed: bool,
    sandbox: Option<Sandbox>,
    /// The `kubernetes` Service inside the sandbox, when it is served there.
    api: Option<ApiService>,
    inert: bool,
    start_time: Timestamp,
    /// Init containers, then containers, then ephemeral containers.
    slots: Vec<Slot>,
    n_init: usize,
    /// How many regular containers follow the init containers.
    n_main: usize,
    next_init: usize,
    init_failed: bool,
    volumes: Option<BTreeMap<String, PathBuf>>,
    lookups: Lookups,
    retry_at: Option<Instant>,
    write_retry_at: Option<Instant>,
    stopping: bool,
    tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
    written: Option<serde_json::Value>,
    conditions: Vec<PodCondition>,
    running: Arc<Mutex<BTreeSet<String>>>,
    targets: Arc<Mutex<BTreeMap<String, ExecTarget>>>,
}

fn restart_policy(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.clone())
        .unwrap_or_else(|| "Always".into())
}

fn phase_of(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

impl Worker {
    fn new(shared: Arc<Shared>, pod: Pod) -> Result<Self> {
        let (ns, name) = pod_key(&pod);
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if uid.is_empty() || uid.contains('/') || uid.contains("..") {
            return Err(KubeletError::PodSpec(format!(
                "pod {ns}/{name}: metadata.uid {uid:?} cannot name a directory"
            )));
        }
        let dir = shared.pod_dir(&uid);
        let inert = matches!(phase_of(&pod), Some("Succeeded" | "Failed"));
        let reported: Option<Ipv4Addr> = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse().ok());
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        let sandboxed = !inert && !host_network && shared.network.is_some();
        let (ip, owns_ip) = if inert {
            (reported.unwrap_or(Ipv4Addr::UNSPECIFIED), false)
        } else if host_network {
            // Like Kubernetes: a host-network pod's IP is the node's.
            (shared.config.node_ip, false)
        } else {
            let mut pool = lock(&shared.ips);
            match reported.filter(|ip| pool.reserve(*ip)) {
                Some(ip) => (ip, true),
                None => (pool.allocate()?, true),
            }
        };
        let spec = pod.spec.clone().unwrap_or_default();
        let mut slots = Vec::new();
        for (i, c) in spec.init_containers.iter().flatten().enumerate() {
            slots.push(Slot::new(
                c.name.clone(),
                c.image.clone(),
                format!("spec.initContainers[{i}]"),
                true,
                &shared,
            ));
        }
        let n_init = slots.len();
        let n_main = spec.containers.len();
        for (i, c) in spec.containers.iter().enumerate() {
            slots.push(Slot::new(
                c.name.clone(),
                c.image.clone(),
                format!("spec.containers[{i}]"),
                false,
                &shared,
            ));
        }
        for s in &mut slots[..n_init.min(1)] {
            s.ctr.run = ContainerRun::waiting("PodInitializing", None);
        }
        if n_init == 0 {
            for s in &mut slots {
                s.ctr.run = ContainerRun::waiting("ContainerCreating", None);
            }
        }
        // Containers that ran under an earlier kubelet keep their restart
        // counts; starting them again counts as a restart.
        if !inert && let Some(status) = &pod.status {
            let previous = status
                .init_container_statuses
                .iter()
                .flatten()
                .chain(status.container_statuses.iter().flatten());
            for prev in previous {
                let ran = prev.restart_count > 0
                    || prev
                        .state
                        .as_ref()
                        .is_some_and(|st| st.running.is_some() || st.terminated.is_some());
                if let Some(slot) = slots.iter_mut().find(|s| s.ctr.name == prev.name) {
                    slot.ctr.restarts = prev.restart_count.max(0);
                    slot.ever_started = ran;
                }
            }
        }
        let running: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let targets: Arc<Mutex<BTreeMap<String, ExecTarget>>> = Arc::default();
        lock(&shared.pods).insert(
            (ns.clone(), name.clone()),
            PodEntry {
                uid: uid.clone(),
                dir: dir.clone(),
                running: running.clone(),
                targets: targets.clone(),
            },
        );
        let (tx, rx) = mpsc::unbounded_channel();
        let conditions = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        tracing::info!(pod = %format!("{ns}/{name}"), %ip, inert, "taking pod");
        Ok(Self {
            shared,
            pod,
            ns,
            name,
            uid,
            dir,
            ip,
            owns_ip,
            sandboxed,
            sandbox: None,
            api: None,
            inert,
            start_time: Timestamp::now(),
            slots,
            n_init,
            n_main,
            next_init: 0,
            init_failed: false,
            volumes: None,
            lookups: Lookups::default(),
            retry_at: None,
            write_retry_at: None,
            stopping: false,
            tx,
            rx,
            written: None,
            conditions,
            running,
            targets,
        })
    }

    fn facts(&self) -> PodFacts {
        PodFacts {
            pod_ip: self.ip,
            host_ip: self.shared.config.node_ip,
            node_name: self.shared.config.node_name.clone(),
        }
    }

    fn key(&self) -> String {
        format!("{}/{}", self.ns, self.name)
    }

    fn grace(&self) -> Duration {
        let secs = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                self.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30);
        Duration::from_secs(secs.max(0) as u64)
    }

    fn terminal(&self) -> bool {
        let phase = self.phase();
        phase == "Succeeded" || phase == "Failed"
    }

    async fn main_loop(&mut self, mut updates: watch::Receiver<Update>) {
        let shutdown = self.shared.shutdown.clone();
        loop {
            if self.pod.metadata.deletion_timestamp.is_some() {
                let grace = self.grace();
                self.stop_all(grace).await;
                if !self.inert {
                    self.write_status().await;
                }
                self.finish_deletion().await;
                return;
            }
            if !self.inert && !self.stopping {
                self.progress().await;
                self.write_status().await;
            }
            let wake = self.next_wake();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    let grace = self.grace().min(self.shared.config.shutdown_grace);
                    self.stop_all(grace).await;
                    return;
                }
                changed = updates.changed() => {
                    let update = match changed {
                        Ok(()) => updates.borrow_and_update().clone(),
                        Err(_) => Update::Gone,
                    };
                    match update {
                        Update::Pod(p) => {
                            self.pod = *p;
                            self.sync_ephemeral();
                        }
                        Update::Gone => {
                            tracing::info!(pod = %self.key(), "pod removed from the API server; stopping it");
                            let grace = self.grace().min(self.shared.config.shutdown_grace);
                            self.stop_all(grace).await;
                            return;
                        }
                    }
                }
                Some(event) = self.rx.recv() => self.handle(event),
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    fn next_wake(&self) -> Instant {
        let far = Instant::now() + Duration::from_secs(3600);
        if self.inert || self.stopping {
            return far;
        }
        let mut wake = far;
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                wake = wake.min(t);
            }
        };
        consider(self.retry_at);
        consider(self.write_retry_at);
        let initialized = self.next_init >= self.n_init;
        let blocked = self.init_failed || self.terminal();
        for (i, s) in self.slots.iter().enumerate() {
            if s.pgid.is_none() {
                // Only a container that may start now has a start time worth waking for.
                let eligible = if i < self.n_init {
                    i == self.next_init
                } else {
                    initialized || s.ephemeral
                };
                if eligible && !blocked {
                    consider(s.next_start);
                }
            } else {
                let probes = if s.ctr.started {
                    [&s.readiness, &s.liveness]
                } else {
                    [&s.startup, &None]
                };
                for p in probes.into_iter().flatten() {
                    if !p.in_flight {
                        consider(Some(p.next_at));
                    }
                }
            }
        }
        wake
    }

    /// Starts what is due: volumes, the next init container, containers,
    /// probes.
    async fn progress(&mut self) {
        let now = Instant::now();
        if self.retry_at.is_some_and(|t| t > now) {
            return;
        }
        self.retry_at = None;
        if self.volumes.is_none() {
            match self.prepare().await {
                Ok(v) => {
                    self.volumes = Some(v);
                }
                Err(e) => {
                    let reason = match e {
                        KubeletError::MissingReference(_) | KubeletError::PodSpec(_) => {
                            "CreateContainerConfigError"
                        }
                        _ => "ContainerCreating",
                    };
                    tracing::warn!(pod = %self.key(), error = %e, "cannot prepare pod volumes");
                    for s in self.slots.iter_mut().filter(|s| !s.ever_started) {
                        s.ctr.run = ContainerRun::waiting(reason, Some(e.to_string()));
                    }
                    self.retry_at = Some(now + RETRY);
                    return;
                }
            }
        }
        if self.init_failed || self.terminal() {
            return;
        }
        if self.next_init < self.n_init {
            let i = self.next_init;
            if self.slots[i].pgid.is_none() && self.slots[i].next_start.is_none_or(|t| t <= now) {
                self.start(i).await;
            }
        } else {
            for i in self.n_init..self.n_init + self.n_main {
                if self.slots[i].pgid.is_none()
                    && self.slots[i].next_start.is_some_and(|t| t <= now)
                {
                    self.start(i).await;
                }
            }
        }
        // Ephemeral containers do not wait for the init containers
        // (invariant 6).
        for i in self.n_init + self.n_main..self.slots.len() {
            if self.slots[i].pgid.is_none() && self.slots[i].next_start.is_some_and(|t| t <= now) {
                self.start(i).await;
            }
        }
        self.run_probes(now);
    }

    fn phase(&self) -> &'static str {
        self.with_input(super::status::phase)
    }

    /// Calls `f` with the status input of the pod as it is now.
    fn with_input<R>(&self, f: impl FnOnce(&StatusInput<'_>) -> R) -> R {
        let init: Vec<Ctr> = self.slots[..self.n_init]
            .iter()
            .map(|s| s.ctr.clone())
            .collect();
        let main: Vec<Ctr> = self.slots[self.n_init..self.n_init + self.n_main]
            .iter()
            .map(|s| s.ctr.clone())
            .collect();
        let ephemeral: Vec<Ctr> = self.slots[self.n_init + self.n_main..]
            .iter()
            .map(|s| s.ctr.clone())
            .collect();
        let input = StatusInput {
            restart_policy: self
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.restart_policy.as_deref())
                .unwrap_or("Always"),
            init: &init,
            initialized: self.next_init >= self.n_init,
            init_failed: self.init_failed,
            main: &main,
            ephemeral: &ephemeral,
            pod_ip: self.ip,
            host_ip: self.shared.config.node_ip,
            start_time: self.start_time,
            qos_class: self
                .pod
                .spec
                .as_ref()
                .map(qos_class)
                .unwrap_or_else(|| "BestEffort".into()),
            previous: &self.conditions,
        };
        f(&input)
    }

    async fn write_status(&mut self) {
        let status = self.with_input(pod_status);
        let mut value = match serde_json::to_value(&status) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, "cannot serialize pod status");
                return;
            }
        };
        if let Some(obj) = value.as_object_mut() {
            obj.entry("reason").or_insert(serde_json::Value::Null);
            obj.entry("message").or_insert(serde_json::Value::Null);
        }
        if self.written.as_ref() == Some(&value) {
            self.write_retry_at = None;
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), &self.ns);
        let patch = serde_json::json!({ "status": value });
        let (params, body) = (PatchParams::default(), Patch::Merge(&patch));
        let call = api.patch_status(&self.name, &params, &body);
        match bounded(|| format!("update status of pod {}", self.key()), call).await {
            Ok(_) => {
                self.conditions = status.conditions.clone().unwrap_or_default();
                self.written = Some(value);
                self.write_retry_at = None;
            }
            Err(e) => {
                tracing::warn!(pod = %self.key(), error = %e, "cannot write pod status; will retry");
                self.write_retry_at = Some(Instant::now() + RETRY);
            }
        }
    }

    async fn finish_deletion(&mut self) {
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), &self.ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match bounded(
            || format!("delete pod {}", self.key()),
            api.delete(&self.name, &dp),
        )
        .await
        {
            Ok(_) => tracing::info!(pod = %self.key(), "pod deleted"),
            Err(KubeletError::Api {
                source: kube::Error::Api(s),
                ..
            }) if s.code == 404 || s.code == 409 => {}
            Err(e) => tracing::warn!(pod = %self.key(), error = %e, "cannot finish pod deletion"),
        }
    }

    async fn cleanup(&mut self) {
        {
            let mut groups = lock(&self.shared.groups);
            for s in &self.slots {
                if let Some(pgid) = s.pgid {
                    process::signal_group(pgid, libc::SIGKILL);
                    groups.remove(&pgid);
                }
            }
        }
        if let Some(sandbox) = self.sandbox.take() {
            sandbox.teardown().await;
        }
        if self.owns_ip {
            lock(&self.shared.ips).release(self.ip);
        }
        let mut pods = lock(&self.shared.pods);
        if pods
            .get(&(self.ns.clone(), self.name.clone()))
            .is_some_and(|e| e.uid == self.uid)
        {
            pods.remove(&(self.ns.clone(), self.name.clone()));
        }
        drop(pods);
        self.shared.log_cuts.forget_under(&self.dir);
        // Tokens and secrets go with the pod, also when the kubelet stops.
        if let Err(e) = crate::private_dir::remove(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove pod directory");
        }
    }
}

impl Worker {
    /// Gives each ephemeral container of the spec that has no slot yet one
    /// (invariant 6): due now, unless it already ended before this worker
    /// took the pod, or the pod is finished or going away.
    fn sync_ephemeral(&mut self) {
        let Some(spec) = self.pod.spec.as_ref() else {
            return;
        };
        let known: BTreeSet<String> = self.slots.iter().map(|s| s.ctr.name.clone()).collect();
        let fresh: Vec<(usize, String, Option<String>)> = spec
            .ephemeral_containers
            .iter()
            .flatten()
            .enumerate()
            .filter(|(_, c)| !known.contains(&c.name))
            .map(|(i, c)| (i, c.name.clone(), c.image.clone()))
            .collect();
        let ended = self.inert || self.stopping || self.pod.metadata.deletion_timestamp.is_some();
        for (i, name, image) in fresh {
            let mut slot = Slot::new(
                name.clone(),
                image,
                format!("spec.ephemeralContainers[{i}]"),
                false,
                &self.shared,
            );
            slot.ephemeral = true;
            slot.ctr.run = ContainerRun::waiting("ContainerCreating", None);
            let before = self
                .pod
                .status
                .as_ref()
                .and_then(|s| s.ephemeral_container_statuses.as_ref())
                .and_then(|all| all.iter().find(|c| c.name == name))
                .and_then(|c| c.state.as_ref()?.terminated.clone());
            if let Some(t) = before {
                slot.ever_started = true;
                slot.next_start = None;
                slot.ctr.run = ContainerRun::Terminated {
                    pid: t
                        .container_id
                        .as_deref()
                        .and_then(|id| id.strip_prefix("process://")?.parse().ok()),
                    exit_code: t.exit_code,
                    signal: t.signal,
                    reason: t.reason.unwrap_or_else(|| "Error".into()),
                    message: t.message,
                    started_at: t.started_at.map(|s| s.0),
                    finished_at: t.finished_at.map(|f| f.0).unwrap_or_else(Timestamp::now),
                };
            } else if ended || self.terminal() {
                slot.next_start = None;
            }
            tracing::info!(pod = %self.key(), container = %name, "ephemeral container added");
            self.slots.push(slot);
        }
    }
}

impl Slot {
    fn new(
        name: String,
        image: Option<String>,
        field: String,
        init: bool,
        shared: &Shared,
    ) -> Self {
        Self {
            ctr: Ctr::new(
                &name,
                image.as_deref().unwrap_or_default(),
                "PodInitializing",
            ),
            field,
            init,
            ephemeral: false,
            run_id: 0,
            pgid: None,
            started: None,
            next_start: if init { None } else { Some(Instant::now()) },
            backoff: shared.config.restart_backoff,
            ever_started: false,
            startup: None,
            readiness: None,
            liveness: None,
        }
    }
}
