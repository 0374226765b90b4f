//! `certificates.k8s.io/v1` CertificateSigningRequests against the real
//! `kubectl` and kube-rs: the real server's validation errors, the
//! requester recorded in the spec, `kubectl certificate approve|deny`, the
//! cluster CA signing approved `kubernetes.io/kube-apiserver-client` and
//! `...-client-kubelet` requests (the certificate then authenticates as its
//! CN and Os), signer refusals as `Failed` conditions, kubelet client
//! requests approved automatically, and approval authorized by RBAC.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use hostmesh_devcluster::apiserver::ApiServerHandle;
use hostmesh_testkit::cluster::api_server_with_kubeconfig;
use hostmesh_testkit::eventually_ok;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

struct Env {
    server: ApiServerHandle,
    client: Client,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

impl Env {
    async fn start() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        let (server, client) = api_server_with_kubeconfig(&kubeconfig).await;
        Env {
            server,
            client,
            kubeconfig,
            dir,
        }
    }

    fn write(&self, name: &str, body: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, body).expect("write");
        p
    }

    /// Runs kubectl; returns (success, stdout, stderr).
    async fn kubectl(&self, kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
        let out = tokio::time::timeout(
            Duration::from_secs(120),
            tokio::process::Command::new("kubectl")
                .args(args)
                .env("KUBECONFIG", kubeconfig)
                .env_remove("KUBERNETES_SERVICE_HOST")
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("kubectl finished in time")
        .expect("kubectl runs (install kubectl; .ci/run does)");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.kubectl(&self.kubeconfig, args).await;
        assert!(ok, "kubectl {args:?} failed:\n{out}\n{err}");
        out
    }

    fn csrs(&self) -> Api<CertificateSigningRequest> {
        Api::all(self.client.clone())
    }

    /// Creates a request named `name` for a new key; returns the key (PEM).
    async fn request(
        &self,
        name: &str,
        cn: &str,
        orgs: &[&str],
        signer: &str,
        usages: &[&str],
    ) -> String {
        let (csr, key) = signing_request(cn, orgs);
        let obj: CertificateSigningRequest = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "request": base64::engine::general_purpose::STANDARD.encode(csr),
                "signerName": signer,
                "usages": usages,
                "expirationSeconds": 3600,
            },
        }))
        .expect("csr object");
        self.csrs()
            .create(&PostParams::default(), &obj)
            .await
            .expect("create csr");
        key
    }

    /// The request once `pred` holds for it.
    async fn wait(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&CertificateSigningRequest) -> bool,
    ) -> CertificateSigningRequest {
        let api = self.csrs();
        eventually_ok(&format!("csr {name}: {what}"), async || {
            let c = api.get(name).await.map_err(|e| e.to_string())?;
            if pred(&c) {
                Ok(c)
            } else {
                Err(format!("{:?}", c.status))
            }
        })
        .await
    }
}

/// A PEM certificate signing request for `cn` in `orgs` (at most two, as
/// rcgen writes them) and its key.
fn signing_request(cn: &str, orgs: &[&str]) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    let types = [
        rcgen::DnType::OrganizationName,
        rcgen::DnType::CustomDnType(vec![2, 5, 4, 10]),
    ];
    for (o, t) in orgs.iter().zip(types) {
        p.distinguished_name.push(t, *o);
    }
    let csr = p.serialize_request(&key).expect("csr").pem().expect("pem");
    (csr, key.serialize_pem())
}

fn condition<'a>(
    c: &'a CertificateSigningRequest,
    type_: &str,
) -> Option<&'a k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition> {
    c.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|x| x.type_ == type_)
}

fn certificate(c: &CertificateSigningRequest) -> Option<String> {
    let b = c.status.as_ref()?.certificate.as_ref()?;
    Some(String::from_utf8(b.0.clone()).expect("PEM"))
}

fn api_error(r: Result<impl std::fmt::Debug, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn invalid_requests_get_the_real_servers_errors() {
    let env = Env::start().await;
    let empty: CertificateSigningRequest =
        serde_json::from_value(json!({"metadata": {"name": "c2"}, "spec": {"request": ""}}))
            .expect("object");
    let s = api_error(env.csrs().create(&PostParams::default(), &empty).await);
    assert_eq!(s.code, 422);
    assert_eq!(
        s.message,
        "CertificateSigningRequest.certificates.k8s.io \"c2\" is invalid: [spec.request: Invalid value: []byte{}: PEM block type must be CERTIFICATE REQUEST, spec.usages: Required value, spec.signerName: Required value]"
    );
    let (csr, _) = signing_request("alice", &[]);
    let bad: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": {"name": "c4"},
        "spec": {"request": base64::engine::general_purpose::STANDARD.encode(csr),
                 "signerName": "kubernetes.io/legacy-unknown", "usages": ["client auth", "client auth"],
                 "expirationSeconds": 100},
    }))
    .expect("object");
    let s = api_error(env.csrs().create(&PostParams::default(), &bad).await);
    assert_eq!(
        s.message,
        "CertificateSigningRequest.certificates.k8s.io \"c4\" is invalid: [spec.usages[1]: Duplicate value: \"client auth\", spec.signerName: Invalid value: \"kubernetes.io/legacy-unknown\": the legacy signerName is not allowed via this API version, spec.expirationSeconds: Invalid value: 100: may not specify a duration less than 600 seconds (10 minutes)]"
    );
    env.server.shutdown().await;
}

#[tokio::test]
async fn an_approved_client_request_is_signed_and_its_certificate_authenticates() {
    let env = Env::start().await;
    let key = env
        .request(
            "alice",
            "alice",
            &["dev", "ops"],
            "kubernetes.io/kube-apiserver-client",
            &["client auth"],
        )
        .await;
    // The requester is recorded, whatever the client sent.
    let c = env.csrs().get("alice").await.expect("get");
    let spec = c.spec.clone();
    assert_eq!(spec.username.as_deref(), Some("hostmesh-admin"));
    assert_eq!(
        spec.groups,
        Some(vec![
            "system:masters".to_string(),
            "system:authenticated".into()
        ])
    );
    let table = env.ok(&["get", "csr"]).await;
    let row = table.lines().find(|l| l.starts_with("alice")).expect("row");
    for cell in [
        "kubernetes.io/kube-apiserver-client",
        "hostmesh-admin",
        "60m",
        "Pending",
    ] {
        assert!(row.contains(cell), "{cell} in {row:?}");
    }
    env.ok(&["certificate", "approve", "alice"]).await;
    let c = env
        .wait("alice", "signed", |c| certificate(c).is_some())
        .await;
    let approved = condition(&c, "Approved").expect("Approved");
    assert_eq!(
        (approved.reason.as_deref(), approved.message.as_deref()),
        (
            Some("KubectlApprove"),
            Some("This CSR was approved by kubectl certificate approve.")
        )
    );
    assert!(approved.last_update_time.is_some() && approved.last_transition_time.is_some());
    let table = env.ok(&["get", "csr", "alice"]).await;
    assert!(table.contains("Approved,Issued"), "{table}");
    // The certificate authenticates as its CN and Os.
    let cert = certificate(&c).expect("certificate");
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: alice\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: alice}}\ncurrent-context: c\n",
        env.server.url(),
        b64(env.server.ca_pem()),
        b64(&cert),
        b64(&key)
    );
    let path = env.write("alice.kubeconfig", &kubeconfig);
    let (ok, out, err) = env.kubectl(&path, &["auth", "whoami", "-o", "json"]).await;
    assert!(ok, "whoami as alice: {out}\n{err}");
    let who: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(who["status"]["userInfo"]["username"], "alice");
    assert_eq!(
        who["status"]["userInfo"]["groups"],
        json!(["dev", "ops", "system:authenticated"])
    );
    // Approved and Denied exclude each other; Approved stays.
    let mut both = c.clone();
    let mut conds = both
        .status
        .clone()
        .expect("status")
        .conditions
        .expect("conditions");
    conds.push(
        serde_json::from_value(json!({"type": "Denied", "status": "True"})).expect("condition"),
    );
    both.status.as_mut().expect("status").conditions = Some(conds);
    let put = http::Request::put(
        "/apis/certificates.k8s.io/v1/certificatesigningrequests/alice/approval",
    )
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&both).expect("json"))
    .expect("request");
    let s = api_error(env.client.request::<Value>(put).await);
    assert_eq!(
        s.message,
        "CertificateSigningRequest.certificates.k8s.io \"alice\" is invalid: status.conditions[1].type: Invalid value: \"Denied\": Approved and Denied conditions are mutually exclusive"
    );
    let (ok, _, err) = env
        .kubectl(&env.kubeconfig, &["certificate", "deny", "alice"])
        .await;
    assert!(!ok && err.contains("already Approved"), "{err}");
    env.server.shutdown().await;
}

#[tokio::test]
async fn denied_failed_foreign_and_kubelet_requests() {
    let env = Env::start().await;
    let client = "kubernetes.io/kube-apiserver-client";
    env.request("bob", "bob", &[], client, &["client auth"])
        .await;
    env.ok(&["certificate", "deny", "bob"]).await;
    // A signer refuses what it may not sign: a Failed condition says why.
    env.request("srv", "srv", &[], client, &["server auth"])
        .await;
    env.ok(&["certificate", "approve", "srv"]).await;
    let c = env
        .wait("srv", "failed", |c| condition(c, "Failed").is_some())
        .await;
    let failed = condition(&c, "Failed").expect("Failed");
    assert_eq!(
        (failed.reason.as_deref(), failed.message.as_deref()),
        (
            Some("SignerValidationFailure"),
            Some("invalid usage for client certificate: server auth")
        )
    );
    assert!(certificate(&c).is_none());
    // Another signer's request is left to that signer.
    env.request("other", "x", &[], "example.com/signer", &["client auth"])
        .await;
    env.ok(&["certificate", "approve", "other"]).await;
    // A kubelet's client request is approved and signed by itself; once
    // it is, every earlier request has been looked at.
    env.request(
        "node-n1",
        "system:node:n1",
        &["system:nodes"],
        "kubernetes.io/kube-apiserver-client-kubelet",
        &["digital signature", "client auth"],
    )
    .await;
    let n = env
        .wait("node-n1", "signed", |c| certificate(c).is_some())
        .await;
    let approved = condition(&n, "Approved").expect("auto-approved");
    assert_eq!(approved.reason.as_deref(), Some("AutoApproved"));
    for name in ["bob", "other"] {
        let c = env.csrs().get(name).await.expect("get");
        assert!(certificate(&c).is_none(), "{name} is not signed");
    }
    let bob = env.csrs().get("bob").await.expect("get");
    assert_eq!(
        condition(&bob, "Denied").and_then(|c| c.reason.as_deref()),
        Some("KubectlDeny")
    );
    // A kubelet-signer request that is no kubelet's fails validation.
    env.request(
        "fake-node",
        "alice",
        &["dev"],
        "kubernetes.io/kube-apiserver-client-kubelet",
        &["client auth"],
    )
    .await;
    env.ok(&["certificate", "approve", "fake-node"]).await;
    let c = env
        .wait("fake-node", "failed", |c| condition(c, "Failed").is_some())
        .await;
    assert_eq!(
        condition(&c, "Failed").and_then(|c| c.message.as_deref()),
        Some("subject organization is not system:nodes")
    );
    env.server.shutdown().await;
}

#[tokio::test]
async fn approving_needs_approve_on_the_signer() {
    let env = Env::start().await;
    env.request(
        "carol",
        "carol",
        &[],
        "kubernetes.io/kube-apiserver-client",
        &["client auth"],
    )
    .await;
    // A user who may update approvals but not approve for this signer.
    let kc = env.write(
        "dave.kubeconfig",
        &env.server
            .kubeconfig_with_client_cert("dave", &["reviewers"])
            .expect("client cert"),
    );
    for (kind, plural, body) in [
        (
            "ClusterRole",
            "clusterroles",
            json!({"metadata": {"name": "csr-approver"}, "rules": [
                {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests", "certificatesigningrequests/approval"], "verbs": ["get", "list", "update"]},
            ]}),
        ),
        (
            "ClusterRoleBinding",
            "clusterrolebindings",
            json!({"metadata": {"name": "csr-approver"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "csr-approver"},
                   "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "reviewers"}]}),
        ),
    ] {
        let mut body = body;
        body["apiVersion"] = json!("rbac.authorization.k8s.io/v1");
        body["kind"] = json!(kind);
        let req = http::Request::post(format!("/apis/rbac.authorization.k8s.io/v1/{plural}"))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).expect("json"))
            .expect("request");
        env.client.request::<Value>(req).await.expect("create rbac");
    }
    let (ok, _, err) = env.kubectl(&kc, &["certificate", "approve", "carol"]).await;
    assert!(!ok);
    assert!(
        err.contains("user not permitted to approve requests with signerName \"kubernetes.io/kube-apiserver-client\""),
        "{err}"
    );
    // `approve` on the signer (here its domain's wildcard) lets it through.
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "signer-approver"},
        "rules": [{"apiGroups": ["certificates.k8s.io"], "resources": ["signers"], "resourceNames": ["kubernetes.io/*"], "verbs": ["approve"]}]});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "signer-approver"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "signer-approver"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "dave"}]});
    for (plural, body) in [("clusterroles", role), ("clusterrolebindings", binding)] {
        let req = http::Request::post(format!("/apis/rbac.authorization.k8s.io/v1/{plural}"))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).expect("json"))
            .expect("request");
        env.client.request::<Value>(req).await.expect("create rbac");
    }
    let (ok, out, err) = env.kubectl(&kc, &["certificate", "approve", "carol"]).await;
    assert!(ok, "{out}\n{err}");
    env.wait("carol", "signed", |c| certificate(c).is_some())
        .await;
    env.server.shutdown().await;
}
