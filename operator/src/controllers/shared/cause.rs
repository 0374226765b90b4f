//! Whose fault a failure was (`hostmesh_crds::cause`), read from what the
//! cluster and the agents report: a host pod's conditions, reason and
//! container ends, the devices its kubelet reports Unhealthy, and a proc's
//! (or Monarch worker's) exit, signal and stderr. Pure: both controllers
//! call it with what they observed.
//!
//! Invariants (numbered as in `hostmesh_crds::cause`, continued):
//! 4. Pod-level facts that only Kubernetes components write are
//!    infrastructure: a `DisruptionTarget` condition (preemption, taint
//!    eviction, the Eviction API, pod GC, the kubelet), a pod `reason`
//!    (`Evicted`, `NodeLost`, node shutdown), a device whose
//!    `allocatedResourcesStatus` health is `Unhealthy`.
//! 5. The host container runs the hostmesh agent, so its end is an
//!    infrastructure failure (the agent crashed or was killed), except an
//!    `OOMKilled` end: the procs share its memory limit, which the user
//!    sets.
//! 6. A proc's own end is the user's: a non-zero exit (a Python traceback
//!    named when its stderr has one), a signal the process raises itself
//!    (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS), its
//!    memory limit. A signal sent from outside (SIGKILL, SIGTERM, ...) with
//!    nothing else known is `Unknown`.

use hostmesh_crds::cause::{Attribution, reasons};
use hostmesh_crds::procmesh::{ProcState, RankStatus};
use k8s_openapi::api::core::v1::Pod;

use crate::controllers::procmesh::exit;

/// The first line of a Python traceback.
const TRACEBACK: &str = "Traceback (most recent call last):";

/// Signals a process raises itself (invariant 6).
const RAISED_SIGNALS: &[i32] = &[4, 5, 6, 7, 8, 11, 31];

/// The first device allocated to one of `pod`'s containers that its
/// kubelet reports `Unhealthy`, named with its resource, id and message
/// (invariant 4).
pub fn unhealthy_device(pod: &Pod) -> Option<Attribution> {
    let status = pod.status.as_ref()?;
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .flat_map(|c| {
            c.allocated_resources_status
                .iter()
                .flatten()
                .map(move |r| (c, r))
        })
        .flat_map(|(c, r)| r.resources.iter().flatten().map(move |h| (c, r, h)))
        .find(|(_, _, h)| h.health.as_deref() == Some("Unhealthy"))
        .map(|(c, r, h)| {
            Attribution::infrastructure(
                reasons::DEVICE_UNHEALTHY,
                format!(
                    "device {} {} of container {} is Unhealthy",
                    r.name, h.resource_id, c.name
                ),
            )
        })
}

/// Infrastructure facts about `pod` that Kubernetes recorded (invariant 4):
/// an Unhealthy device, a `DisruptionTarget` condition, an eviction or a
/// lost node in its `reason`.
pub fn of_pod(pod: &Pod) -> Option<Attribution> {
    if let Some(a) = unhealthy_device(pod) {
        return Some(a);
    }
    let status = pod.status.as_ref()?;
    let disruption = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget" && c.status == "True");
    if let Some(c) = disruption {
        let why = c.reason.as_deref().unwrap_or_default();
        let label = match why {
            "PreemptionByScheduler" | "PreemptionByKubeScheduler" => reasons::PREEMPTED,
            "DeletionByTaintManager" | "DeletionByPodGC" => reasons::NODE_LOST,
            _ => reasons::EVICTED,
        };
        let message = match c.message.as_deref().filter(|m| !m.is_empty()) {
            Some(m) => format!("DisruptionTarget {why}: {m}"),
            None => format!("DisruptionTarget {why}"),
        };
        return Some(Attribution::infrastructure(label, message));
    }
    let reason = status.reason.as_deref()?;
    let label = match reason {
        "Evicted" | "UnexpectedAdmissionError" | "OutOfcpu" | "OutOfmemory" => reasons::EVICTED,
        "NodeLost" | "NodeAffinity" | "Terminated" | "Shutdown" => reasons::NODE_LOST,
        "Preempting" => reasons::PREEMPTED,
        _ => return None,
    };
    let message = match status.message.as_deref().filter(|m| !m.is_empty()) {
        Some(m) => format!("pod {reason}: {m}"),
        None => format!("pod {reason}"),
    };
    Some(Attribution::infrastructure(label, message))
}

/// A host pod's container that ended, attributed (invariant 5): `OOMKilled`
/// is the user's, any other end of the host container (named
/// `host_container`: the agent) or of another container (the install init
/// container, a sidecar) is the infrastructure's.
pub fn of_container_end(
    c: &crate::controllers::world::observe::FailedContainer,
    host_container: &str,
) -> Attribution {
    if c.reason.as_deref() == Some("OOMKilled") {
        return Attribution::user(
            reasons::OOM_KILLED,
            format!(
                "container {} went over its memory limit (its procs share it)",
                c.name
            ),
        );
    }
    let how = match c.signal {
        Some(sig) => exit::killed(sig),
        None => format!("exited with code {}", c.exit_code),
    };
    if c.name == host_container {
        Attribution::infrastructure(
            reasons::AGENT_EXITED,
            format!("the hostmesh agent (container {}) {how}", c.name),
        )
    } else {
        Attribution::infrastructure(reasons::POD_FAILED, format!("container {} {how}", c.name))
    }
}

/// What a process's end says (invariant 6): `state`, `exit_code`, `signal`,
/// the agent's `reason`, whether the OOM killer ended it, and its stderr.
pub fn of_exit(
    state: ProcState,
    exit_code: Option<i32>,
    signal: Option<i32>,
    reason: Option<&str>,
    oom_killed: bool,
    stderr: &[Option<&str>],
) -> Attribution {
    if oom_killed {
        return Attribution::user(
            reasons::OOM_KILLED,
            "killed by the kernel's OOM killer over its memory limit",
        );
    }
    if let Some(line) = traceback(stderr) {
        return Attribution::user(reasons::PYTHON_TRACEBACK, line);
    }
    let signal = signal.or_else(|| exit_code.and_then(exit::signal_of_code));
    if let Some(sig) = signal {
        let name = exit::signal_name(sig).map_or_else(|| format!("signal {sig}"), str::to_string);
        return if RAISED_SIGNALS.contains(&sig) {
            Attribution::user(
                reasons::SIGNAL_RAISED,
                format!("{name}: raised by the process itself"),
            )
        } else {
            Attribution::unknown(
                reasons::KILLED,
                format!("{name} sent from outside; nothing says by whom"),
            )
        };
    }
    match (state, exit_code) {
        (_, Some(126 | 127)) => Attribution::user(
            reasons::START_FAILED,
            format!(
                "exit code {}: the command could not be run",
                exit_code.unwrap_or_default()
            ),
        ),
        (_, Some(code)) if code != 0 => {
            Attribution::user(reasons::NON_ZERO_EXIT, format!("exited with code {code}"))
        }
        (ProcState::Timeout, _) => {
            Attribution::unknown(reasons::SPAWN_TIMEOUT, "did not start within spawnTimeout")
        }
        (ProcState::Stalled, _) => {
            Attribution::unknown(reasons::STALLED, "no progress within stallTimeout")
        }
        (ProcState::Lost, _) => Attribution::infrastructure(
            reasons::HOST_LOST,
            reason.unwrap_or("its host was lost").to_string(),
        ),
        (ProcState::Failed, None) if reason.is_some_and(start_error) => Attribution::user(
            reasons::START_FAILED,
            reason.unwrap_or_default().to_string(),
        ),
        _ => Attribution::unknown(
            reasons::UNKNOWN,
            reason.unwrap_or("no exit code, signal or stderr to go by"),
        ),
    }
}

/// Whether the agent's reason for a proc it could not start is about the
/// command (not found, not executable): the spec's, so the user's.
fn start_error(reason: &str) -> bool {
    [
        "No such file",
        "not found",
        "Permission denied",
        "not executable",
    ]
    .iter()
    .any(|s| reason.contains(s))
}

/// A failed rank's cause (invariants 2 and 6): what its own end says,
/// unless its host carries infrastructure evidence (`host`: a device
/// reported Unhealthy, the host lost), which then names what happened to
/// the host, more precisely than the rank's own `HostLost`.
pub fn of_rank(s: &RankStatus, oom_killed: bool, host: Option<&Attribution>) -> Attribution {
    if let Some(h) = host.filter(|h| h.cause == hostmesh_crds::cause::FailureCause::Infrastructure)
    {
        return h.clone();
    }
    of_exit(
        s.state,
        s.exit_code,
        s.signal,
        s.reason.as_deref(),
        oom_killed || s.reason.as_deref() == Some(exit::OOM_KILLED),
        &[s.stderr_head.as_deref(), s.stderr_tail.as_deref()],
    )
}

/// The exception line of a Python traceback in `stderr` (its pieces in
/// order), if one is there: the last non-empty line after the traceback's
/// header, else the header.
fn traceback(stderr: &[Option<&str>]) -> Option<String> {
    let text: Vec<&str> = stderr.iter().flatten().copied().collect();
    let at = text.iter().rposition(|t| t.contains(TRACEBACK))?;
    let after = text[at..].join("\n");
    let from = after.rfind(TRACEBACK).unwrap_or(0);
    let line = after[from..]
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty() && !l.starts_with(' '))
        .last()
        .map(str::trim);
    // A tail that cut the traceback's header off keeps the exception line
    // at its end.
    let last_line = text
        .last()
        .and_then(|t| t.lines().rev().find(|l| !l.trim().is_empty()))
        .map(str::trim);
    Some(format!(
        "Python traceback: {}",
        line.or(last_line).unwrap_or(TRACEBACK)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostmesh_crds::cause::FailureCause;

    fn pod(status_yaml: &str) -> Pod {
        serde_saphyr::from_str(&format!(
            "metadata: {{name: w-host-0}}\nstatus:\n{status_yaml}"
        ))
        .unwrap()
    }

    #[test]
    fn an_unhealthy_device_is_named_with_its_id() {
        let p = pod(
            "  phase: Running\n  containerStatuses:\n  - name: host\n    image: x\n    imageID: ''\n    ready: true\n    restartCount: 0\n    allocatedResourcesStatus:\n    - name: nvidia.com/gpu\n      resources:\n      - {resourceID: gpu-0, health: Healthy}\n      - {resourceID: gpu-1, health: Unhealthy}\n",
        );
        let a = of_pod(&p).unwrap();
        assert_eq!(a.cause, FailureCause::Infrastructure);
        assert_eq!(a.evidence.reason, "DeviceUnhealthy");
        assert_eq!(
            a.evidence.message,
            "device nvidia.com/gpu gpu-1 of container host is Unhealthy"
        );
        let healthy = pod(
            "  phase: Running\n  containerStatuses:\n  - name: host\n    image: x\n    imageID: ''\n    ready: true\n    restartCount: 0\n    allocatedResourcesStatus:\n    - name: nvidia.com/gpu\n      resources: [{resourceID: gpu-0, health: Healthy}]\n",
        );
        assert_eq!(of_pod(&healthy), None);
    }

    #[test]
    fn disruption_targets_and_pod_reasons_are_infrastructure() {
        let cases = [
            (
                "  conditions: [{type: DisruptionTarget, status: 'True', reason: PreemptionByScheduler, message: 'Preempted in order to admit critical pod'}]\n",
                "Preempted",
                "DisruptionTarget PreemptionByScheduler: Preempted in order to admit critical pod",
            ),
            (
                "  conditions: [{type: DisruptionTarget, status: 'True', reason: DeletionByTaintManager}]\n",
                "NodeLost",
                "DisruptionTarget DeletionByTaintManager",
            ),
            (
                "  conditions: [{type: DisruptionTarget, status: 'True', reason: EvictionByEvictionAPI, message: 'Eviction API: evicting'}]\n",
                "Evicted",
                "DisruptionTarget EvictionByEvictionAPI: Eviction API: evicting",
            ),
            (
                "  phase: Failed\n  reason: Evicted\n  message: 'The node was low on resource: memory.'\n",
                "Evicted",
                "pod Evicted: The node was low on resource: memory.",
            ),
            (
                "  phase: Failed\n  reason: NodeLost\n",
                "NodeLost",
                "pod NodeLost",
            ),
        ];
        for (yaml, label, message) in cases {
            let a = of_pod(&pod(yaml)).unwrap();
            assert_eq!(a.cause, FailureCause::Infrastructure, "{yaml}");
            assert_eq!(
                (a.evidence.reason.as_str(), a.evidence.message.as_str()),
                (label, message)
            );
        }
        assert_eq!(of_pod(&pod("  phase: Running\n")), None);
        let false_target = "  conditions: [{type: DisruptionTarget, status: 'False', reason: PreemptionByScheduler}]\n";
        assert_eq!(of_pod(&pod(false_target)), None);
    }

    #[test]
    fn the_agent_s_end_is_infrastructure_its_memory_limit_the_user_s() {
        let c = |name: &str, reason: Option<&str>, code, signal| {
            crate::controllers::world::observe::FailedContainer {
                name: name.into(),
                reason: reason.map(Into::into),
                exit_code: code,
                signal,
                message: None,
                command: vec![],
            }
        };
        let killed = of_container_end(&c("host", Some("Error"), 137, Some(9)), "host");
        assert_eq!(killed.cause, FailureCause::Infrastructure);
        assert_eq!(killed.evidence.reason, "AgentExited");
        assert!(
            killed
                .evidence
                .message
                .starts_with("the hostmesh agent (container host) killed by signal SIGKILL (9)"),
            "{}",
            killed.evidence.message
        );
        let oom = of_container_end(&c("host", Some("OOMKilled"), 137, Some(9)), "host");
        assert_eq!(
            (oom.cause, oom.evidence.reason.as_str()),
            (FailureCause::User, "OOMKilled")
        );
        let install = of_container_end(
            &c("hostmesh-install", Some("StartError"), 128, None),
            "host",
        );
        assert_eq!(
            (install.cause, install.evidence.reason.as_str()),
            (FailureCause::Infrastructure, "PodFailed")
        );
    }

    fn failed(code: Option<i32>, signal: Option<i32>, tail: Option<&str>) -> RankStatus {
        RankStatus {
            state: if signal.is_some() {
                ProcState::Killed
            } else {
                ProcState::Failed
            },
            exit_code: code,
            signal,
            stderr_tail: tail.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn a_proc_s_own_end_is_the_user_s_a_kill_from_outside_unknown() {
        let tb = "step 3\nTraceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    1/0\nZeroDivisionError: division by zero\n";
        let a = of_rank(&failed(Some(1), None, Some(tb)), false, None);
        assert_eq!(a.cause, FailureCause::User);
        assert_eq!(a.evidence.reason, "PythonTraceback");
        assert_eq!(
            a.evidence.message,
            "Python traceback: ZeroDivisionError: division by zero"
        );
        let a = of_rank(&failed(Some(3), None, Some("bad input\n")), false, None);
        assert_eq!(
            (
                a.cause,
                a.evidence.reason.as_str(),
                a.evidence.message.as_str()
            ),
            (FailureCause::User, "NonZeroExit", "exited with code 3")
        );
        let a = of_rank(&failed(None, Some(11), None), false, None);
        assert_eq!(
            (a.cause, a.evidence.reason.as_str()),
            (FailureCause::User, "SignalRaised")
        );
        let a = of_rank(&failed(Some(134), None, None), false, None);
        assert_eq!(
            (a.cause, a.evidence.reason.as_str()),
            (FailureCause::User, "SignalRaised")
        );
        let a = of_rank(&failed(None, Some(9), None), false, None);
        assert_eq!(
            (a.cause, a.evidence.reason.as_str()),
            (FailureCause::Unknown, "Killed")
        );
        let a = of_rank(&failed(None, Some(9), None), true, None);
        assert_eq!(
            (a.cause, a.evidence.reason.as_str()),
            (FailureCause::User, "OOMKilled")
        );
        let a = of_rank(&failed(Some(127), None, None), false, None);
        assert_eq!(
            (a.cause, a.evidence.reason.as_str()),
            (FailureCause::User, "StartFailed")
        );
        let timeout = RankStatus {
            state: ProcState::Timeout,
            ..Default::default()
        };
        assert_eq!(of_rank(&timeout, false, None).cause, FailureCause::Unknown);
        let lost = RankStatus {
            state: ProcState::Lost,
            reason: Some("host 1 is Expired".into()),
            ..Default::default()
        };
        let a = of_rank(&lost, false, None);
        assert_eq!(
            (
                a.cause,
                a.evidence.reason.as_str(),
                a.evidence.message.as_str()
            ),
            (
                FailureCause::Infrastructure,
                "HostLost",
                "host 1 is Expired"
            )
        );
    }

    #[test]
    fn a_traceback_on_a_host_with_an_unhealthy_device_is_infrastructure() {
        let device = Attribution::infrastructure("DeviceUnhealthy", "device nvidia.com/gpu gpu-0");
        let tb = "Traceback (most recent call last):\nRuntimeError: CUDA error\n";
        let a = of_rank(&failed(Some(1), None, Some(tb)), false, Some(&device));
        assert_eq!(a, device);
        // The host's lost evidence names what happened to it.
        let deleted = Attribution::infrastructure("PodDeleted", "w-host-1 deleted");
        let lost = RankStatus {
            state: ProcState::Lost,
            ..Default::default()
        };
        assert_eq!(of_rank(&lost, false, Some(&deleted)), deleted);
        // A host's user evidence does not replace the proc's own.
        let oom = Attribution::user("OOMKilled", "host");
        let a = of_rank(&failed(Some(2), None, None), false, Some(&oom));
        assert_eq!(a.evidence.reason, "NonZeroExit");
    }

    #[test]
    fn a_traceback_cut_at_its_head_keeps_the_exception_line() {
        let head = "Traceback (most recent call last):\n  File \"a.py\", line 1\n";
        let tail = "    raise ValueError('bad shard')\nValueError: bad shard\n";
        assert_eq!(
            traceback(&[Some(head), Some(tail)]).as_deref(),
            Some("Python traceback: ValueError: bad shard")
        );
        assert_eq!(traceback(&[Some("plain error\n"), None]), None);
    }
}
