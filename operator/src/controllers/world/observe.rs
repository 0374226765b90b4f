//! Host state from a pod and the hub's view of its agent: the pod-level
//! reason when there is one (Unschedulable, ImagePullBackOff, Evicted), how
//! a failed pod's container ended (reason, exit code, the signal 128+n
//! means, the kubelet's message), and readiness that needs both pod Ready
//! and heartbeats.

use crate::hub::Liveness;
use hostmesh_crds::world::{HostState, HostStatus};
use k8s_openapi::api::core::v1::Pod;

/// Longest host reason kept in status (a container's message is cut to it).
const MAX_REASON: usize = 320;

/// Waiting reasons that mean "stuck starting": reported, never restarted.
const STUCK_WAITING: &[&str] = &[
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
];

fn host(state: HostState, reason: Option<&str>) -> HostStatus {
    HostStatus::new(state, reason.map(str::to_string))
}

/// The state of the host whose pod is `pod` (`None`: no pod).
pub fn observe_pod(pod: Option<&Pod>, liveness: Liveness) -> HostStatus {
    let Some(pod) = pod else {
        return host(HostState::Pending, None);
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return host(HostState::Terminating, None);
    }
    let Some(status) = pod.status.as_ref() else {
        return host(HostState::Starting, None);
    };
    match status.phase.as_deref() {
        Some("Failed") => {
            if let Some(r) = status.reason.as_deref() {
                return host(HostState::Failed, Some(r));
            }
            let term_reason = failed_container(pod).map(|c| c.describe());
            return host(
                HostState::Failed,
                Some(term_reason.as_deref().unwrap_or("PodFailed")),
            );
        }
        Some("Succeeded") => return host(HostState::Failed, Some("AgentExited")),
        _ => {}
    }
    let conds = status.conditions.as_deref().unwrap_or_default();
    let cond = |t: &str| conds.iter().find(|c| c.type_ == t);
    if let Some(c) = cond("PodScheduled")
        && c.status == "False"
    {
        // The scheduler's message says which filter refused every node
        // (`0/8 nodes are available: ...`); equal for every host it
        // refuses, so the host runs stay few.
        let reason = c.reason.as_deref().unwrap_or("Unschedulable");
        let full = match c.message.as_deref() {
            Some(m) if !m.is_empty() => format!("{reason}: {m}"),
            _ => reason.to_string(),
        };
        return host(
            HostState::Starting,
            Some(hostmesh_crds::procmesh::head(&full, MAX_REASON)),
        );
    }
    let waiting = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
        .find(|r| STUCK_WAITING.contains(&r.as_str()));
    if let Some(r) = waiting {
        return host(HostState::Starting, Some(&r));
    }
    let pod_ready = cond("Ready").is_some_and(|c| c.status == "True");
    match (pod_ready, liveness) {
        (_, Liveness::Expired) => host(HostState::Expired, Some("NoHeartbeat")),
        (true, Liveness::Alive) => host(HostState::Ready, None),
        (true, Liveness::Unknown) => host(HostState::Starting, Some("AwaitingHeartbeat")),
        (false, Liveness::Alive) => host(HostState::NotReady, Some("ReadinessProbeFailed")),
        (false, Liveness::Unknown) => host(HostState::Starting, None),
    }
}

/// How a host pod's container ended, as the kubelet reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedContainer {
    /// The container (`host`, or the init container `hostmesh-install`).
    pub name: String,
    /// The kubelet's reason (`Error`, `OOMKilled`, `StartError`), if any.
    pub reason: Option<String>,
    /// Its exit code (137 for a SIGKILL).
    pub exit_code: i32,
    /// The signal that ended it: the kubelet's `signal`, or read from an
    /// exit code of 128+n when n names a real signal.
    pub signal: Option<i32>,
    /// The kubelet's message: what failed to start, or the tail of the
    /// container's log (`FallbackToLogsOnError`).
    pub message: Option<String>,
    /// The container's command and args from the pod spec.
    pub command: Vec<String>,
}

impl FailedContainer {
    /// `Error: container host exited with code 1: <message>`, bounded to
    /// the host reason's length; a long message keeps its end, where the
    /// cause is. A container killed by a signal is described without its
    /// log (`OOMKilled: container host exited with code 137 (SIGKILL)`):
    /// what it last printed is not why it was killed, and stays in
    /// `firstFailure.stderrTail`.
    pub fn describe(&self) -> String {
        let reason = self.reason.as_deref().unwrap_or("Error");
        let signal = self
            .signal
            .and_then(crate::controllers::procmesh::exit::signal_name)
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        let prefix = format!(
            "{reason}: container {} exited with code {}{signal}",
            self.name, self.exit_code
        );
        match self.message.as_deref().map(str::trim) {
            Some(m) if !m.is_empty() && self.signal.is_none() => {
                let room = MAX_REASON.saturating_sub(prefix.len() + 2);
                format!("{prefix}: {}", hostmesh_crds::procmesh::tail(m, room))
            }
            _ => prefix,
        }
    }
}

/// The first of the pod's containers (init containers first) that ended
/// with a non-zero code or was OOM-killed.
pub fn failed_container(pod: &Pod) -> Option<FailedContainer> {
    let status = pod.status.as_ref()?;
    let spec = pod.spec.as_ref();
    let command = |name: &str| {
        spec.into_iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .find(|c| c.name == name)
            .map(|c| {
                c.command
                    .iter()
                    .flatten()
                    .chain(c.args.iter().flatten())
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    };
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .filter_map(|c| Some((&c.name, c.state.as_ref()?.terminated.as_ref()?)))
        .find(|(_, t)| t.exit_code != 0 || t.reason.as_deref() == Some("OOMKilled"))
        .map(|(name, t)| FailedContainer {
            name: name.clone(),
            reason: t.reason.clone(),
            exit_code: t.exit_code,
            signal: t
                .signal
                .filter(|s| *s != 0)
                .or_else(|| crate::controllers::procmesh::exit::signal_of_code(t.exit_code)),
            message: t.message.clone().filter(|m| !m.trim().is_empty()),
            command: command(name),
        })
}

/// Drops from a host pod what the World controller never reads, before the
/// pod goes into its store (invariant 7 of [`super`]): `managedFields`,
/// the volumes and, of each container, all but its name, image, command,
/// arguments and the fence timeout in its environment (what
/// [`failed_container`] and [`super::fencing::pod_fence_timeout`] read).
/// A 1,000-host World's pods so cost the operator a few megabytes, not
/// twenty.
pub fn slim(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.volumes = None;
    let keep = |c: &mut k8s_openapi::api::core::v1::Container| {
        let env = c.env.take().map(|env| {
            env.into_iter()
                .filter(|e| e.name == hostmesh_agent::contract::env::FENCE_TIMEOUT)
                .collect::<Vec<_>>()
        });
        *c = k8s_openapi::api::core::v1::Container {
            name: std::mem::take(&mut c.name),
            image: c.image.take(),
            command: c.command.take(),
            args: c.args.take(),
            env: env.filter(|e| !e.is_empty()),
            ..Default::default()
        };
    };
    spec.containers.iter_mut().for_each(keep);
    spec.init_containers.iter_mut().flatten().for_each(keep);
}

/// The pod's IP when it has one and is not being deleted.
pub fn pod_ip(pod: &Pod) -> Option<std::net::IpAddr> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use kube::ResourceExt as _;

    pub(crate) fn mk_pod(status_yaml: &str) -> Pod {
        let mut p: Pod = serde_saphyr::from_str(&format!(
            "metadata: {{name: w-host-0}}\nstatus:\n{status_yaml}"
        ))
        .unwrap();
        if status_yaml.trim().is_empty() {
            p.status = None;
        }
        p
    }

    pub(crate) const READY: &str =
        "  phase: Running\n  podIP: 127.0.1.2\n  conditions: [{type: Ready, status: 'True'}]\n";

    /// What the store keeps of a host pod still answers what the
    /// controller asks of it: the fence timeout, a failed container's
    /// command, the node, the annotations.
    #[test]
    fn a_slimmed_pod_keeps_what_the_controller_reads() {
        let mut p: Pod = serde_saphyr::from_str(
            "metadata:\n  name: w-host-0\n  annotations: {hostmesh.dev/epoch: '7'}\n  managedFields: [{manager: m, operation: Apply}]\n\
             spec:\n  nodeName: n1\n  volumes: [{name: v, emptyDir: {}}]\n\
             \x20 initContainers: [{name: hostmesh-install, image: i, command: [hostmesh, install-agent], volumeMounts: [{name: v, mountPath: /v}]}]\n\
             \x20 containers:\n  - name: host\n    image: busybox\n    command: [/hostmesh/bin/hostmesh, agent]\n\
             \x20   env: [{name: HOSTMESH_WORLD, value: w}, {name: HOSTMESH_FENCE_TIMEOUT, value: 90s}]\n\
             \x20   readinessProbe: {httpGet: {path: /readyz, port: 26601}}\n\
             status:\n  phase: Failed\n  containerStatuses:\n  - {name: host, ready: false, restartCount: 0, image: busybox, imageID: '', state: {terminated: {exitCode: 3}}}\n",
        )
        .unwrap();
        let timeout = crate::controllers::world::fencing::pod_fence_timeout(&p);
        let failed = failed_container(&p);
        slim(&mut p);
        assert!(p.metadata.managed_fields.is_none());
        let spec = p.spec.as_ref().unwrap();
        assert!(spec.volumes.is_none());
        assert!(spec.containers[0].readiness_probe.is_none());
        assert_eq!(spec.containers[0].env.as_ref().unwrap().len(), 1);
        assert!(
            spec.init_containers.as_ref().unwrap()[0]
                .volume_mounts
                .is_none()
        );
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert!(timeout.is_some());
        assert_eq!(
            crate::controllers::world::fencing::pod_fence_timeout(&p),
            timeout
        );
        assert_eq!(failed_container(&p), failed);
        assert_eq!(failed.unwrap().command, ["/hostmesh/bin/hostmesh", "agent"]);
        assert_eq!(p.annotations()["hostmesh.dev/epoch"], "7");
    }

    #[test]
    fn ready_needs_pod_ready_and_heartbeats() {
        let p = mk_pod(READY);
        assert_eq!(
            observe_pod(Some(&p), Liveness::Alive).state,
            HostState::Ready
        );
        let s = observe_pod(Some(&p), Liveness::Unknown);
        assert_eq!(
            (s.state, s.reason.as_deref()),
            (HostState::Starting, Some("AwaitingHeartbeat"))
        );
        let s = observe_pod(Some(&p), Liveness::Expired);
        assert_eq!(
            (s.state, s.reason.as_deref()),
            (HostState::Expired, Some("NoHeartbeat"))
        );
        assert_eq!(pod_ip(&p), Some("127.0.1.2".parse().unwrap()));
    }

    #[test]
    fn pod_level_reasons() {
        let cases = [
            (
                "  phase: Pending\n  conditions: [{type: PodScheduled, status: 'False', reason: Unschedulable}]\n",
                HostState::Starting,
                "Unschedulable",
            ),
            (
                "  phase: Pending\n  conditions: [{type: PodScheduled, status: 'False', reason: Unschedulable, message: '0/2 nodes are available: 2 node(s) didn''t match pod affinity rules.'}]\n",
                HostState::Starting,
                "Unschedulable: 0/2 nodes are available: 2 node(s) didn't match pod affinity rules.",
            ),
            (
                "  phase: Pending\n  containerStatuses: [{name: host, image: x, imageID: '', ready: false, restartCount: 0, state: {waiting: {reason: ImagePullBackOff}}}]\n",
                HostState::Starting,
                "ImagePullBackOff",
            ),
            (
                "  phase: Failed\n  containerStatuses: [{name: host, image: x, imageID: '', ready: false, restartCount: 0, state: {terminated: {exitCode: 137, reason: OOMKilled}}}]\n",
                HostState::Failed,
                "OOMKilled: container host exited with code 137 (SIGKILL)",
            ),
            (
                "  phase: Failed\n  initContainerStatuses: [{name: hostmesh-install, image: x, imageID: '', ready: false, restartCount: 0, state: {terminated: {exitCode: 128, reason: StartError, message: 'failed to start \"/w/hostmesh\": Permission denied (os error 13)'}}}]\n",
                HostState::Failed,
                "StartError: container hostmesh-install exited with code 128: failed to start \"/w/hostmesh\": Permission denied (os error 13)",
            ),
            (
                "  phase: Failed\n  reason: Evicted\n",
                HostState::Failed,
                "Evicted",
            ),
            (
                "  phase: Failed\n  containerStatuses: [{name: host, image: x, imageID: '', ready: false, restartCount: 0, state: {terminated: {exitCode: 3}}}]\n",
                HostState::Failed,
                "Error: container host exited with code 3",
            ),
            ("  phase: Succeeded\n", HostState::Failed, "AgentExited"),
            (
                "  phase: Running\n  conditions: [{type: Ready, status: 'False'}]\n",
                HostState::NotReady,
                "ReadinessProbeFailed",
            ),
        ];
        for (yaml, state, reason) in cases {
            let s = observe_pod(Some(&mk_pod(yaml)), Liveness::Alive);
            assert_eq!(
                (s.state, s.reason.as_deref()),
                (state, Some(reason)),
                "{yaml}"
            );
        }
        // A long message (a log tail under FallbackToLogsOnError) keeps its
        // end, where the cause is, within the bound.
        let log: Vec<String> = (0..40).map(|i| format!("line {i} of the log")).collect();
        let yaml = format!(
            "  phase: Failed\n  containerStatuses: [{{name: host, image: x, imageID: '', ready: false, restartCount: 0, state: {{terminated: {{exitCode: 1, reason: Error, message: '{}'}}}}}}]\n",
            log.join(" ")
        );
        let why = observe_pod(Some(&mk_pod(&yaml)), Liveness::Alive)
            .reason
            .unwrap();
        assert!(
            why.starts_with("Error: container host exited with code 1: "),
            "{why}"
        );
        assert!(why.ends_with("line 39 of the log"), "{why}");
        assert!(why.len() <= MAX_REASON, "{}", why.len());
        assert_eq!(
            observe_pod(None, Liveness::Unknown).state,
            HostState::Pending
        );
        assert_eq!(
            observe_pod(Some(&mk_pod("")), Liveness::Unknown).state,
            HostState::Starting
        );
    }
}
