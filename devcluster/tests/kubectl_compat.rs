//! Compatibility with the real `kubectl` (the machine's wrapper picks the
//! client matching the server's v1.33.0): apply client-side and
//! server-side, get with CRD printer columns, get -w, describe, wait,
//! delete, explain, logs through the kubelet proxy, and as a service
//! account: `create token`, `auth whoami`, `auth can-i`, Forbidden errors.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use hostmesh_devcluster::apiserver::ApiServerHandle;
use hostmesh_testkit::cluster::api_server_with_kubeconfig;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

struct Env {
    server: ApiServerHandle,
    client: kube::Client,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

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

impl Env {
    fn write(&self, name: &str, body: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, body).expect("write manifest");
        p
    }

    fn cmd(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("kubectl");
        c.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .kill_on_drop(true);
        c
    }

    /// Runs kubectl; returns (success, stdout, stderr).
    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = tokio::time::timeout(Duration::from_secs(120), self.cmd(args).output())
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
        let (ok, out, err) = self.run(args).await;
        assert!(ok, "kubectl {args:?} failed:\n{out}\n{err}");
        out
    }
}

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.example.dev
spec:
  group: example.dev
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget, shortNames: [gd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    - {name: Phase, type: string, jsonPath: .status.phase}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        description: A gadget.
        properties:
          spec:
            type: object
            description: What the gadget should be.
            properties:
              size: {type: integer, minimum: 1, description: How big.}
              color: {type: string, default: blue}
          status:
            type: object
            properties:
              phase: {type: string}
              conditions:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [type]
                items:
                  type: object
                  properties:
                    type: {type: string}
                    status: {type: string}
                    reason: {type: string}
                    message: {type: string}
                    lastTransitionTime: {type: string}
"#;

const GADGET: &str =
    "apiVersion: example.dev/v1\nkind: Gadget\nmetadata:\n  name: g1\nspec:\n  size: 3\n";

async fn with_crd() -> Env {
    let env = start().await;
    let crd = env.write("crd.yaml", CRD);
    env.ok(&["apply", "-f", crd.to_str().expect("path")]).await;
    env.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/gadgets.example.dev",
        "--timeout=30s",
    ])
    .await;
    env
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

#[tokio::test]
async fn version_and_api_resources() {
    let env = start().await;
    let out = env.ok(&["version", "-o", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["serverVersion"]["gitVersion"], "v1.33.0");
    let out = env.ok(&["api-resources"]).await;
    for r in ["pods", "leases", "customresourcedefinitions", "events"] {
        assert!(out.contains(r), "{r} missing from api-resources:\n{out}");
    }
    // The kubeconfig is the admin (system:masters): access reviews allow,
    // whoami names it.
    assert_eq!(
        env.ok(&["auth", "can-i", "delete", "pods"]).await.trim(),
        "yes"
    );
    assert!(env.ok(&["auth", "whoami"]).await.contains("hostmesh-admin"));
    env.server.shutdown().await;
}

const SA_RBAC: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: can-i}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: op, namespace: can-i}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-reader, namespace: can-i}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get, list]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: op-reads-pods, namespace: can-i}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader}
subjects:
- {kind: ServiceAccount, name: op, namespace: can-i}
"#;

#[tokio::test]
async fn auth_can_i_whoami_and_forbidden_as_a_service_account() {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let env = start().await;
    let f = env.write("rbac.yaml", SA_RBAC);
    env.ok(&["apply", "-f", f.to_str().unwrap_or_default()])
        .await;
    let api: kube::Api<ServiceAccount> = kube::Api::namespaced(env.client.clone(), "can-i");
    let req: TokenRequest =
        serde_json::from_value(serde_json::json!({"spec": {"audiences": []}})).expect("request");
    let token = api
        .create_token_request("op", &Default::default(), &req)
        .await
        .expect("token")
        .status
        .expect("status")
        .token;
    // `kubectl create token` sends a protobuf TokenRequest.
    let minted = env
        .ok(&["create", "token", "op", "-n", "can-i", "--duration=20m"])
        .await;
    let whoami = env
        .ok(&[
            "--token",
            minted.trim(),
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .await;
    assert_eq!(whoami, "system:serviceaccount:can-i:op");
    let tok = format!("--token={token}");
    let out = env.ok(&[&tok, "auth", "whoami"]).await;
    assert!(out.contains("system:serviceaccount:can-i:op"), "{out}");
    // `auth can-i` sends a protobuf SelfSubjectAccessReview.
    let can = |args: &'static [&'static str]| {
        let tok = tok.clone();
        let env = &env;
        async move {
            let mut all = vec![tok.as_str(), "auth", "can-i"];
            all.extend_from_slice(args);
            env.run(&all).await.1.trim().to_string()
        }
    };
    assert_eq!(can(&["list", "pods", "-n", "can-i"]).await, "yes");
    assert_eq!(can(&["list", "pods", "-n", "default"]).await, "no");
    assert_eq!(can(&["delete", "pods", "-n", "can-i"]).await, "no");
    let (ok, _, err) = env.run(&[&tok, "get", "pods", "-n", "default"]).await;
    assert!(!ok);
    assert!(
        err.contains(r#"Error from server (Forbidden): pods is forbidden: User "system:serviceaccount:can-i:op" cannot list resource "pods" in API group "" in the namespace "default""#),
        "{err}"
    );
    env.ok(&[&tok, "get", "pods", "-n", "can-i"]).await;
    // `auth can-i --list` (a protobuf SelfSubjectRulesReview) lists the
    // Role's rule and the discovery grants every user has.
    let list = env
        .ok(&[&tok, "auth", "can-i", "--list", "-n", "can-i"])
        .await;
    let pods = list
        .lines()
        .find(|l| l.starts_with("pods "))
        .unwrap_or_default();
    assert!(pods.contains("[get list]"), "{list}");
    assert!(list.contains("[/apis/*]"), "{list}");
    env.server.shutdown().await;
}

#[tokio::test]
async fn client_side_apply_get_describe_delete() {
    let env = with_crd().await;
    let g = env.write("g.yaml", GADGET);
    assert!(
        env.ok(&["apply", "-f", p(&g)])
            .await
            .contains("gadget.example.dev/g1 created")
    );
    assert!(env.ok(&["apply", "-f", p(&g)]).await.contains("unchanged"));
    let g2 = env.write("g2.yaml", &GADGET.replace("size: 3", "size: 5"));
    assert!(
        env.ok(&["apply", "-f", p(&g2)])
            .await
            .contains("configured")
    );

    // Printer columns, short name, and schema defaults.
    let out = env.ok(&["get", "gd"]).await;
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().expect("header").split_whitespace().collect();
    assert_eq!(header, ["NAME", "SIZE", "PHASE", "AGE"]);
    let row: Vec<&str> = lines.next().expect("row").split_whitespace().collect();
    assert_eq!(&row[..2], ["g1", "5"]);
    assert_eq!(
        env.ok(&["get", "gadget", "g1", "-o", "jsonpath={.spec.color}"])
            .await,
        "blue"
    );

    let out = env.ok(&["describe", "gadget", "g1"]).await;
    assert!(
        out.contains("Name:") && out.contains("g1") && out.contains("Size:"),
        "{out}"
    );

    // Built-in types merge lists by key through client-side apply.
    let deploy = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d1\nspec:\n  selector: {matchLabels: {app: d1}}\n  template:\n    metadata: {labels: {app: d1}}\n    spec:\n      containers:\n      - name: c\n        image: busybox:1\n        env: [{name: A, value: \"1\"}]\n";
    let df = env.write("deploy.yaml", deploy);
    env.ok(&["apply", "-f", p(&df)]).await;
    let df2 = env.write("deploy2.yaml", &deploy.replace("\"1\"", "\"2\""));
    assert!(
        env.ok(&["apply", "-f", p(&df2)])
            .await
            .contains("configured")
    );
    assert_eq!(
        env.ok(&[
            "get",
            "deploy",
            "d1",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].env[0].value}"
        ])
        .await,
        "2"
    );
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p1\nspec:\n  containers:\n  - name: c\n    image: busybox:1\n";
    let pf = env.write("pod.yaml", pod);
    env.ok(&["apply", "-f", p(&pf)]).await;
    let pf2 = env.write("pod2.yaml", &pod.replace("busybox:1", "busybox:2"));
    assert!(
        env.ok(&["apply", "-f", p(&pf2)])
            .await
            .contains("configured")
    );
    let out = env.ok(&["get", "pods"]).await;
    assert!(
        out.contains("READY") && out.contains("p1") && out.contains("Pending"),
        "{out}"
    );
    let out = env.ok(&["describe", "pod", "p1"]).await;
    assert!(out.contains("busybox:2"), "{out}");
    let pf3 = env.write(
        "pod3.yaml",
        &pod.replace("image: busybox:1", "image: busybox:1\n    args: [x]"),
    );
    let (ok, _, err) = env.run(&["apply", "-f", p(&pf3)]).await;
    assert!(
        !ok && err.contains("pod updates may not change fields"),
        "{err}"
    );

    assert!(env.ok(&["delete", "-f", p(&g2)]).await.contains("deleted"));
    let (ok, _, err) = env.run(&["get", "gadget", "g1"]).await;
    assert!(!ok && err.contains("NotFound"), "{err}");
    env.ok(&["delete", "pod", "p1"]).await;

    // Events show in `get events` and in `describe`.
    let ev = "apiVersion: v1\nkind: Event\nmetadata: {name: e1}\ninvolvedObject: {kind: Pod, name: p2, namespace: default}\nreason: Started\nmessage: container started\ntype: Normal\nlastTimestamp: \"2026-01-01T00:00:00Z\"\n";
    let ef = env.write("ev.yaml", ev);
    env.ok(&["create", "-f", p(&ef)]).await;
    let out = env.ok(&["get", "events"]).await;
    assert!(
        out.contains("REASON")
            && out.contains("Started")
            && out.contains("pod/p2")
            && out.contains("container started"),
        "{out}"
    );
    env.server.shutdown().await;
}

#[tokio::test]
async fn server_side_apply_conflicts_and_force() {
    let env = with_crd().await;
    let g = env.write("g.yaml", GADGET);
    assert!(
        env.ok(&["apply", "--server-side", "-f", p(&g)])
            .await
            .contains("serverside-applied")
    );
    let g2 = env.write("g2.yaml", &GADGET.replace("size: 3", "size: 4"));
    let (ok, _, err) = env
        .run(&[
            "apply",
            "--server-side",
            "--field-manager=other",
            "-f",
            p(&g2),
        ])
        .await;
    assert!(
        !ok && err.contains("conflict"),
        "a different manager conflicts: {err}"
    );
    env.ok(&[
        "apply",
        "--server-side",
        "--field-manager=other",
        "--force-conflicts",
        "-f",
        p(&g2),
    ])
    .await;
    assert_eq!(
        env.ok(&["get", "gadget", "g1", "-o", "jsonpath={.spec.size}"])
            .await,
        "4"
    );
    let mf = env
        .ok(&[
            "get",
            "gadget",
            "g1",
            "-o",
            "jsonpath={.metadata.managedFields[*].manager}",
            "--show-managed-fields",
        ])
        .await;
    assert!(mf.contains("other"), "{mf}");

    // kubectl diff runs a server-side dry-run apply: nothing is stored.
    let (same, out, _) = env
        .run(&[
            "diff",
            "--server-side",
            "--field-manager=other",
            "-f",
            p(&g2),
        ])
        .await;
    assert!(same, "no difference expected:\n{out}");
    let (same, out, _) = env
        .run(&[
            "diff",
            "--server-side",
            "--field-manager=other",
            "--force-conflicts",
            "-f",
            p(&g),
        ])
        .await;
    assert!(
        !same && out.contains("-  size: 4") && out.contains("+  size: 3"),
        "{out}"
    );
    assert_eq!(
        env.ok(&["get", "gadget", "g1", "-o", "jsonpath={.spec.size}"])
            .await,
        "4",
        "dry run stored nothing"
    );

    // Validation errors come back as a clear 422.
    let bad = env.write("bad.yaml", &GADGET.replace("size: 3", "size: 0"));
    let (ok, _, err) = env
        .run(&["apply", "--server-side", "--force-conflicts", "-f", p(&bad)])
        .await;
    assert!(
        !ok && err.contains("spec.size") && err.contains("greater than or equal to 1"),
        "{err}"
    );

    // kubectl validates on the server (fieldValidation=Strict): unknown
    // fields are refused, and pruned when validation is off.
    let extra = env.write(
        "extra.yaml",
        &GADGET
            .replace("size: 3", "size: 3\n  bogus: 1")
            .replace("g1", "g3"),
    );
    let (ok, _, err) = env.run(&["apply", "-f", p(&extra)]).await;
    assert!(!ok && err.contains("unknown field \"spec.bogus\""), "{err}");
    env.ok(&["apply", "--validate=false", "-f", p(&extra)])
        .await;
    assert_eq!(
        env.ok(&["get", "gadget", "g3", "-o", "jsonpath={.spec}"])
            .await,
        r#"{"color":"blue","size":3}"#
    );
    env.server.shutdown().await;
}

#[tokio::test]
async fn get_watch_and_wait_for_condition() {
    let env = with_crd().await;
    let g = env.write("g.yaml", GADGET);
    env.ok(&["apply", "-f", p(&g)]).await;

    let mut watch = env
        .cmd(&["get", "gadgets", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut lines = tokio::io::BufReader::new(watch.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("header in time")
        .expect("read");
    assert!(
        first.as_deref().is_some_and(|l| l.starts_with("NAME")),
        "{first:?}"
    );

    let mut waiter = env
        .cmd(&[
            "wait",
            "--for=condition=Ready",
            "gadget/g1",
            "--timeout=60s",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn wait");
    env.ok(&[
        "patch", "gadget", "g1", "--subresource=status", "--type=merge", "-p",
        r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True","reason":"Up","message":"ok","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#,
    ])
    .await;
    let mut saw_running = false;
    for _ in 0..20 {
        match tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await {
            Ok(Ok(Some(l))) if l.contains("Running") => {
                saw_running = true;
                break;
            }
            Ok(Ok(Some(_))) => continue,
            _ => break,
        }
    }
    assert!(saw_running, "kubectl get -w shows the new phase");
    watch.kill().await.expect("stop watch");

    let status = tokio::time::timeout(Duration::from_secs(90), waiter.wait())
        .await
        .expect("wait ends")
        .expect("wait");
    assert!(
        status.success(),
        "kubectl wait --for=condition=Ready succeeds"
    );

    // wait --for=delete.
    let mut del_waiter = env
        .cmd(&["wait", "--for=delete", "gadget/g1", "--timeout=60s"])
        .spawn()
        .expect("spawn");
    env.ok(&["delete", "gadget", "g1", "--wait=false"]).await;
    let status = tokio::time::timeout(Duration::from_secs(90), del_waiter.wait())
        .await
        .expect("ends")
        .expect("wait");
    assert!(status.success());
    env.server.shutdown().await;
}

#[tokio::test]
async fn explain_uses_the_crd_schema() {
    let env = with_crd().await;
    let out = env.ok(&["explain", "gadgets.spec"]).await;
    assert!(out.contains("size") && out.contains("How big."), "{out}");
    env.server.shutdown().await;
}

/// A stand-in kubelet endpoint serving `/containerLogs` on loopback, so the
/// API server's proxy and its contract (docs/architecture.md) are tested.
async fn log_endpoint(token: String) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = l.local_addr().expect("addr").port();
    tokio::spawn(async move {
        for _ in 0..16 {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let token = token.clone();
            tokio::spawn(async move {
                let mut r = tokio::io::BufReader::new(&mut s);
                let mut req = String::new();
                let mut auth_ok = false;
                let mut line = String::new();
                r.read_line(&mut req).await.expect("request line");
                loop {
                    line.clear();
                    if r.read_line(&mut line).await.expect("header") == 0 || line == "\r\n" {
                        break;
                    }
                    if line.to_ascii_lowercase().starts_with("authorization:")
                        && line.trim_end().ends_with(&format!("Bearer {token}"))
                    {
                        auth_ok = true;
                    }
                }
                let (code, body) = if !auth_ok {
                    ("401 Unauthorized", "bad token".to_string())
                } else if req.starts_with("GET /containerLogs/default/lp/main?")
                    && req.contains("tailLines=2")
                {
                    ("200 OK", "line two\nline three\n".to_string())
                } else {
                    ("404 Not Found", format!("unexpected request {req}"))
                };
                let resp = format!(
                    "HTTP/1.1 {code}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn logs_are_proxied_to_the_kubelet() {
    let env = start().await;
    let port = log_endpoint(env.server.token().to_string()).await;
    let node = format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\nstatus:\n  addresses: [{{type: InternalIP, address: 127.0.0.1}}]\n  daemonEndpoints: {{kubeletEndpoint: {{Port: {port}}}}}\n"
    );
    let nf = env.write("node.yaml", &node);
    env.ok(&["create", "-f", p(&nf)]).await;
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: lp\nspec:\n  nodeName: n1\n  containers:\n  - {name: main, image: img:1}\n";
    let pf = env.write("pod.yaml", pod);
    env.ok(&["create", "-f", p(&pf)]).await;
    let out = env.ok(&["logs", "lp", "--tail=2"]).await;
    assert_eq!(out, "line two\nline three\n");
    let (ok, _, err) = env.run(&["logs", "lp", "-c", "nope"]).await;
    assert!(!ok && err.contains("container nope is not valid"), "{err}");
    env.server.shutdown().await;
}

const SCALED_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: pools.example.dev
spec:
  group: example.dev
  scope: Namespaced
  names: {plural: pools, singular: pool, kind: Pool}
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas, labelSelectorPath: .status.selector}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {replicas: {type: integer}}}
          status: {type: object, properties: {replicas: {type: integer}, selector: {type: string}}}
"#;

#[tokio::test]
async fn scale_deployments_and_custom_resources() {
    let env = start().await;
    let dep = env.write(
        "web.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replicas: 1\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: c, image: busybox}]}\n",
    );
    env.ok(&["apply", "-f", p(&dep)]).await;
    env.ok(&["scale", "deployment/web", "--replicas=3"]).await;
    let out = env
        .ok(&["get", "deployment/web", "-o", "jsonpath={.spec.replicas}"])
        .await;
    assert_eq!(out.trim(), "3");
    // A precondition that does not hold is refused.
    let (ok, _, err) = env
        .run(&[
            "scale",
            "deployment/web",
            "--current-replicas=2",
            "--replicas=5",
        ])
        .await;
    assert!(!ok, "a wrong --current-replicas is refused");
    assert!(err.contains("Expected replicas to be 2"), "{err}");

    let crd = env.write("pools.yaml", SCALED_CRD);
    env.ok(&["apply", "-f", p(&crd)]).await;
    env.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/pools.example.dev",
        "--timeout=30s",
    ])
    .await;
    let pool = env.write(
        "pool.yaml",
        "apiVersion: example.dev/v1\nkind: Pool\nmetadata: {name: p1}\nspec: {replicas: 1}\n",
    );
    env.ok(&["apply", "-f", p(&pool)]).await;
    env.ok(&["scale", "pool/p1", "--replicas=4"]).await;
    let out = env
        .ok(&["get", "pool/p1", "-o", "jsonpath={.spec.replicas}"])
        .await;
    assert_eq!(out.trim(), "4");
    let scale = env
        .ok(&[
            "get",
            "--raw",
            "/apis/example.dev/v1/namespaces/default/pools/p1/scale",
        ])
        .await;
    let scale: serde_json::Value = serde_json::from_str(&scale).expect("scale json");
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["apiVersion"], "autoscaling/v1");
    assert_eq!(scale["spec"]["replicas"], 4);
}

#[tokio::test]
async fn drain_evicts_the_pods_of_a_node() {
    let env = start().await;
    let node = env.write(
        "node.yaml",
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n",
    );
    env.ok(&["apply", "-f", p(&node)]).await;
    for name in ["p1", "p2"] {
        let pod = env.write(
            &format!("{name}.yaml"),
            &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  nodeName: n1\n  containers: [{{name: c, image: busybox}}]\n"),
        );
        env.ok(&["apply", "-f", p(&pod)]).await;
    }
    let out = env
        .ok(&[
            "drain",
            "n1",
            "--force",
            "--grace-period=0",
            "--timeout=60s",
        ])
        .await;
    assert!(out.contains("evicted") && out.contains("drained"), "{out}");
    let unschedulable = env
        .ok(&["get", "node", "n1", "-o", "jsonpath={.spec.unschedulable}"])
        .await;
    assert_eq!(unschedulable.trim(), "true");
    let left = env.ok(&["get", "pods", "-o", "name"]).await;
    assert!(left.trim().is_empty(), "{left}");
}

#[tokio::test]
async fn client_certificates_authenticate_as_cn_and_o() {
    let env = start().await;
    let jane = env.write(
        "jane.kubeconfig",
        &env.server
            .kubeconfig_with_client_cert("jane", &["dev", "ops"])
            .expect("client cert"),
    );
    let as_jane = |args: &[&str]| {
        let mut all = vec!["--kubeconfig", p(&jane)];
        all.extend_from_slice(args);
        all.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let args = as_jane(&["auth", "whoami", "-o", "json"]);
    let out = env
        .ok(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    let who: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(who["status"]["userInfo"]["username"], "jane");
    assert_eq!(
        who["status"]["userInfo"]["groups"],
        serde_json::json!(["dev", "ops", "system:authenticated"])
    );
    // RBAC applies to the certificate's user.
    let args = as_jane(&["get", "pods"]);
    let (ok, _, err) = env
        .run(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    assert!(!ok);
    assert!(
        err.contains(r#"User "jane" cannot list resource "pods""#),
        "{err}"
    );
    // An admin certificate (system:masters) may do anything.
    let admin = env.write(
        "admin.kubeconfig",
        &env.server
            .kubeconfig_with_client_cert("kubernetes-admin", &["system:masters"])
            .expect("admin cert"),
    );
    env.ok(&["--kubeconfig", p(&admin), "get", "pods"]).await;
    // A certificate from another CA fails the handshake.
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "mallory");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:masters");
    let forged = params.self_signed(&key).expect("self-signed");
    let cert = env.write("forged.pem", &forged.pem());
    let keyf = env.write("forged-key.pem", &key.serialize_pem());
    let (ok, _, err) = env
        .run(&[
            "--kubeconfig",
            p(&admin),
            "--client-certificate",
            p(&cert),
            "--client-key",
            p(&keyf),
            "get",
            "pods",
        ])
        .await;
    assert!(!ok, "a certificate of another CA is refused: {err}");
}

#[tokio::test]
async fn create_services_and_rbac_objects_sent_as_protobuf() {
    let env = start().await;
    // kubectl sends these as application/vnd.kubernetes.protobuf.
    env.ok(&["create", "service", "clusterip", "web", "--tcp=80:8080"])
        .await;
    let svc = env.ok(&["get", "service", "web", "-o", "json"]).await;
    let svc: serde_json::Value = serde_json::from_str(&svc).expect("json");
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    assert_eq!(svc["spec"]["selector"]["app"], "web");
    assert_eq!(svc["spec"]["ports"][0]["port"], 80);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8080);
    assert_eq!(svc["spec"]["ports"][0]["protocol"], "TCP");
    env.ok(&["create", "service", "nodeport", "np", "--tcp=81:http"])
        .await;
    let port = env
        .ok(&[
            "get",
            "service",
            "np",
            "-o",
            "jsonpath={.spec.ports[0].targetPort}",
        ])
        .await;
    assert_eq!(port.trim(), "http");
    env.ok(&[
        "create",
        "clusterrole",
        "reader",
        "--verb=get,list",
        "--resource=pods",
    ])
    .await;
    let rules = env
        .ok(&[
            "get",
            "clusterrole",
            "reader",
            "-o",
            "jsonpath={.rules[0].verbs}",
        ])
        .await;
    assert_eq!(rules.trim(), r#"["get","list"]"#);
    env.ok(&["create", "role", "r", "--verb=get", "--resource=configmaps"])
        .await;
    env.ok(&["create", "rolebinding", "rb", "--role=r", "--user=jane"])
        .await;
    env.ok(&[
        "create",
        "clusterrolebinding",
        "crb",
        "--clusterrole=reader",
        "--group=devs",
    ])
    .await;
    let subject = env
        .ok(&[
            "get",
            "clusterrolebinding",
            "crb",
            "-o",
            "jsonpath={.subjects[0].kind}/{.subjects[0].name}/{.roleRef.name}",
        ])
        .await;
    assert_eq!(subject.trim(), "Group/devs/reader");
    env.ok(&["create", "serviceaccount", "robot"]).await;
    env.ok(&[
        "create",
        "priorityclass",
        "high",
        "--value=1000",
        "--description=important",
    ])
    .await;
    let value = env
        .ok(&[
            "get",
            "priorityclass",
            "high",
            "-o",
            "jsonpath={.value}/{.description}",
        ])
        .await;
    assert_eq!(value.trim(), "1000/important");
    env.ok(&[
        "create",
        "pdb",
        "web",
        "--selector=app=web",
        "--min-available=50%",
    ])
    .await;
    let pdb = env
        .ok(&[
            "get",
            "pdb",
            "web",
            "-o",
            "jsonpath={.spec.minAvailable}/{.spec.selector.matchLabels.app}",
        ])
        .await;
    assert_eq!(pdb.trim(), "50%/web");
    env.ok(&[
        "create",
        "deployment",
        "app",
        "--image=busybox",
        "--port=8080",
        "--replicas=0",
        "--",
        "sleep",
        "60",
    ])
    .await;
    let dep = env.ok(&["get", "deployment", "app", "-o", "json"]).await;
    let dep: serde_json::Value = serde_json::from_str(&dep).expect("json");
    assert_eq!(dep["spec"]["replicas"], 0, "an explicit 0 is kept");
    assert_eq!(dep["spec"]["selector"]["matchLabels"]["app"], "app");
    let c = &dep["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "busybox");
    assert_eq!(c["command"], serde_json::json!(["sleep", "60"]));
    assert_eq!(c["ports"][0]["containerPort"], 8080);
    env.ok(&["create", "quota", "q", "--hard=pods=10,cpu=2"])
        .await;
    let hard = env
        .ok(&[
            "get",
            "quota",
            "q",
            "-o",
            "jsonpath={.spec.hard.pods}/{.spec.hard.cpu}",
        ])
        .await;
    assert_eq!(hard.trim(), "10/2");
}

/// What clients probe on a real cluster answers the same here: the
/// extension and storage kinds (`kubectl get apiservices,storageclasses,
/// ...` as on a real cluster, with its columns), `kubectl get cs` (healthy,
/// with the deprecation warning), and `get nodes -o wide` with the wide
/// columns.
#[tokio::test]
async fn kubectl_gets_what_a_real_cluster_serves() {
    let env = start().await;
    let out = env
        .ok(&[
            "get",
            "apiservices,storageclasses,runtimeclasses,validatingwebhookconfigurations,horizontalpodautoscalers,flowschemas",
            "-A",
        ])
        .await;
    for line in [
        "apiservice.apiregistration.k8s.io/v1.apps",
        "apiservice.apiregistration.k8s.io/v2.autoscaling",
        "flowschema.flowcontrol.apiserver.k8s.io/exempt",
        "flowschema.flowcontrol.apiserver.k8s.io/catch-all",
    ] {
        assert!(out.contains(line), "{line} missing:\n{out}");
    }
    let header = out
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with("NAME") && l.contains("SERVICE"))
        .expect("APIService header");
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["NAME", "SERVICE", "AVAILABLE", "AGE"]
    );
    let apps = out
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with("apiservice.apiregistration.k8s.io/v1.apps "))
        .expect("v1.apps row");
    assert_eq!(
        apps.split_whitespace().skip(1).take(2).collect::<Vec<_>>(),
        ["Local", "True"]
    );
    let exempt = out
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with("flowschema.flowcontrol.apiserver.k8s.io/exempt "))
        .unwrap_or_else(|| panic!("exempt row missing:\n{out}"));
    assert_eq!(
        exempt
            .split_whitespace()
            .skip(1)
            .take(3)
            .collect::<Vec<_>>(),
        ["exempt", "1", "<none>"]
    );
    let hpa = "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {name: web}\nspec:\n  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}\n  maxReplicas: 5\n";
    let path = env.write("hpa.yaml", hpa);
    env.ok(&["apply", "-f", p(&path)]).await;
    let out = env.ok(&["get", "hpa"]).await;
    let row = out
        .lines()
        .find(|l| l.starts_with("web "))
        .expect("hpa row");
    assert_eq!(
        row.split_whitespace().take(6).collect::<Vec<_>>(),
        ["web", "Deployment/web", "<unknown>/80%", "1", "5", "0"]
    );

    let (ok, out, err) = env.run(&["get", "cs"]).await;
    assert!(ok, "{err}");
    assert!(
        err.contains("Warning: v1 ComponentStatus is deprecated in v1.19+"),
        "{err}"
    );
    for c in ["scheduler", "controller-manager", "etcd-0"] {
        let row = out
            .lines()
            .find(|l| l.starts_with(&format!("{c} ")))
            .unwrap_or_else(|| panic!("{c} missing:\n{out}"));
        assert_eq!(row.split_whitespace().nth(1), Some("Healthy"), "{row}");
    }

    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/control-plane": ""}},
        "spec": {"unschedulable": true},
    }))
    .expect("node");
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(env.client.clone());
    nodes
        .create(&kube::api::PostParams::default(), &node)
        .await
        .expect("node");
    let status = serde_json::json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready"}],
        "addresses": [{"type": "InternalIP", "address": "10.1.2.3"}, {"type": "Hostname", "address": "n1"}],
        "nodeInfo": {"kubeletVersion": "v1.33.0", "osImage": "Debian GNU/Linux 12 (bookworm)", "kernelVersion": "6.1.0",
                     "containerRuntimeVersion": "hostmesh-process://0.1.0", "machineID": "", "systemUUID": "", "bootID": "",
                     "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
    }});
    nodes
        .patch_status(
            "n1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
        .expect("node status");
    let out = env.ok(&["get", "nodes", "-o", "wide"]).await;
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().expect("header").split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "STATUS",
            "ROLES",
            "AGE",
            "VERSION",
            "INTERNAL-IP",
            "EXTERNAL-IP",
            "OS-IMAGE",
            "KERNEL-VERSION",
            "CONTAINER-RUNTIME"
        ]
    );
    let row = lines.next().expect("row");
    for cell in [
        "Ready,SchedulingDisabled",
        "control-plane",
        "v1.33.0",
        "10.1.2.3",
        "<none>",
        "Debian GNU/Linux 12 (bookworm)",
        "6.1.0",
        "hostmesh-process://0.1.0",
    ] {
        assert!(row.contains(cell), "{cell} missing from {row:?}");
    }
    env.server.shutdown().await;
}

/// `hostmesh apiserver --kubeconfig-auth client-cert`: the kubeconfig
/// carries a client certificate for `hostmesh-admin` in `system:masters`
/// instead of the token.
#[tokio::test]
async fn a_client_certificate_kubeconfig_is_written_on_request() {
    use clap::Parser as _;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: hostmesh_devcluster::apiserver::ApiServerArgs,
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("admin.kubeconfig");
    let cli = Cli::try_parse_from([
        "hostmesh-apiserver",
        "--listen",
        "127.0.0.1:0",
        "--kubeconfig",
        p(&kubeconfig),
        "--kubeconfig-auth",
        "client-cert",
    ])
    .expect("flags parse");
    let (server, client) = hostmesh_testkit::cluster::api_server_with(cli.args.into()).await;
    let yaml = std::fs::read_to_string(&kubeconfig).expect("kubeconfig written");
    assert!(yaml.contains("client-certificate-data:") && yaml.contains("client-key-data:"));
    assert!(
        !yaml.contains(server.token()),
        "no token in a client-cert kubeconfig"
    );
    let who: serde_json::Value = client
        .request(
            http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
                .header("content-type", "application/json")
                .body(
                    br#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#
                        .to_vec(),
                )
                .expect("request"),
        )
        .await
        .expect("whoami");
    assert_eq!(who["status"]["userInfo"]["username"], "hostmesh-admin");
    assert_eq!(
        who["status"]["userInfo"]["groups"],
        serde_json::json!(["system:masters", "system:authenticated"])
    );
    let out = tokio::process::Command::new("kubectl")
        .args(["auth", "whoami", "-o", "json"])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .await
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let who: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(who["status"]["userInfo"]["username"], "hostmesh-admin");
    let bad = Cli::try_parse_from(["x", "--kubeconfig-auth", "password"]);
    assert!(bad.is_err());
    server.shutdown().await;
}
