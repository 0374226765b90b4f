//! The Kueue Workload of a World as plain data (no client): what the
//! operator writes (kueue invariants 2, 5), how it reads Kueue's decision
//! ([`Verdict`], invariant 1), where admission places the hosts
//! ([`Placement`], invariant 4) and how the quota is given back after an
//! eviction ([`release_quota`], invariant 3). Field names are those of
//! `kueue.x-k8s.io/v1beta2` (Kueue 0.15 and later; the storage version
//! from 0.19).

use hostmesh_crds::Rank;
use std::collections::BTreeMap;

use hostmesh_crds::World;
use k8s_openapi::api::core::v1::{PodTemplateSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{ApiResource, GroupVersionKind};
use kube::{Resource as _, ResourceExt as _};
use serde_json::{Value, json};

use crate::OperatorError;

/// Kueue's API group.
pub const GROUP: &str = "kueue.x-k8s.io";
/// The Workload API version the operator writes and reads.
pub const VERSION: &str = "v1beta2";
/// The World's one pod set: every host pod.
pub const POD_SET: &str = "hosts";
/// Annotation on the Workload: hash of the pod set it was built from
/// (kueue invariant 2).
pub const ANNOTATION_POD_SET_HASH: &str = "hostmesh.dev/pod-set-hash";
/// Label Kueue puts on the Workloads of its integrations: the owner's uid.
pub const LABEL_JOB_UID: &str = "kueue.x-k8s.io/job-uid";
/// Label Kueue's integrations put on pods: their pod set.
pub const LABEL_POD_SET: &str = "kueue.x-k8s.io/podset";
/// Scheduling gate Kueue's TopologyUngater removes once it has put a pod in
/// its assigned topology domain (kueue invariant 7).
pub const TOPOLOGY_GATE: &str = "kueue.x-k8s.io/topology";
/// Label on pods admitted with topology-aware scheduling.
pub const LABEL_TAS: &str = "kueue.x-k8s.io/tas";
/// Annotation on pods naming their admitted Workload.
pub const ANNOTATION_WORKLOAD: &str = "kueue.x-k8s.io/workload";
/// Finalizer Kueue adds to Workloads while they hold quota; the owner's
/// controller removes it once the owner's pods are gone.
pub const FINALIZER_RESOURCE_IN_USE: &str = "kueue.x-k8s.io/resource-in-use";

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, kind), plural)
}

/// `workloads.kueue.x-k8s.io/v1beta2` (namespaced).
pub fn workloads() -> ApiResource {
    resource("Workload", "workloads")
}

/// `resourceflavors.kueue.x-k8s.io/v1beta2` (cluster-scoped).
pub fn resource_flavors() -> ApiResource {
    resource("ResourceFlavor", "resourceflavors")
}

/// `workloadpriorityclasses.kueue.x-k8s.io/v1beta2` (cluster-scoped).
pub fn workload_priority_classes() -> ApiResource {
    resource("WorkloadPriorityClass", "workloadpriorityclasses")
}

/// Name of a World's Workload: `world-<name>-<5 hex digits of its uid's
/// SHA-256>`, at most 63 characters (Kueue names its own the same way:
/// kind, owner name, a short hash).
pub fn name(world: &World) -> String {
    let uid = world.metadata.uid.as_deref().unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, uid.as_bytes());
    let hash: String = digest.as_ref()[..3]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let base = format!("world-{}", world.name_any());
    let base = hostmesh_crds::procmesh::head(&base, 63 - 6).trim_end_matches(['-', '.']);
    format!("{base}-{}", &hash[..5])
}

/// Hash of what Kueue admits the World by: its pod template (resources,
/// node selectors, affinity, priority), its number of hosts and its
/// topology. Not the agent image or port: an operator upgrade rolls the
/// host pods but does not requeue an admitted World (kueue invariant 2).
pub fn pod_set_hash(world: &World, hosts: Rank) -> String {
    let topology = world.spec.scheduling.as_ref().map(|s| &s.topology);
    let input = json!({"template": world.spec.template, "hosts": hosts, "topology": topology});
    let digest = ring::digest::digest(&ring::digest::SHA256, input.to_string().as_bytes());
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The priority a Workload carries: a Kueue `WorkloadPriorityClass` (World
/// label `kueue.x-k8s.io/priority-class`) or the host pods' Kubernetes
/// `PriorityClass`, with its value (Kueue orders and preempts by the value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Priority {
    /// `scheduling.k8s.io` or `kueue.x-k8s.io`.
    pub group: &'static str,
    /// `PriorityClass` or `WorkloadPriorityClass`.
    pub kind: &'static str,
    /// The class's name.
    pub name: String,
    /// The class's value.
    pub value: i32,
}

/// The Workload a World asks for (kueue invariants 2 and 5): one pod set of
/// `hosts` pods shaped like its host pods, in the queue of its label.
pub fn desired(
    world: &World,
    queue: &str,
    template: PodTemplateSpec,
    hosts: Rank,
    priority: Option<&Priority>,
    pod_set_hash: &str,
) -> Result<Value, OperatorError> {
    let owner = world
        .controller_owner_ref(&())
        .ok_or(OperatorError::MissingField("World metadata.uid"))?;
    let mut template = template;
    let mut pod_set = json!({"name": POD_SET, "count": hosts});
    // Topology invariant 4: Kueue's topology-aware scheduling.
    if let Some((request, annotations)) = super::super::topology::kueue_request(world) {
        pod_set["topologyRequest"] = request;
        template
            .metadata
            .get_or_insert_with(Default::default)
            .annotations
            .get_or_insert_with(Default::default)
            .extend(annotations);
    }
    pod_set["template"] = serde_json::to_value(&template)?;
    let mut spec = json!({
        "queueName": queue,
        "active": !world.spec.suspend,
        "podSets": [pod_set],
    });
    if let Some(p) = priority {
        spec["priorityClassRef"] = json!({"group": p.group, "kind": p.kind, "name": p.name});
        spec["priority"] = json!(p.value);
    }
    let mut labels = serde_json::Map::new();
    if let Some(uid) = &world.metadata.uid {
        labels.insert(LABEL_JOB_UID.into(), json!(uid));
    }
    Ok(json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "Workload",
        "metadata": {
            "name": name(world),
            "namespace": world.namespace(),
            "labels": labels,
            "annotations": {ANNOTATION_POD_SET_HASH: pod_set_hash},
            "ownerReferences": [owner],
        },
        "spec": spec,
    }))
}

/// What Kueue decided about a Workload (kueue invariant 1).
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Not admitted (yet): waiting for quota, an inactive queue, a missing
    /// LocalQueue; the message is Kueue's when it gave one.
    Pending {
        /// Why, for the World's status.
        message: String,
    },
    /// Admitted by `cluster_queue` with these flavors for the hosts.
    Admitted {
        /// The ClusterQueue that admitted it.
        cluster_queue: String,
        /// Flavor names assigned to the host pod set (deduplicated, sorted).
        flavors: Vec<String>,
        /// What admission checks add to the host pods (`podSetUpdates`).
        updates: Placement,
    },
    /// Evicted (`Evicted=True`): preempted, deactivated, timed out.
    Evicted {
        /// Kueue's reason (`Preempted`, `PodsReadyTimeout`, `Deactivated`, ...).
        reason: String,
        /// Kueue's message.
        message: String,
        /// Quota is still reserved: the operator gives it back once the hosts
        /// are gone (kueue invariant 3).
        quota_reserved: bool,
    },
}

fn conditions(wl: &Value) -> Vec<Condition> {
    wl.pointer("/status/conditions")
        .cloned()
        .and_then(|c| serde_json::from_value(c).ok())
        .unwrap_or_default()
}

fn is_true(conds: &[Condition], t: &str) -> bool {
    conds.iter().any(|c| c.type_ == t && c.status == "True")
}

/// Reads Kueue's decision from a Workload's status.
pub fn verdict(wl: &Value) -> Verdict {
    let conds = conditions(wl);
    let get = |t: &str| conds.iter().find(|c| c.type_ == t);
    if let Some(c) = get("Evicted").filter(|c| c.status == "True") {
        return Verdict::Evicted {
            reason: c.reason.clone(),
            message: c.message.clone(),
            quota_reserved: is_true(&conds, "QuotaReserved"),
        };
    }
    let admission = wl.pointer("/status/admission").filter(|a| !a.is_null());
    if let (true, Some(a)) = (is_true(&conds, "Admitted"), admission) {
        let assignments = a["podSetAssignments"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mine = assignments
            .iter()
            .find(|p| p["name"] == POD_SET)
            .or(assignments.first());
        let mut flavors: Vec<String> = mine
            .and_then(|p| p["flavors"].as_object())
            .into_iter()
            .flat_map(|m| m.values().filter_map(Value::as_str).map(str::to_string))
            .collect();
        flavors.sort();
        flavors.dedup();
        let mut updates = Placement::of_updates(wl);
        if mine.is_some_and(|p| !p["topologyAssignment"].is_null()) {
            updates.topology_workload = wl
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        return Verdict::Admitted {
            cluster_queue: a["clusterQueue"].as_str().unwrap_or_default().to_string(),
            flavors,
            updates,
        };
    }
    let name = wl
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let queue = wl
        .pointer("/spec/queueName")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let why = get("QuotaReserved")
        .filter(|c| c.status == "False" && !c.message.is_empty())
        .or_else(|| get("Admitted").filter(|c| c.status == "False" && !c.message.is_empty()))
        .map(|c| format!(": {}", c.message))
        .unwrap_or_default();
    let inactive = if wl.pointer("/spec/active") == Some(&Value::Bool(false)) {
        " (spec.active is false)"
    } else {
        ""
    };
    Verdict::Pending {
        message: format!(
            "waiting for Kueue to admit Workload {name} in LocalQueue {queue}{inactive}{why}"
        ),
    }
}

/// Where an admission places the hosts (kueue invariant 4).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Placement {
    /// Node labels of the assigned flavors.
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the assigned flavors.
    pub tolerations: Vec<Toleration>,
    /// Pod labels admission checks ask for.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Pod annotations admission checks ask for.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The Workload whose admission carries a `topologyAssignment` for the
    /// hosts: the pods are handed to Kueue's TopologyUngater (kueue
    /// invariant 7).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology_workload: Option<String>,
}

impl Placement {
    /// The union of the flavors' `spec.nodeLabels` and `spec.tolerations`
    /// (ResourceFlavor objects as read from the API server).
    pub fn of_flavors(flavors: &[Value]) -> Placement {
        let mut p = Placement::default();
        for f in flavors {
            if let Some(labels) = f.pointer("/spec/nodeLabels").and_then(Value::as_object) {
                for (k, v) in labels {
                    if let Some(v) = v.as_str() {
                        p.node_selector.insert(k.clone(), v.to_string());
                    }
                }
            }
            let tolerations: Vec<Toleration> = f
                .pointer("/spec/tolerations")
                .cloned()
                .and_then(|t| serde_json::from_value(t).ok())
                .unwrap_or_default();
            for t in tolerations {
                if !p.tolerations.contains(&t) {
                    p.tolerations.push(t);
                }
            }
        }
        p
    }

    /// What the Workload's admission checks add to the host pod set
    /// (`status.admissionChecks[].podSetUpdates` named `hosts`), as Kueue
    /// merges them into its own jobs' pods.
    pub fn of_updates(wl: &Value) -> Placement {
        let mut p = Placement::default();
        let checks = wl
            .pointer("/status/admissionChecks")
            .and_then(Value::as_array);
        for update in checks
            .into_iter()
            .flatten()
            .filter_map(|c| c["podSetUpdates"].as_array())
            .flatten()
            .filter(|u| u["name"] == POD_SET)
        {
            let map = |v: &Value| -> BTreeMap<String, String> {
                v.as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            };
            p.node_selector.extend(map(&update["nodeSelector"]));
            p.labels.extend(map(&update["labels"]));
            p.annotations.extend(map(&update["annotations"]));
            let tolerations: Vec<Toleration> =
                serde_json::from_value(update["tolerations"].clone()).unwrap_or_default();
            for t in tolerations {
                if !p.tolerations.contains(&t) {
                    p.tolerations.push(t);
                }
            }
        }
        p
    }

    /// `other` added to `self` (its map entries win).
    pub fn merge(mut self, other: Placement) -> Placement {
        self.topology_workload = other.topology_workload.or(self.topology_workload);
        self.node_selector.extend(other.node_selector);
        self.labels.extend(other.labels);
        self.annotations.extend(other.annotations);
        for t in other.tolerations {
            if !self.tolerations.contains(&t) {
                self.tolerations.push(t);
            }
        }
        self
    }

    /// Nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.node_selector.is_empty()
            && self.tolerations.is_empty()
            && self.labels.is_empty()
            && self.annotations.is_empty()
            && self.topology_workload.is_none()
    }
}

/// The status patch that gives an evicted Workload's quota back (kueue
/// invariant 3), as Kueue's own integrations write it once their job has
/// stopped: `Requeued`, `QuotaReserved=False` (reason `Pending`),
/// `Admitted=False` (`NoReservation`), `admission` removed. The patch
/// carries the Workload's resourceVersion, so it applies only to the
/// status it was computed from.
pub fn release_quota(wl: &Value, now: &Time) -> Value {
    let mut conds = conditions(wl);
    let generation = wl.pointer("/metadata/generation").and_then(Value::as_i64);
    let (reason, message) = conds
        .iter()
        .find(|c| c.type_ == "Evicted")
        .map(|c| (c.reason.clone(), c.message.clone()))
        .unwrap_or_default();
    let requeued = matches!(reason.as_str(), "Preempted" | "NodeFailures");
    let mut set = |t: &str, status: bool, reason: &str, message: &str| {
        set_condition(&mut conds, t, status, reason, message, generation, now);
    };
    set("Requeued", requeued, &reason, &message);
    set("QuotaReserved", false, "Pending", &message);
    set(
        "Admitted",
        false,
        "NoReservation",
        "The workload has no reservation",
    );
    json!({
        "metadata": {"resourceVersion": wl.pointer("/metadata/resourceVersion")},
        "status": {"conditions": conds, "admission": null},
    })
}

/// Sets condition `t` in `conds` as Kueue's `workload.UpdateStatus` does:
/// the transition time moves only when the status changes.
fn set_condition(
    conds: &mut Vec<Condition>,
    t: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let status = if status { "True" } else { "False" };
    match conds.iter_mut().find(|c| c.type_ == t) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now.clone();
            }
            c.status = status.into();
            c.reason = reason.into();
            c.message = message.into();
            c.observed_generation = generation;
        }
        None => conds.push(Condition {
            type_: t.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: generation,
            last_transition_time: now.clone(),
        }),
    }
}

/// What an admitted World tells its Workload, as Kueue's job framework
/// does for its own kinds (kueue invariant 6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadProgress {
    /// Every host is Ready (the World is Running).
    pub all_ready: bool,
    /// The World failed for good, with the message of its `Failed`
    /// condition.
    pub failed: Option<String>,
    /// The World succeeded (`finishWhen`), with the message of its
    /// `Complete` condition.
    pub succeeded: Option<String>,
}

/// The status patch that brings the Workload's `PodsReady` and `Finished`
/// conditions in line with `progress`, or `None` when they already are
/// (kueue invariant 6). `PodsReady` uses Kueue's reasons: `WaitForStart`
/// until the hosts were first all Ready, then `Started`; `WaitForRecovery`
/// after a host is lost, then `Recovered`. A finished World is
/// `Finished=True` (reason `Succeeded` or `Failed`), which gives its quota
/// back. The patch
/// carries the resourceVersion, as [`release_quota`]'s does.
pub fn report(wl: &Value, progress: &WorkloadProgress, now: &Time) -> Option<Value> {
    let mut conds = conditions(wl);
    let before = conds.clone();
    let generation = wl.pointer("/metadata/generation").and_then(Value::as_i64);
    if is_true(&conds, "Finished") {
        return None;
    }
    let was = conds.iter().find(|c| c.type_ == "PodsReady");
    let started_before = was.is_some_and(|c| {
        c.status == "True" || matches!(c.reason.as_str(), "WaitForRecovery" | "Recovered")
    });
    let recovered =
        was.is_some_and(|c| matches!(c.reason.as_str(), "WaitForRecovery" | "Recovered"));
    let (ready, reason, message) = match (progress.all_ready, started_before) {
        (true, _) if recovered => (
            true,
            "Recovered",
            "All pods are ready again after a failure",
        ),
        (true, _) => (
            true,
            "Started",
            "All pods reached readiness and the workload is running",
        ),
        (false, true) => (
            false,
            "WaitForRecovery",
            "At least one pod has failed, waiting for recovery",
        ),
        (false, false) => (false, "WaitForStart", "Not all pods are ready or succeeded"),
    };
    set_condition(
        &mut conds,
        "PodsReady",
        ready,
        reason,
        message,
        generation,
        now,
    );
    if let Some(msg) = &progress.failed {
        set_condition(&mut conds, "Finished", true, "Failed", msg, generation, now);
    } else if let Some(msg) = &progress.succeeded {
        set_condition(
            &mut conds,
            "Finished",
            true,
            "Succeeded",
            msg,
            generation,
            now,
        );
    }
    let same = conds.len() == before.len()
        && conds.iter().zip(&before).all(|(a, b)| {
            a.type_ == b.type_
                && a.status == b.status
                && a.reason == b.reason
                && a.message == b.message
        });
    if same {
        return None;
    }
    Some(json!({
        "metadata": {"resourceVersion": wl.pointer("/metadata/resourceVersion")},
        "status": {"conditions": conds},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wl(status: Value) -> Value {
        json!({"metadata": {"name": "world-w-abcde", "generation": 1, "resourceVersion": "7"},
               "spec": {"queueName": "team-a"}, "status": status})
    }

    fn c(t: &str, s: &str, reason: &str, message: &str) -> Value {
        json!({"type": t, "status": s, "reason": reason, "message": message,
               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

    #[test]
    fn a_new_workload_is_pending_with_kueues_message() {
        let v = verdict(&wl(json!({})));
        assert_eq!(
            v,
            Verdict::Pending {
                message: "waiting for Kueue to admit Workload world-w-abcde in LocalQueue team-a"
                    .into()
            }
        );
        let v = verdict(&wl(
            json!({"conditions": [c("QuotaReserved", "False", "Inadmissible", "LocalQueue team-a doesn't exist")]}),
        ));
        let Verdict::Pending { message } = v else {
            panic!()
        };
        assert!(
            message.ends_with(": LocalQueue team-a doesn't exist"),
            "{message}"
        );
    }

    #[test]
    fn admitted_reads_the_cluster_queue_and_flavors() {
        let v = verdict(&wl(json!({
            "conditions": [c("QuotaReserved", "True", "QuotaReserved", ""), c("Admitted", "True", "Admitted", "")],
            "admission": {"clusterQueue": "cq", "podSetAssignments": [
                {"name": "hosts", "flavors": {"cpu": "on-demand", "memory": "on-demand", "nvidia.com/gpu": "a100"}, "count": 4}]},
        })));
        assert_eq!(
            v,
            Verdict::Admitted {
                cluster_queue: "cq".into(),
                flavors: vec!["a100".into(), "on-demand".into()],
                updates: Placement::default(),
            }
        );
        // An admission check's pod set update reaches the placement.
        let v = verdict(&wl(json!({
            "conditions": [c("QuotaReserved", "True", "QuotaReserved", ""), c("Admitted", "True", "Admitted", "")],
            "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "hosts", "count": 4}]},
            "admissionChecks": [{"name": "prov", "state": "Ready", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
                "podSetUpdates": [{"name": "hosts", "nodeSelector": {"provreq": "r1"}, "annotations": {"a": "b"},
                                   "tolerations": [{"key": "k", "operator": "Exists"}]}]}],
        })));
        let Verdict::Admitted { updates, .. } = v else {
            panic!("{v:?}")
        };
        assert_eq!(updates.node_selector["provreq"], "r1");
        assert_eq!(updates.annotations["a"], "b");
        assert_eq!(updates.tolerations.len(), 1);
        // Quota reserved but admission checks pending: not admitted.
        let v = verdict(&wl(json!({
            "conditions": [c("QuotaReserved", "True", "QuotaReserved", "")],
            "admission": {"clusterQueue": "cq", "podSetAssignments": []},
        })));
        assert!(matches!(v, Verdict::Pending { .. }));
    }

    #[test]
    fn eviction_wins_and_release_gives_the_quota_back_as_kueue_does() {
        let w = wl(json!({
            "conditions": [c("QuotaReserved", "True", "QuotaReserved", ""), c("Admitted", "True", "Admitted", ""),
                           c("Evicted", "True", "Preempted", "Preempted to accommodate a workload")],
            "admission": {"clusterQueue": "cq", "podSetAssignments": []},
        }));
        assert_eq!(
            verdict(&w),
            Verdict::Evicted {
                reason: "Preempted".into(),
                message: "Preempted to accommodate a workload".into(),
                quota_reserved: true
            }
        );
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(100).unwrap());
        let patch = release_quota(&w, &now);
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert!(patch["status"]["admission"].is_null());
        let conds: Vec<Condition> =
            serde_json::from_value(patch["status"]["conditions"].clone()).unwrap();
        let get = |t: &str| conds.iter().find(|c| c.type_ == t).unwrap();
        assert_eq!(
            (
                get("QuotaReserved").status.as_str(),
                get("QuotaReserved").reason.as_str()
            ),
            ("False", "Pending")
        );
        assert_eq!(
            (
                get("Admitted").status.as_str(),
                get("Admitted").reason.as_str()
            ),
            ("False", "NoReservation")
        );
        assert_eq!(
            (
                get("Requeued").status.as_str(),
                get("Requeued").reason.as_str()
            ),
            ("True", "Preempted")
        );
        assert_eq!(
            get("Evicted").status,
            "True",
            "Kueue resets Evicted on the next reservation"
        );
        // After the release Kueue's verdict is still Evicted, without quota.
        let mut after = w.clone();
        after["status"] = patch["status"].clone();
        assert!(matches!(
            verdict(&after),
            Verdict::Evicted {
                quota_reserved: false,
                ..
            }
        ));
    }

    #[test]
    fn placement_is_the_union_of_the_flavors() {
        let flavors = [
            json!({"spec": {"nodeLabels": {"cloud.example.com/pool": "a100"},
                            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}),
            json!({"spec": {"nodeLabels": {"topology.kubernetes.io/zone": "z1"},
                            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}),
            json!({"spec": {}}),
        ];
        let p = Placement::of_flavors(&flavors);
        assert_eq!(p.node_selector.len(), 2);
        assert_eq!(p.tolerations.len(), 1);
        assert!(Placement::of_flavors(&[]).is_empty());
    }

    #[test]
    fn names_are_short_and_stable() {
        let mut w: World = serde_json::from_value(json!({
            "apiVersion": "hostmesh.dev/v1alpha1", "kind": "World",
            "metadata": {"name": "x".repeat(63), "namespace": "ns", "uid": "u-1"},
            "spec": {"hosts": 2, "template": {}}}))
        .unwrap();
        let n = name(&w);
        assert!(n.len() <= 63 && n.starts_with("world-xxx"), "{n}");
        assert_eq!(n, name(&w));
        w.metadata.uid = Some("u-2".into());
        assert_ne!(n, name(&w));
    }

    fn progress(all_ready: bool, failed: Option<&str>) -> WorkloadProgress {
        WorkloadProgress {
            all_ready,
            failed: failed.map(str::to_string),
            succeeded: None,
        }
    }

    fn pods_ready(patch: &Value) -> (String, String) {
        let c = patch["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "PodsReady")
            .unwrap();
        (
            c["status"].as_str().unwrap().to_string(),
            c["reason"].as_str().unwrap().to_string(),
        )
    }

    #[test]
    fn pods_ready_follows_kueues_reasons_from_start_through_recovery() {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let admitted = wl(json!({"conditions": [c("Admitted", "True", "Admitted", "")]}));
        let p = report(&admitted, &progress(false, None), &now).unwrap();
        assert_eq!(pods_ready(&p), ("False".into(), "WaitForStart".into()));
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        let waiting = wl(p["status"].clone());
        assert_eq!(
            report(&waiting, &progress(false, None), &now),
            None,
            "no change, no write"
        );
        let p = report(&waiting, &progress(true, None), &now).unwrap();
        assert_eq!(pods_ready(&p), ("True".into(), "Started".into()));
        let started = wl(p["status"].clone());
        assert_eq!(report(&started, &progress(true, None), &now), None);
        let p = report(&started, &progress(false, None), &now).unwrap();
        assert_eq!(pods_ready(&p), ("False".into(), "WaitForRecovery".into()));
        let lost = wl(p["status"].clone());
        let p = report(&lost, &progress(true, None), &now).unwrap();
        assert_eq!(pods_ready(&p), ("True".into(), "Recovered".into()));
        let recovered = wl(p["status"].clone());
        assert_eq!(report(&recovered, &progress(true, None), &now), None);
    }

    #[test]
    fn a_failed_world_finishes_its_workload_once() {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let admitted = wl(json!({"conditions": [c("Admitted", "True", "Admitted", "")]}));
        let p = report(
            &admitted,
            &progress(false, Some("host 1 failed 4 times")),
            &now,
        )
        .unwrap();
        let finished = p["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Finished")
            .unwrap()
            .clone();
        assert_eq!(finished["status"], "True");
        assert_eq!(finished["reason"], "Failed");
        assert_eq!(finished["message"], "host 1 failed 4 times");
        let done = wl(p["status"].clone());
        assert_eq!(report(&done, &progress(false, Some("x")), &now), None);
    }

    #[test]
    fn a_succeeded_world_finishes_its_workload_with_reason_succeeded() {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let admitted = wl(json!({"conditions": [c("Admitted", "True", "Admitted", "")]}));
        let done = WorkloadProgress {
            all_ready: false,
            failed: None,
            succeeded: Some("all 1 ProcMeshes succeeded: train".into()),
        };
        let p = report(&admitted, &done, &now).unwrap();
        let finished = p["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Finished")
            .unwrap()
            .clone();
        assert_eq!(
            (finished["status"].as_str(), finished["reason"].as_str()),
            (Some("True"), Some("Succeeded"))
        );
        assert_eq!(report(&wl(p["status"].clone()), &done, &now), None);
    }
}
