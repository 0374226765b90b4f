//! Container run states and the pod status computed from them: phase,
//! conditions and container statuses, as the Kubernetes kubelet reports them.
//!
//! Invariants:
//! 1. The status is computed whole from the worker's state; nothing is
//!    patched piecemeal.
//! 2. A condition keeps its `lastTransitionTime` while its status does not
//!    change.
//! 3. A container waiting to restart (back-off) counts as stopped, not as
//!    not-yet-started, when computing the phase (so a crash-looping pod with
//!    `restartPolicy: Always` is Running, as in Kubernetes).

use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// The state of one container's current (or next) run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ContainerRun {
    /// Not running: not started yet, backing off, or unable to start.
    Waiting {
        /// `PodInitializing`, `ContainerCreating`, `CrashLoopBackOff`, `CreateContainerConfigError`, ...
        reason: String,
        /// Detail for humans.
        message: Option<String>,
    },
    /// Running as process group `pid`.
    Running {
        /// Process (and process group) id.
        pid: i32,
        /// When it started.
        started_at: Timestamp,
    },
    /// Finished.
    Terminated {
        /// Its process id, if it ever started.
        pid: Option<i32>,
        /// Exit code (128 + signal when killed by a signal).
        exit_code: i32,
        /// The signal that killed it.
        signal: Option<i32>,
        /// `Completed`, `Error`, `StartError`.
        reason: String,
        /// Detail for humans.
        message: Option<String>,
        /// When it started.
        started_at: Option<Timestamp>,
        /// When it finished.
        finished_at: Timestamp,
    },
}

impl ContainerRun {
    /// A waiting state.
    pub(crate) fn waiting(reason: &str, message: Option<String>) -> Self {
        ContainerRun::Waiting {
            reason: reason.into(),
            message,
        }
    }

    fn to_api(&self) -> ContainerState {
        match self {
            ContainerRun::Waiting { reason, message } => ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.clone()),
                    message: message.clone(),
                }),
                ..Default::default()
            },
            ContainerRun::Running { started_at, .. } => ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(*started_at)),
                }),
                ..Default::default()
            },
            ContainerRun::Terminated {
                pid,
                exit_code,
                signal,
                reason,
                message,
                started_at,
                finished_at,
            } => ContainerState {
                terminated: Some(ContainerStateTerminated {
                    container_id: pid.map(container_id),
                    exit_code: *exit_code,
                    signal: *signal,
                    reason: Some(reason.clone()),
                    message: message.clone(),
                    started_at: started_at.map(Time),
                    finished_at: Some(Time(*finished_at)),
                }),
                ..Default::default()
            },
        }
    }
}

/// The container id the kubelet reports for a process.
pub(crate) fn container_id(pid: i32) -> String {
    format!("process://{pid}")
}

/// One container as the worker tracks it.
#[derive(Debug, Clone)]
pub(crate) struct Ctr {
    /// Container name.
    pub(crate) name: String,
    /// Image as written in the spec.
    pub(crate) image: String,
    /// Current state.
    pub(crate) run: ContainerRun,
    /// The previous run, once it terminated.
    pub(crate) last: Option<ContainerRun>,
    /// Restarts so far.
    pub(crate) restarts: i32,
    /// Passed its readiness probe (or has none) while running.
    pub(crate) ready: bool,
    /// Passed its startup probe (or has none) while running.
    pub(crate) started: bool,
}

impl Ctr {
    /// A container that has not started.
    pub(crate) fn new(name: &str, image: &str, reason: &str) -> Self {
        Self {
            name: name.into(),
            image: image.into(),
            run: ContainerRun::waiting(reason, None),
            last: None,
            restarts: 0,
            ready: false,
            started: false,
        }
    }

    fn to_api(&self) -> ContainerStatus {
        let running = matches!(self.run, ContainerRun::Running { .. });
        ContainerStatus {
            name: self.name.clone(),
            image: self.image.clone(),
            image_id: String::new(),
            container_id: match &self.run {
                ContainerRun::Running { pid, .. } => Some(container_id(*pid)),
                ContainerRun::Terminated { pid, .. } => pid.map(container_id),
                ContainerRun::Waiting { .. } => None,
            },
            ready: self.ready && running,
            started: Some(running && self.started),
            restart_count: self.restarts,
            state: Some(self.run.to_api()),
            last_state: Some(
                self.last
                    .as_ref()
                    .map(ContainerRun::to_api)
                    .unwrap_or_default(),
            ),
            ..Default::default()
        }
    }
}

/// Everything the pod status is computed from.
#[derive(Debug)]
pub(crate) struct StatusInput<'a> {
    /// `spec.restartPolicy` (`Always` when unset).
    pub(crate) restart_policy: &'a str,
    /// Init containers in order.
    pub(crate) init: &'a [Ctr],
    /// Every init container succeeded.
    pub(crate) initialized: bool,
    /// An init container failed for good (restartPolicy Never).
    pub(crate) init_failed: bool,
    /// Regular containers.
    pub(crate) main: &'a [Ctr],
    /// Ephemeral containers (reported; no part of phase or readiness).
    pub(crate) ephemeral: &'a [Ctr],
    /// The pod's IP.
    pub(crate) pod_ip: Ipv4Addr,
    /// The node's IP.
    pub(crate) host_ip: Ipv4Addr,
    /// When the worker took the pod.
    pub(crate) start_time: Timestamp,
    /// QoS class from the spec.
    pub(crate) qos_class: String,
    /// The conditions currently on the pod (for transition times).
    pub(crate) previous: &'a [PodCondition],
}

/// The pod phase, following the Kubernetes kubelet's rules (invariant 3).
pub(crate) fn phase(input: &StatusInput<'_>) -> &'static str {
    if input.init_failed {
        return "Failed";
    }
    if !input.initialized {
        return "Pending";
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for c in input.main {
        match &c.run {
            ContainerRun::Running { .. } => running += 1,
            ContainerRun::Terminated { exit_code, .. } => {
                stopped += 1;
                if *exit_code == 0 {
                    succeeded += 1;
                }
            }
            ContainerRun::Waiting { .. } => {
                if matches!(c.last, Some(ContainerRun::Terminated { .. })) {
                    stopped += 1;
                } else {
                    waiting += 1;
                }
            }
        }
    }
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped > 0 {
        // Containers waiting to restart are counted as stopped: the pod keeps running.
        let restarting = input
            .main
            .iter()
            .any(|c| matches!(c.run, ContainerRun::Waiting { .. }));
        if restarting || input.restart_policy == "Always" {
            return "Running";
        }
        if stopped == succeeded {
            return "Succeeded";
        }
        if input.restart_policy == "OnFailure" {
            return "Running";
        }
        return "Failed";
    }
    "Pending"
}

fn condition(
    previous: &[PodCondition],
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let now = Time(Timestamp::now());
    let kept = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone());
    PodCondition {
        type_: type_.into(),
        status: status.into(),
        last_transition_time: Some(kept.unwrap_or(now)),
        last_probe_time: None,
        reason: if ok { None } else { reason.map(Into::into) },
        message: if ok { None } else { message },
        observed_generation: None,
    }
}

/// The full pod status.
pub(crate) fn pod_status(input: &StatusInput<'_>) -> PodStatus {
    let phase = phase(input);
    let terminal = phase == "Succeeded" || phase == "Failed";
    let unready: Vec<&str> = input
        .main
        .iter()
        .filter(|c| !(c.ready && matches!(c.run, ContainerRun::Running { .. })))
        .map(|c| c.name.as_str())
        .collect();
    let uninit: Vec<&str> = input
        .init
        .iter()
        .filter(|c| !matches!(c.run, ContainerRun::Terminated { exit_code: 0, .. }))
        .map(|c| c.name.as_str())
        .collect();
    let ready = unready.is_empty() && !terminal;
    let (not_ready_reason, not_ready_message) = if terminal {
        ("PodCompleted", None)
    } else {
        (
            "ContainersNotReady",
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };
    let conditions = vec![
        condition(input.previous, "PodScheduled", true, None, None),
        condition(
            input.previous,
            "Initialized",
            input.initialized,
            Some("ContainersNotInitialized"),
            Some(format!(
                "containers with incomplete status: [{}]",
                uninit.join(" ")
            )),
        ),
        condition(
            input.previous,
            "ContainersReady",
            ready,
            Some(not_ready_reason),
            not_ready_message.clone(),
        ),
        condition(
            input.previous,
            "Ready",
            ready,
            Some(not_ready_reason),
            not_ready_message,
        ),
    ];
    let ip = input.pod_ip.to_string();
    let host = input.host_ip.to_string();
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(conditions),
        host_ip: Some(host.clone()),
        host_ips: Some(vec![HostIP { ip: host }]),
        pod_ip: Some(ip.clone()),
        pod_ips: Some(vec![PodIP { ip }]),
        start_time: Some(Time(input.start_time)),
        qos_class: Some(input.qos_class.clone()),
        init_container_statuses: Some(input.init.iter().map(Ctr::to_api).collect()),
        container_statuses: Some(input.main.iter().map(Ctr::to_api).collect()),
        ephemeral_container_statuses: (!input.ephemeral.is_empty()).then(|| {
            input
                .ephemeral
                .iter()
                .map(|c| ContainerStatus {
                    // Ephemeral containers have no startup state.
                    started: None,
                    ..c.to_api()
                })
                .collect()
        }),
        ..Default::default()
    }
}

/// The QoS class of a pod spec, as Kubernetes computes it (simplified:
/// Guaranteed when every container sets cpu and memory limits equal to
/// their requests).
pub(crate) fn qos_class(spec: &k8s_openapi::api::core::v1::PodSpec) -> String {
    let mut any = false;
    let mut guaranteed = true;
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        let res = c.resources.clone().unwrap_or_default();
        let limits = res.limits.unwrap_or_default();
        let requests = res.requests.unwrap_or_else(|| limits.clone());
        any |= !limits.is_empty() || !requests.is_empty();
        for r in ["cpu", "memory"] {
            match (limits.get(r), requests.get(r)) {
                (Some(l), Some(q)) if l == q => {}
                _ => guaranteed = false,
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort".into(),
        (true, true) => "Guaranteed".into(),
        (true, false) => "Burstable".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(code: i32) -> ContainerRun {
        ContainerRun::Terminated {
            pid: Some(10),
            exit_code: code,
            signal: None,
            reason: if code == 0 {
                "Completed".into()
            } else {
                "Error".into()
            },
            message: None,
            started_at: None,
            finished_at: Timestamp::now(),
        }
    }

    fn ctr(run: ContainerRun, last: Option<ContainerRun>, ready: bool) -> Ctr {
        Ctr {
            name: "c".into(),
            image: "i".into(),
            run,
            last,
            restarts: 0,
            ready,
            started: true,
        }
    }

    fn input<'a>(policy: &'a str, main: &'a [Ctr], prev: &'a [PodCondition]) -> StatusInput<'a> {
        StatusInput {
            restart_policy: policy,
            init: &[],
            initialized: true,
            init_failed: false,
            main,
            ephemeral: &[],
            pod_ip: Ipv4Addr::new(127, 0, 0, 2),
            host_ip: Ipv4Addr::LOCALHOST,
            start_time: Timestamp::now(),
            qos_class: "BestEffort".into(),
            previous: prev,
        }
    }

    #[test]
    fn phases_follow_kubernetes() {
        let running = [ctr(
            ContainerRun::Running {
                pid: 1,
                started_at: Timestamp::now(),
            },
            None,
            true,
        )];
        assert_eq!(phase(&input("Always", &running, &[])), "Running");
        let creating = [ctr(
            ContainerRun::waiting("ContainerCreating", None),
            None,
            false,
        )];
        assert_eq!(phase(&input("Always", &creating, &[])), "Pending");
        let backoff = [ctr(
            ContainerRun::waiting("CrashLoopBackOff", None),
            Some(term(1)),
            false,
        )];
        assert_eq!(phase(&input("Always", &backoff, &[])), "Running");
        let done = [ctr(term(0), None, false)];
        assert_eq!(phase(&input("Never", &done, &[])), "Succeeded");
        assert_eq!(phase(&input("OnFailure", &done, &[])), "Succeeded");
        let failed = [ctr(term(3), None, false)];
        assert_eq!(phase(&input("Never", &failed, &[])), "Failed");
        let mut i = input("Never", &running, &[]);
        i.initialized = false;
        assert_eq!(phase(&i), "Pending");
        i.init_failed = true;
        assert_eq!(phase(&i), "Failed");
    }

    #[test]
    fn conditions_keep_transition_times_and_name_unready_containers() {
        let unready = [ctr(
            ContainerRun::Running {
                pid: 1,
                started_at: Timestamp::now(),
            },
            None,
            false,
        )];
        let s = pod_status(&input("Always", &unready, &[]));
        let conds = s.conditions.unwrap();
        let ready = conds.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "False");
        assert_eq!(
            ready.message.as_deref(),
            Some("containers with unready status: [c]")
        );
        let mut old = conds.clone();
        let t0 = Time("2020-01-01T00:00:00Z".parse().unwrap());
        for c in &mut old {
            c.last_transition_time = Some(t0.clone());
        }
        let again = pod_status(&input("Always", &unready, &old))
            .conditions
            .unwrap();
        assert!(
            again
                .iter()
                .all(|c| c.last_transition_time.as_ref() == Some(&t0))
        );
        let ready_now = [ctr(
            ContainerRun::Running {
                pid: 1,
                started_at: Timestamp::now(),
            },
            None,
            true,
        )];
        let flipped = pod_status(&input("Always", &ready_now, &old))
            .conditions
            .unwrap();
        let r = flipped.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(r.status, "True");
        assert_ne!(r.last_transition_time.as_ref(), Some(&t0));
    }

    #[test]
    fn container_status_reports_ids_and_exit_codes() {
        let mut c = ctr(term(3), None, false);
        c.restarts = 2;
        let s = c.to_api();
        assert_eq!(s.container_id.as_deref(), Some("process://10"));
        assert_eq!(s.restart_count, 2);
        assert_eq!(s.state.unwrap().terminated.unwrap().exit_code, 3);
    }
}
