//! `kubectl exec`, `cp` and `port-forward` with the real kubectl against the
//! embedded API server and a process kubelet: exit codes, stdin, a
//! terminal, the SPDY fallback, copies both ways, forwarded traffic both
//! ways, the real cluster's errors for a missing container and a closed
//! port, RBAC on `pods/exec`, and bounded sessions that leak nothing.

mod kubelet_common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use hostmesh_testkit::http::free_port;
use hostmesh_testkit::{PATIENCE, eventually, eventually_async, eventually_ok};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kubelet_common::{Cluster, phase};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

struct Env {
    cluster: Cluster,
    kubeconfig: PathBuf,
}

impl Env {
    async fn start(block: u8) -> Env {
        let cluster = Cluster::start(block).await;
        let kubeconfig = cluster.dir.path().join("kubeconfig");
        let yaml = cluster
            .api
            .as_ref()
            .expect("api")
            .kubeconfig_yaml()
            .to_string();
        std::fs::write(&kubeconfig, yaml).expect("write kubeconfig");
        Env {
            cluster,
            kubeconfig,
        }
    }

    fn cmd(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("kubectl");
        c.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    /// Runs kubectl with `stdin`; returns (exit code, stdout, stderr).
    async fn run_in(
        &self,
        args: &[&str],
        envs: &[(&str, &str)],
        stdin: Option<&[u8]>,
    ) -> (i32, String, String) {
        let mut c = self.cmd(args);
        c.envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if stdin.is_some() {
            c.stdin(Stdio::piped());
        }
        let mut child = c.spawn().expect("kubectl runs");
        if let Some(data) = stdin {
            let mut w = child.stdin.take().expect("stdin");
            w.write_all(data).await.expect("write stdin");
            drop(w);
        }
        let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .expect("kubectl finished in time")
            .expect("kubectl output");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn run(&self, args: &[&str]) -> (i32, String, String) {
        self.run_in(args, &[], None).await
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.run(args).await;
        assert_eq!(code, 0, "kubectl {args:?} failed:\n{out}\n{err}");
        out
    }

    /// A running pod `name` whose container `main` sleeps.
    async fn sleeper(&self, name: &str) {
        self.cluster
            .create_pod(&format!(
                r#"
metadata: {{name: {name}}}
spec:
  containers:
  - name: main
    image: busybox
    command: [sleep, "3600"]
    env: [{{name: GREETING, value: hello from the pod}}]
"#
            ))
            .await;
        self.cluster
            .wait_pod(name, "Running", |p| phase(p) == "Running")
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exec_returns_output_exit_codes_and_reads_stdin() {
    let env = Env::start(221).await;
    env.sleeper("shell").await;
    for (label, envs) in [
        ("websocket", vec![]),
        ("spdy", vec![("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")]),
    ] {
        let (code, out, err) = env
            .run_in(
                &[
                    "exec",
                    "shell",
                    "--",
                    "sh",
                    "-c",
                    "echo out $GREETING; echo err >&2",
                ],
                &envs,
                None,
            )
            .await;
        assert_eq!(
            (code, out.as_str(), err.as_str()),
            (0, "out hello from the pod\n", "err\n"),
            "{label}"
        );
        let (code, _, err) = env
            .run_in(&["exec", "shell", "--", "sh", "-c", "exit 3"], &envs, None)
            .await;
        assert_eq!(code, 3, "{label}: {err}");
        assert!(
            err.contains("command terminated with exit code 3"),
            "{label}: {err}"
        );
        let (code, out, err) = env
            .run_in(
                &["exec", "-i", "shell", "--", "tr", "a-z", "A-Z"],
                &envs,
                Some(b"piped in\n"),
            )
            .await;
        assert_eq!((code, out.as_str()), (0, "PIPED IN\n"), "{label}: {err}");
        let (code, _, err) = env
            .run_in(&["exec", "shell", "--", "no-such-program-x"], &envs, None)
            .await;
        assert_ne!(code, 0, "{label}");
        assert!(err.contains("executable file not found"), "{label}: {err}");
    }
    // A terminal: kubectl needs one itself, which `script` provides.
    let kubeconfig = env.kubeconfig.display().to_string();
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("script")
            .args([
                "-qec",
                &format!("stty cols 123 rows 45; KUBECONFIG={kubeconfig} kubectl exec -it shell -- sh -c 'tty; stty size; exit 5'"),
                "/dev/null",
            ])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("in time")
    .expect("script runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("/dev/pts/"),
        "the command has a terminal: {text}"
    );
    assert_eq!(out.status.code(), Some(5), "{text}");

    let (code, _, err) = env
        .run(&["exec", "shell", "-c", "nope", "--", "true"])
        .await;
    assert_ne!(code, 0);
    assert!(
        err.contains("container nope is not valid for pod shell"),
        "{err}"
    );
    let (code, _, err) = env.run(&["exec", "missing", "--", "true"]).await;
    assert_ne!(code, 0);
    assert!(err.contains("pods \"missing\" not found"), "{err}");
    env.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cp_copies_files_in_and_out() {
    let env = Env::start(222).await;
    env.sleeper("box").await;
    let dir = env.cluster.dir.path().to_path_buf();
    let local = dir.join("in.txt");
    let body: String = (0..2000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(&local, &body).unwrap();
    let remote_dir = dir.join("inside");
    std::fs::create_dir_all(&remote_dir).unwrap();
    let remote = remote_dir.join("copied.txt");
    env.ok(&[
        "cp",
        local.to_str().unwrap(),
        &format!("default/box:{}", remote.display()),
    ])
    .await;
    let got = env
        .ok(&["exec", "box", "--", "cat", remote.to_str().unwrap()])
        .await;
    assert_eq!(got, body);
    let back = dir.join("back.txt");
    env.ok(&[
        "cp",
        &format!("default/box:{}", remote.display()),
        back.to_str().unwrap(),
    ])
    .await;
    assert_eq!(std::fs::read_to_string(&back).unwrap(), body);
    env.cluster.stop().await;
}

/// Starts `kubectl port-forward pod :port`; returns the child and the
/// local port it listens on.
async fn forward(
    env: &Env,
    pod: &str,
    port: u16,
    envs: &[(&str, &str)],
) -> (
    tokio::process::Child,
    u16,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
) {
    let mut c = env.cmd(&["port-forward", pod, &format!(":{port}")]);
    c.envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("kubectl port-forward runs");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let local = tokio::time::timeout(PATIENCE, async {
        while let Some(line) = lines.next_line().await.expect("read") {
            // "Forwarding from 127.0.0.1:41234 -> 8080"
            if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                return rest
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .parse::<u16>()
                    .unwrap();
            }
        }
        panic!("kubectl port-forward ended before forwarding");
    })
    .await
    .expect("port-forward is ready in time");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, local, stderr)
}

async fn echo_round(local: u16, payload: &[u8]) -> Vec<u8> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", local))
        .await
        .expect("connect to kubectl");
    s.write_all(payload).await.unwrap();
    let mut got = vec![0u8; payload.len()];
    tokio::time::timeout(PATIENCE, s.read_exact(&mut got))
        .await
        .expect("echo in time")
        .expect("echo");
    got
}

/// A pod `name` running a TCP echo server on `port` (all addresses).
async fn echo_pod(env: &Env, name: &str, port: u16) {
    let py = kubelet_common::python();
    env.cluster
        .create_pod(&format!(
            r#"
metadata: {{name: {name}}}
spec:
  containers:
  - name: main
    image: busybox
    command: [{py}, -c]
    args:
    - |
      import socket, threading
      s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      s.bind(("0.0.0.0", {port})); s.listen(64)
      def serve(c):
          while True:
              d = c.recv(65536)
              if not d: break
              c.sendall(d)
          c.close()
      while True:
          c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"#
        ))
        .await;
    env.cluster
        .wait_pod(name, "Running", |p| phase(p) == "Running")
        .await;
    // The server is up once it accepts on the pod's side.
    let pod_ip = env
        .cluster
        .wait_pod(name, "an IP", |p| {
            p.status.as_ref().and_then(|s| s.pod_ip.clone()).is_some()
        })
        .await
        .status
        .unwrap()
        .pod_ip
        .unwrap();
    eventually_async("the echo server listens", async || {
        (tokio::net::TcpStream::connect((pod_ip.as_str(), port))
            .await
            .is_ok()
            || tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok())
        .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn port_forward_carries_traffic_both_ways_and_reports_closed_ports() {
    let env = Env::start(223).await;
    let port = free_port();
    echo_pod(&env, "echo", port).await;
    for (label, envs) in [
        ("websocket", vec![]),
        ("spdy", vec![("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")]),
    ] {
        let (mut child, local, mut _stderr) = forward(&env, "echo", port, &envs).await;
        if tokio::net::TcpStream::connect(("127.0.0.1", local))
            .await
            .is_err()
        {
            child.kill().await.unwrap();
            let mut rest = String::new();
            while let Ok(Some(l)) = _stderr.next_line().await {
                rest.push_str(&l);
                rest.push('\n');
            }
            panic!("{label}: kubectl does not listen on {local}: {rest}");
        }
        for round in 0..5u8 {
            let payload: Vec<u8> = (0..100_000u32)
                .map(|i| (i as u8).wrapping_add(round))
                .collect();
            assert_eq!(
                echo_round(local, &payload).await,
                payload,
                "{label} round {round}"
            );
        }
        child.kill().await.unwrap();
    }
    // Nobody listens on the other port: kubectl reports the kubelet's error.
    let closed = free_port();
    let (mut child, local, mut stderr) = forward(&env, "echo", closed, &[]).await;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", local))
        .await
        .unwrap();
    let _ = s.write_all(b"hi").await;
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(PATIENCE, s.read(&mut buf))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0, "a closed port gives no data");
    let line = tokio::time::timeout(PATIENCE, async {
        while let Some(l) = stderr.next_line().await.unwrap() {
            if l.contains("failed to connect to") {
                return l;
            }
        }
        panic!("no error from kubectl");
    })
    .await
    .expect("error in time");
    assert!(
        line.contains(&format!("error forwarding port {closed}")) && line.contains("refused"),
        "{line}"
    );
    child.kill().await.unwrap();
    let (code, _, err) = env.run(&["port-forward", "echo", "70000"]).await;
    assert_ne!(code, 0, "{err}");
    env.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exec_needs_create_on_pods_exec() {
    let env = Env::start(224).await;
    env.sleeper("guarded").await;
    // kubectl's generators send protobuf for these kinds; they are made
    // through the API as JSON.
    env.cluster
        .create::<ServiceAccount>("metadata: {name: viewer}")
        .await;
    env.cluster
        .create::<Role>(
            "metadata: {name: reader}\nrules: [{apiGroups: [''], resources: [pods], verbs: [get, list]}]",
        )
        .await;
    env.cluster
        .create::<RoleBinding>(
            "metadata: {name: reader}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}\nsubjects: [{kind: ServiceAccount, name: viewer, namespace: default}]",
        )
        .await;
    let token = env
        .ok(&["create", "token", "viewer"])
        .await
        .trim()
        .to_string();
    let as_viewer = ["--token", token.as_str()];
    let (code, _, err) = env
        .run(&[&as_viewer[..], &["exec", "guarded", "--", "true"]].concat())
        .await;
    assert_ne!(code, 0);
    assert!(
        err.contains("cannot create resource \"pods/exec\""),
        "{err}"
    );
    let (code, _, err) = env
        .run(&[&as_viewer[..], &["port-forward", "guarded", "1234"]].concat())
        .await;
    assert_ne!(code, 0);
    assert!(err.contains("pods/portforward"), "{err}");
    env.cluster
        .create::<Role>(
            "metadata: {name: execer}\nrules: [{apiGroups: [''], resources: [pods/exec], verbs: [create]}]",
        )
        .await;
    env.cluster
        .create::<RoleBinding>(
            "metadata: {name: execer}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: execer}\nsubjects: [{kind: ServiceAccount, name: viewer, namespace: default}]",
        )
        .await;
    let out = eventually_ok("the role applies", async || {
        let (code, out, err) = env
            .run(
                &[
                    &as_viewer[..],
                    &["exec", "guarded", "--", "echo", "allowed"],
                ]
                .concat(),
            )
            .await;
        if code == 0 { Ok(out) } else { Err(err) }
    })
    .await;
    assert_eq!(out, "allowed\n");
    env.cluster.stop().await;
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// `sleep <marker>` processes (the exec'd commands, not the kubectls).
fn processes_with(marker: &str) -> usize {
    let want = format!("sleep\0{marker}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| c == want.as_bytes())
                .unwrap_or(false)
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_sessions_are_bounded_and_leak_nothing() {
    let env = Env::start(225).await;
    env.sleeper("busy").await;
    // Warm up once so lazily opened descriptors are counted in the baseline.
    env.ok(&["exec", "busy", "--", "true"]).await;
    let baseline = open_fds();
    let marker = "4321.5";
    let mut held = Vec::new();
    for _ in 0..16 {
        let mut c = env.cmd(&["exec", "busy", "--", "sleep", marker]);
        c.stdout(Stdio::null()).stderr(Stdio::null());
        held.push(c.spawn().unwrap());
    }
    eventually("16 sessions run", || processes_with(marker) >= 16).await;
    let (code, _, err) = env.run(&["exec", "busy", "--", "true"]).await;
    assert_ne!(code, 0);
    assert!(err.contains("already has 16"), "{err}");
    for mut c in held {
        c.kill().await.unwrap();
    }
    eventually("the commands are gone", || processes_with(marker) == 0).await;
    eventually("descriptors are released", || open_fds() <= baseline + 4).await;
    // Slots are free again.
    assert_eq!(
        env.ok(&["exec", "busy", "--", "echo", "again"]).await,
        "again\n"
    );
    // Port-forwarded connections leave no descriptor or thread behind
    // either.
    let threads = || {
        std::fs::read_dir("/proc/self/task")
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let port = free_port();
    echo_pod(&env, "echo", port).await;
    let thread_baseline = threads();
    let baseline = open_fds();
    let (mut child, local, _stderr) = forward(&env, "echo", port, &[]).await;
    for i in 0..20u8 {
        assert_eq!(echo_round(local, &[i; 1000]).await, [i; 1000]);
    }
    child.kill().await.unwrap();
    eventually("descriptors are released after port-forward", || {
        open_fds() <= baseline + 4
    })
    .await;
    eventually("no thread is left behind", || {
        threads() <= thread_baseline + 2
    })
    .await;
    env.cluster.stop().await;
}

/// A pod whose container runs in network and UTS namespaces of its own
/// (made by the container itself with `unshare`, as the kubelet will do for
/// every pod): exec joins them, and port-forward reaches a listener bound
/// to 127.0.0.1 inside, as on a real cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exec_and_port_forward_enter_the_pods_network_namespace() {
    let env = Env::start(226).await;
    let port = free_port();
    let py = kubelet_common::python();
    env.cluster
        .create_pod(&format!(
            r#"
metadata: {{name: isolated}}
spec:
  containers:
  - name: main
    image: busybox
    command: [unshare, --net, --uts, sh, -c]
    args:
    - |
      ip link set lo up && hostname isolated-host && exec {py} -c '
      import socket, threading
      s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      s.bind(("127.0.0.1", {port})); s.listen(8)
      def serve(c):
          while True:
              d = c.recv(65536)
              if not d: break
              c.sendall(d)
          c.close()
      while True:
          c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
      '
"#
        ))
        .await;
    env.cluster
        .wait_pod("isolated", "Running", |p| phase(p) == "Running")
        .await;
    // exec runs in the container's UTS and network namespaces.
    let out = eventually_ok("the listener is up inside", async || {
        let (code, out, err) = env
            .run(&[
                "exec",
                "isolated",
                "--",
                "sh",
                "-c",
                &format!("hostname; grep -c ':{port:04X} 00000000:0000 0A' /proc/net/tcp"),
            ])
            .await;
        if code == 0 { Ok(out) } else { Err(err) }
    })
    .await;
    assert_eq!(out, "isolated-host\n1\n");
    let (mut child, local, _stderr) = forward(&env, "isolated", port, &[]).await;
    let payload: Vec<u8> = (0..50_000u32).map(|i| i as u8).collect();
    assert_eq!(echo_round(local, &payload).await, payload);
    child.kill().await.unwrap();
    env.cluster.stop().await;
}

/// `kubectl attach` shows what the container writes from then on (the
/// process kubelet's containers have no stdin).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn attach_shows_the_containers_output() {
    let env = Env::start(227).await;
    env.cluster
        .create_pod(
            r#"
metadata: {name: ticker}
spec:
  containers:
  - name: main
    image: busybox
    command: [sh, -c, 'i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done']
"#,
        )
        .await;
    env.cluster
        .wait_pod("ticker", "Running", |p| phase(p) == "Running")
        .await;
    let mut child = env
        .cmd(&["attach", "ticker", "-c", "main"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl attach runs");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(PATIENCE, async {
        while let Some(l) = lines.next_line().await.expect("read") {
            if l.starts_with("tick ") {
                return l;
            }
        }
        panic!("kubectl attach ended without output");
    })
    .await
    .expect("output in time");
    assert!(line.starts_with("tick "), "{line}");
    child.kill().await.unwrap();
    env.cluster.stop().await;
}
