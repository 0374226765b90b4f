//! PodSecurity admission of the embedded API server through kube-rs: a
//! namespace labelled `enforce: restricted` refuses a non-compliant pod
//! (403, the real message, by create and by server-side apply) and admits a
//! compliant one; a `warn` label admits with a `Warning` header.

use hostmesh_testkit::cluster::api_server;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("valid object")
}

async fn namespace(client: &Client, name: &str, labels: Value) {
    let api: Api<Namespace> = Api::all(client.clone());
    api.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": name, "labels": labels}})),
    )
    .await
    .expect("create namespace");
}

fn plain_pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    })
}

/// What the restricted standard asks of a pod.
fn restricted_pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "image": "busybox", "securityContext": {
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}],
        },
    })
}

const RESTRICTED_MESSAGE: &str = r#"violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")"#;

fn status_of(r: Result<Pod, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn enforce_restricted_refuses_a_non_compliant_pod_and_admits_a_compliant_one() {
    let (_server, client) = api_server().await;
    namespace(
        &client,
        "locked",
        json!({"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "locked");

    let s = status_of(
        pods.create(&PostParams::default(), &obj(plain_pod("loose")))
            .await,
    );
    assert_eq!(s.code, 403);
    assert_eq!(s.reason, "Forbidden");
    assert_eq!(
        s.message,
        format!("pods \"loose\" is forbidden: {RESTRICTED_MESSAGE}")
    );
    // Server-side apply creating the pod is judged the same way.
    let s = status_of(
        pods.patch(
            "applied",
            &PatchParams::apply("psa-test"),
            &Patch::Apply(plain_pod("applied")),
        )
        .await,
    );
    assert_eq!(s.code, 403);
    assert_eq!(
        s.message,
        format!("pods \"applied\" is forbidden: {RESTRICTED_MESSAGE}")
    );
    assert!(pods.get_opt("loose").await.expect("get").is_none());

    // The compliant pod is admitted, with the ServiceAccount volume that
    // admission adds (a projected volume, allowed by restricted).
    let created = pods
        .create(&PostParams::default(), &obj(restricted_pod("tight")))
        .await
        .expect("a restricted pod is admitted");
    let vols = created.spec.expect("spec").volumes.unwrap_or_default();
    assert!(vols.iter().any(|v| v.projected.is_some()), "{vols:?}");

    // A host namespace is refused even with everything else right.
    let mut host = restricted_pod("host");
    host["spec"]["hostNetwork"] = json!(true);
    let s = status_of(pods.create(&PostParams::default(), &obj(host)).await);
    assert_eq!(
        s.message,
        r#"pods "host" is forbidden: violates PodSecurity "restricted:latest": host namespaces (hostNetwork=true)"#
    );

    // Unlabelled namespaces admit anything.
    let open: Api<Pod> = Api::namespaced(client.clone(), "default");
    open.create(&PostParams::default(), &obj(plain_pod("loose")))
        .await
        .expect("no policy, no refusal");
}

#[tokio::test]
async fn warn_admits_with_a_warning_header() {
    let (_server, client) = api_server().await;
    namespace(
        &client,
        "warned",
        json!({"pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/warn": "restricted"}),
    )
    .await;
    let post = |body: Value| {
        http::Request::post("/api/v1/namespaces/warned/pods")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(kube::client::Body::from(
                serde_json::to_vec(&body).expect("json"),
            ))
            .expect("request")
    };
    let resp = client.send(post(plain_pod("loose"))).await.expect("send");
    assert_eq!(resp.status(), 201);
    let warnings: Vec<String> = resp
        .headers()
        .get_all(http::header::WARNING)
        .iter()
        .map(|v| v.to_str().expect("ascii").to_string())
        .collect();
    let text = RESTRICTED_MESSAGE.replacen("violates", "would violate", 1);
    let want = format!("299 - \"{}\"", text.replace('"', "\\\""));
    assert_eq!(warnings, vec![want]);

    let resp = client
        .send(post(restricted_pod("tight")))
        .await
        .expect("send");
    assert_eq!(resp.status(), 201);
    assert!(resp.headers().get(http::header::WARNING).is_none());

    // Baseline is still enforced.
    let mut privileged = plain_pod("priv");
    privileged["spec"]["containers"][0]["securityContext"] = json!({"privileged": true});
    let resp = client.send(post(privileged)).await.expect("send");
    assert_eq!(resp.status(), 403);
}
