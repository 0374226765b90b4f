//! Readiness probes decide the Ready condition: an `httpGet` probe on the
//! pod IP and an `exec` probe run inside the container's mount namespace,
//! both flipping the pod Ready and back as their checks pass and fail.

mod kubelet_common;

use hostmesh_testkit::eventually;
use kubelet_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_probes_gate_the_ready_condition() {
    let c = Cluster::start(236).await;
    let python = python();
    let pod = c
        .create_pod(&format!(
            r#"
metadata: {{name: probed}}
spec:
  volumes: [{{name: www, emptyDir: {{}}}}, {{name: flags, emptyDir: {{}}}}]
  containers:
  - name: web
    image: python
    command: [{python}, -m, http.server, --bind, $(POD_IP), --directory, /hostmesh-kubelet-test/srv/www, "18080"]
    env: [{{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}]
    volumeMounts: [{{name: www, mountPath: /hostmesh-kubelet-test/srv/www}}]
    readinessProbe:
      httpGet: {{path: /ready, port: 18080}}
      periodSeconds: 1
      failureThreshold: 1
  - name: worker
    image: busybox
    command: [sleep, "600"]
    volumeMounts: [{{name: flags, mountPath: /hostmesh-kubelet-test/srv/flags}}]
    readinessProbe:
      exec: {{command: [test, -f, /hostmesh-kubelet-test/srv/flags/ok]}}
      periodSeconds: 1
      failureThreshold: 1
"#
        ))
        .await;
    let uid = pod.metadata.uid.clone().unwrap();
    let volumes = c.dir.path().join("kubelet/pods").join(&uid).join("volumes");

    let pod = c
        .wait_pod("probed", "both containers running", |p| {
            container_pid(p, "web").is_some() && container_pid(p, "worker").is_some()
        })
        .await;
    assert_eq!(phase(&pod), "Running");
    assert_eq!(condition(&pod, "Ready").as_deref(), Some("False"));

    std::fs::write(volumes.join("www/ready"), "ok").unwrap();
    let pod = c
        .wait_pod("probed", "web ready", |p| {
            container(p, "web").is_some_and(|s| s.ready)
        })
        .await;
    assert_eq!(
        condition(&pod, "Ready").as_deref(),
        Some("False"),
        "worker is not ready yet"
    );
    let message = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("worker") && !message.contains("web"),
        "{message}"
    );

    std::fs::write(volumes.join("flags/ok"), "").unwrap();
    c.wait_pod("probed", "Ready", |p| {
        condition(p, "Ready").as_deref() == Some("True")
    })
    .await;

    std::fs::remove_file(volumes.join("www/ready")).unwrap();
    let pod = c
        .wait_pod("probed", "not Ready again", |p| {
            condition(p, "Ready").as_deref() == Some("False")
        })
        .await;
    assert!(!container(&pod, "web").unwrap().ready);
    assert!(container(&pod, "worker").unwrap().ready);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_liveness_probe_restarts_the_container() {
    let c = Cluster::start(243).await;
    let pod = c
        .create_pod(
            r#"
metadata: {name: lively}
spec:
  volumes: [{name: flags, emptyDir: {}}]
  containers:
  - name: main
    image: busybox
    command: [sh, -c, 'touch /hostmesh-kubelet-test/flags/alive; exec sleep 600']
    volumeMounts: [{name: flags, mountPath: /hostmesh-kubelet-test/flags}]
    livenessProbe:
      exec: {command: [test, -f, /hostmesh-kubelet-test/flags/alive]}
      periodSeconds: 1
      failureThreshold: 2
"#,
        )
        .await;
    let uid = pod.metadata.uid.clone().unwrap();
    let flag = c
        .dir
        .path()
        .join("kubelet/pods")
        .join(&uid)
        .join("volumes/flags/alive");
    let pod = c
        .wait_pod("lively", "running", |p| container_pid(p, "main").is_some())
        .await;
    let first = container_pid(&pod, "main").unwrap();
    read_flag(&flag).await;
    std::fs::remove_file(&flag).unwrap();
    let pod = c
        .wait_pod("lively", "restarted and running", |p| {
            container(p, "main").is_some_and(|s| s.restart_count == 1)
                && container_pid(p, "main").is_some()
        })
        .await;
    assert_ne!(container_pid(&pod, "main").unwrap(), first);
    wait_pids_gone(&[first]).await;
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(c.client.clone(), "default");
    let list = events.list(&Default::default()).await.unwrap();
    assert!(
        list.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Unhealthy")
                && e.message
                    .as_deref()
                    .unwrap_or_default()
                    .contains("Liveness")),
        "no Unhealthy event: {:?}",
        list.items
            .iter()
            .map(|e| e.reason.clone())
            .collect::<Vec<_>>()
    );
    c.stop().await;
}

/// Polls until the flag file exists (the container created it).
async fn read_flag(path: &std::path::Path) {
    eventually(&format!("{} to appear", path.display()), || path.exists()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_the_startup_probe() {
    let c = Cluster::start(248).await;
    let pod = c
        .create_pod(
            r#"
metadata: {name: slow-start}
spec:
  volumes: [{name: flags, emptyDir: {}}]
  containers:
  - name: main
    image: busybox
    command: [sleep, "600"]
    volumeMounts: [{name: flags, mountPath: /hostmesh-kubelet-test/flags}]
    startupProbe:
      exec: {command: [test, -f, /hostmesh-kubelet-test/flags/started]}
      periodSeconds: 1
      failureThreshold: 600
    readinessProbe:
      exec: {command: ["true"]}
      periodSeconds: 1
"#,
        )
        .await;
    let uid = pod.metadata.uid.clone().unwrap();
    let flags = c
        .dir
        .path()
        .join("kubelet/pods")
        .join(&uid)
        .join("volumes/flags");
    let pod = c
        .wait_pod("slow-start", "running", |p| {
            container_pid(p, "main").is_some()
        })
        .await;
    let s = container(&pod, "main").unwrap();
    assert_eq!((s.started, s.ready), (Some(false), false));
    assert_eq!(condition(&pod, "Ready").as_deref(), Some("False"));
    std::fs::write(flags.join("started"), "").unwrap();
    let pod = c
        .wait_pod("slow-start", "Ready", |p| {
            condition(p, "Ready").as_deref() == Some("True")
        })
        .await;
    assert_eq!(container(&pod, "main").unwrap().started, Some(true));
    c.stop().await;
}
