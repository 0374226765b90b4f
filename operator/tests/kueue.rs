//! The World controller with an unmodified Kueue's API (its published CRDs,
//! `tests/data/kueue/`, installed on the embedded API server), where the
//! test plays Kueue's part exactly as Kueue writes its objects:
//!
//! - admission: `status.admission` (`clusterQueue`, `podSetAssignments`
//!   with flavors and counts) and the conditions `QuotaReserved=True`
//!   (reason `QuotaReserved`, "Quota reserved in ClusterQueue cq") and
//!   `Admitted=True` (reason `Admitted`), through the status subresource,
//!   as Kueue's scheduler does (`workload.SetQuotaReservation`,
//!   `SyncAdmittedCondition`);
//! - preemption: `Evicted=True` (reason `Preempted`) and `Preempted=True`
//!   (reason `InClusterQueue`), as Kueue's preemptor does;
//! - re-admission: a new admission, with `Evicted` and `Preempted` reset to
//!   False (reason `QuotaReserved`, "Previously: ...").
//!
//! What the operator must do is what Kueue's `jobframework` does for its own
//! kinds: create the Workload, hold the World until admitted, place the
//! hosts on the flavors, stop on eviction and then give the quota back
//! (`QuotaReserved=False` reason `Pending`, `Requeued`, no admission).

use hostmesh_crds::World;
use hostmesh_crds::world::WorldPhase;
use hostmesh_testkit::eventually_async;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::Api;
use kube::api::{
    ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

mod support;

use support::{Cluster, NS, cond};

fn kueue(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", kind),
        plural,
    )
}

async fn start_with_kueue() -> Cluster {
    let c = Cluster::start().await;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kueue");
    hostmesh_testkit::cluster::install_crd_dir(&c.client, &dir).await;
    // The cluster side of Kueue, as an admin sets it up.
    let flavors: Api<DynamicObject> = Api::all_with(
        c.client.clone(),
        &kueue("ResourceFlavor", "resourceflavors"),
    );
    let flavor: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": "a100"},
        "spec": {"nodeLabels": {"cloud.example.com/pool": "a100"},
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    }))
    .unwrap();
    flavors
        .create(&PostParams::default(), &flavor)
        .await
        .unwrap();
    let cqs: Api<DynamicObject> =
        Api::all_with(c.client.clone(), &kueue("ClusterQueue", "clusterqueues"));
    let cq: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": "cq"},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu"],
                 "flavors": [{"name": "a100", "resources": [{"name": "cpu", "nominalQuota": "8"}]}]}]},
    }))
    .unwrap();
    cqs.create(&PostParams::default(), &cq).await.unwrap();
    let lqs: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), NS, &kueue("LocalQueue", "localqueues"));
    let lq: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "team-a", "namespace": NS},
        "spec": {"clusterQueue": "cq"},
    }))
    .unwrap();
    lqs.create(&PostParams::default(), &lq).await.unwrap();
    let pc: PriorityClass =
        serde_json::from_value(json!({"metadata": {"name": "high"}, "value": 1000})).unwrap();
    Api::<PriorityClass>::all(c.client.clone())
        .create(&PostParams::default(), &pc)
        .await
        .unwrap();
    c
}

const QUEUED: &str = r#"apiVersion: hostmesh.dev/v1alpha1
kind: World
metadata: {name: w, namespace: ctl, labels: {kueue.x-k8s.io/queue-name: team-a}}
spec:
  shape: [{name: host, size: 2}]
  template:
    spec:
      priorityClassName: high
      containers: [{name: host, image: busybox, resources: {requests: {cpu: '1'}}}]
"#;

fn workloads(c: &Cluster) -> Api<DynamicObject> {
    Api::namespaced_with(c.client.clone(), NS, &kueue("Workload", "workloads"))
}

/// The World's Workload, once the operator created it.
async fn workload(c: &Cluster) -> Value {
    let api = workloads(c);
    eventually_async("the World's Workload", || async {
        let l = api.list(&ListParams::default()).await.ok()?;
        let wl = l.items.into_iter().next()?;
        serde_json::to_value(wl).ok()
    })
    .await
}

async fn world_status(
    c: &Cluster,
    what: &str,
    f: impl Fn(&hostmesh_crds::WorldStatus) -> bool,
) -> hostmesh_crds::WorldStatus {
    let worlds = c.api::<World>();
    eventually_async(what, || async {
        let s = worlds.get("w").await.ok()?.status?;
        f(&s).then_some(s)
    })
    .await
}

fn suspended(s: &hostmesh_crds::WorldStatus) -> Option<(String, String, String)> {
    s.conditions
        .iter()
        .find(|c| c.type_ == "Suspended")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn host_pods(c: &Cluster) -> Vec<Pod> {
    c.api::<Pod>()
        .list(&ListParams::default().labels("hostmesh.dev/world=w"))
        .await
        .unwrap()
        .items
}

fn kueue_condition(t: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": t, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1})
}

/// Kueue admits the Workload on flavor `a100` (its scheduler's write).
async fn admit(c: &Cluster, name: &str, mut conditions: Vec<Value>) {
    conditions.push(kueue_condition(
        "QuotaReserved",
        "True",
        "QuotaReserved",
        "Quota reserved in ClusterQueue cq",
    ));
    conditions.push(kueue_condition(
        "Admitted",
        "True",
        "Admitted",
        "The workload is admitted",
    ));
    let status = json!({"status": {
        "admission": {"clusterQueue": "cq", "podSetAssignments": [{
            "name": "hosts", "flavors": {"cpu": "a100"}, "resourceUsage": {"cpu": "2"}, "count": 2}]},
        "conditions": conditions,
    }});
    workloads(c)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// Pods exist for both ranks; the test plays the kubelet and the World runs.
async fn run_hosts(c: &Cluster, ips: [&str; 2]) -> Vec<Pod> {
    let pods = c.api::<Pod>();
    let list = eventually_async("two live host pods", || async {
        let l = pods
            .list(&ListParams::default().labels("hostmesh.dev/world=w"))
            .await
            .ok()?;
        let live: Vec<Pod> = l
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        (live.len() == 2).then_some(live)
    })
    .await;
    c.pod_ready("w-host-0", ips[0]).await;
    c.pod_ready("w-host-1", ips[1]).await;
    world_status(c, "World Running", |s| s.phase == Some(WorldPhase::Running)).await;
    list
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_world_waits_for_admission_then_runs_on_the_admitted_flavor() {
    let c = start_with_kueue().await;
    c.apply_yaml(QUEUED).await;
    let s = world_status(&c, "the World held for admission", |s| {
        suspended(s).is_some()
    })
    .await;
    assert_eq!(s.phase, Some(WorldPhase::Suspended));
    let (st, reason, message) = suspended(&s).unwrap();
    assert_eq!(
        (st.as_str(), reason.as_str()),
        ("True", "AwaitingAdmission")
    );
    assert!(message.contains("LocalQueue team-a"), "{message}");
    assert!(
        cond(&s.conditions, "Ready").is_none(),
        "a World that never ran has no Ready yet"
    );

    let wl = workload(&c).await;
    let name = wl["metadata"]["name"].as_str().unwrap().to_string();
    assert!(name.starts_with("world-w-"), "{name}");
    let owner = &wl["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["controller"].as_bool()),
        (Some("World"), Some(true))
    );
    assert_eq!(wl["spec"]["queueName"], "team-a");
    assert_eq!(wl["spec"]["active"], true);
    assert_eq!(
        wl["spec"]["priorityClassRef"],
        json!({"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "high"})
    );
    assert_eq!(wl["spec"]["priority"], 1000);
    let ps = &wl["spec"]["podSets"][0];
    assert_eq!(
        (ps["name"].as_str(), ps["count"].as_i64()),
        (Some("hosts"), Some(2))
    );
    let containers = ps["template"]["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers[0]["resources"]["requests"]["cpu"], "1");
    assert_eq!(
        ps["template"]["spec"]["initContainers"][0]["name"], "hostmesh-install",
        "Kueue counts the install container too"
    );
    // Held: the status says so and no host pod exists.
    assert!(host_pods(&c).await.is_empty());

    admit(&c, &name, vec![]).await;
    let pods = run_hosts(&c, ["127.0.9.1", "127.0.9.2"]).await;
    for p in &pods {
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(
            spec.node_selector.as_ref().unwrap()["cloud.example.com/pool"],
            "a100"
        );
        let t = &spec.tolerations.as_ref().unwrap()[0];
        assert_eq!(
            (t.key.as_deref(), t.operator.as_deref(), t.effect.as_deref()),
            (Some("nvidia.com/gpu"), Some("Exists"), Some("NoSchedule"))
        );
        assert_eq!(
            p.metadata.labels.as_ref().unwrap()["kueue.x-k8s.io/podset"],
            "hosts"
        );
    }
    let s = world_status(&c, "Suspended=False Admitted", |s| {
        suspended(s).is_some_and(|c| c.0 == "False")
    })
    .await;
    let (_, reason, message) = suspended(&s).unwrap();
    assert_eq!(reason, "Admitted");
    assert!(
        message.contains("ClusterQueue cq (flavors a100)"),
        "{message}"
    );
    assert_eq!(s.attempt, 0, "the first admission is the first run");
    // Kueue invariant 6: the World reports PodsReady as Kueue's own
    // integrations do, for waitForPodsReady.
    let api = workloads(&c);
    let ready = eventually_async("Workload PodsReady=True (Started)", || async {
        let wl = serde_json::to_value(api.get(&name).await.ok()?).ok()?;
        let conds = wl["status"]["conditions"].as_array()?.clone();
        conds
            .into_iter()
            .find(|c| c["type"] == "PodsReady" && c["status"] == "True" && c["reason"] == "Started")
    })
    .await;
    assert!(
        ready["message"].as_str().unwrap().contains("running"),
        "{ready}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_stops_the_world_requeues_it_and_readmission_is_a_new_attempt() {
    let c = start_with_kueue().await;
    c.apply_yaml(QUEUED).await;
    let wl = workload(&c).await;
    let name = wl["metadata"]["name"].as_str().unwrap().to_string();
    admit(&c, &name, vec![]).await;
    let first = run_hosts(&c, ["127.0.9.1", "127.0.9.2"]).await;

    // Kueue preempts the Workload for a higher-priority one.
    let why = "Preempted to accommodate a workload (UID: 5c1f, JobUID: 77aa) due to prioritization in the ClusterQueue";
    let wl = serde_json::to_value(workloads(&c).get(&name).await.unwrap()).unwrap();
    let mut conds = wl["status"]["conditions"].as_array().cloned().unwrap();
    conds.push(kueue_condition("Evicted", "True", "Preempted", why));
    conds.push(kueue_condition("Preempted", "True", "InClusterQueue", why));
    workloads(&c)
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"conditions": conds}})),
        )
        .await
        .unwrap();

    let s = world_status(&c, "the World suspended by the eviction", |s| {
        s.phase == Some(WorldPhase::Suspended)
    })
    .await;
    let (st, reason, message) = suspended(&s).unwrap();
    assert_eq!((st.as_str(), reason.as_str()), ("True", "Preempted"));
    assert!(message.contains(why), "{message}");
    assert_ne!(
        cond(&s.conditions, "Failed").map(|c| c.0),
        Some("True".into())
    );
    eventually_async("the host pods gone", || async {
        host_pods(&c).await.is_empty().then_some(())
    })
    .await;
    // With the hosts gone, the quota is given back as Kueue's integrations do.
    let wl = eventually_async("the quota released", || async {
        let wl = serde_json::to_value(workloads(&c).get(&name).await.ok()?).ok()?;
        wl["status"]["admission"].is_null().then_some(wl)
    })
    .await;
    let kc = |t: &str| {
        wl["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == t)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        (
            kc("QuotaReserved")["status"].as_str(),
            kc("QuotaReserved")["reason"].as_str()
        ),
        (Some("False"), Some("Pending"))
    );
    assert_eq!(
        (
            kc("Requeued")["status"].as_str(),
            kc("Requeued")["reason"].as_str()
        ),
        (Some("True"), Some("Preempted"))
    );
    assert_eq!(kc("Admitted")["status"], "False");
    let s = world_status(&c, "still suspended, waiting again", |s| {
        suspended(s).is_some_and(|c| c.1 == "Preempted")
    })
    .await;
    assert_eq!(s.phase, Some(WorldPhase::Suspended));
    assert_eq!(s.restarts, 0, "an eviction is not a failure");

    // Kueue admits it again: the Evicted and Preempted conditions reset.
    admit(
        &c,
        &name,
        vec![
            kueue_condition(
                "Evicted",
                "False",
                "QuotaReserved",
                &format!("Previously: {why}"),
            ),
            kueue_condition(
                "Preempted",
                "False",
                "QuotaReserved",
                &format!("Previously: {why}"),
            ),
            kc("Requeued"),
        ],
    )
    .await;
    let second = run_hosts(&c, ["127.0.9.3", "127.0.9.4"]).await;
    assert_ne!(
        first[0].metadata.uid, second[0].metadata.uid,
        "new host pods"
    );
    let s = world_status(&c, "resumed as attempt 1", |s| s.attempt == 1).await;
    assert_eq!(s.restarts, 0);
    assert_eq!(suspended(&s).unwrap().1, "Admitted");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_without_kueue_installed_says_so() {
    let c = Cluster::start().await;
    c.apply_yaml(QUEUED).await;
    let s = world_status(&c, "the World held: Kueue missing", |s| {
        suspended(s).is_some()
    })
    .await;
    let (st, reason, message) = suspended(&s).unwrap();
    assert_eq!(
        (st.as_str(), reason.as_str()),
        ("True", "KueueNotInstalled")
    );
    assert!(
        message.contains("workloads.kueue.x-k8s.io/v1beta2"),
        "{message}"
    );
    assert!(
        message.contains("kueue.x-k8s.io/queue-name=team-a"),
        "{message}"
    );
    assert_eq!(s.phase, Some(WorldPhase::Suspended));
    assert!(host_pods(&c).await.is_empty());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_by_is_immutable_and_a_multikueue_world_only_gets_its_workload() {
    let c = start_with_kueue().await;
    let worlds = c.api::<World>();
    c.apply_yaml(&QUEUED.replacen(
        "spec:\n",
        "spec:\n  managedBy: kueue.x-k8s.io/multikueue\n",
        1,
    ))
    .await;
    // MultiKueue dispatches from the Workload: it is kept...
    let wl = workload(&c).await;
    assert_eq!(wl["spec"]["queueName"], "team-a");
    // ...and nothing else: a World of ours created after it gets its pods
    // and status while this one has neither.
    c.apply_yaml(&support::WORLD.replace("name: w,", "name: mine,"))
        .await;
    eventually_async("the other World's status", || async {
        worlds.get("mine").await.ok()?.status.map(|_| ())
    })
    .await;
    let w = worlds.get("w").await.unwrap();
    assert!(w.status.is_none(), "{:?}", w.status);
    assert!(host_pods(&c).await.is_empty());

    // Changing managedBy is refused by the API server (the CRD's rule).
    let err = worlds
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"managedBy": "hostmesh.dev/operator"}})),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(e) = err else {
        panic!("{err}")
    };
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("spec.managedBy is immutable"),
        "{}",
        e.message
    );
    // A World created without it is ours, and that is immutable too.
    let mine = worlds.get("mine").await.unwrap();
    assert_eq!(mine.spec.managed_by, "hostmesh.dev/operator");
    let err = worlds
        .patch(
            "mine",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"managedBy": "kueue.x-k8s.io/multikueue"}})),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("spec.managedBy is immutable"),
        "{err}"
    );
    c.shutdown().await;
}

/// Kueue invariants 5 and 2: `spec.suspend` deactivates the Workload (Kueue
/// then evicts it with reason `Deactivated`, and the quota goes back with
/// `Requeued=False`); a changed template replaces the Workload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_deactivates_the_workload_and_a_new_template_replaces_it() {
    let c = start_with_kueue().await;
    c.apply_yaml(QUEUED).await;
    let wl = workload(&c).await;
    let name = wl["metadata"]["name"].as_str().unwrap().to_string();
    let hash = wl["metadata"]["annotations"]["hostmesh.dev/pod-set-hash"].clone();
    admit(&c, &name, vec![]).await;
    run_hosts(&c, ["127.0.9.1", "127.0.9.2"]).await;

    let worlds = c.api::<World>();
    worlds
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": true}})),
        )
        .await
        .unwrap();
    let api = workloads(&c);
    eventually_async("the Workload deactivated", || async {
        let wl = api.get(&name).await.ok()?;
        (wl.data["spec"]["active"] == false).then_some(())
    })
    .await;
    // Kueue evicts a deactivated Workload.
    let wl = serde_json::to_value(api.get(&name).await.unwrap()).unwrap();
    let mut conds = wl["status"]["conditions"].as_array().cloned().unwrap();
    conds.push(kueue_condition(
        "Evicted",
        "True",
        "Deactivated",
        "The workload is deactivated",
    ));
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"conditions": conds}})),
    )
    .await
    .unwrap();
    let wl = eventually_async("the quota released", || async {
        let wl = serde_json::to_value(api.get(&name).await.ok()?).ok()?;
        wl["status"]["admission"].is_null().then_some(wl)
    })
    .await;
    let requeued = wl["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Requeued")
        .cloned()
        .unwrap();
    assert_eq!(
        (requeued["status"].as_str(), requeued["reason"].as_str()),
        (Some("False"), Some("Deactivated"))
    );
    let s = world_status(&c, "suspended by spec", |s| {
        suspended(s).is_some_and(|c| c.1 == "SpecSuspended")
    })
    .await;
    assert_eq!(s.phase, Some(WorldPhase::Suspended));

    // Resumed with another template: the stale Workload is replaced.
    worlds
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"suspend": false, "template": {"spec": {"containers": [
                {"name": "host", "image": "busybox", "resources": {"requests": {"cpu": "2"}}}]}}}}),
            ),
        )
        .await
        .unwrap();
    let wl = eventually_async("a new Workload", || async {
        let l = api.list(&ListParams::default()).await.ok()?;
        let wl = serde_json::to_value(l.items.into_iter().next()?).ok()?;
        (wl["metadata"]["annotations"]["hostmesh.dev/pod-set-hash"] != hash
            && wl["metadata"]["deletionTimestamp"].is_null())
        .then_some(wl)
    })
    .await;
    assert_eq!(wl["spec"]["active"], true);
    assert_eq!(
        wl["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"],
        "2"
    );
    let s = world_status(&c, "waiting for the new admission", |s| {
        suspended(s).is_some_and(|c| c.1 == "AwaitingAdmission")
    })
    .await;
    assert!(host_pods(&c).await.is_empty(), "{s:?}");
    c.shutdown().await;
}

/// Kueue invariant 7: a topology-aware admission hands the host pods to
/// Kueue's TopologyUngater. The test plays the ungater as Kueue writes the
/// pods: a JSON patch that removes the `kueue.x-k8s.io/topology` gate and
/// adds the domain's node selector, in `hostmesh.dev/rank` order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topology_assignment_gates_the_pods_until_kueue_places_them() {
    let c = start_with_kueue().await;
    c.apply_yaml(&QUEUED.replacen(
        "  shape: [{name: host, size: 2}]\n",
        "  shape: [{name: replica, size: 2}, {name: host, size: 1}]\n  scheduling:\n    topology: [{dimension: replica, key: example.com/rack, mode: Required}]\n",
        1,
    ))
    .await;
    let wl = workload(&c).await;
    let name = wl["metadata"]["name"].as_str().unwrap().to_string();
    assert_eq!(
        wl["spec"]["podSets"][0]["topologyRequest"]["podIndexLabel"],
        "hostmesh.dev/rank"
    );
    let status = json!({"status": {
        "admission": {"clusterQueue": "cq", "podSetAssignments": [{
            "name": "hosts", "flavors": {"cpu": "a100"}, "resourceUsage": {"cpu": "2"}, "count": 2,
            "topologyAssignment": {"levels": ["example.com/rack"], "slices": [{
                "domainCount": 2,
                "valuesPerLevel": [{"individual": {"prefix": "rack-", "roots": ["1", "2"]}}],
                "podCounts": {"universal": 1}}]}}]},
        "conditions": [
            kueue_condition("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cq"),
            kueue_condition("Admitted", "True", "Admitted", "The workload is admitted"),
        ],
    }});
    workloads(&c)
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let pods = eventually_async("two gated host pods", || async {
        let live: Vec<Pod> = host_pods(&c)
            .await
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        (live.len() == 2).then_some(live)
    })
    .await;
    let api = c.api::<Pod>();
    for p in &pods {
        let labels = p.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["kueue.x-k8s.io/tas"], "true");
        assert_eq!(
            p.metadata.annotations.as_ref().unwrap()["kueue.x-k8s.io/workload"],
            name.as_str()
        );
        let gates: Vec<&str> = p
            .spec
            .as_ref()
            .unwrap()
            .scheduling_gates
            .iter()
            .flatten()
            .map(|g| g.name.as_str())
            .collect();
        assert_eq!(gates, ["kueue.x-k8s.io/topology"]);
        // The ungater: rank r goes to rack-(r+1).
        let rank: u64 = labels["hostmesh.dev/rank"].parse().unwrap();
        let patch = json!([
            {"op": "remove", "path": "/spec/schedulingGates"},
            {"op": "add", "path": "/spec/nodeSelector/example.com~1rack", "value": format!("rack-{}", rank + 1)},
        ]);
        api.patch(
            p.metadata.name.as_deref().unwrap(),
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(patch).unwrap()),
        )
        .await
        .unwrap();
    }
    c.pod_ready("w-host-0", "127.0.9.1").await;
    c.pod_ready("w-host-1", "127.0.9.2").await;
    world_status(&c, "World Running", |s| {
        s.phase == Some(WorldPhase::Running)
    })
    .await;
    let placed = host_pods(&c).await;
    assert_eq!(placed.len(), 2, "the ungater's writes replace no pod");
    for p in &placed {
        let spec = p.spec.as_ref().unwrap();
        assert!(spec.scheduling_gates.is_none());
        let rank: u64 = p.metadata.labels.as_ref().unwrap()["hostmesh.dev/rank"]
            .parse()
            .unwrap();
        let sel = spec.node_selector.as_ref().unwrap();
        assert_eq!(sel["example.com/rack"], format!("rack-{}", rank + 1));
        assert_eq!(
            sel["cloud.example.com/pool"], "a100",
            "the flavor's label stays"
        );
    }
    c.shutdown().await;
}
