//! Object lifecycle through kube-rs: finalizers and deletionTimestamp,
//! garbage collection (background, foreground, orphan), namespace
//! deletion, pod binding and graceful deletion, and persistence across a
//! restart.

use hostmesh_devcluster::apiserver::{ApiServer, ApiServerConfig};
use hostmesh_testkit::cluster::{api_server, api_server_with};
use hostmesh_testkit::{PATIENCE, eventually_async};
use k8s_openapi::api::core::v1::{Binding, ConfigMap, Namespace, Pod, Secret};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}),
    )
    .expect("cm")
}

fn owned_secret(name: &str, owner: &ConfigMap) -> Secret {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": owner.name_any(),
            "uid": owner.metadata.uid.clone().expect("uid"), "blockOwnerDeletion": true,
        }]},
        "stringData": {"a": "b"},
    }))
    .expect("secret")
}

/// Whether object `name` is deleted within the patience bound.
async fn gone<K>(api: &Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deleted = async || match api.get_opt(name).await.expect("get") {
        None => Ok(()),
        Some(o) => Err(o),
    };
    hostmesh_testkit::poll(PATIENCE, deleted).await.is_ok()
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let (server, client) = api_server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let mut c = cm("f");
    c.metadata.finalizers = Some(vec!["example.dev/cleanup".into()]);
    cms.create(&PostParams::default(), &c)
        .await
        .expect("create");
    let d = cms
        .delete("f", &DeleteParams::default())
        .await
        .expect("delete");
    let marked = d.left().expect("still there");
    assert!(marked.metadata.deletion_timestamp.is_some());
    // No new finalizers while deleting.
    let err = cms
        .patch(
            "f",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.dev/cleanup", "x/y"]}})),
        )
        .await
        .expect_err("forbidden");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403),
        "{err:?}"
    );
    cms.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("clear");
    assert!(gone(&cms, "f").await);
    server.shutdown().await;
}

#[tokio::test]
async fn garbage_collection_background_foreground_orphan() {
    let (server, client) = api_server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());

    // Background: the owner goes at once, the dependent follows.
    let o = cms
        .create(&PostParams::default(), &cm("bg"))
        .await
        .expect("owner");
    secrets
        .create(&PostParams::default(), &owned_secret("bg-dep", &o))
        .await
        .expect("dep");
    cms.delete("bg", &DeleteParams::background())
        .await
        .expect("delete");
    assert!(
        gone(&secrets, "bg-dep").await,
        "background GC deletes the dependent"
    );

    // Foreground: the dependent goes first; the owner waits for it.
    let o = cms
        .create(&PostParams::default(), &cm("fg"))
        .await
        .expect("owner");
    let mut dep = owned_secret("fg-dep", &o);
    dep.metadata.finalizers = Some(vec!["example.dev/hold".into()]);
    secrets
        .create(&PostParams::default(), &dep)
        .await
        .expect("dep");
    cms.delete("fg", &DeleteParams::foreground())
        .await
        .expect("delete");
    eventually_async("the dependent to be in deletion", async || {
        let d = secrets.get("fg-dep").await.expect("dep");
        d.metadata.deletion_timestamp.is_some().then_some(())
    })
    .await;
    let owner = cms.get("fg").await.expect("owner still there");
    assert!(owner.finalizers().iter().any(|f| f == "foregroundDeletion"));
    secrets
        .patch(
            "fg-dep",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release");
    assert!(gone(&secrets, "fg-dep").await);
    assert!(
        gone(&cms, "fg").await,
        "the owner goes once its dependents are gone"
    );

    // Orphan: the dependent stays, without the owner reference.
    let o = cms
        .create(&PostParams::default(), &cm("or"))
        .await
        .expect("owner");
    secrets
        .create(&PostParams::default(), &owned_secret("or-dep", &o))
        .await
        .expect("dep");
    cms.delete("or", &DeleteParams::orphan())
        .await
        .expect("delete");
    assert!(gone(&cms, "or").await);
    let d = secrets.get("or-dep").await.expect("orphan survives");
    assert!(d.metadata.owner_references.unwrap_or_default().is_empty());
    server.shutdown().await;
}

#[tokio::test]
async fn namespace_deletion_removes_contents() {
    let (server, client) = api_server().await;
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}),
    )
    .expect("ns");
    nss.create(&PostParams::default(), &ns)
        .await
        .expect("create ns");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    cms.create(&PostParams::default(), &cm("x"))
        .await
        .expect("cm");
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), "team");
    assert!(
        sas.get_opt("default").await.expect("sa").is_some(),
        "default ServiceAccount"
    );
    nss.delete("team", &DeleteParams::default())
        .await
        .expect("delete ns");
    let t = nss.get_opt("team").await.expect("get");
    if let Some(t) = t {
        assert_eq!(
            t.status.and_then(|s| s.phase).as_deref(),
            Some("Terminating")
        );
        // Creating in a terminating namespace is refused.
        if let Err(kube::Error::Api(s)) = cms.create(&PostParams::default(), &cm("late")).await {
            assert!(s.code == 403 || s.code == 404, "{s:?}");
        }
    }
    assert!(gone(&nss, "team").await);
    let err = nss
        .delete("default", &DeleteParams::default())
        .await
        .expect_err("protected");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403),
        "{err:?}"
    );
    assert!(
        cms.list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    server.shutdown().await;
}

#[tokio::test]
async fn pod_binding_and_graceful_deletion() {
    let (server, client) = api_server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "img:1"}], "terminationGracePeriodSeconds": 5},
    }))
    .expect("pod");
    let p = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("create");
    assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
    let binding: Binding = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "node-1"},
    }))
    .expect("binding");
    let raw = serde_json::to_vec(&binding).expect("json");
    let req = http::Request::post("/api/v1/namespaces/default/pods/p/binding")
        .header("content-type", "application/json")
        .body(raw.clone())
        .expect("request");
    client.request_text(req).await.expect("bind");
    let p = pods.get("p").await.expect("get");
    assert_eq!(
        p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("node-1")
    );
    let scheduled = p.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        scheduled
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "True")
    );
    let req = http::Request::post("/api/v1/namespaces/default/pods/p/binding")
        .header("content-type", "application/json")
        .body(raw)
        .expect("request");
    let err = client.request_text(req).await.expect_err("second binding");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409),
        "{err:?}"
    );

    // A bound pod stays with a grace period until the kubelet deletes it
    // with grace 0.
    let d = pods
        .delete("p", &DeleteParams::default())
        .await
        .expect("delete");
    let marked = d.left().expect("still there");
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(5));
    assert!(pods.get_opt("p").await.expect("get").is_some());
    pods.delete(
        "p",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .expect("force");
    assert!(gone(&pods, "p").await);

    // Unbound pods go at once.
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create");
    pods.delete("p", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(pods.get_opt("p").await.expect("get").is_none());
    server.shutdown().await;
}

#[tokio::test]
async fn persistence_keeps_objects_and_credentials_across_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = ApiServerConfig {
        data_dir: Some(dir.path().to_path_buf()),
        ..ApiServerConfig::default()
    };
    let (server, client) = api_server_with(cfg.clone()).await;
    let token = server.token().to_string();
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let c = cms
        .create(&PostParams::default(), &cm("keep"))
        .await
        .expect("create");
    let rv: u64 = c
        .metadata
        .resource_version
        .expect("rv")
        .parse()
        .expect("num");
    server.shutdown().await;

    let (server, client) = api_server_with(cfg).await;
    assert_eq!(server.token(), token, "same credentials");
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let got = cms.get("keep").await.expect("kept");
    assert_eq!(got.metadata.uid, c.metadata.uid);
    let next = cms
        .create(&PostParams::default(), &cm("after"))
        .await
        .expect("create");
    let rv2: u64 = next
        .metadata
        .resource_version
        .expect("rv")
        .parse()
        .expect("num");
    assert!(rv2 > rv, "resourceVersions keep growing");
    server.shutdown().await;
}

/// A server that dies without writing its state (SIGKILL) loses no
/// acknowledged write: creates, updates and deletes come back from the
/// journal (persist invariants 1 and 3), and a torn last line is skipped.
#[tokio::test]
async fn a_killed_server_keeps_every_acknowledged_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = ApiServerConfig {
        data_dir: Some(dir.path().to_path_buf()),
        ..ApiServerConfig::default()
    };
    let (server, client) = api_server_with(cfg.clone()).await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    for name in ["a", "b", "gone"] {
        cms.create(&PostParams::default(), &cm(name))
            .await
            .expect("create");
    }
    let patched = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "updated"}})),
        )
        .await
        .expect("patch");
    cms.delete("gone", &DeleteParams::default())
        .await
        .expect("delete");
    let last_rv: u64 = cms
        .get("b")
        .await
        .expect("b")
        .metadata
        .resource_version
        .expect("rv")
        .parse()
        .expect("num");
    // Killed: no shutdown, so no state written beyond what is on disk now.
    std::mem::forget(server);
    let journal = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains("journal-"))
        .max()
        .expect("a journal");
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .append(true)
        .open(&journal)
        .expect("journal")
        .write_all(b"{\"rv\":99999999,\"key\":")
        .expect("torn line");

    let (server, client) = api_server_with(cfg).await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let a = cms.get("a").await.expect("a kept");
    assert_eq!(a.data.expect("data")["k"], "updated");
    assert_eq!(
        a.metadata.resource_version,
        patched.metadata.resource_version
    );
    assert!(cms.get_opt("b").await.expect("get").is_some());
    assert!(
        cms.get_opt("gone").await.expect("get").is_none(),
        "the delete was kept"
    );
    let next: u64 = cms
        .create(&PostParams::default(), &cm("after"))
        .await
        .expect("create")
        .metadata
        .resource_version
        .expect("rv")
        .parse()
        .expect("num");
    assert!(
        next > last_rv,
        "resourceVersions keep growing: {next} > {last_rv}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn kube_runtime_finalizer_helper_adds_and_removes_its_finalizer() {
    use kube::runtime::controller::Action;
    use kube::runtime::finalizer::{Event, finalizer};
    let (server, client) = api_server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    cms.create(&PostParams::default(), &cm("fin"))
        .await
        .expect("create");
    let cleaned = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let run = |obj: ConfigMap| {
        let cms = cms.clone();
        let cleaned = cleaned.clone();
        async move {
            finalizer(
                &cms,
                "example.dev/cleanup",
                std::sync::Arc::new(obj),
                |ev| async move {
                    if let Event::Cleanup(_) = ev {
                        cleaned.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    Ok::<_, kube::Error>(Action::await_change())
                },
            )
            .await
        }
    };
    // First pass adds the finalizer (JSON patch: test null + add).
    run(cms.get("fin").await.expect("get"))
        .await
        .expect("add finalizer");
    let got = cms.get("fin").await.expect("get");
    assert_eq!(got.finalizers(), ["example.dev/cleanup"]);
    // Deleting waits for the cleanup, which removes the finalizer.
    cms.delete("fin", &DeleteParams::default())
        .await
        .expect("delete");
    run(cms.get("fin").await.expect("still there"))
        .await
        .expect("cleanup");
    assert!(cleaned.load(std::sync::atomic::Ordering::SeqCst));
    assert!(gone(&cms, "fin").await);
    server.shutdown().await;
}

#[tokio::test]
async fn a_corrupt_state_file_is_a_clear_startup_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("state.json"), "{not json").expect("write");
    let cfg = ApiServerConfig {
        data_dir: Some(dir.path().to_path_buf()),
        ..ApiServerConfig::default()
    };
    let err = ApiServer::start(cfg).await.expect_err("corrupt state");
    let msg = err.to_string();
    assert!(
        msg.contains("state.json") && msg.contains("move it away"),
        "{msg}"
    );
}

#[tokio::test]
async fn eviction_honours_pod_disruption_budgets() {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use kube::api::EvictParams;
    let (server, _) = api_server().await;
    // kube-rs retries 429 answers by default (for minutes); see each one.
    let kc = kube::config::Kubeconfig::from_yaml(server.kubeconfig_yaml()).expect("kubeconfig");
    let mut cfg = kube::Config::try_from(kc).expect("config");
    cfg.default_retry = false;
    let client = kube::Client::try_from(cfg).expect("client");
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    for name in ["a", "b"] {
        let p: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "db"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }))
        .expect("pod");
        pods.create(&PostParams::default(), &p)
            .await
            .expect("create pod");
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})),
        )
        .await
        .expect("ready");
    }
    let pdbs: Api<PodDisruptionBudget> = Api::default_namespaced(client.clone());
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "db"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "db"}}},
    }))
    .expect("pdb");
    pdbs.create(&PostParams::default(), &pdb)
        .await
        .expect("create pdb");
    // The disruption controller keeps the status.
    eventually_async("pdb status counts two healthy pods", async || {
        let s = pdbs.get("db").await.ok()?.status?;
        (s.current_healthy == 2 && s.desired_healthy == 2 && s.disruptions_allowed == 0)
            .then_some(())
    })
    .await;
    let err = pods
        .evict("a", &EvictParams::default())
        .await
        .expect_err("budget");
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err:?}")
    };
    assert_eq!(
        (status.code, status.reason.as_str()),
        (429, "TooManyRequests")
    );
    assert_eq!(
        status.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    let causes = status.details.map(|d| d.causes).unwrap_or_default();
    assert_eq!(causes.len(), 1);
    assert_eq!(causes[0].reason, "DisruptionBudget");
    assert_eq!(
        causes[0].message,
        "The disruption budget db needs 2 healthy pods and has 2 currently"
    );
    let a = pods.get("a").await.expect("a");
    assert!(a.metadata.deletion_timestamp.is_none(), "a stays");

    // One disruption allowed: the first eviction deletes a, the second is
    // refused while a is still going.
    pdbs.patch(
        "db",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minAvailable": 1}})),
    )
    .await
    .expect("relax the budget");
    let ok = pods
        .evict("a", &EvictParams::default())
        .await
        .expect("evict a");
    assert_eq!(ok.code, 201);
    let a = pods.get_opt("a").await.expect("get a");
    assert!(
        a.is_none_or(|a| a.metadata.deletion_timestamp.is_some()),
        "a is being deleted"
    );
    let err = pods
        .evict("b", &EvictParams::default())
        .await
        .expect_err("b is needed");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 429),
        "{err:?}"
    );
    let s = pdbs.get("db").await.expect("pdb").status.expect("status");
    assert!(
        s.disrupted_pods
            .as_ref()
            .is_some_and(|d| d.contains_key("a"))
            || s.current_healthy == 1,
        "{s:?}"
    );
    // A pod without a budget is evicted, a missing one is 404.
    pdbs.delete("db", &DeleteParams::default())
        .await
        .expect("delete pdb");
    pods.evict("b", &EvictParams::default())
        .await
        .expect("evict b without a budget");
    let err = pods
        .evict("nope", &EvictParams::default())
        .await
        .expect_err("missing");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404),
        "{err:?}"
    );
    server.shutdown().await;
}
