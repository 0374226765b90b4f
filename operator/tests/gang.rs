//! Gang scheduling against the embedded API server with the providers'
//! published CRDs installed (`tests/data/scheduler-plugins/`,
//! `tests/data/volcano/`): the group object each provider gets, the fields
//! its host pods carry, and the `GangScheduled` condition (the test binds
//! the pods as the gang scheduler would, through `pods/binding`). The
//! Kubernetes provider's API (`scheduling.k8s.io/v1beta1`) is not served by
//! the embedded server, which is how its "not installed" report is tested.

use hostmesh_crds::World;
use hostmesh_testkit::eventually_async;
use k8s_openapi::api::core::v1::{Binding, Pod};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::json;

mod support;

use support::{Cluster, NS};

async fn start() -> Cluster {
    let c = Cluster::start().await;
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    hostmesh_testkit::cluster::install_crd_dir(&c.client, &data.join("scheduler-plugins")).await;
    hostmesh_testkit::cluster::install_crd_dir(&c.client, &data.join("volcano")).await;
    c
}

fn world(name: &str, gang: &str) -> String {
    [
        "apiVersion: hostmesh.dev/v1alpha1".to_string(),
        "kind: World".to_string(),
        format!("metadata: {{name: {name}, namespace: ctl}}"),
        "spec:".to_string(),
        "  shape: [{name: host, size: 2}]".to_string(),
        format!("  scheduling: {{gang: {gang}}}"),
        "  template: {spec: {containers: [{name: host, image: busybox}]}}".to_string(),
    ]
    .join("\n")
}

async fn pods_of(c: &Cluster, world: &str) -> Vec<Pod> {
    let pods = c.api::<Pod>();
    eventually_async(&format!("two host pods of {world}"), || async {
        let l = pods
            .list(&ListParams::default().labels(&format!("hostmesh.dev/world={world}")))
            .await
            .ok()?;
        (l.items.len() == 2).then_some(l.items)
    })
    .await
}

async fn group(c: &Cluster, group: &str, version: &str, name: &str) -> serde_json::Value {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, "PodGroup"),
        "podgroups",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), NS, &ar);
    eventually_async(&format!("PodGroup {name} ({group})"), || async {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_plugins_gang_waits_until_every_host_is_bound() {
    let c = start().await;
    c.apply_yaml(&world(
        "w",
        "{provider: SchedulerPlugins, scheduleTimeoutSeconds: 60}",
    ))
    .await;
    let pg = group(&c, "scheduling.x-k8s.io", "v1alpha1", "w").await;
    assert_eq!(pg["spec"]["minMember"], 2);
    assert_eq!(pg["spec"]["scheduleTimeoutSeconds"], 60);
    assert_eq!(pg["metadata"]["ownerReferences"][0]["kind"], "World");
    let pods = pods_of(&c, "w").await;
    for p in &pods {
        assert_eq!(
            p.spec.as_ref().unwrap().scheduler_name.as_deref(),
            Some("scheduler-plugins-scheduler")
        );
        assert_eq!(
            p.metadata.labels.as_ref().unwrap()["scheduling.x-k8s.io/pod-group"],
            "w"
        );
    }
    let msg = gang_condition(&c, "w", "WaitingForScheduler").await;
    assert!(msg.starts_with("0/2 host pods bound"), "{msg}");
    // The gang scheduler binds both pods at once.
    for p in &pods {
        let name = p.metadata.name.clone().unwrap();
        let binding: Binding = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NS},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"},
        }))
        .unwrap();
        let _: serde_json::Value = c
            .api::<Pod>()
            .create_subresource("binding", &name, &PostParams::default(), &binding)
            .await
            .unwrap();
    }
    let msg = gang_condition(&c, "w", "AllBound").await;
    assert!(msg.contains("scheduler-plugins-scheduler"), "{msg}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volcano_gets_its_pod_group_and_annotation_and_a_missing_provider_is_named() {
    let c = start().await;
    c.apply_yaml(&world("v", "{provider: Volcano, queue: research}"))
        .await;
    let pg = group(&c, "scheduling.volcano.sh", "v1beta1", "v").await;
    assert_eq!(pg["spec"]["minMember"], 2);
    assert_eq!(pg["spec"]["queue"], "research");
    for p in pods_of(&c, "v").await {
        assert_eq!(
            p.spec.as_ref().unwrap().scheduler_name.as_deref(),
            Some("volcano")
        );
        assert_eq!(
            p.metadata.annotations.as_ref().unwrap()["scheduling.k8s.io/group-name"],
            "v"
        );
    }
    gang_condition(&c, "v", "WaitingForScheduler").await;

    // Kubernetes' own PodGroup API is not served here: the World says so.
    c.apply_yaml(&world("k", "{provider: Kubernetes}")).await;
    let msg = gang_condition(&c, "k", "ProviderNotInstalled").await;
    assert!(msg.contains("podgroups.scheduling.k8s.io/v1beta1"), "{msg}");
    assert!(
        msg.contains("spec.scheduling.gang.provider Kubernetes"),
        "{msg}"
    );
    c.shutdown().await;
}
