//! CRUD semantics of the embedded API server, driven through kube-rs:
//! discovery, create/get/list/update/patch/delete, selectors, paging,
//! conflicts, generateName, CRDs with a status subresource, generation,
//! schema validation and authentication.

use std::time::Duration;

use hostmesh_testkit::cluster::api_server;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Discovery};
use serde_json::json;

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": {"k": "v"},
    }))
    .expect("configmap")
}

/// A CRD `widgets.example.dev` with status, printer columns and a schema.
pub fn widget_crd() -> serde_json::Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.dev"},
        "spec": {
            "group": "example.dev",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [{"name": "Phase", "type": "string", "jsonPath": ".status.phase"}],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size"],
                            "properties": {
                                "size": {"type": "integer", "minimum": 1},
                                "port": {"type": "integer", "default": 26600},
                                "mode": {"type": "string", "enum": ["Fast", "Slow"]},
                                "label": {"type": "string", "pattern": "^[a-z]+$"},
                            },
                        },
                        "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                    },
                }},
            }],
        },
    })
}

async fn install_widgets(client: &Client) -> Api<DynamicObject> {
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    let crd: DynamicObject = serde_json::from_value(widget_crd()).expect("crd");
    crds.create(&PostParams::default(), &crd)
        .await
        .expect("create crd");
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.dev", "v1", "Widget"),
        "widgets",
    );
    Api::namespaced_with(client.clone(), "default", &ar)
}

fn widget(name: &str, size: i64) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "example.dev/v1", "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": size},
    }))
    .expect("widget")
}

fn api_status(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn discovery_lists_builtin_and_crd_resources() {
    let (server, client) = api_server().await;
    let v = client.apiserver_version().await.expect("version");
    assert_eq!(v.git_version, "v1.33.0");
    install_widgets(&client).await;
    let d = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let mut kinds = Vec::new();
    for g in d.groups() {
        for (ar, _) in g.recommended_resources() {
            kinds.push(format!("{}/{}", ar.group, ar.kind));
        }
    }
    for k in [
        "/Pod",
        "/Namespace",
        "/Secret",
        "coordination.k8s.io/Lease",
        "events.k8s.io/Event",
        "example.dev/Widget",
    ] {
        assert!(
            kinds.iter().any(|x| x == k),
            "{k} missing from discovery: {kinds:?}"
        );
    }
    let nss: Api<Namespace> = Api::all(client);
    let names: Vec<String> = nss
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(names.contains(&"default".to_string()) && names.contains(&"kube-system".to_string()));
    server.shutdown().await;
}

#[tokio::test]
async fn wrong_token_is_rejected() {
    let (server, _) = api_server().await;
    let yaml = server
        .kubeconfig_yaml()
        .replace(server.token(), "not-the-token");
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).expect("kubeconfig");
    let client = Client::try_from(kube::Config::try_from(kc).expect("config")).expect("client");
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let (code, _) = api_status(
        cms.list(&ListParams::default())
            .await
            .expect_err("must be refused"),
    );
    assert_eq!(code, 401);
    server.shutdown().await;
}

#[tokio::test]
async fn create_get_update_patch_delete() {
    let (server, client) = api_server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let created = cms
        .create(&PostParams::default(), &cm("a", json!({"app": "x"})))
        .await
        .expect("create");
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    let (code, _) = api_status(
        cms.create(&PostParams::default(), &cm("a", json!({})))
            .await
            .expect_err("dup"),
    );
    assert_eq!(code, 409, "AlreadyExists");

    // Update with the current resourceVersion works, with a stale one is 409.
    let mut cur = cms.get("a").await.expect("get");
    cur.data
        .get_or_insert_default()
        .insert("k".into(), "v2".into());
    let updated = cms
        .replace("a", &PostParams::default(), &cur)
        .await
        .expect("replace");
    assert_ne!(
        updated.metadata.resource_version,
        cur.metadata.resource_version
    );
    let (code, msg) = api_status(
        cms.replace("a", &PostParams::default(), &cur)
            .await
            .expect_err("stale"),
    );
    assert_eq!(code, 409);
    assert!(msg.contains("the object has been modified"), "{msg}");

    // Merge patch, JSON patch, strategic merge.
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"m": "1"}})),
    )
    .await
    .expect("merge");
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/data/j", "value": "2"}]))
            .expect("jp");
    cms.patch("a", &PatchParams::default(), &Patch::<()>::Json(jp))
        .await
        .expect("json patch");
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Strategic(json!({"data": {"s": "3"}})),
    )
    .await
    .expect("smp");
    let got = cms.get("a").await.expect("get");
    let data = got.data.expect("data");
    assert_eq!(
        (
            data["k"].as_str(),
            data["m"].as_str(),
            data["j"].as_str(),
            data["s"].as_str()
        ),
        ("v2", "1", "2", "3")
    );

    // A write that changes nothing keeps the resourceVersion.
    let same = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"m": "1"}})),
        )
        .await
        .expect("noop");
    assert_eq!(
        same.metadata.resource_version,
        got.metadata.resource_version
    );

    cms.delete("a", &DeleteParams::default())
        .await
        .expect("delete");
    let (code, msg) = api_status(cms.get("a").await.expect_err("gone"));
    assert_eq!(code, 404);
    assert_eq!(msg, "configmaps \"a\" not found");
    server.shutdown().await;
}

#[tokio::test]
async fn strategic_merge_uses_merge_keys() {
    let (server, client) = api_server().await;
    let deploys: Api<Deployment> = Api::default_namespaced(client);
    let d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [
                {"name": "a", "image": "img:1", "env": [{"name": "X", "value": "1"}]},
                {"name": "b", "image": "img:1"},
            ]}},
        },
    }))
    .expect("deployment");
    deploys
        .create(&PostParams::default(), &d)
        .await
        .expect("create");
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "img:2", "env": [{"name": "Y", "value": "2"}]}]}}}});
    let d = deploys
        .patch("d", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .expect("smp");
    let cs = d
        .spec
        .expect("spec")
        .template
        .spec
        .expect("pod spec")
        .containers;
    assert_eq!(cs.len(), 2, "containers merge by name");
    assert_eq!(cs[0].image.as_deref(), Some("img:2"));
    let env: Vec<String> = cs[0]
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(env, ["X", "Y"], "env merges by name");
    let del = json!({"spec": {"template": {"spec": {"containers": [{"name": "b", "$patch": "delete"}]}}}});
    let d = deploys
        .patch("d", &PatchParams::default(), &Patch::Strategic(del))
        .await
        .expect("smp delete");
    assert_eq!(
        d.spec
            .expect("spec")
            .template
            .spec
            .expect("pod spec")
            .containers
            .len(),
        1
    );
    server.shutdown().await;
}

#[tokio::test]
async fn pod_spec_is_immutable_except_images_and_secrets_fold_string_data() {
    let (server, client) = api_server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a", "image": "img:1"}]},
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create");
    let img = json!({"spec": {"containers": [{"name": "a", "image": "img:2"}]}});
    pods.patch("p", &PatchParams::default(), &Patch::Strategic(img))
        .await
        .expect("image changes are allowed");
    let env =
        json!({"spec": {"containers": [{"name": "a", "env": [{"name": "X", "value": "1"}]}]}});
    let (code, msg) = api_status(
        pods.patch("p", &PatchParams::default(), &Patch::Strategic(env))
            .await
            .expect_err("env"),
    );
    assert_eq!(code, 422);
    assert!(msg.contains("pod updates may not change fields"), "{msg}");
    let node = json!({"spec": {"nodeName": "n1"}});
    let (code, _) = api_status(
        pods.patch("p", &PatchParams::default(), &Patch::Merge(node))
            .await
            .expect_err("nodeName"),
    );
    assert_eq!(code, 422, "binding is the only way to set nodeName");

    let secrets: Api<Secret> = Api::default_namespaced(client);
    let s: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
        "data": {"a": "eA=="}, "stringData": {"b": "hello"},
    }))
    .expect("secret");
    let s = secrets
        .create(&PostParams::default(), &s)
        .await
        .expect("create");
    assert!(s.string_data.is_none(), "stringData is write-only");
    let data = s.data.expect("data");
    assert_eq!(data["b"].0, b"hello");
    assert_eq!(data["a"].0, b"x");
    assert_eq!(s.type_.as_deref(), Some("Opaque"));
    server.shutdown().await;
}

#[tokio::test]
async fn selectors_paging_and_generate_name() {
    let (server, client) = api_server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    for i in 0..7 {
        let tier = if i % 2 == 0 { "even" } else { "odd" };
        cms.create(
            &PostParams::default(),
            &cm(&format!("c{i}"), json!({"tier": tier, "i": i.to_string()})),
        )
        .await
        .expect("create");
    }
    let even = cms
        .list(&ListParams::default().labels("tier=even"))
        .await
        .expect("list");
    assert_eq!(even.items.len(), 4);
    let set = cms
        .list(&ListParams::default().labels("i in (1,2),tier!=odd"))
        .await
        .expect("list");
    assert_eq!(set.items.len(), 1);
    let named = cms
        .list(&ListParams::default().fields("metadata.name=c3"))
        .await
        .expect("fields");
    assert_eq!(named.items.len(), 1);

    let mut seen = Vec::new();
    let mut lp = ListParams::default().limit(3);
    for _ in 0..10 {
        let page = cms.list(&lp).await.expect("page");
        seen.extend(page.items.into_iter().filter_map(|c| c.metadata.name));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    // Our seven, and the CA every namespace holds (as in a real cluster).
    assert_eq!(
        seen,
        ["c0", "c1", "c2", "c3", "c4", "c5", "c6", "kube-root-ca.crt"]
    );

    let mut g = cm("", json!({}));
    g.metadata.name = None;
    g.metadata.generate_name = Some("gen-".into());
    let made = cms
        .create(&PostParams::default(), &g)
        .await
        .expect("generateName");
    let name = made.metadata.name.expect("name");
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    server.shutdown().await;
}

#[tokio::test]
async fn invalid_selectors_are_bad_requests_and_unset_booleans_are_false() {
    use k8s_openapi::api::core::v1::Node;
    let (server, client) = api_server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let bad = |e: kube::Error| match e {
        kube::Error::Api(s) if s.code == 400 && s.reason == "BadRequest" => s.message,
        other => panic!("expected 400 BadRequest, got {other:?}"),
    };
    for sel in [
        "app=web=x",
        "a b=c",
        "-bad=x",
        "app=-x",
        "a in ()",
        "n>x",
        "a,,b",
    ] {
        let e = cms
            .list(&ListParams::default().labels(sel))
            .await
            .expect_err(sel);
        let msg = bad(e);
        assert!(
            msg.contains("unable to parse requirement")
                || msg.contains("couldn't parse the selector"),
            "{sel}: {msg}"
        );
    }
    let msg = bad(cms
        .list(&ListParams::default().fields("spec.foo=x"))
        .await
        .expect_err("unknown field"));
    assert_eq!(
        msg,
        "\"spec.foo\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
    );
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let msg = bad(pods
        .list(&ListParams::default().fields("spec.foo=x"))
        .await
        .expect_err("unknown pod field"));
    assert_eq!(msg, "field label not supported: spec.foo");
    // Watches refuse the same selectors.
    match pods
        .watch(&kube::api::WatchParams::default().fields("spec.foo=x"), "0")
        .await
    {
        Err(e) => assert_eq!(bad(e), "field label not supported: spec.foo"),
        Ok(_) => panic!("a watch with an unknown field is refused"),
    }

    let nodes: Api<Node> = Api::all(client);
    for (name, spec) in [
        ("plain", json!({})),
        ("cordoned", json!({"unschedulable": true})),
    ] {
        let n: Node = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": spec}),
        )
        .expect("node");
        nodes
            .create(&PostParams::default(), &n)
            .await
            .expect("create node");
    }
    let names = |l: kube::core::ObjectList<Node>| -> Vec<String> {
        l.items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect()
    };
    let schedulable = nodes
        .list(&ListParams::default().fields("spec.unschedulable=false"))
        .await
        .expect("list schedulable");
    assert_eq!(names(schedulable), ["plain"]);
    let cordoned = nodes
        .list(&ListParams::default().fields("spec.unschedulable!=false"))
        .await
        .expect("list cordoned");
    assert_eq!(names(cordoned), ["cordoned"]);
    server.shutdown().await;
}

#[tokio::test]
async fn deployments_serve_the_scale_subresource() {
    use k8s_openapi::api::autoscaling::v1::Scale;
    let (server, client) = api_server().await;
    let deps: Api<Deployment> = Api::default_namespaced(client.clone());
    let d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web", "tier": "a"}},
            "template": {"metadata": {"labels": {"app": "web", "tier": "a"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
    }))
    .expect("deployment");
    deps.create(&PostParams::default(), &d)
        .await
        .expect("create");
    let s = deps.get_scale("web").await.expect("get scale");
    assert_eq!(s.spec.as_ref().and_then(|s| s.replicas), Some(2));
    assert_eq!(
        s.status.as_ref().and_then(|s| s.selector.as_deref()),
        Some("app=web,tier=a")
    );
    let s = deps
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .expect("patch scale");
    assert_eq!(s.spec.as_ref().and_then(|s| s.replicas), Some(5));
    let d = deps.get("web").await.expect("get");
    assert_eq!(d.spec.as_ref().and_then(|s| s.replicas), Some(5));
    assert_eq!(d.metadata.generation, Some(2), "a scale moves generation");
    // PUT with the Scale's resourceVersion: a stale one is a conflict.
    let mut stale: Scale = s.clone();
    stale.metadata.resource_version = Some("1".into());
    stale.spec.as_mut().expect("spec").replicas = Some(7);
    let err = deps
        .replace_scale("web", &PostParams::default(), &stale)
        .await
        .expect_err("stale scale");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409),
        "{err:?}"
    );
    let err = deps
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": -1}})),
        )
        .await
        .expect_err("negative replicas");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422),
        "{err:?}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn size_limits_are_kubernetes_own() {
    let (server, client) = api_server().await;
    let post = |path: &'static str, body: String| {
        let client = client.clone();
        async move {
            let req = http::Request::post(path)
                .header("content-type", "application/json")
                .body(body.into_bytes())
                .expect("request");
            match client.request_text(req).await {
                Ok(_) => panic!("{path}: a request over a limit is refused"),
                Err(kube::Error::Api(s)) => *s,
                Err(e) => panic!("{path}: expected a Status, got {e:?}"),
            }
        }
    };
    let cms = "/api/v1/namespaces/default/configmaps";
    // Over 3 MiB of body: 413 before anything else.
    let huge = format!(
        r#"{{"metadata": {{"name": "huge"}}, "data": {{"k": "{}"}}}}"#,
        "x".repeat(3 * 1024 * 1024)
    );
    let s = post(cms, huge).await;
    assert_eq!((s.code, s.reason.as_str()), (413, "RequestEntityTooLarge"));
    assert_eq!(s.message, "Request entity too large: limit is 3145728");
    // Annotations over 256 KiB: 422 on metadata.annotations.
    let ann = format!(
        r#"{{"metadata": {{"name": "ann", "annotations": {{"a": "{}"}}}}}}"#,
        "x".repeat(256 * 1024)
    );
    let s = post(cms, ann).await;
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        s.message,
        "ConfigMap \"ann\" is invalid: metadata.annotations: Too long: must have at most 262144 bytes"
    );
    // An object over etcd's 1.5 MiB: the error etcd gives, passed on.
    let lease = format!(
        r#"{{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {{"name": "big"}}, "spec": {{"holderIdentity": "{}"}}}}"#,
        "x".repeat(2 * 1024 * 1024)
    );
    let s = post(
        "/apis/coordination.k8s.io/v1/namespaces/default/leases",
        lease,
    )
    .await;
    assert_eq!(
        (s.code, s.message.as_str()),
        (500, "etcdserver: request is too large")
    );
    // Under every limit: stored.
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "fits", "annotations": {"a": "x".repeat(200 * 1024)}}}),
    )
    .expect("cm");
    Api::<ConfigMap>::default_namespaced(client.clone())
        .create(&PostParams::default(), &cm)
        .await
        .expect("fits");
    server.shutdown().await;
}

#[tokio::test]
async fn json_fields_come_in_kubernetes_order() {
    let (server, client) = api_server().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    api.create(&PostParams::default(), &cm("ordered", json!({"a": "b"})))
        .await
        .expect("create");
    let get = |path: &'static str| {
        let client = client.clone();
        async move {
            let req = http::Request::get(path).body(Vec::new()).expect("request");
            client.request_text(req).await.expect("get")
        }
    };
    let text = get("/api/v1/namespaces/default/configmaps/ordered").await;
    assert!(
        text.starts_with(r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"ordered","namespace":"default","uid":"#),
        "{text}"
    );
    let list = get("/api/v1/namespaces/default/configmaps").await;
    assert!(
        list.starts_with(r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"#),
        "{list}"
    );
    let pods = get("/api/v1/namespaces/default/pods?watch=true&timeoutSeconds=1").await;
    assert!(pods.is_empty(), "no pods: {pods}");
    let watch = get("/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1&fieldSelector=metadata.name%3Dordered").await;
    assert!(
        watch.starts_with(r#"{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"ordered""#),
        "{watch}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn missing_namespace_and_bad_names_are_refused() {
    let (server, client) = api_server().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "nope");
    let (code, msg) = api_status(
        cms.create(&PostParams::default(), &cm("a", json!({})))
            .await
            .expect_err("no ns"),
    );
    assert_eq!((code, msg.as_str()), (404, "namespaces \"nope\" not found"));
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let (code, msg) = api_status(
        cms.create(&PostParams::default(), &cm("Bad_Name", json!({})))
            .await
            .expect_err("bad"),
    );
    assert_eq!(code, 422);
    assert!(msg.contains("metadata.name"), "{msg}");
    server.shutdown().await;
}

#[tokio::test]
async fn crd_serves_resource_with_status_generation_and_validation() {
    let (server, client) = api_server().await;
    let widgets = install_widgets(&client).await;
    let w = widgets
        .create(&PostParams::default(), &widget("w", 2))
        .await
        .expect("create");
    assert_eq!(w.data["spec"]["port"], 26600, "schema default applied");
    assert_eq!(w.metadata.generation, Some(1));

    // Status through the subresource does not bump generation; status in
    // a main-resource write is ignored.
    let st = widgets
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .expect("status");
    assert_eq!(st.metadata.generation, Some(1));
    assert_eq!(st.data["status"]["phase"], "Running");
    let m = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Hacked"}})),
        )
        .await
        .expect("main");
    assert_eq!(m.data["status"]["phase"], "Running");
    assert_eq!(m.metadata.generation, Some(1), "no spec change, no bump");
    let s = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 3}})),
        )
        .await
        .expect("spec");
    assert_eq!(s.metadata.generation, Some(2));
    let l = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .expect("labels");
    assert_eq!(
        l.metadata.generation,
        Some(2),
        "metadata changes do not bump generation"
    );

    // Invalid objects get one 422 naming every bad field.
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.dev/v1", "kind": "Widget", "metadata": {"name": "bad"},
        "spec": {"size": 0, "mode": "Turbo", "label": "Not-Lower"},
    }))
    .expect("bad");
    let (code, msg) = api_status(
        widgets
            .create(&PostParams::default(), &bad)
            .await
            .expect_err("invalid"),
    );
    assert_eq!(code, 422);
    assert!(
        msg.contains("spec.size") && msg.contains("spec.mode") && msg.contains("Turbo"),
        "{msg}"
    );
    let missing: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.dev/v1", "kind": "Widget", "metadata": {"name": "m"}, "spec": {},
    }))
    .expect("missing");
    let (code, msg) = api_status(
        widgets
            .create(&PostParams::default(), &missing)
            .await
            .expect_err("required"),
    );
    assert_eq!(code, 422);
    assert!(msg.contains("spec.size: Required value"), "{msg}");

    // Unknown fields are pruned.
    let extra: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.dev/v1", "kind": "Widget", "metadata": {"name": "x"},
        "spec": {"size": 1, "bogus": true},
    }))
    .expect("extra");
    let x = widgets
        .create(&PostParams::default(), &extra)
        .await
        .expect("pruned");
    assert!(x.data["spec"].get("bogus").is_none());

    // Strategic merge is refused for custom resources.
    let (code, _) = api_status(
        widgets
            .patch(
                "w",
                &PatchParams::default(),
                &Patch::Strategic(json!({"spec": {"size": 4}})),
            )
            .await
            .expect_err("smp"),
    );
    assert_eq!(code, 415);
    server.shutdown().await;
}

#[tokio::test]
async fn crd_removal_stops_serving() {
    let (server, client) = api_server().await;
    let widgets = install_widgets(&client).await;
    widgets
        .create(&PostParams::default(), &widget("w", 1))
        .await
        .expect("create");
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    let crd = crds.get("widgets.example.dev").await.expect("crd");
    let established = crd.data["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .any(|c| c["type"] == "Established" && c["status"] == "True");
    assert!(established);
    crds.delete("widgets.example.dev", &DeleteParams::default())
        .await
        .expect("delete crd");
    let mut gone = false;
    for _ in 0..100 {
        if let Err(kube::Error::Api(s)) = widgets.list(&ListParams::default()).await {
            gone = s.code == 404;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "the custom resource is no longer served");
    // Its objects went with it: a re-installed CRD starts empty.
    let widgets = install_widgets(&client).await;
    assert!(
        widgets
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    server.shutdown().await;
}

async fn raw(
    client: &Client,
    method: &str,
    path: &str,
    ct: &str,
    body: &str,
) -> Result<String, (u16, String)> {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", ct)
        .body(body.as_bytes().to_vec())
        .expect("request");
    client.request_text(req).await.map_err(|e| match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("transport error (did the server panic?): {other:?}"),
    })
}

#[tokio::test]
async fn hostile_inputs_get_clear_errors_not_panics() {
    let (server, client) = api_server().await;
    let pods = "/api/v1/namespaces/default/pods";
    let cms = "/api/v1/namespaces/default/configmaps";
    let json = "application/json";
    let cases: Vec<(&str, &str, &str, &str, u16)> = vec![
        ("POST", cms, json, "not json", 400),
        ("POST", cms, json, "[1,2]", 400),
        ("POST", cms, json, r#"{"metadata": []}"#, 422),
        (
            "POST",
            cms,
            json,
            r#"{"metadata": {"name": "x", "labels": {"a": 1}}}"#,
            422,
        ),
        (
            "POST",
            cms,
            json,
            r#"{"kind": "Pod", "metadata": {"name": "x"}}"#,
            400,
        ),
        (
            "POST",
            cms,
            json,
            r#"{"metadata": {"generateName": "ééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééé"}}"#,
            422,
        ),
        (
            "POST",
            pods,
            json,
            r#"{"metadata": {"name": "p"}, "spec": "x"}"#,
            422,
        ),
        (
            "POST",
            cms,
            "application/vnd.kubernetes.protobuf",
            "k8s\u{0}garbage",
            400,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps?labelSelector=a%20in%20(b",
            json,
            "",
            400,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps?limit=-1",
            json,
            "",
            400,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps?continue=%%%",
            json,
            "",
            400,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=abc",
            json,
            "",
            400,
        ),
        ("GET", "/api/v1/nope", json, "", 404),
        ("GET", "/apis/nope.dev/v1/things", json, "", 404),
    ];
    for (method, path, ct, body, want) in cases {
        match raw(&client, method, path, ct, body).await {
            Err((code, msg)) => assert_eq!(code, want, "{method} {path} {body}: {msg}"),
            Ok(out) => panic!("{method} {path} {body} succeeded: {out}"),
        }
    }
    // A pod whose status a client broke, then bound and deleted with an
    // absurd grace period: answers, no panic.
    raw(
        &client,
        "POST",
        pods,
        json,
        r#"{"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}"#,
    )
    .await
    .expect("pod");
    raw(
        &client,
        "PUT",
        &format!("{pods}/p/status"),
        json,
        r#"{"metadata": {"name": "p"}, "status": "broken"}"#,
    )
    .await
    .ok();
    raw(
        &client,
        "POST",
        &format!("{pods}/p/binding"),
        json,
        r#"{"target": {"name": "n1"}}"#,
    )
    .await
    .expect("bind");
    raw(
        &client,
        "DELETE",
        &format!("{pods}/p?gracePeriodSeconds=9223372036854775807"),
        json,
        "",
    )
    .await
    .expect("delete");
    raw(
        &client,
        "DELETE",
        &format!("{pods}/p?gracePeriodSeconds=0"),
        json,
        "",
    )
    .await
    .expect("force delete");
    // The server still serves.
    assert!(client.apiserver_version().await.is_ok());
    server.shutdown().await;
}

#[tokio::test]
async fn crd_versions_share_storage_and_prefer_the_highest() {
    let (server, client) = api_server().await;
    let mut crd = widget_crd();
    let v1 = crd["spec"]["versions"][0].clone();
    let mut beta = v1.clone();
    beta["name"] = json!("v1beta1");
    beta["storage"] = json!(false);
    crd["spec"]["versions"] = json!([beta, v1]);
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    crds.create(
        &PostParams::default(),
        &serde_json::from_value(crd).expect("crd"),
    )
    .await
    .expect("create");
    let beta_ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.dev", "v1beta1", "Widget"),
        "widgets",
    );
    let v1_ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.dev", "v1", "Widget"),
        "widgets",
    );
    let beta_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &beta_ar);
    let v1_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &v1_ar);
    let mut w = widget("w", 1);
    w.types.as_mut().expect("types").api_version = "example.dev/v1beta1".into();
    beta_api
        .create(&PostParams::default(), &w)
        .await
        .expect("create via v1beta1");
    let got = v1_api.get("w").await.expect("read via v1");
    assert_eq!(got.types.expect("types").api_version, "example.dev/v1");
    let d = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let g = d
        .groups()
        .find(|g| g.name() == "example.dev")
        .expect("group");
    assert_eq!(g.preferred_version_or_latest(), "v1");
    server.shutdown().await;
}

#[tokio::test]
async fn services_get_a_stable_cluster_ip_and_headless_stays_headless() {
    use k8s_openapi::api::core::v1::Service;
    let (server, client) = api_server().await;
    let svcs: Api<Service> = Api::default_namespaced(client);
    let svc = |name: &str, cluster_ip: Option<&str>| -> Service {
        let mut spec = json!({"selector": {"app": name}, "ports": [{"port": 80}]});
        if let Some(ip) = cluster_ip {
            spec["clusterIP"] = json!(ip);
        }
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec})).expect("svc")
    };
    let s = svcs
        .create(&PostParams::default(), &svc("web", None))
        .await
        .expect("create");
    let spec = s.spec.expect("spec");
    let ip = spec.cluster_ip.clone().expect("cluster IP");
    assert!(ip.starts_with("10.96."), "{ip}");
    assert_eq!(
        spec.ports.expect("ports")[0].protocol.as_deref(),
        Some("TCP")
    );
    // An update that omits the IP keeps it.
    let s = svcs
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"clusterIP": null, "clusterIPs": null}})),
        )
        .await
        .expect("patch");
    assert_eq!(
        s.spec.expect("spec").cluster_ip.as_deref(),
        Some(ip.as_str())
    );
    let h = svcs
        .create(&PostParams::default(), &svc("world", Some("None")))
        .await
        .expect("headless");
    assert_eq!(h.spec.expect("spec").cluster_ip.as_deref(), Some("None"));
    server.shutdown().await;
}

/// A raw request's status code and body, bytes as the server wrote them.
async fn raw_bytes(client: &Client, method: &str, path: &str, body: &str) -> (u16, String) {
    use http_body_util::BodyExt as _;
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.as_bytes().to_vec())
        .expect("request");
    let resp = client
        .send(req.map(kube::client::Body::from))
        .await
        .expect("sent");
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (code, String::from_utf8(bytes.to_vec()).expect("utf8"))
}

/// Error bodies are the real server's (kube-apiserver v1.28, compared
/// byte for byte): `Status` fields in `metav1.Status` order, `details`
/// naming the object (group left out for the core group), an empty
/// `details` for a path that serves nothing (kubectl debug reads
/// `details.name` there), the kind qualified by its group and several
/// causes listed in `[]` for Invalid.
#[tokio::test]
async fn error_statuses_are_shaped_as_the_real_servers() {
    let (server, client) = api_server().await;
    let cms = "/api/v1/namespaces/default/configmaps";
    let created = raw_bytes(&client, "POST", cms, r#"{"metadata":{"name":"exists"}}"#).await;
    assert_eq!(created.0, 201, "{}", created.1);
    let status = |message: &str, reason: &str, details: &str, code: u16| {
        format!(
            r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":{message},"reason":"{reason}","details":{details},"code":{code}}}"#
        )
    };
    let cases: Vec<(&str, String, &str, (u16, String))> = vec![
        (
            "GET",
            format!("{cms}/nope"),
            "",
            (
                404,
                status(
                    r#""configmaps \"nope\" not found""#,
                    "NotFound",
                    r#"{"name":"nope","kind":"configmaps"}"#,
                    404,
                ),
            ),
        ),
        (
            "GET",
            "/apis/apps/v1/namespaces/default/deployments/nope".into(),
            "",
            (
                404,
                status(
                    r#""deployments.apps \"nope\" not found""#,
                    "NotFound",
                    r#"{"name":"nope","group":"apps","kind":"deployments"}"#,
                    404,
                ),
            ),
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/nope/ephemeralcontainers".into(),
            "",
            (
                404,
                status(
                    r#""pods \"nope\" not found""#,
                    "NotFound",
                    r#"{"name":"nope","kind":"pods"}"#,
                    404,
                ),
            ),
        ),
        (
            "GET",
            "/api/v1/foos".into(),
            "",
            (
                404,
                status(
                    r#""the server could not find the requested resource""#,
                    "NotFound",
                    "{}",
                    404,
                ),
            ),
        ),
        (
            "POST",
            cms.into(),
            r#"{"metadata":{"name":"exists"}}"#,
            (
                409,
                status(
                    r#""configmaps \"exists\" already exists""#,
                    "AlreadyExists",
                    r#"{"name":"exists","kind":"configmaps"}"#,
                    409,
                ),
            ),
        ),
        (
            "PUT",
            format!("{cms}/exists"),
            r#"{"metadata":{"name":"exists","resourceVersion":"1"}}"#,
            (
                409,
                status(
                    r#""Operation cannot be fulfilled on configmaps \"exists\": the object has been modified; please apply your changes to the latest version and try again""#,
                    "Conflict",
                    r#"{"name":"exists","kind":"configmaps"}"#,
                    409,
                ),
            ),
        ),
        (
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/default/leases".into(),
            r#"{"metadata":{"name":"D"}}"#,
            (
                422,
                status(
                    r#""Lease.coordination.k8s.io \"D\" is invalid: metadata.name: Invalid value: \"D\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')""#,
                    "Invalid",
                    r#"{"name":"D","group":"coordination.k8s.io","kind":"Lease","causes":[{"reason":"FieldValueInvalid","message":"Invalid value: \"D\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')","field":"metadata.name"}]}"#,
                    422,
                ),
            ),
        ),
        (
            "PUT",
            cms.into(),
            "{}",
            (
                405,
                status(
                    r#""the server does not allow this method on the requested resource""#,
                    "MethodNotAllowed",
                    "{}",
                    405,
                ),
            ),
        ),
        (
            "DELETE",
            "/api/v1/namespaces/default".into(),
            "",
            (
                403,
                status(
                    r#""namespaces \"default\" is forbidden: this namespace may not be deleted""#,
                    "Forbidden",
                    r#"{"name":"default","kind":"namespaces"}"#,
                    403,
                ),
            ),
        ),
    ];
    for (method, path, body, want) in cases {
        let got = raw_bytes(&client, method, &path, body).await;
        assert_eq!(got, want, "{method} {path}");
    }
    // Paths no handler serves are plain text, as the real server's.
    for path in ["/foo", "/apis/foo.io/v1", "/apis/foo.io/v1/things"] {
        let got = raw_bytes(&client, "GET", path, "").await;
        assert_eq!(got, (404, "404 page not found\n".to_string()), "{path}");
    }
    // Several causes are listed in [], each with its reason.
    let (code, body) = raw_bytes(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods",
        r#"{"metadata":{"name":"p"},"spec":{"containers":[{"name":"","image":""}]}}"#,
    )
    .await;
    assert_eq!(code, 422);
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        v["message"],
        r#"Pod "p" is invalid: [spec.containers[0].name: Required value, spec.containers[0].image: Required value]"#
    );
    assert_eq!(v["details"]["causes"][0]["reason"], "FieldValueRequired");
    server.shutdown().await;
}
