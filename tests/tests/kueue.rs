//! e2e: a World queued in Kueue, one full round trip on the cluster in a
//! box: held with no pods until admitted, placed by the admitted flavor
//! (its node label is the only thing that puts the host pods on this
//! node), preempted (the hosts stop, the quota is given back, never
//! Failed) and admitted again as attempt 1. Kueue's CRDs are the published
//! ones (`operator/tests/data/kueue/`), and the test plays Kueue's
//! scheduler exactly as Kueue writes a Workload's status (see
//! `operator/tests/kueue.rs` for the controller-level cases).

use std::path::Path;

use hostmesh_e2e::{Env, condition_true};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

fn kueue(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", kind),
        plural,
    )
}

fn cond(t: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": t, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// Kueue's scheduler admitting the Workload on `flavor`.
async fn admit(
    wls: &Api<DynamicObject>,
    name: &str,
    flavor: &str,
    mut extra: Vec<Value>,
) -> anyhow::Result<()> {
    extra.push(cond(
        "QuotaReserved",
        "True",
        "QuotaReserved",
        "Quota reserved in ClusterQueue cq",
    ));
    extra.push(cond(
        "Admitted",
        "True",
        "Admitted",
        "The workload is admitted",
    ));
    let status = json!({"status": {
        "admission": {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "hosts", "flavors": {"cpu": flavor}, "count": 2}]},
        "conditions": extra,
    }});
    wls.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_queued_world_runs_when_admitted_and_is_requeued_on_preemption() -> anyhow::Result<()> {
    let env = Env::start("kueue").await?;
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../operator/tests/data/kueue");
    hostmesh_testkit::cluster::install_crd_dir(&env.client, &data).await;
    let flavor = format!("e2e-{}", env.namespace);
    let flavors: Api<DynamicObject> = Api::all_with(
        env.client.clone(),
        &kueue("ResourceFlavor", "resourceflavors"),
    );
    flavors
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                "metadata": {"name": flavor},
                "spec": {"nodeLabels": {"kubernetes.io/hostname": env.node}},
            }))?,
        )
        .await?;
    env.apply(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata:\n  name: w\n  labels: {kueue.x-k8s.io/queue-name: team-a}\nspec:\n  hosts: 2\n  template:\n    spec:\n      containers:\n      - name: host\n        image: busybox\n",
    )
    .await?;
    let s = env
        .wait_for("World", "w", "held for admission", |s| {
            s["phase"] == "Suspended" && condition_true(s, "Suspended")
        })
        .await?;
    assert!(s.to_string().contains("AwaitingAdmission"), "{s:#}");
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let lp = ListParams::default().labels("hostmesh.dev/world=w");
    assert!(
        pods.list(&lp).await?.items.is_empty(),
        "no host pod before admission"
    );
    let wls: Api<DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        &env.namespace,
        &kueue("Workload", "workloads"),
    );
    let name = wls.list(&ListParams::default()).await?.items[0]
        .metadata
        .name
        .clone()
        .unwrap();

    admit(&wls, &name, &flavor, vec![]).await?;
    env.wait_for("World", "w", "Ready after admission", |s| {
        condition_true(s, "Ready")
    })
    .await?;
    for p in pods.list(&lp).await?.items {
        let spec = p.spec.unwrap();
        assert_eq!(
            spec.node_selector.unwrap()["kubernetes.io/hostname"],
            env.node
        );
        assert_eq!(spec.node_name.as_deref(), Some(env.node.as_str()));
    }

    // Preempted: the hosts stop and the quota goes back; never Failed.
    let why =
        "Preempted to accommodate a workload (UID: e2e) due to prioritization in the ClusterQueue";
    let wl = serde_json::to_value(wls.get(&name).await?)?;
    let mut conds = wl["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    conds.push(cond("Evicted", "True", "Preempted", why));
    conds.push(cond("Preempted", "True", "InClusterQueue", why));
    wls.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"conditions": conds}})),
    )
    .await?;
    let s = env
        .wait_for("World", "w", "suspended by the preemption", |s| {
            s["phase"] == "Suspended"
        })
        .await?;
    assert!(s.to_string().contains(why), "{s:#}");
    assert!(!condition_true(&s, "Failed"), "{s:#}");
    hostmesh_testkit::eventually_async("the quota given back", || async {
        let w = wls.get(&name).await.ok()?;
        w.data["status"]["admission"].is_null().then_some(())
    })
    .await;
    assert!(
        pods.list(&lp).await?.items.is_empty(),
        "no host pod once the quota is back"
    );

    admit(
        &wls,
        &name,
        &flavor,
        vec![
            cond(
                "Evicted",
                "False",
                "QuotaReserved",
                &format!("Previously: {why}"),
            ),
            cond(
                "Preempted",
                "False",
                "QuotaReserved",
                &format!("Previously: {why}"),
            ),
        ],
    )
    .await?;
    let s = env
        .wait_for("World", "w", "Ready again as attempt 1", |s| {
            condition_true(s, "Ready") && s["attempt"] == 1
        })
        .await?;
    assert_eq!(s["restarts"], 0, "{s:#}");
    env.delete("World", "w").await?;
    flavors.delete(&flavor, &Default::default()).await?;
    Ok(())
}
