//! Discovery of what clients probe, as a real kube-apiserver serves it:
//! componentstatuses (get and list only, with the deprecation warning).

use hostmesh_testkit::cluster::api_server;
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
