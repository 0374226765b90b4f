//! Readiness probes decide the Ready condition: an `httpGet` probe on the
//! pod IP and an `exec` probe run inside the container's mount namespace,
//! both flipping the pod Ready and back as their checks pass and fail.

mod kubelet_common;

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
