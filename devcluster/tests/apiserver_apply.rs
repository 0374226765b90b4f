//! Server-side apply through kube-rs: managedFields per manager, shared
//! ownership, conflicts and force, removal of fields a manager stops
//! applying, keyed list merging, status apply; plus the resources the
//! operator's plumbing uses (Leases, Events).

use hostmesh_testkit::cluster::api_server;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn apply_cm(data: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Apply(
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": data}),
    )
}

fn managers(o: &impl kube::Resource) -> Vec<(String, String)> {
    o.meta()
        .managed_fields
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            (
                m.manager.unwrap_or_default(),
                m.operation.unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test]
async fn apply_creates_tracks_owners_conflicts_and_removes() {
    let (server, client) = api_server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let alice = PatchParams::apply("alice");
    let bob = PatchParams::apply("bob");

    let c = cms
        .patch("a", &alice, &apply_cm(json!({"x": "1", "y": "1"})))
        .await
        .expect("apply creates");
    assert_eq!(managers(&c), [("alice".to_string(), "Apply".to_string())]);

    // Same value: shared ownership, no conflict.
    cms.patch("a", &bob, &apply_cm(json!({"x": "1", "z": "1"})))
        .await
        .expect("bob co-owns x");
    // Different value: conflict naming the owner.
    let err = cms
        .patch("a", &bob, &apply_cm(json!({"y": "2"})))
        .await
        .expect_err("conflict");
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert!(
                s.message.contains("alice") && s.message.contains(".data.y"),
                "{}",
                s.message
            );
        }
        other => panic!("{other:?}"),
    }
    // Force takes it.
    let c = cms
        .patch(
            "a",
            &PatchParams::apply("bob").force(),
            &apply_cm(json!({"x": "1", "y": "2", "z": "1"})),
        )
        .await
        .expect("force");
    assert_eq!(c.data.as_ref().expect("data")["y"], "2");

    // Alice stops applying x: bob still owns it, so it stays; she also
    // stops applying y which she no longer owns.
    let c = cms
        .patch("a", &alice, &apply_cm(json!({})))
        .await
        .expect("alice shrinks");
    let data = c.data.expect("data");
    assert_eq!(
        (
            data.get("x").map(String::as_str),
            data.get("z").map(String::as_str)
        ),
        (Some("1"), Some("1"))
    );
    // Bob stops applying z: nobody else owns it, so it is removed.
    let c = cms
        .patch("a", &bob, &apply_cm(json!({"x": "1", "y": "2"})))
        .await
        .expect("bob shrinks");
    assert!(
        !c.data.expect("data").contains_key("z"),
        "unowned fields a manager stops applying are removed"
    );

    // An Update by another manager takes ownership of what it changed.
    let c = cms
        .patch(
            "a",
            &PatchParams {
                field_manager: Some("editor".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"data": {"y": "3"}})),
        )
        .await
        .expect("merge");
    assert!(managers(&c).contains(&("editor".to_string(), "Update".to_string())));
    let err = cms
        .patch("a", &bob, &apply_cm(json!({"x": "1", "y": "2"})))
        .await
        .expect_err("editor owns y now");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.message.contains("editor")),
        "{err:?}"
    );

    // fieldManager is required for apply: 422 as kube-apiserver answers.
    let req = http::Request::patch("/api/v1/namespaces/default/configmaps/a")
        .header("content-type", "application/apply-patch+yaml")
        .body(b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n".to_vec())
        .expect("req");
    let err = client.request_text(req).await.expect_err("no manager");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422 && s.reason == "Invalid"
            && s.message == "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"),
        "{err:?}"
    );
    // force only goes with apply.
    let req = http::Request::patch("/api/v1/namespaces/default/configmaps/a?force=true")
        .header("content-type", "application/merge-patch+json")
        .body(b"{}".to_vec())
        .expect("req");
    let err = client
        .request_text(req)
        .await
        .expect_err("force without apply");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422 && s.message.contains("force: Forbidden")),
        "{err:?}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn apply_merges_keyed_lists_and_status() {
    let (server, client) = api_server().await;
    let deploys: Api<Deployment> = Api::default_namespaced(client.clone());
    let deploy = |containers: serde_json::Value| {
        Patch::Apply(
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {
                "selector": {"matchLabels": {"app": "d"}},
                "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": containers}},
            }}),
        )
    };
    deploys
        .patch(
            "d",
            &PatchParams::apply("a"),
            &deploy(json!([{"name": "one", "image": "i:1"}])),
        )
        .await
        .expect("a");
    let d = deploys
        .patch(
            "d",
            &PatchParams::apply("b"),
            &deploy(json!([{"name": "two", "image": "i:2"}])),
        )
        .await
        .expect("b adds a container by key");
    let names: Vec<String> = d
        .spec
        .expect("spec")
        .template
        .spec
        .expect("pod")
        .containers
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["one", "two"]);

    let pods: Api<Pod> = Api::default_namespaced(client);
    let p = pods
        .patch(
            "p",
            &PatchParams::apply("a"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "one", "image": "i:1"}]}})),
        )
        .await
        .expect("pod");
    // Status apply through the subresource.
    let generation = p.metadata.generation;
    let st = Patch::Apply(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
    );
    let p = pods
        .patch_status("p", &PatchParams::apply("kubelet").force(), &st)
        .await
        .expect("status apply");
    assert_eq!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );
    let st2 = Patch::Apply(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "status": {"conditions": [{"type": "Initialized", "status": "True"}]}}),
    );
    let p = pods
        .patch_status("p", &PatchParams::apply("other").force(), &st2)
        .await
        .expect("second manager");
    let types: Vec<String> = p
        .status
        .expect("status")
        .conditions
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert!(
        types.contains(&"Ready".to_string()) && types.contains(&"Initialized".to_string()),
        "conditions merge by type: {types:?}"
    );
    assert_eq!(
        p.metadata.generation, generation,
        "status writes do not bump generation"
    );
    server.shutdown().await;
}

/// Sends a raw request; returns the status code and the body.
async fn raw(
    client: &kube::Client,
    method: &str,
    path: &str,
    ct: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", ct)
        .body(body.as_bytes().to_vec())
        .expect("request");
    let resp = client
        .send(req.map(kube::client::Body::from))
        .await
        .expect("send");
    let code = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    (
        code,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    )
}

#[tokio::test]
async fn time_and_micro_time_fields_take_their_exact_formats() {
    let (server, client) = api_server().await;
    let leases = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    let json = "application/json";
    let lease = |name: &str, renew: &str| {
        format!(
            r#"{{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {{"name": "{name}"}}, "spec": {{"renewTime": "{renew}"}}}}"#
        )
    };
    // Nine fractional digits, three, or none: a MicroTime refuses them as
    // the real decoder does (400 on create).
    for (i, bad) in [
        "2026-01-01T00:00:00.123456789Z",
        "2026-01-01T00:00:00.123Z",
        "2026-01-01T00:00:00Z",
    ]
    .iter()
    .enumerate()
    {
        let (code, st) = raw(
            &client,
            "POST",
            leases,
            json,
            &lease(&format!("bad{i}"), bad),
        )
        .await;
        assert_eq!(code, 400, "{bad}: {st}");
        let msg = st["message"].as_str().unwrap_or("");
        assert!(
            msg.starts_with("Lease in version \"v1\" cannot be handled as a Lease: parsing time")
                && msg.contains("2006-01-02T15:04:05.000000Z07:00"),
            "{msg}"
        );
    }
    let (code, created) = raw(
        &client,
        "POST",
        leases,
        json,
        &lease("l", "2026-01-01T02:00:00.123456+02:00"),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(
        created["spec"]["renewTime"], "2026-01-01T00:00:00.123456Z",
        "stored in UTC"
    );
    // A merge patch with nine digits: 422 on `patch`, as kube-apiserver
    // answers the process kubelet's old renewals.
    let (code, st) = raw(
        &client,
        "PATCH",
        &format!("{leases}/l"),
        "application/merge-patch+json",
        r#"{"spec": {"renewTime": "2026-01-01T00:00:01.123456789Z"}}"#,
    )
    .await;
    assert_eq!(
        (code, st["reason"].as_str()),
        (422, Some("Invalid")),
        "{st}"
    );
    assert!(
        st["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("Lease.coordination.k8s.io \"\" is invalid: patch: Invalid value:"),
        "{st}"
    );
    // A Time takes RFC 3339; a fraction is accepted and dropped (Go's
    // parser), anything else is refused.
    let cms = "/api/v1/namespaces/default/configmaps";
    let (code, st) = raw(
        &client,
        "POST",
        cms,
        json,
        r#"{"metadata": {"name": "c", "deletionTimestamp": "tomorrow"}}"#,
    )
    .await;
    assert_eq!(code, 400, "{st}");
    let ev = r#"{"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p"},
        "firstTimestamp": "2026-01-01T00:00:00.5Z", "eventTime": "2026-01-01T00:00:00.500000Z"}"#;
    let (code, ev) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/events",
        json,
        ev,
    )
    .await;
    assert_eq!(code, 201, "{ev}");
    assert_eq!(ev["firstTimestamp"], "2026-01-01T00:00:00Z");
    assert_eq!(ev["eventTime"], "2026-01-01T00:00:00.500000Z");
    server.shutdown().await;
}

#[tokio::test]
async fn leases_and_events_round_trip() {
    let (server, client) = api_server().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let l: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "node-1"},
        "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40, "renewTime": "2026-01-01T00:00:00.000000Z"},
    }))
    .expect("lease");
    let created = leases
        .create(&PostParams::default(), &l)
        .await
        .expect("create");
    let mut upd = created.clone();
    upd.spec.as_mut().expect("spec").holder_identity = Some("node-2".into());
    leases
        .replace("node-1", &PostParams::default(), &upd)
        .await
        .expect("renew");
    let err = leases
        .replace("node-1", &PostParams::default(), &created)
        .await
        .expect_err("stale lease");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409),
        "leader election relies on 409"
    );

    // Events written through events.k8s.io are visible as core events
    // (kubectl describe reads those) and the other way round.
    let new_events: Api<k8s_openapi::api::events::v1::Event> =
        Api::default_namespaced(client.clone());
    let ev: k8s_openapi::api::events::v1::Event = serde_json::from_value(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e1"},
        "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "hostmesh.dev/operator",
        "reportingInstance": "op-1", "action": "Reconcile", "reason": "Created", "type": "Normal",
        "note": "created host pods", "regarding": {"kind": "World", "name": "w", "namespace": "default", "uid": "u1"},
    }))
    .expect("event");
    new_events
        .create(&PostParams::default(), &ev)
        .await
        .expect("create event");
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::default_namespaced(client.clone());
    let list = core
        .list(&ListParams::default().fields("involvedObject.name=w"))
        .await
        .expect("core list");
    assert_eq!(list.items.len(), 1);
    let e = &list.items[0];
    assert_eq!(e.message.as_deref(), Some("created host pods"));
    assert_eq!(e.involved_object.kind.as_deref(), Some("World"));
    let back = new_events.get("e1").await.expect("get new");
    assert_eq!(back.note.as_deref(), Some("created host pods"));
    assert_eq!(back.name_any(), "e1");
    server.shutdown().await;
}
