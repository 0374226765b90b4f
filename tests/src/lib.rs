//! The end-to-end harness. A test gets an [`Env`]: a cluster, a fresh
//! namespace, and a `hostmesh operator` process it can kill and restart.
//!
//! - With no `KUBECONFIG` in the environment, the cluster is the embedded one:
//!   `hostmesh apiserver` and `hostmesh kubelet` run as child processes.
//! - With `KUBECONFIG` set, the tests run unchanged against that cluster
//!   ([`Placement`]): by default the pods run on the cluster's own nodes
//!   from real images ([`Images`]: the hostmesh image for the operator's
//!   agent install container and the chart, busybox for host pods, a
//!   Monarch image for Monarch's workers and clients), and the operator runs
//!   locally for the test's namespace only. With
//!   `HOSTMESH_E2E_NODES=process-kubelet`, a process kubelet joins the
//!   cluster as a tainted Node instead and the Worlds the tests create select
//!   that Node ([`Env::pin_to_node`]).
//! - Either way, tests that inject faults signal agents and procs by PID
//!   and read files the procs write ([`Env::shared_dir`]): the cluster's node
//!   must be this machine (a single-node cluster such as
//!   `../shared/realk8s`; docs/testing.md).
//!
//! - On the embedded cluster `hostmesh controller-manager` also runs, so
//!   Deployments (the Helm chart's operator) get ReplicaSets and pods.
//! - [`Env::start_without_operator`] starts no operator of its own (the Helm
//!   test runs the one the chart deploys).
//! - [`Env::start_with_options`] can serve Monarch's MonarchMesh and put
//!   directories first on the kubelet's (so the pods') `PATH`.
//!
//! Every child process is killed when the [`Env`] drops (the kubelet first
//! stops the pods' processes), so a failing test leaves nothing behind.
//!
//! Suites that run the controllers in their own process against an
//! embedded API server (the operator's, the CLI's causal test, the
//! benchmarks) start them and their agents with [`inproc`].

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};

pub mod chart;
pub mod inproc;
pub mod monarch;

/// How long any single wait in the suite may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(120);

/// The taint and node label a process kubelet joining a real cluster carries.
pub const NODE_TAINT: &str = "hostmesh.dev/process-kubelet";

/// Where the pods of a test run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The embedded cluster this suite starts: `hostmesh apiserver`, a
    /// process kubelet and `hostmesh controller-manager`.
    Embedded,
    /// The cluster in `KUBECONFIG`, on its own nodes (kubelet and a
    /// container runtime), from the images of [`Images`].
    ClusterNodes,
    /// The cluster in `KUBECONFIG`, on a process kubelet this suite joins
    /// to it as a tainted Node (`HOSTMESH_E2E_NODES=process-kubelet`).
    ProcessKubelet,
}

impl Placement {
    /// From the environment: embedded without `KUBECONFIG`; with it,
    /// `HOSTMESH_E2E_NODES` (`cluster`, the default, or `process-kubelet`).
    pub fn from_env() -> anyhow::Result<Placement> {
        if std::env::var_os("KUBECONFIG").is_none() {
            return Ok(Placement::Embedded);
        }
        match std::env::var("HOSTMESH_E2E_NODES").as_deref() {
            Err(_) | Ok("" | "cluster") => Ok(Placement::ClusterNodes),
            Ok("process-kubelet") => Ok(Placement::ProcessKubelet),
            Ok(other) => bail!(
                "HOSTMESH_E2E_NODES={other:?}: use `cluster` (pods on the cluster's nodes) or `process-kubelet`"
            ),
        }
    }
}

/// The images the tests' pods run on a cluster's own nodes
/// ([`Placement::ClusterNodes`]). Tests write the placeholders `busybox`,
/// `monarch`, `monarch-client` and `monarch:e2e`, and the chart's default
/// image; [`Env::apply`] and [`Env::image`] put these in their place (the
/// process kubelet runs every image's command as a local program, so on
/// the embedded cluster the placeholders stay).
#[derive(Debug, Clone)]
pub struct Images {
    /// The hostmesh image (`image/build.sh`): the operator's agent install
    /// container and the chart's operator. `HOSTMESH_TEST_IMAGE`.
    pub hostmesh: Option<String>,
    /// A busybox image for host pods. `HOSTMESH_E2E_BUSYBOX_IMAGE`, default
    /// `busybox:1.36`.
    pub busybox: String,
    /// An image with Python, Monarch and the Kubernetes client at the paths
    /// of this machine's Monarch venv (`tests/images/monarch.sh`).
    /// `HOSTMESH_E2E_MONARCH_IMAGE`.
    pub monarch: Option<String>,
    /// The same for the next Monarch (`MONARCH_VARIANT=next
    /// tests/images/monarch.sh`). `HOSTMESH_E2E_MONARCH_NEXT_IMAGE`.
    pub monarch_next: Option<String>,
}

impl Images {
    /// From the environment variables above.
    pub fn from_env() -> Images {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Images {
            hostmesh: var("HOSTMESH_TEST_IMAGE"),
            busybox: var("HOSTMESH_E2E_BUSYBOX_IMAGE").unwrap_or_else(|| "busybox:1.36".into()),
            monarch: var("HOSTMESH_E2E_MONARCH_IMAGE"),
            monarch_next: var("HOSTMESH_E2E_MONARCH_NEXT_IMAGE"),
        }
    }
}

/// What a test's cluster runs besides the defaults ([`Env::start_with_options`]).
#[derive(Debug, Clone, Default)]
pub struct EnvOptions {
    /// Serve Monarch's MonarchMesh: install its CRD (`hostmesh crds
    /// --monarch-mesh`) and start operators with `--serve-monarch-mesh`.
    pub serve_monarch_mesh: bool,
    /// Directories put first on the kubelet's `PATH`, which containers
    /// inherit (so a worker command's `python` is a test venv's).
    pub kubelet_path: Vec<PathBuf>,
    /// Run the embedded API server with `--data-dir` on a fixed port, so
    /// [`Env::stop_apiserver`] and [`Env::start_apiserver`] can restart it
    /// with the same address, objects and credentials.
    pub restartable_apiserver: bool,
    /// More arguments for `hostmesh apiserver` (`--watch-window 30s`).
    pub apiserver_args: Vec<String>,
    /// `nvidia.com/gpu` devices the process kubelet advertises and hands
    /// out (`--gpu-capacity`; their health: [`Env::set_device_health`]).
    pub gpu_capacity: u32,
}

/// A cluster, a namespace and an operator for one test.
pub struct Env {
    /// Client for the cluster.
    pub client: kube::Client,
    /// The test's own namespace.
    pub namespace: String,
    /// Kubeconfig path (for kubectl).
    pub kubeconfig: PathBuf,
    /// The node the process kubelet registered.
    pub node: String,
    /// Whether this is a real cluster (KUBECONFIG was set).
    pub real_cluster: bool,
    /// Where the test's pods run.
    pub placement: Placement,
    /// The images pods run on a cluster's own nodes.
    pub images: Images,
    dir: tempfile::TempDir,
    apiserver: Option<Child>,
    /// The address a restartable API server listens on.
    apiserver_listen: Option<String>,
    kubelet: Option<Child>,
    controller_manager: Option<Child>,
    /// Operator processes, oldest first.
    operators: Vec<Child>,
    /// The Lease of leader-elected operators ([`LEASE_NAMESPACE`]), removed
    /// on drop.
    lease: Option<String>,
    options: EnvOptions,
}

/// Where leader-elected test operators keep their Lease: not the test's
/// namespace, whose deletion (real-cluster cleanup) would take the Lease
/// from the leader that must finalize the namespace's objects.
pub const LEASE_NAMESPACE: &str = "default";

/// The `hostmesh` binary under test: `HOSTMESH_BIN`, or the one cargo built
/// next to this test executable (or next to a binary such as
/// `hostmesh-bench`, which lives in `target/<profile>/` itself).
pub fn hostmesh_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("HOSTMESH_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/hostmesh
    let dir = exe.parent().expect("an executable lives in a directory");
    let profile_dir = if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    };
    profile_dir.join("hostmesh")
}

impl Env {
    /// Starts (or joins) a cluster and creates a namespace named after `test`.
    pub async fn start(test: &str) -> anyhow::Result<Env> {
        Self::start_with(test, true).await
    }

    /// Like [`Env::start`], but no `hostmesh operator` process is started
    /// (the test deploys its own, e.g. from the Helm chart).
    pub async fn start_without_operator(test: &str) -> anyhow::Result<Env> {
        Self::start_with(test, false).await
    }

    /// Like [`Env::start`], with `options`.
    pub async fn start_with_options(test: &str, options: EnvOptions) -> anyhow::Result<Env> {
        Self::start_full(test, true, options).await
    }

    async fn start_with(test: &str, operator: bool) -> anyhow::Result<Env> {
        Self::start_full(test, operator, EnvOptions::default()).await
    }

    async fn start_full(test: &str, operator: bool, options: EnvOptions) -> anyhow::Result<Env> {
        let dir = tempfile::Builder::new().prefix("hostmesh-e2e-").tempdir()?;
        let bin = hostmesh_bin();
        if !bin.exists() {
            bail!(
                "{} does not exist: build it first (cargo build --bin hostmesh) or set HOSTMESH_BIN",
                bin.display()
            );
        }
        let placement = Placement::from_env()?;
        let real_cluster = placement != Placement::Embedded;
        let images = Images::from_env();
        if placement == Placement::ClusterNodes && images.hostmesh.is_none() {
            bail!(
                "KUBECONFIG is set, so the e2e suite runs its pods on that cluster's nodes: set HOSTMESH_TEST_IMAGE to a hostmesh image they have (image/build.sh, then load it; docs/testing.md), or HOSTMESH_E2E_NODES=process-kubelet to join a process kubelet instead"
            );
        }
        let apiserver_listen = (!real_cluster && options.restartable_apiserver)
            .then(|| format!("127.0.0.1:{}", hostmesh_testkit::http::free_port()));
        let (kubeconfig, apiserver, client) = if real_cluster {
            let path = PathBuf::from(std::env::var_os("KUBECONFIG").unwrap_or_default());
            (path, None, kube::Client::try_default().await?)
        } else {
            let path = dir.path().join("kubeconfig");
            let child = spawn_apiserver(
                &bin,
                dir.path(),
                apiserver_listen.as_deref(),
                &options.apiserver_args,
            )?;
            wait_until("the API server's kubeconfig", || path.exists()).await?;
            let client = client_for(&path).await?;
            (path, Some(child), client)
        };
        let node = match placement {
            Placement::ClusterNodes => ready_node(&client).await?,
            _ => format!("hostmesh-e2e-{}", std::process::id()),
        };
        let mut env = Env {
            client,
            namespace: namespace_for(test),
            kubeconfig,
            node: node.clone(),
            real_cluster,
            placement,
            images,
            dir,
            apiserver,
            apiserver_listen,
            kubelet: None,
            controller_manager: None,
            operators: Vec::new(),
            lease: None,
            options,
        };
        env.install_crds(&bin)?;
        if placement != Placement::ClusterNodes {
            env.start_kubelet(&bin)?;
        }
        if !real_cluster {
            let log = log_file(env.dir.path(), "controller-manager")?;
            env.controller_manager = Some(
                Command::new(&bin)
                    .arg("controller-manager")
                    .env("KUBECONFIG", &env.kubeconfig)
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log)
                    .spawn()
                    .context("starting hostmesh controller-manager")?,
            );
        }
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": env.namespace}}))?;
        Api::all(env.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .context("creating the test namespace")?;
        if operator {
            env.start_operator()?;
        }
        Ok(env)
    }

    /// The log a component wrote (`apiserver`, `kubelet`,
    /// `controller-manager`, `operator`), for
    /// failure messages.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Starts the process kubelet: the embedded cluster's node, or a tainted
    /// Node joining a real cluster ([`Placement::ProcessKubelet`]).
    fn start_kubelet(&mut self, bin: &Path) -> anyhow::Result<()> {
        // Appended: a restarted kubelet ([`Env::restart_kubelet`]) keeps
        // the first one's log.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("kubelet.log"))?;
        let mut kubelet = Command::new(bin);
        kubelet
            .arg("kubelet")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--node-name")
            .arg(&self.node)
            .arg("--data-dir")
            .arg(self.dir.path().join("kubelet"))
            .arg("--agent-binary")
            .arg(bin);
        if self.options.gpu_capacity > 0 {
            kubelet.arg(format!("--gpu-capacity={}", self.options.gpu_capacity));
        }
        if !self.options.kubelet_path.is_empty() {
            let mut dirs = self.options.kubelet_path.clone();
            dirs.extend(std::env::split_paths(
                &std::env::var_os("PATH").unwrap_or_default(),
            ));
            kubelet.env("PATH", std::env::join_paths(dirs)?);
        }
        if self.real_cluster {
            kubelet
                .arg("--bind-unscheduled=false")
                .arg("--taint")
                .arg(NODE_TAINT);
        }
        self.kubelet = Some(
            kubelet
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting hostmesh kubelet")?,
        );
        Ok(())
    }

    fn install_crds(&self, bin: &Path) -> anyhow::Result<()> {
        self.apply_crds(
            bin,
            &[],
            &["crd/worlds.hostmesh.dev", "crd/procmeshes.hostmesh.dev"],
        )?;
        if self.options.serve_monarch_mesh {
            self.apply_crds(
                bin,
                &["--monarch-mesh"],
                &["crd/monarchmeshes.monarch.pytorch.org"],
            )?;
        }
        Ok(())
    }

    /// Applies what `hostmesh crds <args>` prints, server-side, and waits
    /// until `names` are Established.
    fn apply_crds(&self, bin: &Path, args: &[&str], names: &[&str]) -> anyhow::Result<()> {
        let out = Command::new(bin).arg("crds").args(args).output()?;
        if !out.status.success() {
            bail!(
                "hostmesh crds {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let path = self.dir.path().join(format!("crds{}.yaml", args.join("")));
        std::fs::write(&path, &out.stdout)?;
        self.kubectl(&[
            "apply",
            "--server-side",
            "-f",
            path.to_str().unwrap_or_default(),
        ])?;
        let mut wait = vec!["wait", "--for=condition=Established"];
        wait.extend_from_slice(names);
        wait.push("--timeout=60s");
        self.kubectl(&wait).map(drop)
    }

    /// Starts the operator process (again, after [`Env::kill_operator`]).
    pub fn start_operator(&mut self) -> anyhow::Result<()> {
        self.spawn_operator(&[])
    }

    /// Starts the operator process with more arguments (e.g.
    /// `--network-policy`).
    pub fn start_operator_with(&mut self, extra: &[&str]) -> anyhow::Result<()> {
        self.spawn_operator(extra)
    }

    /// Starts an operator replica with leader election, as the chart runs
    /// it (fast timings), on a Lease named after the test in
    /// [`LEASE_NAMESPACE`]: the first replica leads, a later one waits as a
    /// standby until the leader goes. Returns the Lease's name.
    pub fn start_elected_operator(&mut self, identity: &str) -> anyhow::Result<String> {
        let lease = self.namespace.clone();
        self.lease = Some(lease.clone());
        self.spawn_operator(&[
            "--leader-elect",
            "--leader-elect-namespace",
            LEASE_NAMESPACE,
            "--leader-elect-lease",
            &lease,
            "--leader-elect-identity",
            identity,
            "--leader-elect-lease-duration",
            "4s",
            "--leader-elect-renew-deadline",
            "3s",
            "--leader-elect-retry-period",
            "500ms",
        ])?;
        Ok(lease)
    }

    fn spawn_operator(&mut self, extra: &[&str]) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("operator.log"))?;
        // Only the test's namespace: on a shared cluster, the operators of
        // tests running side by side (or one installed there) never meet.
        let child = Command::new(hostmesh_bin())
            .arg("operator")
            .env("KUBECONFIG", &self.kubeconfig)
            .arg("--http-addr")
            .arg("127.0.0.1:0")
            .arg("--watch-namespaces")
            .arg(&self.namespace)
            .args(
                self.options
                    .serve_monarch_mesh
                    .then_some("--serve-monarch-mesh"),
            )
            .args(self.agent_image_args())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting hostmesh operator")?;
        self.operators.push(child);
        Ok(())
    }

    /// Labels the test's namespace (e.g. PodSecurity's
    /// `pod-security.kubernetes.io/enforce`).
    pub async fn label_namespace(&self, labels: &[(&str, &str)]) -> anyhow::Result<()> {
        use k8s_openapi::api::core::v1::Namespace;
        use kube::api::{Patch, PatchParams};
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        Api::<Namespace>::all(self.client.clone())
            .patch(
                &self.namespace,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"labels": labels}})),
            )
            .await?;
        Ok(())
    }

    /// Stops the embedded API server with `signal` (`TERM`, `KILL`) and
    /// waits for it to exit; only with
    /// [`EnvOptions::restartable_apiserver`].
    pub async fn stop_apiserver(&mut self, signal: &str) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.apiserver_listen.is_some(),
            "the API server is restartable only with EnvOptions::restartable_apiserver"
        );
        let mut child = self
            .apiserver
            .take()
            .context("the API server is not running")?;
        crate::signal(i32::try_from(child.id())?, signal)?;
        let start = Instant::now();
        while start.elapsed() < WAIT {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        bail!("the API server did not exit within {WAIT:?} of SIG{signal}")
    }

    /// Starts the API server again after [`Env::stop_apiserver`]: the same
    /// address, data directory and credentials; returns once it answers.
    pub async fn start_apiserver(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.apiserver.is_none(), "the API server is running");
        let listen = self
            .apiserver_listen
            .clone()
            .context("the API server is restartable only with EnvOptions::restartable_apiserver")?;
        self.apiserver = Some(spawn_apiserver(
            &hostmesh_bin(),
            self.dir.path(),
            Some(&listen),
            &self.options.apiserver_args,
        )?);
        let client = self.client.clone();
        hostmesh_testkit::wait::poll(WAIT, async || client.apiserver_version().await.map(drop))
            .await
            .context("the restarted API server does not answer")
    }

    /// The embedded API server's pid (`None` on a real cluster or while it
    /// is stopped).
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.as_ref().map(Child::id)
    }

    /// The pid of the process kubelet this suite started (embedded
    /// cluster, or joined with `HOSTMESH_E2E_NODES=process-kubelet`); none
    /// on a real cluster's own nodes.
    pub fn kubelet_pid(&self) -> Option<i32> {
        self.kubelet
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
    }

    /// SIGKILLs the process kubelet this suite started, as a crash does
    /// (its containers go with it: each has a parent-death signal), and
    /// starts it again on the same node and data directory: it takes its
    /// pods back and starts their containers again, on the same pod IPs.
    pub async fn restart_kubelet(&mut self) -> anyhow::Result<()> {
        let mut child = self
            .kubelet
            .take()
            .context("no process kubelet of this suite runs")?;
        child.kill()?;
        child.wait()?;
        self.start_kubelet(&hostmesh_bin())
    }

    /// The pids of the running operator processes, oldest first.
    pub fn operator_pids(&self) -> Vec<i32> {
        self.operators
            .iter()
            .filter_map(|c| i32::try_from(c.id()).ok())
            .collect()
    }

    /// SIGKILLs every operator process.
    pub fn kill_operator(&mut self) {
        for mut c in self.operators.drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the oldest operator process gracefully (SIGTERM, as a rolling
    /// upgrade stops the old pod) and waits for it to exit.
    pub async fn terminate_oldest_operator(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.operators.is_empty(), "no operator is running");
        let mut c = self.operators.remove(0);
        let signalled = nix_terminate(&c);
        let start = Instant::now();
        while signalled.is_ok() && start.elapsed() < WAIT {
            if let Ok(Some(_)) = c.try_wait() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = c.kill();
        let _ = c.wait();
        signalled?;
        bail!("the operator did not exit within {WAIT:?} of SIGTERM")
    }

    /// Runs kubectl against the cluster, failing with its output on error.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("kubectl")
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .output()
            .context("running kubectl")?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `--agent-image` for an operator whose host pods run on a cluster's
    /// own nodes: the hostmesh image those nodes have.
    fn agent_image_args(&self) -> Vec<String> {
        match (&self.placement, &self.images.hostmesh) {
            (Placement::ClusterNodes, Some(image)) => vec!["--agent-image".into(), image.clone()],
            _ => Vec::new(),
        }
    }

    /// The image that stands for `placeholder` (`busybox`, `monarch`,
    /// `monarch-client`, `monarch:e2e`) where this test's pods run: itself on
    /// the embedded cluster and a process kubelet, the image of [`Images`]
    /// on a cluster's own nodes (an error naming the variable to set when
    /// none is given).
    pub fn image(&self, placeholder: &str) -> anyhow::Result<String> {
        if self.placement != Placement::ClusterNodes {
            return Ok(placeholder.to_owned());
        }
        match placeholder {
            "busybox" => Ok(self.images.busybox.clone()),
            "monarch" | "monarch-client" | "monarch:e2e" => self.images.monarch.clone().context(
                "this test runs Monarch in pods on the cluster's nodes: set HOSTMESH_E2E_MONARCH_IMAGE (tests/images/monarch.sh builds one)",
            ),
            "monarch-next" | "monarch-next:e2e" => self.images.monarch_next.clone().context(
                "this test runs the next Monarch in pods on the cluster's nodes: set HOSTMESH_E2E_MONARCH_NEXT_IMAGE (MONARCH_VARIANT=next tests/images/monarch.sh builds one)",
            ),
            other => Ok(other.to_owned()),
        }
    }

    /// Sets the health the process kubelet reports for its devices
    /// (`allocatedResourcesStatus`), through its test hook: one
    /// `<resource> <device id> <Healthy|Unhealthy|Unknown>` per line, every
    /// device not named `Healthy`. Only where a process kubelet runs the
    /// pods (not [`Placement::ClusterNodes`]: a real kubelet's devices
    /// report their own health).
    pub fn set_device_health(&self, lines: &[&str]) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.kubelet.is_some(),
            "no process kubelet runs this test's pods ({:?}): device health comes from the node's device plugins",
            self.placement
        );
        let dir = self.dir.path().join("kubelet").join("devices");
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join("health.tmp");
        std::fs::write(&tmp, lines.join("\n") + "\n")?;
        std::fs::rename(&tmp, dir.join("health"))?;
        Ok(())
    }

    /// Whether a process kubelet runs this test's pods (so its test hooks,
    /// [`Env::set_device_health`], work).
    pub fn has_process_kubelet(&self) -> bool {
        self.kubelet.is_some()
    }

    /// A directory of this machine that the procs of the Worlds this test
    /// applies afterwards see at the same path (made on first call,
    /// writable by any user): on the embedded cluster the procs are local
    /// processes; on a cluster's own nodes [`Env::apply`] mounts it into
    /// every host container as a `hostPath` volume (so the node must be
    /// this machine, as for the tests that signal processes by PID).
    pub fn shared_dir(&self) -> anyhow::Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = self.dir.path().join("shared");
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777))?;
        Ok(dir)
    }

    /// Applies a YAML manifest into the test namespace, each object made
    /// fit for where the pods run ([`Env::localize`]).
    pub async fn apply(&self, yaml: &str) -> anyhow::Result<()> {
        let mut objects = hostmesh_cli::manifest::parse("test manifest", yaml)?;
        for o in &mut objects {
            self.localize(o)?;
        }
        hostmesh_cli::manifest::apply_all(&self.client, &objects, &self.namespace, "e2e").await?;
        Ok(())
    }

    /// Makes a World fit for where its pods run: on a process kubelet
    /// joined to a cluster, pinned to it ([`Env::pin_to_node`]); on a
    /// cluster's own nodes, its containers' placeholder images replaced
    /// ([`Env::image`]) with `imagePullPolicy: IfNotPresent` where unset
    /// (images are loaded, not pulled), and [`Env::shared_dir`], once
    /// made, mounted into every container.
    pub fn localize(&self, obj: &mut DynamicObject) -> anyhow::Result<()> {
        if obj.types.as_ref().map(|t| t.kind.as_str()) != Some("World") {
            return Ok(());
        }
        match self.placement {
            Placement::Embedded => {}
            Placement::ProcessKubelet => self.pin_to_node(obj),
            Placement::ClusterNodes => {
                let shared = self.dir.path().join("shared");
                let shared = shared.exists().then(|| shared.display().to_string());
                let spec = &mut obj.data["spec"]["template"]["spec"];
                if let Some(containers) = spec["containers"].as_array_mut() {
                    for c in containers {
                        if let Some(image) = c["image"].as_str() {
                            c["image"] = serde_json::json!(self.image(image)?);
                        }
                        if c["imagePullPolicy"].is_null() {
                            c["imagePullPolicy"] = serde_json::json!("IfNotPresent");
                        }
                        if let Some(path) = &shared {
                            push(
                                &mut c["volumeMounts"],
                                serde_json::json!({"name": "e2e-shared", "mountPath": path}),
                            );
                        }
                    }
                }
                if let Some(path) = &shared {
                    push(
                        &mut spec["volumes"],
                        serde_json::json!({"name": "e2e-shared", "hostPath": {"path": path, "type": "Directory"}}),
                    );
                }
            }
        }
        Ok(())
    }

    /// Puts a World's host pods on the process kubelet's node: `nodeName`
    /// (so no scheduler is involved: it works on clusters with or without
    /// one), plus the matching node selector and the taint's toleration.
    pub fn pin_to_node(&self, obj: &mut DynamicObject) {
        if obj.types.as_ref().map(|t| t.kind.as_str()) != Some("World") {
            return;
        }
        let spec = &mut obj.data["spec"]["template"]["spec"];
        spec["nodeName"] = serde_json::json!(self.node);
        spec["nodeSelector"] = serde_json::json!({"kubernetes.io/hostname": self.node});
        spec["tolerations"] =
            serde_json::json!([{"key": NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}]);
    }

    /// A dynamic API for a hostmesh kind in the test namespace.
    pub fn hostmesh_api(&self, kind: &str) -> Api<DynamicObject> {
        let gvk = kube::core::GroupVersionKind::gvk("hostmesh.dev", "v1alpha1", kind);
        let plural = match kind {
            "World" => "worlds",
            _ => "procmeshes",
        };
        let ar = kube::discovery::ApiResource::from_gvk_with_plural(&gvk, plural);
        Api::namespaced_with(self.client.clone(), &self.namespace, &ar)
    }

    /// Polls `kind/name` until `pred` holds on it, failing after [`WAIT`] with
    /// the last status seen.
    pub async fn wait_for(
        &self,
        kind: &str,
        name: &str,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> anyhow::Result<serde_json::Value> {
        let api = self.hostmesh_api(kind);
        let start = Instant::now();
        let mut last = serde_json::Value::Null;
        while start.elapsed() < WAIT {
            if let Some(o) = api.get_opt(name).await? {
                last = o.data.get("status").cloned().unwrap_or_default();
                if pred(&last) {
                    return Ok(last);
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!(
            "{kind} {name}: {what} not reached in {WAIT:?}; last status: {last:#}\n--- operator log (tail) ---\n{}",
            tail(&self.log("operator"), 40)
        )
    }

    /// Deletes a hostmesh object.
    pub async fn delete(&self, kind: &str, name: &str) -> anyhow::Result<()> {
        self.hostmesh_api(kind)
            .delete(name, &DeleteParams::default())
            .await?;
        Ok(())
    }

    /// Deletes hostmesh object `kind/name` and waits until it is gone
    /// (finalized by the operator): what a test does before it uninstalls
    /// an operator it installed, so nothing is left stuck.
    pub async fn delete_and_wait(&self, kind: &str, name: &str) -> anyhow::Result<()> {
        self.delete(kind, name).await?;
        let api = self.hostmesh_api(kind);
        hostmesh_testkit::wait::poll(WAIT, async || {
            matches!(api.get_opt(name).await, Ok(None))
                .then_some(())
                .ok_or(())
        })
        .await
        .map_err(|()| anyhow::anyhow!("{kind} {name} not deleted in {WAIT:?}"))
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // On a cluster the suite did not start, leave nothing behind: the
        // namespace goes while the operator still runs (its finalizers stop
        // the procs), the Node once the kubelet is gone.
        if self.real_cluster {
            let ns = format!("namespace/{}", self.namespace);
            let _ = self.kubectl(&["delete", &ns, "--wait=true", "--timeout=120s"]);
        }
        self.kill_operator();
        if self.real_cluster
            && let Some(lease) = self.lease.take()
        {
            let _ = self.kubectl(&[
                "delete",
                "lease",
                "-n",
                LEASE_NAMESPACE,
                &lease,
                "--ignore-not-found",
            ]);
        }
        if let Some(mut c) = self.controller_manager.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // The kubelet stops every pod's processes on SIGTERM.
        if let Some(mut k) = self.kubelet.take() {
            let _ = nix_terminate(&k);
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = k.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = k.kill();
            let _ = k.wait();
        }
        if self.placement == Placement::ProcessKubelet {
            let node = format!("node/{}", self.node);
            let _ = self.kubectl(&["delete", &node, "--ignore-not-found"]);
        }
        if let Some(mut a) = self.apiserver.take() {
            let _ = a.kill();
            let _ = a.wait();
        }
        self.keep_logs();
    }
}

/// Where [`Env`] copies its components' logs when it ends (the chaos suite
/// keeps a failed run's logs this way): `<dir>/<namespace>/`.
pub const KEEP_LOGS_ENV: &str = "HOSTMESH_E2E_KEEP_LOGS";

/// The namespace of test `test`'s [`Env`] in this process.
pub fn namespace_for(test: &str) -> String {
    format!("e2e-{}-{}", sanitize(test), std::process::id())
}

impl Env {
    /// Copies the `*.log` files of this Env's folder to
    /// `$HOSTMESH_E2E_KEEP_LOGS/<namespace>/`, when that is set.
    fn keep_logs(&self) {
        let Some(root) = std::env::var_os(KEEP_LOGS_ENV) else {
            return;
        };
        let to = PathBuf::from(root).join(&self.namespace);
        if std::fs::create_dir_all(&to).is_err() {
            return;
        }
        let Ok(entries) = std::fs::read_dir(self.dir.path()) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "log") {
                let _ = std::fs::copy(&path, to.join(e.file_name()));
            }
        }
    }
}

/// Appends `item` to the JSON array at `slot` (made when absent).
fn push(slot: &mut serde_json::Value, item: serde_json::Value) {
    if !slot.is_array() {
        *slot = serde_json::json!([]);
    }
    if let Some(items) = slot.as_array_mut() {
        items.push(item);
    }
}

/// The name of a Ready node of the cluster (the first, by name): where a
/// single-node cluster runs the tests' pods.
async fn ready_node(client: &kube::Client) -> anyhow::Result<String> {
    use k8s_openapi::api::core::v1::Node;
    let nodes: Api<Node> = Api::all(client.clone());
    let mut ready: Vec<String> = nodes
        .list(&Default::default())
        .await
        .context("listing the cluster's nodes")?
        .items
        .into_iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(|n| n.metadata.name)
        .collect();
    ready.sort();
    ready
        .into_iter()
        .next()
        .context("the cluster in KUBECONFIG has no Ready node to run the tests' pods")
}

fn nix_terminate(child: &Child) -> std::io::Result<()> {
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other("kill -TERM failed"))
    }
}

fn log_file(dir: &Path, name: &str) -> anyhow::Result<std::fs::File> {
    Ok(std::fs::File::create(dir.join(format!("{name}.log")))?)
}

/// Starts `hostmesh apiserver` writing `dir/kubeconfig` and appending to
/// `dir/apiserver.log`: on a free port, or restartable (`listen` given)
/// on that address with its state in `dir/apiserver`.
fn spawn_apiserver(
    bin: &Path,
    dir: &Path,
    listen: Option<&str>,
    extra: &[String],
) -> anyhow::Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("apiserver.log"))?;
    let mut cmd = Command::new(bin);
    cmd.arg("apiserver")
        .arg("--listen")
        .arg(listen.unwrap_or("127.0.0.1:0"))
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"));
    if listen.is_some() {
        cmd.arg("--data-dir").arg(dir.join("apiserver"));
    }
    cmd.args(extra);
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting hostmesh apiserver")
}

/// A kube client from a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    Ok(kube::Client::try_from(config)?)
}

/// A client of the cluster in `kubeconfig` that authenticates with a
/// bearer `token` instead of the kubeconfig's own credentials (to act as a
/// service account).
pub async fn client_with_token(kubeconfig: &Path, token: &str) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let mut kc = serde_json::to_value(kc)?;
    let users = kc
        .get_mut("users")
        .and_then(serde_json::Value::as_array_mut)
        .context("the kubeconfig has no users")?;
    for u in users {
        u["user"] = serde_json::json!({"token": token});
    }
    let kc: kube::config::Kubeconfig = serde_json::from_value(kc)?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    Ok(kube::Client::try_from(config)?)
}

/// A token for ServiceAccount `namespace/name` from TokenRequest.
pub async fn service_account_token(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<String> {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let req: TokenRequest = serde_json::from_value(
        serde_json::json!({"spec": {"audiences": [], "expirationSeconds": 600}}),
    )?;
    let tr = api
        .create_token_request(name, &PostParams::default(), &req)
        .await
        .with_context(|| format!("TokenRequest for serviceaccount {namespace}/{name}"))?;
    tr.status
        .map(|s| s.token)
        .context("the TokenRequest came back without a token")
}

async fn wait_until(what: &str, f: impl Fn() -> bool) -> anyhow::Result<()> {
    hostmesh_testkit::wait::poll(WAIT, async || f().then_some(()).ok_or(()))
        .await
        .map_err(|()| anyhow::anyhow!("{what} did not appear in {WAIT:?}"))
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn sanitize(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    s.chars()
        .take(30)
        .collect::<String>()
        .trim_matches('-')
        .to_owned()
}

/// The `type=Ready` condition is True in a status object.
pub fn condition_true(status: &serde_json::Value, kind: &str) -> bool {
    status["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == kind && c["status"] == "True")
    })
}

/// The `state` of host `rank` in a World status: that of the `hosts` run
/// (`start`, `count`) holding the rank, `""` when no run does.
pub fn host_state(status: &serde_json::Value, rank: u64) -> String {
    run_state(status, "hosts", rank)
}

/// The `state` of rank `rank` in a ProcMesh status (its `ranks` runs).
pub fn rank_state(status: &serde_json::Value, rank: u64) -> String {
    run_state(status, "ranks", rank)
}

/// The `state` of the run of `status[field]` (`start`, `count`) holding
/// `rank`, `""` when no run does.
fn run_state(status: &serde_json::Value, field: &str, rank: u64) -> String {
    status[field]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| {
            let start = r["start"].as_u64().unwrap_or(u64::MAX);
            let count = r["count"].as_u64().unwrap_or(0);
            start <= rank && rank < start.saturating_add(count)
        })
        .map(|r| r["state"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

/// PIDs of live processes whose environment satisfies `pred` (reads
/// `/proc/<pid>/environ`; processes that vanish mid-scan are skipped).
pub fn find_pids(pred: impl Fn(&std::collections::HashMap<String, String>) -> bool) -> Vec<i32> {
    let mut pids = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if u32::try_from(pid).map_or(true, hostmesh_testkit::process::gone) {
            continue;
        }
        let env: std::collections::HashMap<String, String> = raw
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                kv.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
            })
            .collect();
        if pred(&env) {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    pids
}

impl Env {
    /// PIDs of the agents of host `rank` of World `world` in this test's
    /// namespace.
    pub fn agent_pids(&self, world: &str, rank: u32) -> Vec<i32> {
        agents_in(&self.namespace, world, Some(rank))
    }

    /// Cuts pod `name`'s network (`up` false) or restores it (`up` true):
    /// the host end of its veth goes down or up, which partitions the pod
    /// from everything, the operator included, while every process in it
    /// runs on. Only for pods of the process kubelet's sandbox network.
    pub async fn set_pod_link(&self, name: &str, up: bool) -> anyhow::Result<()> {
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let ip: std::net::Ipv4Addr = pods
            .get(name)
            .await?
            .status
            .and_then(|s| s.pod_ip)
            .with_context(|| format!("pod {name} has no IP"))?
            .parse()
            .with_context(|| format!("pod {name}'s IP"))?;
        let veth = hostmesh_devcluster::kubelet::veth_name(ip);
        let state = if up { "up" } else { "down" };
        let out = Command::new("ip")
            .args(["link", "set", "dev", &veth, state])
            .output()
            .context("run `ip` (iproute2)")?;
        if !out.status.success() {
            bail!(
                "ip link set dev {veth} {state}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// PIDs of the procs of ProcMesh `mesh` on World `world` in this test's
    /// namespace: the processes its agents started, not their children (a
    /// `sh -c` proc's `sleep`).
    pub fn proc_pids(&self, world: &str, mesh: &str) -> Vec<i32> {
        let agents = agents_in(&self.namespace, world, None);
        find_pids(|e| e.get("HOSTMESH_PROC_MESH").map(String::as_str) == Some(mesh))
            .into_iter()
            .filter(|p| parent_of(*p).is_some_and(|pp| agents.contains(&pp)))
            .collect()
    }
}

fn agents_in(namespace: &str, world: &str, rank: Option<u32>) -> Vec<i32> {
    let rank = rank.map(|r| r.to_string());
    find_pids(|e| {
        e.get("HOSTMESH_NAMESPACE").map(String::as_str) == Some(namespace)
            && e.get("HOSTMESH_WORLD").map(String::as_str) == Some(world)
            && rank
                .as_ref()
                .is_none_or(|r| e.get("HOSTMESH_HOST_RANK") == Some(r))
            && !e.contains_key("HOSTMESH_PROC_MESH")
    })
}

fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid ...
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The PID that process `pid` (of this machine) has in its own PID
/// namespace: itself for a process kubelet's pods, which share the
/// machine's; its number inside the pod for a container runtime's (the
/// last `NSpid` of `/proc/<pid>/status`), which is what an agent reports.
pub fn pid_in_pod(pid: i32) -> i32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|ids| ids.split_whitespace().last()?.parse().ok())
        })
        .unwrap_or(pid)
}

/// Sends `signal` to `pid`.
pub fn signal(pid: i32, signal: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()?;
    anyhow::ensure!(status.success(), "kill -{signal} {pid} failed");
    Ok(())
}

/// SIGCONTs a stopped process when dropped: a test or a chaos run never
/// leaves a process it froze (a kubelet, an agent) stopped, whatever its
/// outcome.
pub struct Thaw(pub i32);

impl Drop for Thaw {
    fn drop(&mut self) {
        let _ = signal(self.0, "CONT");
    }
}

/// Polls `f` until it returns true, failing after [`WAIT`] with `what`.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) -> anyhow::Result<()> {
    hostmesh_testkit::wait::poll(WAIT, async || f().then_some(()).ok_or(()))
        .await
        .map_err(|()| anyhow::anyhow!("{what}: not true after {WAIT:?}"))
}

/// Polls `f` for `period`, failing at once with `what` and `f`'s message
/// when it reports a violation (an invariant that must hold throughout).
pub async fn always_for(
    what: &str,
    period: Duration,
    mut f: impl AsyncFnMut() -> anyhow::Result<Option<String>>,
) -> anyhow::Result<()> {
    let start = Instant::now();
    while start.elapsed() < period {
        if let Some(violation) = f().await? {
            bail!("{what}: violated after {:?}: {violation}", start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// A World manifest of `shape` (e.g. `[("replica", 2), ("host", 2)]`) with
/// extra spec fields merged in; its hosts run `busybox` ([`Env::image`]).
pub fn world_yaml(name: &str, shape: &[(&str, u32)], extra_spec: &str) -> String {
    world_yaml_with_image(name, shape, "busybox", extra_spec)
}

/// Like [`world_yaml`], with host containers of `image` (a placeholder of
/// [`Env::image`] or a real image).
pub fn world_yaml_with_image(
    name: &str,
    shape: &[(&str, u32)],
    image: &str,
    extra_spec: &str,
) -> String {
    let dims: Vec<String> = shape
        .iter()
        .map(|(n, s)| format!("{{name: {n}, size: {s}}}"))
        .collect();
    format!(
        "apiVersion: hostmesh.dev/v1alpha1\nkind: World\nmetadata:\n  name: {name}\nspec:\n  shape: [{}]\n  template:\n    metadata:\n      labels: {{team: e2e}}\n    spec:\n      containers:\n      - name: host\n        image: {image}\n{extra_spec}",
        dims.join(", ")
    )
}

/// Records a figure a test measured (reported, never asserted: targets
/// live in the benchmarks): one JSON line `{"measure", "value", "unit",
/// "placement"}` on stderr and, when `HOSTMESH_E2E_MEASUREMENTS` names a
/// file, appended to it (`.ci/e2e-realk8s.sh` prints that file).
pub fn record(env: &Env, name: &str, value: f64, unit: &str) {
    let line = serde_json::json!({
        "measure": name,
        "value": (value * 1000.0).round() / 1000.0,
        "unit": unit,
        "placement": format!("{:?}", env.placement),
    })
    .to_string();
    #[allow(clippy::print_stderr)]
    {
        eprintln!("{line}");
    }
    if let Some(path) = std::env::var_os("HOSTMESH_E2E_MEASUREMENTS") {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}
