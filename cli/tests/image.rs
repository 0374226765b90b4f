//! The hostmesh image under a real OCI runtime (podman with runc, not the
//! process kubelet), the way a cluster uses it:
//!
//! - the image (built by `image/build.sh`, FROM scratch around the static
//!   binary) answers `hostmesh --version` and runs as 65532:65532 with
//!   `hostmesh` on its PATH;
//! - as the `hostmesh-install` init container it copies the agent (the
//!   agent-only build, at most 16 MB) into a
//!   shared volume (`hostmesh install-agent --to /hostmesh/bin/hostmesh`,
//!   non-root, no capabilities);
//! - that copy then runs as the host container's command in three foreign
//!   root filesystems: nothing at all (no libc, no shell), busybox only
//!   (static, Alpine-like, no shared libc), and glibc (the host's loader,
//!   libc and dash). In each, `/healthz` answers on the health port, the agent
//!   dials its supervisor by a name only `/etc/hosts` knows (the static
//!   binary's own resolver, hostmesh-net), and procs it spawns are reported
//!   to that supervisor with their exit codes and their output is forwarded.
//!
//! Needs podman and runc. Skipped (with a message) only when podman is
//! missing and `CI` is unset; under `CI` a missing podman fails. The image
//! is `HOSTMESH_TEST_IMAGE` when set (CI builds it first), else this test
//! runs `image/build.sh` (a static release build: minutes the first time).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hostmesh_agent::protocol::{AgentPush, CreateOrUpdate, ProcPhase, ProcSpec};
use hostmesh_agent::{AgentClient, AgentEvent, AgentEventKind, ClientConfig};
use hostmesh_testkit::http::free_port;
use tokio::sync::mpsc;

const SECRET: &[u8] = b"hostmesh-image-test-secret-0123456789";
const SUPERVISOR_NAME: &str = "supervisor.hostmesh.test";
const WAIT: Duration = Duration::from_secs(60);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Whether this test can run: podman present, or a failure under `CI`.
fn podman_present() -> bool {
    let ok = Command::new("podman")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but podman is missing: apt-get install -y podman runc (.ci/run does)"
        );
        #[allow(clippy::print_stderr)]
        {
            eprintln!(
                "SKIPPED: podman is not installed (apt-get install -y podman runc); set CI=1 to make this a failure"
            );
        }
    }
    ok
}

/// `podman ARGS` with the OCI runtime this machine needs; panics with the
/// output unless it succeeds.
fn podman(args: &[&str]) -> Output {
    let out = podman_raw(args);
    assert!(
        out.status.success(),
        "podman {} failed ({}):\n{}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn podman_raw(args: &[&str]) -> Output {
    Command::new("podman")
        .args(["--runtime", "runc"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run podman")
}

/// `podman run` flags every container here gets (runc on this machine's
/// cgroups needs explicit limits; host network on loopback only).
const RUN: &[&str] = &[
    "run",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
    "--network",
    "host",
];

/// The image under test, built once per test process (and serialized
/// across processes by a lock file, since nextest runs tests in parallel).
fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        if let Ok(image) = std::env::var("HOSTMESH_TEST_IMAGE")
            && !image.is_empty()
        {
            return image;
        }
        let tag = "localhost/hostmesh:image-test";
        let lock_path = root().join("target/image-test.lock");
        std::fs::create_dir_all(lock_path.parent().unwrap()).unwrap();
        let lock = std::fs::File::create(&lock_path).unwrap();
        lock.lock().unwrap();
        let out = Command::new("bash")
            .arg(root().join("image/build.sh"))
            .arg(tag)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .expect("run image/build.sh");
        assert!(
            out.status.success(),
            "image/build.sh failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        tag.to_string()
    })
}

#[test]
fn image_reports_its_version_and_runs_as_non_root_with_hostmesh_on_path() {
    if !podman_present() {
        return;
    }
    let image = image();
    let mut args = RUN.to_vec();
    args.extend(["--rm", image, "--version"]);
    let out = podman(&args);
    let version = String::from_utf8_lossy(&out.stdout);
    let want = format!("hostmesh {} (git ", env!("CARGO_PKG_VERSION"));
    assert!(version.starts_with(&want), "{version}");
    assert!(!version.contains("(git )"), "{version}");

    let inspect = podman(&[
        "image",
        "inspect",
        image,
        "--format",
        "{{.Config.User}}|{{json .Config.Entrypoint}}|{{json .Config.Env}}|{{index .Config.Labels \"org.opencontainers.image.version\"}}|{{index .Config.Labels \"org.opencontainers.image.source\"}}|{{index .Config.Labels \"org.opencontainers.image.revision\"}}",
    ]);
    let text = String::from_utf8_lossy(&inspect.stdout).trim().to_string();
    let f: Vec<&str> = text.split('|').collect();
    assert_eq!(f[0], "65532:65532", "{text}");
    assert_eq!(f[1], r#"["/usr/local/bin/hostmesh"]"#, "{text}");
    assert!(f[2].contains("PATH=/usr/local/bin"), "{text}");
    assert_eq!(f[3], env!("CARGO_PKG_VERSION"), "{text}");
    assert_eq!(f[4], "https://github.com/hostmesh/hostmesh", "{text}");
    assert!(!f[5].is_empty(), "{text}");

    // `hostmesh` by name (the init container's command) finds the binary.
    let mut args = RUN.to_vec();
    args.extend(["--rm", "--entrypoint", "hostmesh", image, "crds"]);
    let out = podman(&args);
    assert!(String::from_utf8_lossy(&out.stdout).contains("kind: CustomResourceDefinition"));
}

/// `hostmesh status` inside the image (no libc, no /etc/nsswitch.conf)
/// reaches an API server that its kubeconfig names by a host name only the
/// container's `/etc/hosts` knows: the Kubernetes client resolves through
/// hostmesh-net, and sends the name as its Host.
#[test]
fn status_in_the_image_reaches_an_api_server_named_in_its_hosts_file() {
    use std::io::{Read as _, Write as _};
    if !podman_present() {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // One request: record its Host, answer as an API server that has no
    // such World.
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(WAIT)).unwrap();
        let mut req = Vec::new();
        let mut buf = [0u8; 4096];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).unwrap();
            assert!(n > 0, "request cut short");
            req.extend_from_slice(&buf[..n]);
        }
        let body = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"worlds.hostmesh.dev \"trainer\" not found","reason":"NotFound","details":{"name":"trainer","group":"hostmesh.dev","kind":"worlds"},"code":404}"#;
        let _ = conn.write_all(
            format!(
                "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
        let text = String::from_utf8_lossy(&req).to_lowercase();
        text.lines()
            .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
            .unwrap_or_default()
    });
    let dir = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(
        dir.path().join("config"),
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster: {{server: \"http://api.hostmesh.test:{port}\"}}\nusers:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u, namespace: ml}}\n"
        ),
    )
    .unwrap();
    let mount = format!("{}:/kube:ro", dir.path().display());
    let mut args = RUN.to_vec();
    args.extend([
        "--rm",
        "--add-host",
        "api.hostmesh.test:127.0.0.1",
        "-v",
        &mount,
        image(),
        "status",
        "world/trainer",
        "--kubeconfig",
        "/kube/config",
    ]);
    let out = podman_raw(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("not found"), "{stderr}");
    assert_eq!(server.join().unwrap(), format!("api.hostmesh.test:{port}"));
}

/// A temporary directory others may write to (an emptyDir is 0777).
fn shared_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// Runs the image as the `hostmesh-install` init container does (the
/// operator's pod builder): its command, user 65532, no capabilities, no
/// privilege escalation, read-only root; returns the volume holding the
/// agent.
fn install_agent() -> tempfile::TempDir {
    let vol = shared_dir();
    let mount = format!("{}:/hostmesh/bin", vol.path().display());
    let mut args = RUN.to_vec();
    args.extend([
        "--rm",
        "--user",
        "65532:65532",
        "--cap-drop",
        "all",
        "--security-opt",
        "no-new-privileges",
        "--read-only",
        "-v",
        &mount,
        "--entrypoint",
        "hostmesh",
        image(),
        "install-agent",
        "--to",
        "/hostmesh/bin/hostmesh",
    ]);
    podman(&args);
    let agent = vol.path().join("hostmesh");
    let meta = std::fs::metadata(&agent).expect("install-agent wrote the agent");
    assert!(meta.len() > 1_000_000, "{meta:?}");
    // The agent-only build (`/usr/local/bin/hostmesh-agent`), not the
    // full binary: what every host pod holds is at most 16 MB.
    assert!(
        meta.len() <= 16 << 20,
        "install-agent copied {} bytes: not the agent-only build",
        meta.len()
    );
    vol
}

/// A root filesystem image built FROM scratch out of `files` (path inside,
/// source on this machine) and `links` (path inside, target).
fn rootfs_image(kind: &str, files: &[(&str, PathBuf)], links: &[(&str, &str)]) -> String {
    let ctx = tempfile::tempdir().unwrap();
    let rootfs = ctx.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("tmp")).unwrap();
    for (inside, src) in files {
        let dst = rootfs.join(inside.trim_start_matches('/'));
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(src, &dst).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
    }
    for (inside, target) in links {
        let dst = rootfs.join(inside.trim_start_matches('/'));
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, &dst).unwrap();
    }
    let copy = if files.is_empty() && links.is_empty() {
        ""
    } else {
        "COPY rootfs/ /\n"
    };
    std::fs::write(
        ctx.path().join("Containerfile"),
        format!("FROM scratch\nLABEL org.hostmesh.test.rootfs={kind}\n{copy}"),
    )
    .unwrap();
    let tag = format!("localhost/hostmesh-test-rootfs:{kind}");
    podman(&[
        "build",
        "--quiet",
        "--tag",
        &tag,
        ctx.path().to_str().unwrap(),
    ]);
    tag
}

/// A container this test started; removed (by name) when dropped, after
/// printing its logs if the test is failing.
struct Container {
    name: String,
}

impl Container {
    fn logs(&self) -> String {
        let out = podman_raw(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking() {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("--- logs of {} ---\n{}", self.name, self.logs());
            }
        }
        let _ = podman_raw(&["rm", "--force", "--time", "2", &self.name]);
    }
}

/// What one proc is expected to end with.
struct Expect {
    name: &'static str,
    spec: ProcSpec,
    exit_code: i32,
    /// Text in the agent's stdout (the forwarded output) or the stderr tail.
    output: &'static str,
}

/// Starts the agent from `vol` as the command of a container of `image`
/// (as the operator rewrites the host container), then checks health,
/// the supervisor dial by name, and that every proc's exit code and output
/// come back.
async fn agent_runs_in(kind: &str, image: &str, procs: Vec<Expect>) {
    let vol = install_agent();
    let secret_dir = tempfile::tempdir().unwrap();
    std::fs::write(secret_dir.path().join("token"), SECRET).unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(secret_dir.path(), std::fs::Permissions::from_mode(0o755))
            .unwrap();
    }

    // The supervisor: an AgentClient listening on loopback, which the
    // agent dials by a name only the container's /etc/hosts knows.
    let sup_port = free_port();
    let (tx, mut events) = mpsc::channel::<AgentEvent>(4096);
    let client = AgentClient::new(
        &format!("image-test-{kind}"),
        SECRET,
        ClientConfig {
            listen: Some(format!("127.0.0.1:{sup_port}").parse().unwrap()),
            ..ClientConfig::default()
        },
        tx,
    )
    .await
    .unwrap();

    let port = free_port();
    let health = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let name = format!("hostmesh-image-test-{kind}-{}", std::process::id());
    let _ = podman_raw(&["rm", "--force", &name]);
    let bin_mount = format!("{}:/hostmesh/bin:ro", vol.path().display());
    let secret_mount = format!(
        "{}:/var/run/hostmesh/secret:ro",
        secret_dir.path().display()
    );
    let add_host = format!("{SUPERVISOR_NAME}:127.0.0.1");
    let env = [
        "HOSTMESH_WORLD=w".to_string(),
        "HOSTMESH_NAMESPACE=default".to_string(),
        "HOSTMESH_HOST_RANK=0".to_string(),
        format!("HOSTMESH_LISTEN={addr}"),
        format!("HOSTMESH_HEALTH_PORT={health}"),
        format!("HOSTMESH_SUPERVISOR={SUPERVISOR_NAME}:{sup_port}"),
        "HOSTMESH_HEARTBEAT_INTERVAL=200ms".to_string(),
    ];
    let mut args = RUN.to_vec();
    args.extend([
        "--detach",
        "--name",
        &name,
        "--add-host",
        &add_host,
        "-v",
        &bin_mount,
        "-v",
        &secret_mount,
    ]);
    for e in &env {
        args.extend(["--env", e]);
    }
    args.extend(["--entrypoint", "/hostmesh/bin/hostmesh", image, "agent"]);
    podman(&args);
    let container = Container { name };

    // Health, as the kubelet's probe sees it.
    let start = Instant::now();
    loop {
        if let Some((200, _)) = hostmesh_testkit::http::get(("127.0.0.1", health), "/healthz").await
        {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "[{kind}] /healthz never answered 200; logs:\n{}",
            container.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The agent dialed the supervisor by name: its first push is a Snapshot.
    let snapshot = tokio::time::timeout(WAIT, async {
        loop {
            let ev = events.recv().await.expect("event channel open");
            if let AgentEventKind::Push(AgentPush::Snapshot { agent_addr, .. }) = ev.kind {
                return agent_addr;
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "[{kind}] no snapshot from the agent's own dial to {SUPERVISOR_NAME}; logs:\n{}",
            container.logs()
        )
    });
    assert_eq!(snapshot, addr.to_string(), "[{kind}]");

    for p in &procs {
        let req = CreateOrUpdate {
            name: p.name.to_string(),
            rank: 0,
            spec: p.spec.clone(),
            incarnation: 0,
        };
        client
            .create_or_update(addr, req)
            .await
            .unwrap_or_else(|e| panic!("[{kind}] create {}: {e}", p.name));
    }
    // Final statuses as the supervisor receives them, in whatever order the
    // procs end.
    let mut ended: HashMap<String, ProcPhase> = HashMap::new();
    let all_ended = tokio::time::timeout(WAIT, async {
        while procs.iter().any(|p| !ended.contains_key(p.name)) {
            let ev = events.recv().await.expect("event channel open");
            if let AgentEventKind::Push(AgentPush::Changed(c)) = ev.kind
                && c.state.status.is_terminal()
            {
                ended.insert(c.state.name, c.state.status);
            }
        }
    })
    .await;
    assert!(
        all_ended.is_ok(),
        "[{kind}] not every proc ended ({:?} did); logs:\n{}",
        ended.keys().collect::<Vec<_>>(),
        container.logs()
    );
    for p in &procs {
        let status = &ended[p.name];
        match status {
            ProcPhase::Stopped {
                exit_code,
                stderr_tail,
            } => {
                assert_eq!(*exit_code, p.exit_code, "[{kind}] {}: {status:?}", p.name);
                let logs = container.logs();
                assert!(
                    logs.contains(p.output) || stderr_tail.iter().any(|l| l.contains(p.output)),
                    "[{kind}] {}: {:?} in neither the stderr tail {stderr_tail:?} nor the logs:\n{logs}",
                    p.name,
                    p.output
                );
            }
            other => panic!("[{kind}] {}: expected Stopped, got {other:?}", p.name),
        }
    }
    drop(container);
    drop(client);
}

fn sh(script: &str) -> ProcSpec {
    ProcSpec::command("sh", &["-c", script])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_runs_in_an_empty_root_filesystem_without_libc() {
    if !podman_present() {
        return;
    }
    let image = rootfs_image("empty", &[], &[]);
    // Nothing to run but the agent itself.
    let agent = "/hostmesh/bin/hostmesh";
    agent_runs_in(
        "empty",
        &image,
        vec![
            Expect {
                name: "version",
                spec: ProcSpec::command(agent, &["--version"]),
                exit_code: 0,
                // What install-agent installed is the agent-only build.
                output: "[default/0] hostmesh-agent ",
            },
            Expect {
                name: "usage-error",
                spec: ProcSpec::command(agent, &["no-such-subcommand"]),
                exit_code: 2,
                output: "no-such-subcommand",
            },
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_runs_in_a_busybox_root_filesystem() {
    if !podman_present() {
        return;
    }
    let busybox = Path::new("/bin/busybox");
    assert!(
        busybox.exists(),
        "needs a static busybox at /bin/busybox (apt-get install -y busybox-static)"
    );
    let image = rootfs_image(
        "busybox",
        &[("/bin/busybox", busybox.to_path_buf())],
        &[("/bin/sh", "busybox"), ("/bin/echo", "busybox")],
    );
    agent_runs_in(
        "busybox",
        &image,
        vec![Expect {
            name: "shell",
            spec: sh("echo hello from busybox; echo to stderr >&2; exit 7"),
            exit_code: 7,
            output: "[default/0] hello from busybox",
        }],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_runs_in_a_glibc_root_filesystem() {
    if !podman_present() {
        return;
    }
    // This machine's dynamic loader, libc and dash: a minimal glibc image.
    let lib = Path::new("/lib/x86_64-linux-gnu");
    let files = [
        (
            "/lib64/ld-linux-x86-64.so.2",
            PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
        ),
        ("/lib/x86_64-linux-gnu/libc.so.6", lib.join("libc.so.6")),
        ("/bin/dash", PathBuf::from("/bin/dash")),
    ];
    for (_, src) in &files {
        assert!(
            src.exists(),
            "needs {} (a glibc x86_64 host)",
            src.display()
        );
    }
    let image = rootfs_image("glibc", &files, &[("/bin/sh", "dash")]);
    agent_runs_in(
        "glibc",
        &image,
        vec![Expect {
            name: "shell",
            spec: sh("echo hello from glibc; exit 9"),
            exit_code: 9,
            output: "[default/0] hello from glibc",
        }],
    )
    .await;
}
