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
//! 4. The pod's IP is released only after all its processes are gone.
//! 5. A pod that was already Succeeded or Failed when the worker took it is
//!    left untouched (no processes, no status writes) until it is deleted.

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
use super::logs;
use super::probe::{self, ProbeSpec};
use super::process::{self, Launch, Namespace, Output};
use super::shared::{PodEntry, Shared, lock};
use super::status::{Ctr, Run, StatusInput, pod_status, qos_class};
use super::volumes::{create_mount_targets, prepare_volumes};

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
    run_id: u64,
    pgid: Option<i32>,
    started: Option<Instant>,
    next_start: Option<Instant>,
    backoff: Duration,
    ever_started: bool,
    readiness: Option<ProbeState>,
    liveness: Option<ProbeState>,
}

const RETRY: Duration = Duration::from_secs(2);
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
    worker.main_loop(updates).await;
    worker.cleanup();
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
    inert: bool,
    start_time: Timestamp,
    slots: Vec<Slot>,
    n_init: usize,
    next_init: usize,
    init_failed: bool,
    volumes: Option<BTreeMap<String, PathBuf>>,
    lookups: Lookups,
    problem: Option<(String, String)>,
    retry_at: Option<Instant>,
    write_retry_at: Option<Instant>,
    stopping: bool,
    tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
    written: Option<serde_json::Value>,
    conditions: Vec<PodCondition>,
    running: Arc<Mutex<BTreeSet<String>>>,
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
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let dir = shared.pod_dir(&uid);
        let inert = matches!(phase_of(&pod), Some("Succeeded" | "Failed"));
        let reported: Option<Ipv4Addr> = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse().ok());
        let (ip, owns_ip) = if inert {
            (reported.unwrap_or(Ipv4Addr::UNSPECIFIED), false)
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
            s.ctr.run = Run::waiting("PodInitializing", None);
        }
        if n_init == 0 {
            for s in &mut slots {
                s.ctr.run = Run::waiting("ContainerCreating", None);
            }
        }
        let running: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        lock(&shared.pods).insert(
            (ns.clone(), name.clone()),
            PodEntry {
                uid: uid.clone(),
                dir: dir.clone(),
                running: running.clone(),
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
            inert,
            start_time: Timestamp::now(),
            slots,
            n_init,
            next_init: 0,
            init_failed: false,
            volumes: None,
            lookups: Lookups::default(),
            problem: None,
            retry_at: None,
            write_retry_at: None,
            stopping: false,
            tx,
            rx,
            written: None,
            conditions,
            running,
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
                        Update::Pod(p) => self.pod = *p,
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
                    initialized
                };
                if eligible && !blocked {
                    consider(s.next_start);
                }
            } else {
                for p in [&s.readiness, &s.liveness].into_iter().flatten() {
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
                    self.problem = None;
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
                        s.ctr.run = Run::waiting(reason, Some(e.to_string()));
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
            for i in self.n_init..self.slots.len() {
                if self.slots[i].pgid.is_none()
                    && self.slots[i].next_start.is_some_and(|t| t <= now)
                {
                    self.start(i).await;
                }
            }
        }
        self.run_probes(now);
    }

    /// Fetches the secrets and config maps the pod refers to, and with
    /// `tokens` the service account tokens its projected volumes ask for.
    async fn fetch_lookups(&self, tokens: bool) -> Result<Lookups> {
        let (secrets, cms) = referenced_objects(&self.pod);
        let client = self.shared.client.clone();
        let secret_api: Api<Secret> = Api::namespaced(client.clone(), &self.ns);
        let cm_api: Api<ConfigMap> = Api::namespaced(client, &self.ns);
        let mut lookups = Lookups::default();
        for name in secrets {
            let got = secret_api
                .get_opt(&name)
                .await
                .map_err(|e| KubeletError::api(format!("get secret {}/{name}", self.ns), e))?;
            lookups.secrets.insert(name, got);
        }
        for name in cms {
            let got = cm_api
                .get_opt(&name)
                .await
                .map_err(|e| KubeletError::api(format!("get configmap {}/{name}", self.ns), e))?;
            lookups.config_maps.insert(name, got);
        }
        for spec in token_specs(&self.pod).into_iter().filter(|_| tokens) {
            let token = self.request_token(&spec).await;
            lookups.tokens.insert(token_key(&spec), token);
        }
        Ok(lookups)
    }

    /// Asks the API server for a token of the pod's service account (what
    /// a projected `serviceAccountToken` source holds); `None` when it will
    /// not issue one.
    async fn request_token(&self, spec: &TokenSpec) -> Option<String> {
        let sa = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let request: TokenRequest = serde_json::from_value(serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": if spec.audience.is_empty() { vec![] } else { vec![spec.audience.clone()] },
                "expirationSeconds": spec.expiration_seconds.unwrap_or(3600),
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid},
            },
        }))
        .ok()?;
        let api: Api<ServiceAccount> = Api::namespaced(self.shared.client.clone(), &self.ns);
        match api
            .create_token_request(&sa, &PostParams::default(), &request)
            .await
        {
            Ok(r) => r.status.map(|s| s.token),
            Err(e) => {
                tracing::warn!(pod = %self.key(), serviceaccount = %sa, error = %e, "no service account token; the projected token file stays empty");
                None
            }
        }
    }

    async fn prepare(&mut self) -> Result<BTreeMap<String, PathBuf>> {
        let lookups = self.fetch_lookups(true).await?;
        let vol_dir = self.dir.join("volumes");
        std::fs::create_dir_all(self.dir.join("logs"))
            .map_err(|e| KubeletError::io("cannot create", self.dir.join("logs"), e))?;
        let volumes = prepare_volumes(&self.pod, &vol_dir, &lookups, &self.facts())?;
        self.lookups = lookups;
        Ok(volumes)
    }

    fn container_spec(&self, i: usize) -> Option<k8s_openapi::api::core::v1::Container> {
        let spec = self.pod.spec.as_ref()?;
        if i < self.n_init {
            spec.init_containers.as_ref()?.get(i).cloned()
        } else {
            spec.containers.get(i - self.n_init).cloned()
        }
    }

    fn build_launch(&self, i: usize) -> Result<(Launch, k8s_openapi::api::core::v1::Container)> {
        let slot = &self.slots[i];
        let container = self.container_spec(i).ok_or_else(|| {
            KubeletError::PodSpec(format!(
                "{}: container disappeared from the spec",
                slot.field
            ))
        })?;
        let env = resolve_env(
            &self.pod,
            &container,
            &slot.field,
            &self.facts(),
            &self.lookups,
        )?;
        let mut all = launch::service_env(self.shared.config.kubernetes_service.as_ref());
        all.extend(env);
        let env = all;
        let volumes = self.volumes.clone().unwrap_or_default();
        let launch = launch::build(
            &self.pod,
            &container,
            &slot.field,
            &self.shared.images,
            env,
            &volumes,
        )?;
        if !launch.mounts.is_empty() && !process::is_root() {
            return Err(KubeletError::PodSpec(format!(
                "{}.volumeMounts: mounting volumes needs a kubelet running as root (mount namespaces)",
                slot.field
            )));
        }
        create_mount_targets(&launch.mounts)?;
        Ok((launch, container))
    }

    async fn start(&mut self, i: usize) {
        let now = Instant::now();
        // Environment variables read secrets and config maps as they are now.
        let built = match self.fetch_lookups(false).await {
            Ok(lookups) => {
                self.lookups = lookups;
                self.build_launch(i)
            }
            Err(e) => Err(e),
        };
        let (launch, container) = match built {
            Ok(v) => v,
            Err(e) => {
                let reason = match e {
                    KubeletError::ImageNotMapped(_) => "ErrImageNeverPull",
                    _ => "CreateContainerConfigError",
                };
                let message = e.to_string();
                let slot = &mut self.slots[i];
                let repeated =
                    matches!(&slot.ctr.run, Run::Waiting { message: Some(m), .. } if *m == message);
                if repeated {
                    tracing::debug!(pod = %format!("{}/{}", self.ns, self.name), container = %slot.ctr.name, error = %message, "still cannot start container");
                } else {
                    tracing::warn!(pod = %format!("{}/{}", self.ns, self.name), container = %slot.ctr.name, error = %message, "cannot start container");
                    events::emit(&self.shared, &self.pod, true, "Failed", message.clone());
                }
                slot.ctr.run = Run::waiting(reason, Some(message));
                slot.next_start = Some(now + RETRY);
                return;
            }
        };
        let log = logs::log_path(&self.dir, &self.slots[i].ctr.name, false);
        if self.slots[i].ever_started {
            let previous = logs::log_path(&self.dir, &self.slots[i].ctr.name, true);
            if let Err(e) = std::fs::rename(&log, &previous) {
                tracing::debug!(error = %e, "no log to keep as previous");
            }
        }
        let pod_ip = IpAddr::V4(self.ip);
        let key = self.key();
        let slot = &mut self.slots[i];
        slot.run_id += 1;
        slot.next_start = None;
        if slot.ever_started {
            slot.ctr.restarts += 1;
        }
        slot.ever_started = true;
        let started_at = Timestamp::now();
        // Register under the lock so a concurrent emergency kill sees the group.
        let groups = self.shared.groups.clone();
        let spawned = {
            let mut g = lock(&groups);
            let r = process::spawn(&launch, Output::Log(log), Namespace::New);
            if let Ok(child) = &r
                && let Some(pid) = child.id()
            {
                g.insert(pid as i32);
            }
            r
        };
        match spawned {
            Ok(mut child) => {
                let pid = child.id().map(|p| p as i32).unwrap_or_default();
                tracing::info!(pod = %key, container = %slot.ctr.name, pid, program = %launch.program, "started container");
                events::emit(
                    &self.shared,
                    &self.pod,
                    false,
                    "Started",
                    format!("Started container {} (pid {pid})", slot.ctr.name),
                );
                lock(&self.running).insert(slot.ctr.name.clone());
                slot.pgid = Some(pid);
                slot.started = Some(now);
                slot.ctr.run = Run::Running { pid, started_at };
                let mk = |p: Option<&k8s_openapi::api::core::v1::Probe>,
                          what: &str|
                 -> Option<ProbeState> {
                    let p = p?;
                    match probe::probe_spec(
                        p,
                        &container,
                        &format!("{}.{what}", slot.field),
                        pod_ip,
                        &launch,
                    ) {
                        Ok(spec) => Some(ProbeState {
                            next_at: now + spec.initial_delay,
                            spec,
                            successes: 0,
                            failures: 0,
                            in_flight: false,
                        }),
                        Err(e) => {
                            tracing::warn!(error = %e, "ignoring invalid probe");
                            None
                        }
                    }
                };
                if slot.init {
                    slot.readiness = None;
                    slot.liveness = None;
                    slot.ctr.ready = false;
                } else {
                    slot.readiness = mk(container.readiness_probe.as_ref(), "readinessProbe");
                    slot.liveness = mk(container.liveness_probe.as_ref(), "livenessProbe");
                    slot.ctr.ready = slot.readiness.is_none();
                }
                let tx = self.tx.clone();
                let (init, run_id) = (slot.init, slot.run_id);
                tokio::spawn(async move {
                    if let Ok(status) = child.wait().await {
                        let _ = tx.send(Event::Exited {
                            init,
                            idx: i,
                            run_id,
                            status,
                        });
                    }
                });
            }
            Err(e) => {
                tracing::warn!(pod = %key, container = %slot.ctr.name, error = %e, "container failed to start");
                events::emit(
                    &self.shared,
                    &self.pod,
                    true,
                    "Failed",
                    format!("Error: cannot start container {}: {e}", slot.ctr.name),
                );
                let run = Run::Terminated {
                    pid: None,
                    exit_code: 128,
                    signal: None,
                    reason: "StartError".into(),
                    message: Some(format!("failed to start {:?}: {e}", launch.program)),
                    started_at: None,
                    finished_at: Timestamp::now(),
                };
                self.after_exit(i, run, 128);
            }
        }
    }

    fn run_probes(&mut self, now: Instant) {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let Some(pid) = slot.pgid else { continue };
            for (kind, state) in [
                (ProbeKind::Readiness, &mut slot.readiness),
                (ProbeKind::Liveness, &mut slot.liveness),
            ] {
                let Some(state) = state.as_mut() else {
                    continue;
                };
                if state.in_flight || state.next_at > now {
                    continue;
                }
                state.in_flight = true;
                let action = state.spec.action.clone();
                let timeout = state.spec.timeout;
                let tx = self.tx.clone();
                let run_id = slot.run_id;
                tokio::spawn(async move {
                    let result = probe::run(&action, timeout, pid).await;
                    let _ = tx.send(Event::Probed {
                        idx: i,
                        run_id,
                        kind,
                        result,
                    });
                });
            }
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Exited {
                init,
                idx,
                run_id,
                status,
            } => {
                let key = self.key();
                let Some(slot) = self.slots.get_mut(idx) else {
                    return;
                };
                if slot.run_id != run_id || slot.init != init {
                    return;
                }
                use std::os::unix::process::ExitStatusExt as _;
                let signal = status.signal();
                let code = status.code().unwrap_or_else(|| 128 + signal.unwrap_or(0));
                let pid = slot.pgid.take();
                lock(&self.running).remove(&slot.ctr.name);
                if let Some(pgid) = pid {
                    // The leader is gone: end the rest of the container, as a runtime would.
                    process::signal_group(pgid, libc::SIGKILL);
                    lock(&self.shared.groups).remove(&pgid);
                }
                let started_at = match &slot.ctr.run {
                    Run::Running { started_at, .. } => Some(*started_at),
                    _ => None,
                };
                let run = Run::Terminated {
                    pid,
                    exit_code: code,
                    signal,
                    reason: if code == 0 {
                        "Completed".into()
                    } else {
                        "Error".into()
                    },
                    message: None,
                    started_at,
                    finished_at: Timestamp::now(),
                };
                tracing::info!(pod = %key, container = %slot.ctr.name, code, ?signal, "container exited");
                self.after_exit(idx, run, code);
            }
            Event::Probed {
                idx,
                run_id,
                kind,
                result,
            } => {
                let Some(slot) = self.slots.get_mut(idx) else {
                    return;
                };
                let state = match kind {
                    ProbeKind::Readiness => slot.readiness.as_mut(),
                    ProbeKind::Liveness => slot.liveness.as_mut(),
                };
                let Some(state) = state else { return };
                if slot.run_id != run_id {
                    return;
                }
                state.in_flight = false;
                state.next_at = Instant::now() + state.spec.period;
                match result {
                    Ok(()) => {
                        state.successes += 1;
                        state.failures = 0;
                    }
                    Err(message) => {
                        state.failures += 1;
                        state.successes = 0;
                        if state.failures == state.spec.failure_threshold {
                            let what = match kind {
                                ProbeKind::Readiness => "Readiness",
                                ProbeKind::Liveness => "Liveness",
                            };
                            events::emit(
                                &self.shared,
                                &self.pod,
                                true,
                                "Unhealthy",
                                format!(
                                    "{what} probe of container {} failed: {message}",
                                    slot.ctr.name
                                ),
                            );
                        }
                        tracing::debug!(pod = %format!("{}/{}", self.ns, self.name), container = %slot.ctr.name, ?kind, %message, "probe failed");
                    }
                }
                let (ok, failed) = (
                    state.successes >= state.spec.success_threshold,
                    state.failures >= state.spec.failure_threshold,
                );
                match kind {
                    ProbeKind::Readiness => {
                        if ok {
                            slot.ctr.ready = true;
                        } else if failed {
                            slot.ctr.ready = false;
                        }
                    }
                    ProbeKind::Liveness => {
                        if failed && let Some(pgid) = slot.pgid {
                            tracing::info!(container = %slot.ctr.name, "liveness probe failed; killing container");
                            process::signal_group(pgid, libc::SIGKILL);
                        }
                    }
                }
            }
        }
    }

    /// Records a finished run of slot `i` and schedules a restart if the
    /// restart policy asks for one.
    fn after_exit(&mut self, i: usize, run: Run, code: i32) {
        let policy = restart_policy(&self.pod);
        let cfg = &self.shared.config;
        let stopping = self.stopping;
        let is_init = i < self.n_init;
        let slot = &mut self.slots[i];
        slot.ctr.ready = false;
        slot.readiness = None;
        slot.liveness = None;
        if stopping {
            slot.ctr.run = run;
            return;
        }
        if is_init && code == 0 {
            slot.ctr.run = run;
            self.next_init = i + 1;
            if self.next_init == self.n_init {
                for s in &mut self.slots[self.n_init..] {
                    s.ctr.run = Run::waiting("ContainerCreating", None);
                    s.next_start = Some(Instant::now());
                }
            } else {
                self.slots[self.next_init].ctr.run = Run::waiting("PodInitializing", None);
            }
            return;
        }
        let restart = match policy.as_str() {
            "Never" => false,
            "OnFailure" => code != 0,
            _ => !is_init || code != 0,
        };
        if !restart {
            slot.ctr.run = run;
            if is_init {
                self.init_failed = true;
            }
            return;
        }
        let ran = slot.started.map(|t| t.elapsed()).unwrap_or_default();
        if ran > cfg.max_restart_backoff * 2 {
            slot.backoff = cfg.restart_backoff;
        }
        let delay = slot.backoff;
        slot.backoff = (slot.backoff * 2).min(cfg.max_restart_backoff);
        slot.next_start = Some(Instant::now() + delay);
        slot.ctr.last = Some(run);
        events::emit(
            &self.shared,
            &self.pod,
            true,
            "BackOff",
            format!(
                "Back-off {delay:?} restarting failed container {}",
                slot.ctr.name
            ),
        );
        slot.ctr.run = Run::waiting(
            "CrashLoopBackOff",
            Some(format!(
                "back-off {delay:?} restarting failed container={} pod={}",
                slot.ctr.name, self.name
            )),
        );
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
        let main: Vec<Ctr> = self.slots[self.n_init..]
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
            pod_ip: self.ip,
            host_ip: self.shared.config.node_ip,
            start_time: self.start_time,
            qos_class: self
                .pod
                .spec
                .as_ref()
                .map(qos_class)
                .unwrap_or_else(|| "BestEffort".into()),
            problem: self.problem.clone(),
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
        match api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
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

    /// Stops every running container: SIGTERM, at most `grace`, SIGKILL.
    async fn stop_all(&mut self, grace: Duration) {
        self.stopping = true;
        let running: Vec<i32> = self.slots.iter().filter_map(|s| s.pgid).collect();
        if running.is_empty() {
            return;
        }
        tracing::info!(pod = %self.key(), ?grace, "stopping containers");
        for s in self.slots.iter().filter(|s| s.pgid.is_some()) {
            events::emit(
                &self.shared,
                &self.pod,
                false,
                "Killing",
                format!("Stopping container {} (grace period {grace:?})", s.ctr.name),
            );
        }
        for pgid in &running {
            process::signal_group(*pgid, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        self.drain_until(deadline).await;
        let left: Vec<i32> = self.slots.iter().filter_map(|s| s.pgid).collect();
        for pgid in &left {
            process::signal_group(*pgid, libc::SIGKILL);
        }
        self.drain_until(Instant::now() + KILL_WAIT).await;
        for s in &mut self.slots {
            if let Some(pgid) = s.pgid.take() {
                tracing::error!(pod = %format!("{}/{}", self.ns, self.name), pgid, "container did not exit after SIGKILL");
            }
        }
    }

    async fn drain_until(&mut self, deadline: Instant) {
        while self.slots.iter().any(|s| s.pgid.is_some()) {
            tokio::select! {
                Some(event) = self.rx.recv() => self.handle(event),
                _ = tokio::time::sleep_until(deadline) => return,
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
        match api.delete(&self.name, &dp).await {
            Ok(_) => tracing::info!(pod = %self.key(), "pod deleted"),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => tracing::warn!(pod = %self.key(), error = %e, "cannot finish pod deletion"),
        }
    }

    fn cleanup(&mut self) {
        {
            let mut groups = lock(&self.shared.groups);
            for s in &self.slots {
                if let Some(pgid) = s.pgid {
                    process::signal_group(pgid, libc::SIGKILL);
                    groups.remove(&pgid);
                }
            }
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
        if !self.shared.shutdown.is_cancelled()
            && let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove pod directory");
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
            run_id: 0,
            pgid: None,
            started: None,
            next_start: if init { None } else { Some(Instant::now()) },
            backoff: shared.config.restart_backoff,
            ever_started: false,
            readiness: None,
            liveness: None,
        }
    }
}
