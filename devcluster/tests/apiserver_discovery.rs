//! Discovery of the groups clients probe, as a real kube-apiserver serves
//! them: `/apis` in the real order, an APIService per served group version
//! (CRD groups included, gone with their CRD), the stores kubectl lists
//! (empty, with their kinds), the bootstrap FlowSchemas and priority
//! levels, HorizontalPodAutoscalers in `autoscaling/v2` and `v1`, and
//! componentstatuses (get and list only, with the deprecation warning).

use hostmesh_testkit::cluster::api_server;
use hostmesh_testkit::eventually_async;
use http_body_util::BodyExt as _;
use kube::Client;
use serde_json::{Value, json};

/// A raw request: status, `Warning` headers, JSON body.
async fn call(client: &Client, method: &str, path: &str, body: Value) -> (u16, Vec<String>, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(if body.is_null() {
            Vec::new()
        } else {
            serde_json::to_vec(&body).expect("json")
        })
        .expect("request");
    let resp = client
        .send(req.map(kube::client::Body::from))
        .await
        .expect("sent");
    let code = resp.status().as_u16();
    let warnings = resp
        .headers()
        .get_all(http::header::WARNING)
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (code, warnings, v)
}

async fn get(client: &Client, path: &str) -> Value {
    let (code, _, v) = call(client, "GET", path, Value::Null).await;
    assert_eq!(code, 200, "GET {path}: {v}");
    v
}

#[tokio::test]
async fn groups_come_in_the_real_order_each_with_its_apiservice() {
    let (server, client) = api_server().await;
    let apis = get(&client, "/apis").await;
    let groups: Vec<&str> = apis["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter_map(|g| g["name"].as_str())
        .collect();
    assert_eq!(
        groups,
        [
            "apiregistration.k8s.io",
            "apps",
            "events.k8s.io",
            "authentication.k8s.io",
            "authorization.k8s.io",
            "autoscaling",
            "batch",
            "certificates.k8s.io",
            "networking.k8s.io",
            "policy",
            "rbac.authorization.k8s.io",
            "storage.k8s.io",
            "admissionregistration.k8s.io",
            "apiextensions.k8s.io",
            "scheduling.k8s.io",
            "coordination.k8s.io",
            "node.k8s.io",
            "discovery.k8s.io",
            "flowcontrol.apiserver.k8s.io",
        ]
    );
    let autoscaling = get(&client, "/apis/autoscaling").await;
    assert_eq!(autoscaling["preferredVersion"]["version"], "v2");
    let list = get(&client, "/apis/apiregistration.k8s.io/v1/apiservices").await;
    let names: Vec<&str> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    for n in [
        "v1.",
        "v1.apps",
        "v2.autoscaling",
        "v1.autoscaling",
        "v1.certificates.k8s.io",
        "v1.flowcontrol.apiserver.k8s.io",
        "v1.node.k8s.io",
        "v1.storage.k8s.io",
    ] {
        assert!(names.contains(&n), "APIService {n} missing: {names:?}");
    }
    assert!(!names.contains(&"v1.apiregistration.k8s.io"));
    let apps = get(
        &client,
        "/apis/apiregistration.k8s.io/v1/apiservices/v1.apps",
    )
    .await;
    assert_eq!(
        apps["spec"],
        json!({"group": "apps", "version": "v1", "groupPriorityMinimum": 17800, "versionPriority": 15})
    );
    assert_eq!(
        apps["metadata"]["labels"]["kube-aggregator.kubernetes.io/automanaged"],
        "onstart"
    );
    let available = &apps["status"]["conditions"][0];
    assert_eq!(
        (
            &available["type"],
            &available["status"],
            &available["reason"]
        ),
        (&json!("Available"), &json!("True"), &json!("Local"))
    );
    let core = get(&client, "/apis/apiregistration.k8s.io/v1/apiservices/v1.").await;
    assert_eq!(
        core["spec"],
        json!({"version": "v1", "groupPriorityMinimum": 18000, "versionPriority": 1})
    );

    // A CRD's group version gets its APIService, and loses it with the CRD.
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gizmos.example.dev"},
        "spec": {"group": "example.dev", "scope": "Namespaced",
                 "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]},
    });
    let (code, _, v) = call(
        &client,
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        crd,
    )
    .await;
    assert_eq!(code, 201, "{v}");
    let path = "/apis/apiregistration.k8s.io/v1/apiservices/v1.example.dev";
    let gizmo = get(&client, path).await;
    assert_eq!(
        gizmo["spec"],
        json!({"group": "example.dev", "version": "v1", "groupPriorityMinimum": 1000, "versionPriority": 100})
    );
    assert_eq!(
        gizmo["metadata"]["labels"]["kube-aggregator.kubernetes.io/automanaged"],
        "true"
    );
    let groups = get(&client, "/apis").await;
    assert_eq!(
        groups["groups"]
            .as_array()
            .expect("groups")
            .last()
            .expect("last")["name"],
        "example.dev",
        "custom resource groups come after the built-in ones"
    );
    let (code, _, _) = call(
        &client,
        "DELETE",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gizmos.example.dev",
        Value::Null,
    )
    .await;
    assert_eq!(code, 200);
    eventually_async("the CRD's APIService to go", async || {
        let (code, _, _) = call(&client, "GET", path, Value::Null).await;
        (code == 404).then_some(())
    })
    .await;
    server.shutdown().await;
}

#[tokio::test]
async fn the_stores_clients_probe_answer_with_their_kinds() {
    let (server, client) = api_server().await;
    for (path, kind) in [
        ("/apis/storage.k8s.io/v1/storageclasses", "StorageClassList"),
        ("/apis/storage.k8s.io/v1/csidrivers", "CSIDriverList"),
        ("/apis/storage.k8s.io/v1/csinodes", "CSINodeList"),
        (
            "/apis/storage.k8s.io/v1/volumeattachments",
            "VolumeAttachmentList",
        ),
        (
            "/apis/storage.k8s.io/v1/namespaces/default/csistoragecapacities",
            "CSIStorageCapacityList",
        ),
        ("/apis/node.k8s.io/v1/runtimeclasses", "RuntimeClassList"),
        (
            "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
            "ValidatingWebhookConfigurationList",
        ),
        (
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            "MutatingWebhookConfigurationList",
        ),
        (
            "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers",
            "HorizontalPodAutoscalerList",
        ),
        (
            "/apis/certificates.k8s.io/v1/certificatesigningrequests",
            "CertificateSigningRequestList",
        ),
    ] {
        let v = get(&client, path).await;
        assert_eq!(v["kind"], kind, "{path}");
        assert_eq!(v["items"], json!([]), "{path}");
    }
    // Objects are stored as given and read back (no controller acts on
    // them: no provisioner, no webhook is called).
    let sc = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                    "metadata": {"name": "fast", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
                    "provisioner": "example.com/disk"});
    let (code, _, v) = call(
        &client,
        "POST",
        "/apis/storage.k8s.io/v1/storageclasses",
        sc,
    )
    .await;
    assert_eq!(code, 201, "{v}");
    let v = get(&client, "/apis/storage.k8s.io/v1/storageclasses/fast").await;
    assert_eq!(v["provisioner"], "example.com/disk");
    let rc = json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "gvisor"}, "handler": "runsc"});
    let (code, _, v) = call(&client, "POST", "/apis/node.k8s.io/v1/runtimeclasses", rc).await;
    assert_eq!(code, 201, "{v}");

    // The bootstrap priority and fairness configuration.
    let fs = get(&client, "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas").await;
    let names: Vec<&str> = fs["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    for n in ["exempt", "catch-all", "system-leader-election", "probes"] {
        assert!(names.contains(&n), "FlowSchema {n}: {names:?}");
    }
    let exempt = get(
        &client,
        "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas/exempt",
    )
    .await;
    assert_eq!(
        exempt["spec"]["priorityLevelConfiguration"]["name"],
        "exempt"
    );
    assert_eq!(exempt["status"]["conditions"][0]["type"], "Dangling");
    assert_eq!(exempt["status"]["conditions"][0]["status"], "False");
    let pl = get(
        &client,
        "/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations/catch-all",
    )
    .await;
    assert_eq!(pl["spec"]["type"], "Limited");
    server.shutdown().await;
}

#[tokio::test]
async fn autoscalers_are_served_as_v2_and_v1_with_the_real_defaults() {
    let (server, client) = api_server().await;
    let v2 = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers";
    let v1 = "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers";
    let target = json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"});
    let (code, _, v) = call(
        &client,
        "POST",
        v2,
        json!({"metadata": {"name": "a"}, "spec": {"scaleTargetRef": target, "maxReplicas": 5}}),
    )
    .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["spec"]["minReplicas"], 1);
    assert_eq!(
        v["spec"]["metrics"],
        json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}])
    );
    let as_v1 = get(&client, &format!("{v1}/a")).await;
    assert_eq!(as_v1["apiVersion"], "autoscaling/v1");
    assert_eq!(as_v1["spec"]["targetCPUUtilizationPercentage"], 80);
    let (code, _, v) = call(
        &client,
        "POST",
        v1,
        json!({"metadata": {"name": "b"}, "spec": {"scaleTargetRef": target, "maxReplicas": 3, "targetCPUUtilizationPercentage": 50}}),
    )
    .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["spec"]["targetCPUUtilizationPercentage"], 50);
    let as_v2 = get(&client, &format!("{v2}/b")).await;
    assert_eq!(
        as_v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
        50
    );
    server.shutdown().await;
}

#[tokio::test]
async fn componentstatuses_are_healthy_read_only_and_deprecated() {
    let (server, client) = api_server().await;
    let (code, warnings, list) =
        call(&client, "GET", "/api/v1/componentstatuses", Value::Null).await;
    assert_eq!(code, 200);
    assert_eq!(
        warnings,
        ["299 - \"v1 ComponentStatus is deprecated in v1.19+\""]
    );
    assert_eq!(list["kind"], "ComponentStatusList");
    let items = list["items"].as_array().expect("items");
    let names: Vec<&str> = items
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["scheduler", "controller-manager", "etcd-0"]);
    for i in items {
        assert_eq!(
            i["conditions"],
            json!([{"type": "Healthy", "status": "True", "message": "ok"}])
        );
    }
    let (code, _, one) = call(
        &client,
        "GET",
        "/api/v1/componentstatuses/etcd-0",
        Value::Null,
    )
    .await;
    assert_eq!((code, one["kind"].as_str()), (200, Some("ComponentStatus")));
    let (code, _, e) = call(
        &client,
        "GET",
        "/api/v1/componentstatuses/nope",
        Value::Null,
    )
    .await;
    assert_eq!(
        (code, e["message"].as_str()),
        (500, Some("Component not found: nope"))
    );
    let (code, _, e) = call(
        &client,
        "GET",
        "/api/v1/componentstatuses?watch=1",
        Value::Null,
    )
    .await;
    assert_eq!(
        (code, e["message"].as_str()),
        (
            405,
            Some("watch is not supported on resources of kind \"componentstatuses\"")
        )
    );
    let (code, _, _) = call(
        &client,
        "DELETE",
        "/api/v1/componentstatuses/etcd-0",
        Value::Null,
    )
    .await;
    assert_eq!(code, 405);
    let core = get(&client, "/api/v1").await;
    let cs = core["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .find(|r| r["name"] == "componentstatuses")
        .expect("listed")
        .clone();
    assert_eq!(cs["verbs"], json!(["get", "list"]));
    assert_eq!(cs["shortNames"], json!(["cs"]));
    server.shutdown().await;
}
