//! Gang scheduling of a World's host pods (`spec.scheduling.gang`): the
//! provider's group object, the fields each provider reads on a pod, and
//! the `GangScheduled` condition (docs/scheduling.md).
//!
//! Invariants (cited as "gang invariant N"):
//! 1. The group object is named like the World, owned by it (controller
//!    reference), server-side applied, and asks for every host
//!    (`minMember` / `minCount` = hosts): all or nothing.
//! 2. Every host pod carries the provider's scheduler name and group
//!    reference; they are part of the pod template hash, so changing the
//!    provider rolls the pods.
//! 3. A provider whose API the server does not serve is reported by name
//!    (`GangScheduled=False`, reason `ProviderNotInstalled`); the pods are
//!    still created (they wait, and the condition says why).

use hostmesh_crds::Rank;
use hostmesh_crds::World;
use hostmesh_crds::world::{GangProvider, GangSpec};
use kube::api::{ApiResource, GroupVersionKind};
use kube::{Resource as _, ResourceExt as _};
use serde_json::{Value, json};

use crate::OperatorError;

/// scheduler-plugins' pod label naming the pod's PodGroup.
pub const LABEL_SCHEDULER_PLUGINS_GROUP: &str = "scheduling.x-k8s.io/pod-group";
/// Volcano's pod annotation naming the pod's PodGroup.
pub const ANNOTATION_VOLCANO_GROUP: &str = "scheduling.k8s.io/group-name";

/// The World's gang settings, if any.
pub fn spec(world: &World) -> Option<&GangSpec> {
    world.spec.scheduling.as_ref()?.gang.as_ref()
}

/// The provider's group object type.
pub fn resource(provider: GangProvider) -> ApiResource {
    let (group, version) = match provider {
        GangProvider::SchedulerPlugins => ("scheduling.x-k8s.io", "v1alpha1"),
        GangProvider::Volcano => ("scheduling.volcano.sh", "v1beta1"),
        GangProvider::Kubernetes => ("scheduling.k8s.io", "v1beta1"),
    };
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, "PodGroup"),
        "podgroups",
    )
}

/// The scheduler that places the pods (`None`: the default scheduler).
pub fn scheduler_name(gang: &GangSpec) -> Option<String> {
    gang.scheduler_name.clone().or(match gang.provider {
        GangProvider::SchedulerPlugins => Some("scheduler-plugins-scheduler".into()),
        GangProvider::Volcano => Some("volcano".into()),
        GangProvider::Kubernetes => None,
    })
}

/// The group object for `world` with `hosts` members (gang invariant 1).
pub fn group(world: &World, gang: &GangSpec, hosts: Rank) -> Result<Value, OperatorError> {
    let owner = world
        .controller_owner_ref(&())
        .ok_or(OperatorError::MissingField("World metadata.uid"))?;
    let ar = resource(gang.provider);
    let priority = world
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.priority_class_name.clone());
    let spec = match gang.provider {
        GangProvider::SchedulerPlugins => {
            let mut s = json!({"minMember": hosts});
            if let Some(t) = gang.schedule_timeout_seconds {
                s["scheduleTimeoutSeconds"] = json!(t);
            }
            s
        }
        GangProvider::Volcano => {
            let mut s = json!({"minMember": hosts});
            if let Some(q) = &gang.queue {
                s["queue"] = json!(q);
            }
            if let Some(p) = &priority {
                s["priorityClassName"] = json!(p);
            }
            s
        }
        GangProvider::Kubernetes => {
            let mut s = json!({"schedulingPolicy": {"gang": {"minCount": hosts}}});
            if let Some(p) = &priority {
                s["priorityClassName"] = json!(p);
            }
            s
        }
    };
    Ok(json!({
        "apiVersion": ar.api_version,
        "kind": ar.kind,
        "metadata": {
            "name": world.name_any(),
            "namespace": world.namespace(),
            "ownerReferences": [owner],
            "labels": {"hostmesh.dev/world": world.name_any(), "app.kubernetes.io/managed-by": "hostmesh"},
        },
        "spec": spec,
    }))
}

/// Gives host pod `rank` (as JSON) the provider's scheduler name and group
/// reference (gang invariant 2; the Kubernetes provider's group is the
/// rank's, workload invariant 2). The Kubernetes provider's
/// `spec.schedulingGroup` is newer than the API types the operator is built
/// with, hence JSON.
pub fn place_pod(pod: &mut Value, world: &World, gang: &GangSpec, rank: Rank) {
    let group = world.name_any();
    if let Some(s) = scheduler_name(gang) {
        pod["spec"]["schedulerName"] = json!(s);
    }
    match gang.provider {
        GangProvider::SchedulerPlugins => {
            pod["metadata"]["labels"][LABEL_SCHEDULER_PLUGINS_GROUP] = json!(group);
        }
        GangProvider::Volcano => {
            pod["metadata"]["annotations"][ANNOTATION_VOLCANO_GROUP] = json!(group);
        }
        GangProvider::Kubernetes => {
            pod["spec"]["schedulingGroup"] =
                json!({"podGroupName": super::workload_api::group_of(world, rank)});
        }
    }
}

/// `kind.group/version` of the provider's group, for messages.
pub fn describe(provider: GangProvider) -> String {
    let ar = resource(provider);
    format!("{}.{}/{}", ar.plural, ar.group, ar.version)
}

/// The `GangScheduled` condition (status, reason, message) from how many of
/// the `live` host pods are `bound` to a node.
pub fn condition(
    world: &World,
    gang: &GangSpec,
    live: usize,
    bound: usize,
    hosts: Rank,
) -> (bool, &'static str, String) {
    let who = match scheduler_name(gang) {
        Some(s) => format!("scheduler {s}"),
        None => "the default scheduler".to_string(),
    };
    if live == hosts && bound == live {
        return (
            true,
            "AllBound",
            format!("all {hosts} host pods bound by {who}"),
        );
    }
    (
        false,
        "WaitingForScheduler",
        format!(
            "{bound}/{hosts} host pods bound; the gang (PodGroup {}, {:?}) waits for {who} to place all {hosts} at once",
            world.name_any(),
            gang.provider
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `replica=2,host=4` World with `gang` as its gang settings.
    fn world(gang: &str) -> World {
        let mut w: World = serde_saphyr::from_str(&format!(
            "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {{name: trainer, namespace: ml, uid: u1}}\n\
spec:\n  shape: [{{name: replica, size: 2}}, {{name: host, size: 4}}]\n  scheduling: {{gang: {gang}}}\n  template: {{spec: {{priorityClassName: high, containers: [{{name: host, image: x}}]}}}}\n"
        ))
        .unwrap();
        w.metadata.uid = Some("u1".into());
        w
    }

    fn pod_of(w: &World) -> Value {
        let g = spec(w).unwrap();
        let mut p = json!({"metadata": {"name": "trainer-host-0", "labels": {"team": "a"}, "annotations": {}}, "spec": {"containers": []}});
        place_pod(&mut p, w, g, 0);
        p
    }

    /// Gang invariants 1 and 2 for scheduler-plugins coscheduling.
    #[test]
    fn scheduler_plugins_gets_a_pod_group_of_every_host_and_its_label() {
        let w = world("{provider: SchedulerPlugins, scheduleTimeoutSeconds: 120}");
        let g = group(&w, spec(&w).unwrap(), 8).unwrap();
        assert_eq!(g["apiVersion"], "scheduling.x-k8s.io/v1alpha1");
        assert_eq!(g["kind"], "PodGroup");
        assert_eq!(g["metadata"]["name"], "trainer");
        assert_eq!(g["metadata"]["ownerReferences"][0]["kind"], "World");
        assert_eq!(
            g["spec"],
            json!({"minMember": 8, "scheduleTimeoutSeconds": 120})
        );
        let p = pod_of(&w);
        assert_eq!(p["spec"]["schedulerName"], "scheduler-plugins-scheduler");
        assert_eq!(
            p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"],
            "trainer"
        );
        assert_eq!(p["metadata"]["labels"]["team"], "a");
    }

    /// Gang invariants 1 and 2 for Volcano.
    #[test]
    fn volcano_gets_a_pod_group_with_queue_and_priority_and_its_annotation() {
        let w = world("{provider: Volcano, queue: research}");
        let g = group(&w, spec(&w).unwrap(), 8).unwrap();
        assert_eq!(g["apiVersion"], "scheduling.volcano.sh/v1beta1");
        assert_eq!(
            g["spec"],
            json!({"minMember": 8, "queue": "research", "priorityClassName": "high"})
        );
        let p = pod_of(&w);
        assert_eq!(p["spec"]["schedulerName"], "volcano");
        assert_eq!(
            p["metadata"]["annotations"]["scheduling.k8s.io/group-name"],
            "trainer"
        );
    }

    /// Gang invariants 1 and 2 for Kubernetes' Workload API.
    #[test]
    fn kubernetes_gets_a_gang_pod_group_and_a_scheduling_group_reference() {
        let w = world("{provider: Kubernetes}");
        let g = group(&w, spec(&w).unwrap(), 8).unwrap();
        assert_eq!(g["apiVersion"], "scheduling.k8s.io/v1beta1");
        assert_eq!(
            g["spec"]["schedulingPolicy"],
            json!({"gang": {"minCount": 8}})
        );
        let p = pod_of(&w);
        assert!(
            p["spec"].get("schedulerName").is_none(),
            "the default scheduler"
        );
        assert_eq!(
            p["spec"]["schedulingGroup"],
            json!({"podGroupName": "trainer"})
        );
        let w = world("{provider: Kubernetes, schedulerName: my-scheduler}");
        assert_eq!(pod_of(&w)["spec"]["schedulerName"], "my-scheduler");
    }

    #[test]
    fn the_condition_says_when_the_gang_waits() {
        let w = world("{provider: Volcano}");
        let g = spec(&w).unwrap();
        let (ok, reason, msg) = condition(&w, g, 8, 3, 8);
        assert!(!ok);
        assert_eq!(reason, "WaitingForScheduler");
        assert!(msg.starts_with("3/8 host pods bound"), "{msg}");
        assert!(msg.contains("scheduler volcano"), "{msg}");
        assert_eq!(condition(&w, g, 8, 8, 8).1, "AllBound");
        assert_eq!(
            describe(GangProvider::Volcano),
            "podgroups.scheduling.volcano.sh/v1beta1"
        );
    }
}
