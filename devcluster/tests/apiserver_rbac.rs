//! Service account tokens and RBAC of the embedded API server, through
//! kube-rs with a token minted by TokenRequest: who a token is, what RBAC
//! allows and denies (403 with the real message), RoleBinding namespace
//! scoping, resourceNames, subresources, grants taking effect at once,
//! access reviews, expired/forged/orphaned tokens (401), the ServiceAccount
//! admission of pods and the `kube-root-ca.crt` ConfigMap.

use std::time::Duration;

use hostmesh_devcluster::apiserver::{ApiServerConfig, ApiServerHandle};
use hostmesh_testkit::cluster::{api_server, api_server_with};
use hostmesh_testkit::eventually_async;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, Discovery};
use serde_json::{Value, json};

fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("valid object")
}

async fn create<T>(client: &Client, ns: Option<&str>, v: Value) -> T
where
    T: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let api: Api<T> = Api::namespaced(client.clone(), ns.unwrap_or("default"));
    api.create(&PostParams::default(), &obj(v))
        .await
        .expect("create")
}

async fn namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    api.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": name}})),
    )
    .await
    .expect("create namespace");
}

async fn service_account(client: &Client, ns: &str, name: &str) -> ServiceAccount {
    create(client, Some(ns), json!({"metadata": {"name": name}})).await
}

/// A token for `ns/name` through TokenRequest.
async fn mint(client: &Client, ns: &str, name: &str, seconds: i64) -> TokenRequest {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let req: TokenRequest = obj(json!({"spec": {"audiences": [], "expirationSeconds": seconds}}));
    api.create_token_request(name, &PostParams::default(), &req)
        .await
        .expect("token request")
}

async fn token(client: &Client, ns: &str, name: &str) -> String {
    mint(client, ns, name, 3600)
        .await
        .status
        .expect("status")
        .token
}

/// A kube-rs client of the server that sends `token`.
fn client_with(server: &ApiServerHandle, token: &str) -> Client {
    let yaml = server.kubeconfig_yaml().replace(server.token(), token);
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).expect("kubeconfig");
    let cfg = kube::Config::try_from(kc).expect("config");
    Client::try_from(cfg).expect("client")
}

fn api_error(r: Result<impl std::fmt::Debug, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn whoami(client: &Client) -> Value {
    let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let req = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    client.request::<Value>(req).await.expect("whoami")
}

async fn can_i(client: &Client, attrs: Value) -> bool {
    let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": attrs});
    let req = http::Request::post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    let r: Value = client.request(req).await.expect("access review");
    r["status"]["allowed"] == json!(true)
}

async fn rbac(client: &Client, ns: Option<&str>, v: Value) {
    let kind = v["kind"].as_str().unwrap().to_string();
    let plural = match kind.as_str() {
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        "ClusterRole" => "clusterroles",
        _ => "clusterrolebindings",
    };
    let path = match ns {
        Some(ns) => format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/{plural}"),
        None => format!("/apis/rbac.authorization.k8s.io/v1/{plural}"),
    };
    let req = http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&v).unwrap())
        .unwrap();
    let _: Value = client.request(req).await.expect("create RBAC object");
}

fn binding(kind: &str, name: &str, role_kind: &str, role: &str, subjects: Value) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": subjects,
    })
}

fn role(kind: &str, name: &str, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": {"name": name}, "rules": rules})
}

#[tokio::test]
async fn a_service_account_token_is_the_service_account_and_rbac_decides() {
    let (server, admin) = api_server().await;
    namespace(&admin, "team-a").await;
    namespace(&admin, "team-b").await;
    let sa = service_account(&admin, "team-a", "op").await;
    let tr = mint(&admin, "team-a", "op", 3600).await;
    assert_eq!(
        tr.spec.audiences,
        vec!["https://kubernetes.default.svc.cluster.local".to_string()]
    );
    assert_eq!(tr.spec.expiration_seconds, Some(3600));
    let status = tr.status.expect("status");
    let left =
        status.expiration_timestamp.0.as_second() - k8s_openapi::jiff::Timestamp::now().as_second();
    assert!((3500..=3700).contains(&left), "expires in {left} s");
    let op = client_with(&server, &status.token);

    // Who the token is.
    let me = whoami(&op).await;
    assert_eq!(
        me["status"]["userInfo"]["username"],
        "system:serviceaccount:team-a:op"
    );
    assert_eq!(
        me["status"]["userInfo"]["uid"],
        json!(sa.metadata.uid.unwrap())
    );
    assert_eq!(
        me["status"]["userInfo"]["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:team-a",
            "system:authenticated"
        ])
    );

    // Discovery and health need no grant (system:discovery).
    op.apiserver_version().await.expect("version");
    Discovery::new(op.clone())
        .run()
        .await
        .expect("discovery as the service account");

    // Nothing else without a binding: 403 with the real message and Status.
    let pods_a: Api<Pod> = Api::namespaced(op.clone(), "team-a");
    let s = api_error(pods_a.list(&ListParams::default()).await);
    assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        s.message,
        r#"pods is forbidden: User "system:serviceaccount:team-a:op" cannot list resource "pods" in API group "" in the namespace "team-a""#
    );
    assert_eq!(s.details.as_ref().map(|d| d.kind.as_str()), Some("pods"));
    let nodes: Api<Node> = Api::all(op.clone());
    let s = api_error(nodes.delete("n1", &DeleteParams::default()).await);
    assert_eq!(
        s.message,
        r#"nodes "n1" is forbidden: User "system:serviceaccount:team-a:op" cannot delete resource "nodes" in API group "" at the cluster scope"#
    );

    // A RoleBinding in team-a to a ClusterRole grants in team-a only.
    rbac(
        &admin,
        None,
        role(
            "ClusterRole",
            "pod-reader",
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]),
        ),
    )
    .await;
    rbac(
        &admin,
        Some("team-a"),
        binding(
            "RoleBinding",
            "op-reads-pods",
            "ClusterRole",
            "pod-reader",
            json!([{"kind": "ServiceAccount", "name": "op", "namespace": "team-a"}]),
        ),
    )
    .await;
    assert!(
        pods_a.list(&ListParams::default()).await.is_ok(),
        "granted at once"
    );
    let pods_b: Api<Pod> = Api::namespaced(op.clone(), "team-b");
    assert_eq!(
        api_error(pods_b.list(&ListParams::default()).await).code,
        403
    );
    let all_pods: Api<Pod> = Api::all(op.clone());
    let s = api_error(all_pods.list(&ListParams::default()).await);
    assert!(s.message.ends_with("at the cluster scope"), "{}", s.message);
    // Reading is not writing.
    let pod: Pod = obj(
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
    );
    let s = api_error(pods_a.create(&PostParams::default(), &pod).await);
    assert!(
        s.message.contains("cannot create resource \"pods\""),
        "{}",
        s.message
    );

    // Access reviews answer for the token's user.
    let attrs = |verb: &str, ns: &str| json!({"resourceAttributes": {"verb": verb, "resource": "pods", "namespace": ns}});
    assert!(can_i(&op, attrs("list", "team-a")).await);
    assert!(!can_i(&op, attrs("list", "team-b")).await);
    assert!(!can_i(&op, attrs("delete", "team-a")).await);
    assert!(can_i(&admin, attrs("delete", "team-b")).await);

    // Revoking takes effect with the next request.
    let rbs: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        Api::namespaced(admin.clone(), "team-a");
    rbs.delete("op-reads-pods", &DeleteParams::default())
        .await
        .expect("delete binding");
    assert_eq!(
        api_error(pods_a.list(&ListParams::default()).await).code,
        403
    );

    // A ClusterRoleBinding to a group of service accounts grants cluster-wide.
    rbac(
        &admin,
        None,
        role(
            "ClusterRole",
            "node-reader",
            json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]),
        ),
    )
    .await;
    rbac(
        &admin,
        None,
        binding(
            "ClusterRoleBinding",
            "team-a-nodes",
            "ClusterRole",
            "node-reader",
            json!([{"kind": "Group", "name": "system:serviceaccounts:team-a", "apiGroup": "rbac.authorization.k8s.io"}]),
        ),
    )
    .await;
    nodes
        .list(&ListParams::default())
        .await
        .expect("list nodes");
    assert_eq!(
        api_error(nodes.delete("n1", &DeleteParams::default()).await).code,
        403
    );
    server.shutdown().await;
}

#[tokio::test]
async fn resource_names_and_subresources_are_matched_exactly() {
    let (server, admin) = api_server().await;
    namespace(&admin, "rn").await;
    service_account(&admin, "rn", "op").await;
    for name in ["allowed", "other"] {
        let _: ConfigMap = create(
            &admin,
            Some("rn"),
            json!({"metadata": {"name": name}, "data": {"k": "v"}}),
        )
        .await;
    }
    let _: Pod = create(
        &admin,
        Some("rn"),
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
    )
    .await;
    rbac(
        &admin,
        Some("rn"),
        role(
            "Role",
            "narrow",
            json!([
                {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["allowed"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
            ]),
        ),
    )
    .await;
    rbac(
        &admin,
        Some("rn"),
        binding(
            "RoleBinding",
            "narrow",
            "Role",
            "narrow",
            json!([{"kind": "ServiceAccount", "name": "op", "namespace": "rn"}]),
        ),
    )
    .await;
    let op = client_with(&server, &token(&admin, "rn", "op").await);
    let cms: Api<ConfigMap> = Api::namespaced(op.clone(), "rn");
    cms.get("allowed").await.expect("the named ConfigMap");
    let s = api_error(cms.get("other").await);
    assert_eq!(
        s.message,
        r#"configmaps "other" is forbidden: User "system:serviceaccount:rn:op" cannot get resource "configmaps" in API group "" in the namespace "rn""#
    );
    // A list names nothing, unless it selects the one allowed name.
    assert_eq!(api_error(cms.list(&ListParams::default()).await).code, 403);
    let one = cms
        .list(&ListParams::default().fields("metadata.name=allowed"))
        .await
        .expect("list of the allowed name");
    assert_eq!(one.items.len(), 1);

    // pods/status is granted, pods is not.
    let pods: Api<Pod> = Api::namespaced(op.clone(), "rn");
    pods.get_status("p").await.expect("pods/status");
    let s = api_error(pods.get("p").await);
    assert!(
        s.message
            .contains(r#"cannot get resource "pods" in API group """#),
        "{}",
        s.message
    );
    // serviceaccounts/token is granted, serviceaccounts is not.
    assert!(
        mint(&op, "rn", "op", 600).await.status.is_some(),
        "a token through the token subresource"
    );
    let sas: Api<ServiceAccount> = Api::namespaced(op.clone(), "rn");
    let s = api_error(sas.get("op").await);
    assert_eq!(s.code, 403);
    server.shutdown().await;
}

#[tokio::test]
async fn expired_forged_and_orphaned_tokens_get_401() {
    let config = ApiServerConfig {
        max_token_expiration: Some(Duration::from_secs(1)),
        ..ApiServerConfig::default()
    };
    let (server, admin) = api_server_with(config).await;
    service_account(&admin, "default", "short").await;
    // Asking for 10 minutes gets the server's maximum.
    let tr = mint(&admin, "default", "short", 600).await;
    assert_eq!(tr.spec.expiration_seconds, Some(1));
    let short = client_with(&server, &tr.status.expect("status").token);
    let cms: Api<ConfigMap> = Api::namespaced(short, "default");
    eventually_async("the token to expire", async || {
        let listed = cms.list(&ListParams::default()).await;
        matches!(listed, Err(kube::Error::Api(s)) if s.code == 401).then_some(())
    })
    .await;

    let (other_server, other_admin) = api_server().await;
    service_account(&other_admin, "default", "short").await;
    let foreign = token(&other_admin, "default", "short").await;
    other_server.shutdown().await;

    let (server2, admin2) = api_server().await;
    let sa = service_account(&admin2, "default", "op").await;
    let good = token(&admin2, "default", "op").await;
    let mut forged = good.clone();
    let last = forged.pop().expect("non-empty");
    forged.push(if last == 'A' { 'B' } else { 'A' });
    let ok: Api<ConfigMap> = Api::namespaced(client_with(&server2, &good), "default");
    assert_eq!(api_error(ok.list(&ListParams::default()).await).code, 403);
    for (what, tok) in [
        ("forged", forged.as_str()),
        ("another server's", foreign.as_str()),
        ("junk", "not-a-token"),
    ] {
        let api: Api<ConfigMap> = Api::namespaced(client_with(&server2, tok), "default");
        let s = api_error(api.list(&ListParams::default()).await);
        assert_eq!((s.code, s.reason.as_str()), (401, "Unauthorized"), "{what}");
    }
    // A deleted and recreated ServiceAccount has a new uid: old tokens die.
    let sas: Api<ServiceAccount> = Api::namespaced(admin2.clone(), "default");
    sas.delete("op", &DeleteParams::default())
        .await
        .expect("delete");
    let again = service_account(&admin2, "default", "op").await;
    assert_ne!(again.metadata.uid, sa.metadata.uid);
    assert_eq!(api_error(ok.list(&ListParams::default()).await).code, 401);
    // Too short a request is invalid.
    let api: Api<ServiceAccount> = Api::namespaced(admin2.clone(), "default");
    let req: TokenRequest = obj(json!({"spec": {"audiences": [], "expirationSeconds": 10}}));
    let s = api_error(
        api.create_token_request("op", &PostParams::default(), &req)
            .await,
    );
    assert_eq!(s.code, 422);
    assert!(s.message.contains("less than 10 minutes"), "{}", s.message);
    let s = api_error(
        api.create_token_request(
            "nobody",
            &PostParams::default(),
            &obj(json!({"spec": {"audiences": []}})),
        )
        .await,
    );
    assert_eq!(s.code, 404);
    server.shutdown().await;
    server2.shutdown().await;
}

#[tokio::test]
async fn tokens_survive_a_restart_with_a_data_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ApiServerConfig {
        data_dir: Some(dir.path().to_path_buf()),
        ..ApiServerConfig::default()
    };
    let (server, admin) = api_server_with(config.clone()).await;
    service_account(&admin, "default", "op").await;
    let tok = token(&admin, "default", "op").await;
    let key = std::fs::read_to_string(dir.path().join("sa-signing-key")).expect("key file");
    assert!(!key.is_empty());
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(dir.path().join("sa-signing-key"))
        .expect("key file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    server.shutdown().await;
    let (server, _admin) = api_server_with(config.clone()).await;
    let me = whoami(&client_with(&server, &tok)).await;
    assert_eq!(
        me["status"]["userInfo"]["username"],
        "system:serviceaccount:default:op"
    );
    server.shutdown().await;
    // A data directory from before service account tokens (no key file)
    // gets a new key; the admin kubeconfig keeps working.
    std::fs::remove_file(dir.path().join("sa-signing-key")).expect("remove key");
    let (server, admin) = api_server_with(config).await;
    assert!(dir.path().join("sa-signing-key").exists());
    let cms: Api<ConfigMap> = Api::namespaced(client_with(&server, &tok), "default");
    let s = api_error(cms.list(&ListParams::default()).await);
    assert_eq!(s.code, 401, "a token signed with the old key");
    let fresh = token(&admin, "default", "op").await;
    let me = whoami(&client_with(&server, &fresh)).await;
    assert_eq!(
        me["status"]["userInfo"]["username"],
        "system:serviceaccount:default:op"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn pods_get_api_credentials_and_namespaces_the_root_ca() {
    let (server, admin) = api_server().await;
    namespace(&admin, "adm").await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "adm");
    let ca = cms.get("kube-root-ca.crt").await.expect("kube-root-ca.crt");
    assert_eq!(
        ca.data
            .unwrap_or_default()
            .get("ca.crt")
            .map(String::as_str),
        Some(server.ca_pem())
    );
    let _: ConfigMap = Api::namespaced(admin.clone(), "kube-system")
        .get("kube-root-ca.crt")
        .await
        .expect("in the standard namespaces too");

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "adm");
    let p: Pod = create(
        &admin,
        Some("adm"),
        json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [{"name": "init", "image": "x"}],
            "containers": [{"name": "c", "image": "x"}]}}),
    )
    .await;
    let spec = p.spec.expect("spec");
    let vol = spec.volumes.unwrap_or_default();
    assert_eq!(vol.len(), 1);
    assert!(
        vol[0].name.starts_with("kube-api-access-"),
        "{:?}",
        vol[0].name
    );
    assert!(vol[0].projected.is_some());
    for c in spec
        .init_containers
        .unwrap_or_default()
        .iter()
        .chain(&spec.containers)
    {
        let m = &c.volume_mounts.clone().unwrap_or_default()[0];
        assert_eq!(
            (m.name.as_str(), m.mount_path.as_str(), m.read_only),
            (
                vol[0].name.as_str(),
                "/var/run/secrets/kubernetes.io/serviceaccount",
                Some(true)
            )
        );
    }
    // Opting out on the ServiceAccount.
    let _: ServiceAccount = create(
        &admin,
        Some("adm"),
        json!({"metadata": {"name": "quiet"}, "automountServiceAccountToken": false}),
    )
    .await;
    let p: Pod = create(
        &admin,
        Some("adm"),
        json!({"metadata": {"name": "q"}, "spec": {"serviceAccountName": "quiet", "containers": [{"name": "c", "image": "x"}]}}),
    )
    .await;
    assert!(p.spec.expect("spec").volumes.unwrap_or_default().is_empty());
    // A missing ServiceAccount refuses the pod.
    let missing: Pod = obj(
        json!({"metadata": {"name": "m"}, "spec": {"serviceAccountName": "ghost", "containers": [{"name": "c", "image": "x"}]}}),
    );
    let s = api_error(pods.create(&PostParams::default(), &missing).await);
    assert_eq!(s.code, 403);
    assert!(
        s.message.contains(
            r#"error looking up service account adm/ghost: serviceaccount "ghost" not found"#
        ),
        "{}",
        s.message
    );
    // A token bound to a pod dies with the pod.
    let api: Api<ServiceAccount> = Api::namespaced(admin.clone(), "adm");
    let uid = pods
        .get("p")
        .await
        .expect("pod")
        .metadata
        .uid
        .unwrap_or_default();
    let req: TokenRequest = obj(json!({"spec": {"audiences": [], "expirationSeconds": 3607,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": uid}}}));
    let tr = api
        .create_token_request("default", &PostParams::default(), &req)
        .await
        .expect("bound token");
    let bound = client_with(&server, &tr.status.expect("status").token);
    assert_eq!(
        whoami(&bound).await["status"]["userInfo"]["username"],
        "system:serviceaccount:adm:default"
    );
    pods.delete("p", &DeleteParams::default())
        .await
        .expect("delete pod");
    eventually_async("the pod to go", async || {
        matches!(pods.get_opt("p").await, Ok(None)).then_some(())
    })
    .await;
    let cms_bound: Api<ConfigMap> = Api::namespaced(bound, "adm");
    assert_eq!(
        api_error(cms_bound.list(&ListParams::default()).await).code,
        401
    );
    server.shutdown().await;
}

#[tokio::test]
async fn default_cluster_roles_and_bindings_with_aggregation() {
    let (server, admin) = api_server().await;
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(admin.clone());
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(admin.clone());
    for name in [
        "cluster-admin",
        "admin",
        "edit",
        "view",
        "system:discovery",
        "system:basic-user",
        "system:public-info-viewer",
    ] {
        let r = roles
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            r.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("kubernetes.io/bootstrapping"))
                .map(String::as_str),
            Some("rbac-defaults"),
            "{name}"
        );
    }
    let groups = |b: k8s_openapi::api::rbac::v1::ClusterRoleBinding| -> Vec<String> {
        b.subjects
            .unwrap_or_default()
            .into_iter()
            .map(|s| s.name)
            .collect()
    };
    assert_eq!(
        groups(bindings.get("cluster-admin").await.expect("binding")),
        ["system:masters"]
    );
    assert_eq!(
        groups(bindings.get("system:discovery").await.expect("binding")),
        ["system:authenticated"]
    );
    assert_eq!(
        groups(
            bindings
                .get("system:public-info-viewer")
                .await
                .expect("binding")
        ),
        ["system:authenticated", "system:unauthenticated"]
    );
    let edit = roles.get("edit").await.expect("edit");
    assert_eq!(
        edit.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("rbac.authorization.k8s.io/aggregate-to-admin"))
            .map(String::as_str),
        Some("true")
    );
    assert!(edit.aggregation_rule.is_some());

    // A service account bound to `view` in one namespace reads workloads
    // there and writes nothing; bound to `edit` it writes configmaps.
    service_account(&admin, "default", "viewer").await;
    service_account(&admin, "default", "editor").await;
    for (sa, role) in [("viewer", "view"), ("editor", "edit")] {
        rbac(&admin, Some("default"), json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": sa},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": "default"}],
        })).await;
    }
    let viewer = client_with(&server, &token(&admin, "default", "viewer").await);
    let editor = client_with(&server, &token(&admin, "default", "editor").await);
    let deploy = |verb: &str| json!({"resourceAttributes": {"namespace": "default", "verb": verb, "group": "apps", "resource": "deployments"}});
    assert!(can_i(&viewer, deploy("list")).await);
    assert!(!can_i(&viewer, deploy("create")).await);
    assert!(can_i(&editor, deploy("create")).await);
    let cms: Api<ConfigMap> = Api::default_namespaced(editor.clone());
    cms.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "by-editor"}})),
    )
    .await
    .expect("edit may create configmaps");
    let status = api_error(
        Api::<ConfigMap>::default_namespaced(viewer.clone())
            .create(
                &PostParams::default(),
                &obj(json!({"metadata": {"name": "by-viewer"}})),
            )
            .await,
    );
    assert_eq!(status.code, 403);
    assert!(!can_i(&editor, json!({"resourceAttributes": {"namespace": "default", "verb": "create", "group": "rbac.authorization.k8s.io", "resource": "roles"}})).await);

    // A ClusterRole labelled aggregate-to-view is folded into view (and so
    // into edit and admin), as the aggregation controller does.
    rbac(&admin, None, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "widgets-view", "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
        "rules": [{"apiGroups": ["example.dev"], "resources": ["widgets"], "verbs": ["get", "list", "watch"]}],
    })).await;
    eventually_async("view aggregates widgets-view", async || {
        let widgets = json!({"resourceAttributes": {"namespace": "default", "verb": "list", "group": "example.dev", "resource": "widgets"}});
        (can_i(&viewer, widgets.clone()).await && can_i(&editor, widgets).await).then_some(())
    })
    .await;
    server.shutdown().await;
}

#[tokio::test]
async fn token_review_answers_for_service_account_tokens() {
    let (server, admin) = api_server().await;
    let sa = service_account(&admin, "default", "reviewed").await;
    let review = |token: String, audiences: Vec<&str>| {
        let admin = admin.clone();
        let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": audiences}});
        async move {
            let req = http::Request::post("/apis/authentication.k8s.io/v1/tokenreviews")
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&body).unwrap())
                .unwrap();
            admin.request::<Value>(req).await.expect("token review")
        }
    };
    let r = review(token(&admin, "default", "reviewed").await, vec![]).await;
    assert_eq!(r["kind"], "TokenReview");
    assert_eq!(r["status"]["authenticated"], true, "{r}");
    assert_eq!(
        r["status"]["user"]["username"],
        "system:serviceaccount:default:reviewed"
    );
    assert_eq!(
        r["status"]["user"]["uid"],
        json!(sa.metadata.uid.expect("uid"))
    );
    assert!(
        r["status"]["user"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:serviceaccounts:default"))
    );
    assert_eq!(
        r["status"]["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );

    // A token for another audience is valid for that audience only.
    let api: Api<ServiceAccount> = Api::default_namespaced(admin.clone());
    let tr: TokenRequest = obj(json!({"spec": {"audiences": ["vault"], "expirationSeconds": 600}}));
    let vault = api
        .create_token_request("reviewed", &PostParams::default(), &tr)
        .await
        .expect("token request")
        .status
        .expect("status")
        .token;
    let r = review(vault.clone(), vec!["vault"]).await;
    assert_eq!(
        (
            r["status"]["authenticated"].clone(),
            r["status"]["audiences"].clone()
        ),
        (json!(true), json!(["vault"])),
        "{r}"
    );
    let r = review(vault, vec![]).await;
    assert!(r["status"]["authenticated"] != json!(true), "{r}");
    let r = review("not-a-token".into(), vec![]).await;
    assert!(r["status"]["authenticated"] != json!(true));
    assert!(
        r["status"]["error"]
            .as_str()
            .unwrap_or("")
            .starts_with("[invalid bearer token"),
        "{r}"
    );

    // Creating TokenReviews takes RBAC (system:auth-delegator grants it).
    let viewer = client_with(&server, &token(&admin, "default", "reviewed").await);
    let req = http::Request::post("/apis/authentication.k8s.io/v1/tokenreviews")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&json!({"spec": {"token": "x"}})).unwrap())
        .unwrap();
    let err = viewer.request::<Value>(req).await.expect_err("forbidden");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403),
        "{err:?}"
    );
    server.shutdown().await;
}
