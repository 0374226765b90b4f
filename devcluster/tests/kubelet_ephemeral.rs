//! Ephemeral containers (`pods/ephemeralcontainers`, `kubectl debug`) on
//! the embedded API server and the process kubelet: the subresource's
//! rules as the real server's (only ephemeral containers change, none is
//! removed or changed, names are unique), and the kubelet starting each
//! one once in the pod's sandbox, reporting it in
//! `status.ephemeralContainerStatuses`, serving its log, never restarting
//! it and leaving the pod's phase and readiness alone.

mod kubelet_common;

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{LogParams, Patch, PatchParams, PostParams};
use kubelet_common::{Cluster, condition, container, phase};
use serde_json::json;

const POD: &str = "
apiVersion: v1
kind: Pod
metadata: {name: target}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: [sleep, '3600']
";

fn ephemeral<'a>(p: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    p.status
        .as_ref()?
        .ephemeral_container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == name)
}

fn exit_code(c: Option<&ContainerStatus>) -> Option<i32> {
    Some(c?.state.as_ref()?.terminated.as_ref()?.exit_code)
}

fn api_error(r: Result<impl std::fmt::Debug, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_container_runs_once_in_the_pods_sandbox() {
    let c = Cluster::start(205).await;
    c.create_pod(POD).await;
    c.wait_pod("target", "Running and Ready", |p| {
        phase(p) == "Running" && condition(p, "Ready").as_deref() == Some("True")
    })
    .await;
    let pods = c.pods();
    // Only `spec.ephemeralContainers` changes: the rest of the body is
    // dropped, as the real server's strategy drops it.
    let patch = json!({
        "metadata": {"labels": {"ignored": "yes"}},
        "spec": {
            "activeDeadlineSeconds": 5,
            "ephemeralContainers": [{
                "name": "dbg", "image": "busybox:1.36", "targetContainerName": "main",
                "command": ["sh", "-c", "echo hello from $(cat /etc/hostname)"],
            }],
        },
    });
    let p = pods
        .patch_ephemeral_containers("target", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("add an ephemeral container");
    let spec = p.spec.clone().expect("spec");
    assert!(p.metadata.labels.is_none() && spec.active_deadline_seconds.is_none());
    let added = &spec.ephemeral_containers.expect("ephemeral containers")[0];
    assert_eq!(added.termination_message_policy.as_deref(), Some("File"));
    assert_eq!(added.image_pull_policy.as_deref(), Some("IfNotPresent"));

    let p = c
        .wait_pod("target", "the ephemeral container to finish", |p| {
            exit_code(ephemeral(p, "dbg")) == Some(0)
        })
        .await;
    let dbg = ephemeral(&p, "dbg").expect("status");
    assert!(!dbg.ready && dbg.restart_count == 0);
    // The pod is as it was: Running, Ready, its container untouched.
    assert_eq!(phase(&p), "Running");
    assert_eq!(condition(&p, "Ready").as_deref(), Some("True"));
    assert_eq!(container(&p, "main").expect("main").restart_count, 0);
    // It ran in the pod's UTS namespace (the pod's hostname), and its log
    // is served like any container's.
    let logs = pods
        .logs(
            "target",
            &LogParams {
                container: Some("dbg".into()),
                ..LogParams::default()
            },
        )
        .await
        .expect("logs");
    assert_eq!(logs.trim(), "hello from target");

    // The real server's refusals: existing ones stay, names are unique,
    // ephemeral containers have no ports or probes.
    let p = pods.get_ephemeral_containers("target").await.expect("get");
    let mut removed = p.clone();
    removed.spec.as_mut().expect("spec").ephemeral_containers = Some(Vec::new());
    let s = api_error(
        pods.replace_ephemeral_containers("target", &PostParams::default(), &removed)
            .await,
    );
    assert_eq!(s.code, 422);
    assert_eq!(
        s.message,
        "Pod \"target\" is invalid: spec.ephemeralContainers: Forbidden: existing ephemeral containers \"dbg\" may not be removed\n"
    );
    let dup = json!({"spec": {"ephemeralContainers": [{"name": "main", "image": "busybox:1.36", "ports": [{"containerPort": 80}]}]}});
    let s = api_error(
        pods.patch_ephemeral_containers("target", &PatchParams::default(), &Patch::Strategic(&dup))
            .await,
    );
    assert_eq!(
        s.message,
        "Pod \"target\" is invalid: [spec.ephemeralContainers[1].name: Duplicate value: \"main\", spec.ephemeralContainers[1].ports: Forbidden: cannot be set for an Ephemeral Container]"
    );
    // A second one runs too; the first is never started again.
    let second = json!({"spec": {"ephemeralContainers": [{"name": "dbg2", "image": "busybox:1.36", "command": ["sh", "-c", "exit 3"]}]}});
    pods.patch_ephemeral_containers(
        "target",
        &PatchParams::default(),
        &Patch::Strategic(&second),
    )
    .await
    .expect("second");
    let p = c
        .wait_pod("target", "the second ephemeral container to fail", |p| {
            exit_code(ephemeral(p, "dbg2")) == Some(3)
        })
        .await;
    for name in ["dbg", "dbg2"] {
        assert_eq!(ephemeral(&p, name).expect(name).restart_count, 0, "{name}");
    }
    assert_eq!(exit_code(ephemeral(&p, "dbg")), Some(0));
    assert_eq!(phase(&p), "Running");
    // A pod is never created with ephemeral containers.
    let mut with: Pod = serde_saphyr::from_str(POD).expect("pod");
    with.metadata.name = Some("born-with".into());
    with.spec.as_mut().expect("spec").ephemeral_containers = Some(vec![
        serde_json::from_value(json!({"name": "e", "image": "busybox:1.36"})).expect("container"),
    ]);
    let s = api_error(pods.create(&PostParams::default(), &with).await);
    assert_eq!(
        s.message,
        "Pod \"born-with\" is invalid: spec.ephemeralContainers: Forbidden: cannot be set on create"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_debug_runs_a_debug_container_whose_logs_kubectl_reads() {
    let c = Cluster::start(206).await;
    let kubeconfig: PathBuf = c.dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, c.api.as_ref().expect("api").kubeconfig_yaml())
        .expect("write kubeconfig");
    let kubectl = |args: &[&str]| {
        let mut cmd = tokio::process::Command::new("kubectl");
        cmd.args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        cmd
    };
    let run = async |args: &[&str]| {
        let out = tokio::time::timeout(Duration::from_secs(120), kubectl(args).output())
            .await
            .expect("kubectl finished in time")
            .expect("kubectl runs (install kubectl; .ci/run does)");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    c.create_pod(POD).await;
    c.wait_pod("target", "Running", |p| phase(p) == "Running")
        .await;
    let (ok, out, err) = run(&[
        "debug",
        "pod/target",
        "--image=busybox:1.36",
        "--target=main",
        "-c",
        "debugger",
        "--",
        "sh",
        "-c",
        "echo debugging $(cat /etc/hostname)",
    ])
    .await;
    assert!(ok, "kubectl debug: {out}\n{err}");
    c.wait_pod("target", "the debug container to finish", |p| {
        exit_code(ephemeral(p, "debugger")) == Some(0)
    })
    .await;
    let (ok, out, err) = run(&["logs", "target", "-c", "debugger"]).await;
    assert!(ok, "kubectl logs: {out}\n{err}");
    assert_eq!(out.trim(), "debugging target");
    // kubectl describe lists it with the pod's containers.
    let (ok, out, _) = run(&["describe", "pod", "target"]).await;
    assert!(
        ok && out.contains("Ephemeral Containers:") && out.contains("debugger:"),
        "{out}"
    );
    c.stop().await;
}
