//! The `Kubernetes` gang provider: Kubernetes' own Workload API
//! (`scheduling.k8s.io`), in the version the cluster serves
//! (docs/scheduling.md, "Kubernetes' Workload API").
//!
//! Invariants (cited as "workload invariant N"):
//! 1. The version is discovered, newest first: `v1beta1` (1.37: standalone
//!    `PodGroup`s) when `podgroups.scheduling.k8s.io/v1beta1` is served,
//!    else `v1alpha2` (1.36, gates `GenericWorkload` and `GangScheduling`:
//!    a `Workload` of pod-group templates and one `PodGroup` per group
//!    referring to its template) when both its `workloads` and `podgroups`
//!    are; neither is "not installed", naming both.
//! 2. The groups: without a `Required` topology entry, one group of every
//!    host named like the World; with one, a group per slice along its
//!    dimension (topology invariant 1), `<world>-<dimension>-<i>`, each
//!    asking for its slice's hosts (`minCount`) within one domain of the
//!    entry's key (`schedulingConstraints.topology`). Host pod `rank`
//!    joins its group through `spec.schedulingGroup.podGroupName`.
//! 3. `v1alpha2`'s Workload has one template: `hosts` (every host) or the
//!    slice dimension's name (each slice; a template stands for as many
//!    PodGroups as there are slices, and the API allows at most 8
//!    templates). Its objects are named like the World (Workload) and as in
//!    invariant 2 (PodGroups), owned by the World, server-side applied;
//!    their specs are immutable, so one the server refuses to change (422)
//!    is deleted and made again, and groups no longer in the layout are
//!    deleted.
//! 4. What the scheduler says reaches `GangScheduled`: a group's
//!    `PodGroupScheduled=False` gives its reason (`Unschedulable`,
//!    `SchedulerError`) and the scheduler's message, a `DisruptionTarget=True`
//!    gives `Preempted` (`PreemptionByScheduler`) with its message; the
//!    lowest group with a problem is named.

use hostmesh_crds::Rank;
use hostmesh_crds::World;
use hostmesh_crds::world::TopologyMode;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Resource as _, ResourceExt as _};
use serde_json::{Value, json};

use crate::OperatorError;

/// The API group.
pub const GROUP: &str = "scheduling.k8s.io";

/// A version of the Workload API this operator writes (workload invariant
/// 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// Kubernetes 1.36: `Workload` templates and `PodGroup`s made from them.
    V1alpha2,
    /// Kubernetes 1.37: standalone `PodGroup`s.
    V1beta1,
}

impl Version {
    /// `v1alpha2`, `v1beta1`.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1alpha2 => "v1alpha2",
            Version::V1beta1 => "v1beta1",
        }
    }

    /// Newest first (workload invariant 1).
    pub const PREFERENCE: [Version; 2] = [Version::V1beta1, Version::V1alpha2];

    /// The resources this version needs served.
    pub fn needs(self) -> &'static [&'static str] {
        match self {
            Version::V1alpha2 => &["workloads", "podgroups"],
            Version::V1beta1 => &["podgroups"],
        }
    }
}

/// The `PodGroup` type of `version`.
pub fn pod_group_resource(version: Version) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, version.as_str(), "PodGroup"),
        "podgroups",
    )
}

/// The `Workload` type of `version`.
pub fn workload_resource(version: Version) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, version.as_str(), "Workload"),
        "workloads",
    )
}

/// What "not installed" names (workload invariant 1).
pub fn not_served() -> String {
    "podgroups.scheduling.k8s.io/v1beta1 (Kubernetes 1.37), or workloads and podgroups of scheduling.k8s.io/v1alpha2 (Kubernetes 1.36 with the GenericWorkload and GangScheduling feature gates)".to_string()
}

/// One gang of hosts (workload invariant 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The PodGroup's name.
    pub name: String,
    /// Its first host rank.
    pub first: Rank,
    /// Its host count (`minCount`).
    pub hosts: Rank,
}

/// How a World's hosts are grouped (workload invariants 2, 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The v1alpha2 template every group is made from.
    pub template: String,
    /// The node label key each group must share a value of.
    pub topology_key: Option<String>,
    /// The groups, in rank order.
    pub groups: Vec<Group>,
}

/// The layout of `world` (workload invariant 2).
pub fn layout(world: &World) -> Layout {
    let name = world.name_any();
    let hosts = world.spec.full_shape().num_ranks();
    let slices = world
        .spec
        .scheduling
        .iter()
        .flat_map(|s| &s.topology)
        .filter(|t| t.mode == TopologyMode::Required)
        .find_map(|t| Some((t, super::topology::stride(world, &t.dimension)?)));
    match slices {
        Some((t, stride)) if stride > 0 => Layout {
            template: t.dimension.clone(),
            topology_key: Some(t.key.clone()),
            groups: (0..hosts.div_ceil(stride))
                .map(|i| Group {
                    name: format!("{name}-{}-{i}", t.dimension),
                    first: i * stride,
                    hosts: stride.min(hosts - i * stride),
                })
                .collect(),
        },
        _ => Layout {
            template: "hosts".to_string(),
            topology_key: None,
            groups: vec![Group {
                name,
                first: 0,
                hosts,
            }],
        },
    }
}

/// The group host `rank` joins (workload invariant 2).
pub fn group_of(world: &World, rank: Rank) -> String {
    let l = layout(world);
    l.groups
        .iter()
        .find(|g| rank >= g.first && rank < g.first + g.hosts)
        .or(l.groups.last())
        .map_or_else(|| world.name_any(), |g| g.name.clone())
}

fn metadata(world: &World, name: &str) -> Result<Value, OperatorError> {
    let owner = world
        .controller_owner_ref(&())
        .ok_or(OperatorError::MissingField("World metadata.uid"))?;
    Ok(json!({
        "name": name,
        "namespace": world.namespace(),
        "ownerReferences": [owner],
        "labels": {"hostmesh.dev/world": world.name_any(), "app.kubernetes.io/managed-by": "hostmesh"},
    }))
}

/// A group's scheduling policy and constraints.
fn scheduling(layout: &Layout, hosts: Rank) -> (Value, Option<Value>) {
    let policy = json!({"gang": {"minCount": hosts}});
    let constraints = layout
        .topology_key
        .as_ref()
        .map(|k| json!({"topology": [{"key": k}]}));
    (policy, constraints)
}

/// The v1alpha2 `Workload` of `world` (workload invariant 3).
pub fn workload(world: &World, layout: &Layout) -> Result<Value, OperatorError> {
    let ar = workload_resource(Version::V1alpha2);
    let per_group = layout.groups.first().map_or(0, |g| g.hosts);
    let (policy, constraints) = scheduling(layout, per_group);
    let mut template = json!({"name": layout.template, "schedulingPolicy": policy});
    if let Some(c) = constraints {
        template["schedulingConstraints"] = c;
    }
    Ok(json!({
        "apiVersion": ar.api_version,
        "kind": ar.kind,
        "metadata": metadata(world, &world.name_any())?,
        "spec": {
            "controllerRef": {"apiGroup": hostmesh_crds::GROUP, "kind": "World", "name": world.name_any()},
            "podGroupTemplates": [template],
        },
    }))
}

/// The `PodGroup`s of `world` in `version` (workload invariants 2, 3).
pub fn pod_groups(
    world: &World,
    layout: &Layout,
    version: Version,
) -> Result<Vec<Value>, OperatorError> {
    let ar = pod_group_resource(version);
    let priority = world
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.priority_class_name.clone());
    layout
        .groups
        .iter()
        .map(|g| {
            let (policy, constraints) = scheduling(layout, g.hosts);
            let mut spec = json!({"schedulingPolicy": policy});
            if let Some(c) = constraints {
                spec["schedulingConstraints"] = c;
            }
            match version {
                Version::V1alpha2 => {
                    spec["podGroupTemplateRef"] = json!({"workload": {
                        "workloadName": world.name_any(),
                        "podGroupTemplateName": layout.template,
                    }});
                }
                Version::V1beta1 => {
                    if let Some(p) = &priority {
                        spec["priorityClassName"] = json!(p);
                    }
                }
            }
            Ok(json!({
                "apiVersion": ar.api_version,
                "kind": ar.kind,
                "metadata": metadata(world, &g.name)?,
                "spec": spec,
            }))
        })
        .collect()
}

/// What the scheduler says of the groups (workload invariant 4): the
/// `GangScheduled` reason and message of the first group (rank order)
/// with a problem.
pub fn scheduler_verdict(layout: &Layout, groups: &[DynamicObject]) -> Option<(String, String)> {
    for g in &layout.groups {
        let Some(obj) = groups.iter().find(|o| o.name_any() == g.name) else {
            continue;
        };
        let conditions = obj.data["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let find = |t: &str| conditions.iter().find(|c| c["type"] == t);
        let text = |c: &Value, k: &str| c[k].as_str().unwrap_or_default().to_string();
        if let Some(c) = find("DisruptionTarget").filter(|c| c["status"] == "True") {
            return Some((
                "Preempted".to_string(),
                format!(
                    "PodGroup {} ({}): {}",
                    g.name,
                    text(c, "reason"),
                    text(c, "message")
                ),
            ));
        }
        if let Some(c) = find("PodGroupScheduled").filter(|c| c["status"] == "False") {
            let reason = match text(c, "reason") {
                r if r.is_empty() => "Unschedulable".to_string(),
                r => r,
            };
            return Some((
                reason,
                format!("PodGroup {}: {}", g.name, text(c, "message")),
            ));
        }
    }
    None
}

/// Which Workload API version the server serves (workload invariant 1).
async fn discover(client: &kube::Client) -> Result<Option<Version>, kube::Error> {
    for v in Version::PREFERENCE {
        let served = match client
            .list_api_group_resources(&format!("{GROUP}/{}", v.as_str()))
            .await
        {
            Ok(list) => v
                .needs()
                .iter()
                .all(|n| list.resources.iter().any(|r| r.name == *n)),
            Err(kube::Error::Api(e)) if e.code == 404 => false,
            Err(e) => return Err(e),
        };
        if served {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

/// Server-side applies `obj` as `name`; an object whose immutable spec the
/// server refuses to change (422) is deleted and made again (workload
/// invariant 3).
async fn apply_replacing(
    api: &kube::Api<DynamicObject>,
    name: &str,
    obj: &Value,
) -> Result<(), kube::Error> {
    let pp = kube::api::PatchParams::apply(crate::FIELD_MANAGER).force();
    match api.patch(name, &pp, &kube::api::Patch::Apply(obj)).await {
        Err(kube::Error::Api(e)) if e.code == 422 && api.get_opt(name).await?.is_some() => {
            tracing::info!(object = %name, message = %e.message, "immutable spec changed: replacing it");
            let dp = kube::api::DeleteParams::foreground();
            api.delete(name, &dp).await?;
            // Foreground deletion keeps the object until it is gone.
            for _ in 0..50 {
                if api.get_opt(name).await?.is_none() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            api.patch(name, &pp, &kube::api::Patch::Apply(obj)).await?;
            Ok(())
        }
        Err(e) => Err(e),
        Ok(_) => Ok(()),
    }
}

/// Applies the Workload API objects of `world` in the version the server
/// serves and reads what the scheduler says of them (workload invariants
/// 1-4). Returns the `GangScheduled` problem, if any: the API not served,
/// forbidden, refused, or the scheduler's verdict (also published as an
/// Event).
pub async fn ensure(
    world: &World,
    ctx: &crate::controllers::shared::ControllerContext,
) -> Result<Option<(&'static str, String)>, OperatorError> {
    let Some(version) = discover(&ctx.client).await? else {
        return Ok(Some((
            "ProviderNotInstalled",
            format!(
                "spec.scheduling.gang.provider Kubernetes needs {}, which the API server does not serve: enable it or choose another provider",
                not_served()
            ),
        )));
    };
    let ns = world.namespace().unwrap_or_default();
    let layout = layout(world);
    let groups_api: kube::Api<DynamicObject> =
        kube::Api::namespaced_with(ctx.client.clone(), &ns, &pod_group_resource(version));
    let written = async {
        if version == Version::V1alpha2 {
            let api: kube::Api<DynamicObject> =
                kube::Api::namespaced_with(ctx.client.clone(), &ns, &workload_resource(version));
            apply_replacing(&api, &world.name_any(), &workload(world, &layout)?).await?;
        }
        for (g, obj) in layout
            .groups
            .iter()
            .zip(pod_groups(world, &layout, version)?)
        {
            apply_replacing(&groups_api, &g.name, &obj).await?;
        }
        Ok::<_, OperatorError>(())
    }
    .await;
    let what = format!(
        "the Workload API objects of World {} ({})",
        world.name_any(),
        version.as_str()
    );
    match written {
        Ok(()) => {}
        Err(OperatorError::Kube(kube::Error::Api(e))) if e.code == 403 => {
            return Ok(Some((
                "PodGroupForbidden",
                format!(
                    "the operator may not write {what}: {}; install the hostmesh chart with gangScheduling.enabled=true",
                    e.message
                ),
            )));
        }
        Err(OperatorError::Kube(kube::Error::Api(e))) if matches!(e.code, 400 | 422) => {
            return Ok(Some((
                "PodGroupRefused",
                format!("the API server refused {what}: {}", e.message),
            )));
        }
        Err(e) => return Err(e),
    }
    let selector = format!("hostmesh.dev/world={}", world.name_any());
    let listed = groups_api
        .list(&kube::api::ListParams::default().labels(&selector))
        .await?;
    // Groups of an earlier layout go (workload invariant 3).
    for stale in listed
        .items
        .iter()
        .filter(|o| !layout.groups.iter().any(|g| g.name == o.name_any()))
    {
        let _ = groups_api
            .delete(&stale.name_any(), &Default::default())
            .await;
    }
    let Some((reason, message)) = scheduler_verdict(&layout, &listed.items) else {
        return Ok(None);
    };
    let reason: &'static str = match reason.as_str() {
        "Unschedulable" => "Unschedulable",
        "SchedulerError" => "SchedulerError",
        "Preempted" => "Preempted",
        _ => "PodGroupNotScheduled",
    };
    let event = crate::controllers::shared::PlannedEvent {
        severity: crate::controllers::shared::Severity::Warning,
        reason: if reason == "Preempted" {
            "GangPreempted"
        } else {
            "GangUnschedulable"
        },
        note: message.clone(),
    };
    ctx.planned_events(world, std::slice::from_ref(&event))
        .await;
    Ok(Some((reason, message)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world(extra: &str) -> World {
        let mut w: World = serde_saphyr::from_str(&format!(
            "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata: {{name: trainer, namespace: ml, uid: u1}}\n\
spec:\n  shape: [{{name: replica, size: 2}}, {{name: host, size: 4}}]\n  scheduling: {{gang: {{provider: Kubernetes}}{extra}}}\n  template: {{spec: {{priorityClassName: high, containers: [{{name: host, image: x}}]}}}}\n"
        ))
        .unwrap();
        w.metadata.uid = Some("u1".into());
        w
    }

    /// Workload invariants 2 and 3 without topology: one group, one
    /// template of every host.
    #[test]
    fn a_world_without_topology_is_one_gang_of_every_host() {
        let w = world("");
        let l = layout(&w);
        assert_eq!(l.template, "hosts");
        assert_eq!(
            l.groups,
            [Group {
                name: "trainer".into(),
                first: 0,
                hosts: 8
            }]
        );
        let wl = workload(&w, &l).unwrap();
        assert_eq!(wl["apiVersion"], "scheduling.k8s.io/v1alpha2");
        assert_eq!(wl["kind"], "Workload");
        assert_eq!(wl["metadata"]["ownerReferences"][0]["kind"], "World");
        assert_eq!(
            wl["spec"]["podGroupTemplates"],
            json!([{"name": "hosts", "schedulingPolicy": {"gang": {"minCount": 8}}}])
        );
        assert_eq!(
            wl["spec"]["controllerRef"],
            json!({"apiGroup": "hostmesh.dev", "kind": "World", "name": "trainer"})
        );
        let pgs = pod_groups(&w, &l, Version::V1alpha2).unwrap();
        assert_eq!(pgs.len(), 1);
        assert_eq!(
            pgs[0]["spec"],
            json!({
                "schedulingPolicy": {"gang": {"minCount": 8}},
                "podGroupTemplateRef": {"workload": {"workloadName": "trainer", "podGroupTemplateName": "hosts"}},
            })
        );
        assert_eq!(group_of(&w, 7), "trainer");
        // v1beta1: the same group, standalone, with the pods' priority.
        let pgs = pod_groups(&w, &l, Version::V1beta1).unwrap();
        assert_eq!(pgs[0]["apiVersion"], "scheduling.k8s.io/v1beta1");
        assert_eq!(
            pgs[0]["spec"],
            json!({"schedulingPolicy": {"gang": {"minCount": 8}}, "priorityClassName": "high"})
        );
    }

    /// Workload invariant 2 with a Required topology entry: a gang per
    /// slice, each within one domain of the key.
    #[test]
    fn a_topology_dimension_makes_a_gang_per_slice_in_one_domain() {
        let w = world(", topology: [{dimension: replica, key: topology.kubernetes.io/rack}]");
        let l = layout(&w);
        assert_eq!(l.template, "replica");
        let names: Vec<_> = l
            .groups
            .iter()
            .map(|g| (g.name.as_str(), g.first, g.hosts))
            .collect();
        assert_eq!(
            names,
            [("trainer-replica-0", 0, 4), ("trainer-replica-1", 4, 4)]
        );
        assert_eq!(group_of(&w, 3), "trainer-replica-0");
        assert_eq!(group_of(&w, 4), "trainer-replica-1");
        let wl = workload(&w, &l).unwrap();
        assert_eq!(
            wl["spec"]["podGroupTemplates"],
            json!([{
                "name": "replica",
                "schedulingPolicy": {"gang": {"minCount": 4}},
                "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/rack"}]},
            }])
        );
        let pgs = pod_groups(&w, &l, Version::V1alpha2).unwrap();
        assert_eq!(pgs.len(), 2);
        assert_eq!(pgs[1]["metadata"]["name"], "trainer-replica-1");
        assert_eq!(
            pgs[1]["spec"]["schedulingConstraints"],
            json!({"topology": [{"key": "topology.kubernetes.io/rack"}]})
        );
        // A Preferred entry is not a gang boundary.
        let w = world(", topology: [{dimension: replica, key: rack, mode: Preferred}]");
        assert_eq!(layout(&w).groups.len(), 1);
    }

    fn group_with(name: &str, conditions: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "scheduling.k8s.io/v1alpha2",
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": {},
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    /// Workload invariant 4.
    #[test]
    fn the_scheduler_s_verdict_names_the_group_and_its_message() {
        let w = world(", topology: [{dimension: replica, key: rack}]");
        let l = layout(&w);
        let fine = group_with(
            "trainer-replica-0",
            json!([{"type": "PodGroupScheduled", "status": "True", "reason": "Scheduled", "message": ""}]),
        );
        let stuck = group_with(
            "trainer-replica-1",
            json!([{"type": "PodGroupScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]),
        );
        assert_eq!(scheduler_verdict(&l, std::slice::from_ref(&fine)), None);
        assert_eq!(
            scheduler_verdict(&l, &[fine.clone(), stuck]),
            Some((
                "Unschedulable".into(),
                "PodGroup trainer-replica-1: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
                    .into()
            ))
        );
        let preempted = group_with(
            "trainer-replica-0",
            json!([{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "preempted by ml/urgent"}]),
        );
        assert_eq!(
            scheduler_verdict(&l, &[preempted]),
            Some((
                "Preempted".into(),
                "PodGroup trainer-replica-0 (PreemptionByScheduler): preempted by ml/urgent".into()
            ))
        );
    }
}
