//! Scheduling gates: the process kubelet binds no pod that still has
//! `spec.schedulingGates` (as kube-scheduler leaves it alone), and binds it
//! once the gates are removed; the API server lets a gated pod lose its
//! gates and gain node selector entries (what Kueue's topology ungater
//! writes), and refuses adding a gate.

mod kubelet_common;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kubelet_common::*;

fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref().and_then(|s| s.node_name.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_pod_is_bound_only_after_its_gates_are_removed() {
    let c = Cluster::start(226).await;
    let pod = |name: &str, gates: &str| {
        format!(
            "metadata: {{name: {name}}}\nspec:\n  restartPolicy: Never\n  schedulingGates: {gates}\n  containers: [{{name: c, image: busybox, command: [sleep, '300']}}]\n"
        )
    };
    c.create_pod(&pod("gated", "[{name: example.com/hold}]"))
        .await;
    // The reference point: an ungated pod created after it gets bound, so
    // the kubelet has seen the gated one and left it alone.
    c.create_pod(&pod("free", "[]")).await;
    c.wait_pod("free", "bound", |p| node_of(p).is_some()).await;
    let gated = c.pods().get("gated").await.unwrap();
    assert_eq!(node_of(&gated), None, "a gated pod must not be bound");

    // Adding a gate is refused; adding a node selector entry while gated
    // and removing the gate are allowed.
    let err = c
        .pods()
        .patch(
            "free",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"schedulingGates": [{"name": "late"}]}})),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("schedulingGates may only be removed"),
        "{err}"
    );
    c.pods()
        .patch(
            "gated",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {
                "nodeSelector": {"kubernetes.io/hostname": c.node},
                "schedulingGates": null,
            }})),
        )
        .await
        .unwrap();
    let p = c
        .wait_pod("gated", "bound after ungating", |p| node_of(p).is_some())
        .await;
    assert_eq!(node_of(&p).as_deref(), Some(c.node.as_str()));
    c.stop().await;
}
