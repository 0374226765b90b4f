//! Container log rotation (issue 17, item 7): a container that writes far
//! more than `containerLogMaxSize` keeps at most `containerLogMaxFiles`
//! files of at most that size on disk, and the real `kubectl logs` still
//! serves its latest lines, through the API server's `pods/log` proxy.

mod kubelet_common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use kubelet_common::{Cluster, phase};

const MAX_SIZE: u64 = 64 * 1024;
const MAX_FILES: u32 = 3;

/// The container's log files (`main.log`, `main.log.N`) and their total size.
fn logs_of(data: &Path) -> (Vec<PathBuf>, u64) {
    let mut files = Vec::new();
    let pods = data.join("pods");
    for pod in std::fs::read_dir(&pods).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(pod.path().join("logs"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if f.file_name().to_string_lossy().starts_with("main.log") {
                files.push(f.path());
            }
        }
    }
    let total = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    (files, total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chatty_container_s_logs_stay_bounded_and_kubectl_logs_serves_the_latest() {
    let c = Cluster::start_with(221, |cfg| {
        cfg.container_log_max_size = MAX_SIZE;
        cfg.container_log_max_files = MAX_FILES;
        cfg.container_log_monitor_interval = Duration::from_millis(100);
    })
    .await;
    // About 1.4 MB in bursts of 100 lines (20 times the limit), then a
    // last line and silence.
    c.create_pod(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: chatty}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox
    command:
    - /bin/sh
    - -c
    - |
      i=0
      while [ $i -lt 20000 ]; do
        echo "line $i ............................................................"
        i=$((i+1))
        [ $((i % 100)) -eq 0 ] && sleep 0.01
      done
      echo LAST LINE
      exec sleep 3600
"#,
    )
    .await;
    c.wait_pod("chatty", "Running", |p| phase(p) == "Running")
        .await;
    let kubeconfig = c.dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        c.api.as_ref().expect("api server").kubeconfig_yaml(),
    )
    .unwrap();
    let kubectl = |args: &[&str]| {
        let out = std::process::Command::new("kubectl")
            .env("KUBECONFIG", &kubeconfig)
            .args(args)
            .output()
            .expect("kubectl runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let data = c.config.data_dir.clone();
    // Written out, then rotated down to the bound.
    let mut seen = (Vec::new(), 0);
    let bounded = hostmesh_testkit::wait::poll(Duration::from_secs(120), async || {
        let (ok, tail, err) = kubectl(&["logs", "chatty", "--tail=1"]);
        seen = logs_of(&data);
        let (files, total) = &seen;
        if ok
            && tail == "LAST LINE\n"
            && files.len() <= MAX_FILES as usize
            && *total <= MAX_SIZE * u64::from(MAX_FILES)
        {
            Ok(())
        } else {
            Err(format!("kubectl: {ok} {tail:?} {err}; files {seen:?}"))
        }
    })
    .await;
    bounded.unwrap_or_else(|e| panic!("logs not bounded with the last line served: {e}"));
    let (files, _) = &seen;
    assert!(
        files.iter().any(|f| f.ends_with("main.log.1")),
        "rotated at least once: {files:?}"
    );
    for f in files {
        let len = std::fs::metadata(f).unwrap().len();
        assert!(len <= MAX_SIZE, "{}: {len} bytes", f.display());
    }
    // `kubectl logs` serves the current file: the latest lines, not the
    // first ones (rotated away).
    let (ok, all, err) = kubectl(&["logs", "chatty"]);
    assert!(ok, "{err}");
    assert!(all.ends_with("LAST LINE\n"), "{all}");
    assert!(
        !all.contains("line 0 ."),
        "the oldest lines were rotated away"
    );
    c.stop().await;
}
