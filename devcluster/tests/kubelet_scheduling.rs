//! The self-scheduling process kubelet judges unscheduled pods as
//! kube-scheduler's filters do: a pod that fits no node is `PodScheduled=False`
//! (`Unschedulable`, with the scheduler's message) and is bound once it
//! fits (here: once the Node gets the label its selector asks for); required
//! pod anti-affinity keeps a pod off the node of the pods it excludes.

mod kubelet_common;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kubelet_common::*;

fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref().and_then(|s| s.node_name.clone())
}

fn unschedulable(p: &Pod) -> Option<String> {
    let c = p
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")?;
    (c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
        .then(|| c.message.clone().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_no_node_fits_says_why_and_is_bound_once_it_fits() {
    let c = Cluster::start(254).await;
    c.create_pod(
        "metadata: {name: racked}\nspec:\n  restartPolicy: Never\n  nodeSelector: {example.com/rack: r1}\n  containers: [{name: c, image: busybox, command: [sleep, '300']}]\n",
    )
    .await;
    let p = c
        .wait_pod("racked", "Unschedulable", |p| unschedulable(p).is_some())
        .await;
    assert_eq!(node_of(&p), None);
    assert_eq!(
        unschedulable(&p).unwrap(),
        "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    );
    // What an administrator does: label the node. The kubelet tries again.
    Api::<Node>::all(c.client.clone())
        .patch(
            &c.node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"example.com/rack": "r1"}}})),
        )
        .await
        .unwrap();
    let p = c
        .wait_pod("racked", "bound once the node is labelled", |p| {
            node_of(p).is_some()
        })
        .await;
    assert_eq!(node_of(&p).as_deref(), Some(c.node.as_str()));

    // Exclusive placement: a pod that refuses to share a rack with pods of
    // another group stays unscheduled on the only rack.
    c.create_pod(
        "metadata: {name: exclusive, labels: {group: b}}\nspec:\n  restartPolicy: Never\n  containers: [{name: c, image: busybox, command: [sleep, '300']}]\n  affinity:\n    podAntiAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n      - topologyKey: example.com/rack\n        labelSelector: {matchExpressions: [{key: group, operator: NotIn, values: [b]}]}\n",
    )
    .await;
    let p = c
        .wait_pod("exclusive", "Unschedulable by anti-affinity", |p| {
            unschedulable(p).is_some()
        })
        .await;
    assert_eq!(
        unschedulable(&p).unwrap(),
        "0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules."
    );
    assert_eq!(node_of(&p), None);
    // The pod it excludes goes away: it fits and is bound.
    c.pods()
        .delete("racked", &Default::default())
        .await
        .unwrap();
    c.wait_pod_gone("racked").await;
    let p = c
        .wait_pod("exclusive", "bound once alone", |p| node_of(p).is_some())
        .await;
    assert_eq!(node_of(&p).as_deref(), Some(c.node.as_str()));
    c.stop().await;
}
