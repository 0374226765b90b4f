//! The kubelet's state on a shared machine (issue 17, item 5): its data
//! directory, `pods/` and each pod's directory are 0700 while the pod runs,
//! and stopping the kubelet removes every pod directory (volumes with the
//! secret, the service-account token, logs).

mod kubelet_common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use kubelet_common::{Cluster, phase};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_directories_are_private_and_go_when_the_kubelet_stops() {
    let c = Cluster::start(222).await;
    c.create::<k8s_openapi::api::core::v1::Secret>(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: creds}\nstringData: {token: s3cret}\n",
    )
    .await;
    c.create_pod(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: holder}
spec:
  containers:
  - name: main
    image: busybox
    command: [/bin/sh, -c, "exec sleep 3600"]
    volumeMounts: [{name: creds, mountPath: /var/run/creds, readOnly: true}]
  volumes:
  - name: creds
    secret: {secretName: creds, defaultMode: 0o444}
"#,
    )
    .await;
    c.wait_pod("holder", "Running", |p| phase(p) == "Running")
        .await;
    let data = c.config.data_dir.clone();
    let pods = data.join("pods");
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&pods), 0o700);
    let pod_dirs: Vec<_> = std::fs::read_dir(&pods)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(pod_dirs.len(), 1, "{pod_dirs:?}");
    assert_eq!(mode(&pod_dirs[0]), 0o700);
    let secret = pod_dirs[0].join("volumes/creds/token");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "s3cret");
    assert_eq!(mode(&secret), 0o444, "defaultMode is honoured");
    c.stop().await;
    assert!(
        !pods.exists(),
        "pod directories left after the kubelet stopped: {:?}",
        std::fs::read_dir(&pods).map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
    );
}
