//! The `Kubernetes` gang provider against an API server that serves
//! Kubernetes 1.36's Workload API (`scheduling.k8s.io/v1alpha2`, its
//! published types as CRDs: `tests/data/kubernetes-workload/`): the World's
//! `Workload` and `PodGroup`s are accepted, its host pods carry
//! `spec.schedulingGroup`, and what the scheduler writes on a PodGroup
//! (`PodGroupScheduled=False Unschedulable`, `DisruptionTarget`) reaches
//! the World's `GangScheduled` condition and an Event with its message.

use hostmesh_crds::World;
use hostmesh_testkit::eventually_async;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use serde_json::json;

mod support;

use support::{Cluster, NS};

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scheduling.k8s.io", "v1alpha2", kind),
        plural,
    )
}

fn api(c: &Cluster, kind: &str, plural: &str) -> Api<DynamicObject> {
    Api::namespaced_with(c.client.clone(), NS, &resource(kind, plural))
}

async fn start() -> Cluster {
    let c = Cluster::start().await;
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    hostmesh_testkit::cluster::install_crd_dir(&c.client, &data.join("kubernetes-workload")).await;
    c
}

fn world(name: &str, shape: &str, scheduling: &str) -> String {
    [
        "apiVersion: hostmesh.dev/v1alpha1".to_string(),
        "kind: World".to_string(),
        format!("metadata: {{name: {name}, namespace: {NS}}}"),
        "spec:".to_string(),
        format!("  shape: {shape}"),
        format!("  scheduling: {scheduling}"),
        "  template: {spec: {containers: [{name: host, image: busybox}]}}".to_string(),
    ]
    .join("\n")
}

async fn get(api: &Api<DynamicObject>, what: &str, name: &str) -> serde_json::Value {
    eventually_async(&format!("{what} {name}"), || async {
        serde_json::to_value(api.get(name).await.ok()?).ok()
    })
    .await
}

async fn gang_condition(c: &Cluster, world: &str, reason: &str) -> String {
    let worlds = c.api::<World>();
    eventually_async(&format!("{world}: GangScheduled {reason}"), || async {
        let s = worlds.get(world).await.ok()?.status?;
        let cond = s
            .conditions
            .into_iter()
            .find(|c| c.type_ == "GangScheduled")?;
        (cond.reason == reason).then_some(cond.message)
    })
    .await
}

/// The scheduler's status write on a PodGroup (the status subresource).
async fn scheduler_says(c: &Cluster, group: &str, conditions: serde_json::Value) {
    let groups = api(c, "PodGroup", "podgroups");
    groups
        .patch_status(
            group,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"conditions": conditions}})),
        )
        .await
        .unwrap();
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
    json!({
        "type": type_, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": "2026-11-27T12:00:00Z",
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_world_gets_a_workload_its_pod_groups_and_hears_the_scheduler() {
    let c = start().await;
    c.apply_yaml(&world(
        "w",
        "[{name: host, size: 2}]",
        "{gang: {provider: Kubernetes}}",
    ))
    .await;
    let wl = get(&api(&c, "Workload", "workloads"), "Workload", "w").await;
    assert_eq!(
        wl["spec"]["podGroupTemplates"],
        json!([{"name": "hosts", "schedulingPolicy": {"gang": {"minCount": 2}}}]),
        "{wl:#}"
    );
    assert_eq!(wl["spec"]["controllerRef"]["kind"], "World");
    assert_eq!(wl["metadata"]["ownerReferences"][0]["kind"], "World");
    let pg = get(&api(&c, "PodGroup", "podgroups"), "PodGroup", "w").await;
    assert_eq!(
        pg["spec"]["podGroupTemplateRef"],
        json!({"workload": {"workloadName": "w", "podGroupTemplateName": "hosts"}}),
        "{pg:#}"
    );
    assert_eq!(
        pg["spec"]["schedulingPolicy"],
        json!({"gang": {"minCount": 2}})
    );
    // Host pods join the group through spec.schedulingGroup (the default
    // scheduler: no schedulerName).
    let pods = c.api::<Pod>();
    let joined = eventually_async("two host pods in PodGroup w", || async {
        let l = pods
            .list(&ListParams::default().labels("hostmesh.dev/world=w"))
            .await
            .ok()?;
        let raw: Vec<serde_json::Value> = l
            .items
            .iter()
            .map(|p| serde_json::to_value(p).unwrap_or_default())
            .collect();
        (raw.len() == 2).then_some(l.items)
    })
    .await;
    // The typed Pod of this build predates schedulingGroup: read the pods
    // raw.
    let raw_pods: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), NS, &ApiResource::erase::<Pod>(&()));
    for p in &joined {
        let name = p.metadata.name.clone().unwrap();
        let raw = serde_json::to_value(raw_pods.get(&name).await.unwrap()).unwrap();
        assert_eq!(
            raw["spec"]["schedulingGroup"],
            json!({"podGroupName": "w"}),
            "{name}: {:#}",
            raw["spec"]
        );
        assert!(
            raw["spec"]
                .get("schedulerName")
                .is_none_or(|s| s == "default-scheduler")
        );
    }
    gang_condition(&c, "w", "WaitingForScheduler").await;

    // The scheduler cannot place the gang: its reason and message reach
    // the World's condition and an Event.
    let why = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: not eligible.";
    scheduler_says(
        &c,
        "w",
        json!([condition(
            "PodGroupScheduled",
            "False",
            "Unschedulable",
            why
        )]),
    )
    .await;
    let msg = gang_condition(&c, "w", "Unschedulable").await;
    assert_eq!(msg, format!("PodGroup w: {why}"));
    let events = c.api::<Event>();
    eventually_async("a GangUnschedulable Event", || async {
        let l = events.list(&ListParams::default()).await.ok()?;
        l.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("GangUnschedulable")
                    && e.message.as_deref().is_some_and(|m| m.contains(why))
            })
            .then_some(())
    })
    .await;

    // Preempted: DisruptionTarget.
    scheduler_says(
        &c,
        "w",
        json!([
            condition("PodGroupScheduled", "True", "Scheduled", ""),
            condition(
                "DisruptionTarget",
                "True",
                "PreemptionByScheduler",
                "preempted by ctl/urgent"
            ),
        ]),
    )
    .await;
    let msg = gang_condition(&c, "w", "Preempted").await;
    assert!(msg.contains("preempted by ctl/urgent"), "{msg}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topology_dimension_makes_a_pod_group_per_slice_and_a_reshape_replaces_them() {
    let c = start().await;
    c.apply_yaml(&world(
        "t",
        "[{name: replica, size: 2}, {name: host, size: 2}]",
        "{gang: {provider: Kubernetes}, topology: [{dimension: replica, key: topology.kubernetes.io/rack}]}",
    ))
    .await;
    let wl = get(&api(&c, "Workload", "workloads"), "Workload", "t").await;
    assert_eq!(
        wl["spec"]["podGroupTemplates"],
        json!([{
            "name": "replica",
            "schedulingPolicy": {"gang": {"minCount": 2}},
            "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/rack"}]},
        }]),
        "{wl:#}"
    );
    let groups = api(&c, "PodGroup", "podgroups");
    for i in 0..2 {
        let pg = get(&groups, "PodGroup", &format!("t-replica-{i}")).await;
        assert_eq!(pg["spec"]["schedulingPolicy"]["gang"]["minCount"], 2);
        assert_eq!(
            pg["spec"]["podGroupTemplateRef"]["workload"]["podGroupTemplateName"],
            "replica"
        );
    }
    // Three replicas of three: the immutable Workload and PodGroups are
    // made again (the API refuses to change them), the third group added.
    c.apply_yaml(&world(
        "t",
        "[{name: replica, size: 3}, {name: host, size: 3}]",
        "{gang: {provider: Kubernetes}, topology: [{dimension: replica, key: topology.kubernetes.io/rack}]}",
    ))
    .await;
    let workloads = api(&c, "Workload", "workloads");
    eventually_async("the Workload asks for slices of 3", || async {
        let wl = serde_json::to_value(workloads.get("t").await.ok()?).ok()?;
        (wl["spec"]["podGroupTemplates"][0]["schedulingPolicy"]["gang"]["minCount"] == 3)
            .then_some(())
    })
    .await;
    eventually_async("three PodGroups of 3", || async {
        let l = groups
            .list(&ListParams::default().labels("hostmesh.dev/world=t"))
            .await
            .ok()?;
        (l.items.len() == 3
            && l.items
                .iter()
                .all(|g| g.data["spec"]["schedulingPolicy"]["gang"]["minCount"] == 3))
        .then_some(())
    })
    .await;
    c.shutdown().await;
}
