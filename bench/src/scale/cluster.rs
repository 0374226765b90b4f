//! The scale suite's cluster: every component a separate `hostmesh`
//! process, as on a real cluster (`hostmesh apiserver`, `hostmesh
//! controller-manager`, N `hostmesh kubelet`s with `--pod-network host`,
//! one `hostmesh operator`), each logging to its own file, each measured
//! by its resident memory (`VmRSS`), all killed when the cluster drops.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// One child process of the cluster.
pub(crate) struct Component {
    /// What it is (`apiserver`, `kubelet-0`, ...): also its log's name.
    pub(crate) name: String,
    child: Child,
}

impl Component {
    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its resident memory now, in bytes.
    pub(crate) fn rss(&self) -> anyhow::Result<u64> {
        rss_of(self.pid()).with_context(|| format!("reading the RSS of {}", self.name))
    }

    /// Whether it still runs.
    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn stop(&mut self, grace: Duration) {
        if !self.alive() {
            return;
        }
        // SIGTERM first (the kubelet stops its pods' processes), then KILL;
        // a wrapped component (`wrapped`) leads a process group of its own,
        // and the signals go to the group: the wrapper passes none on.
        let pid = self.pid() as i32;
        // SAFETY: getpgid(2) and kill(2) on our own child's pid (or its
        // group, which only it and what it started are in).
        let target = if unsafe { libc::getpgid(pid) } == pid {
            -pid
        } else {
            pid
        };
        unsafe { libc::kill(target, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if !self.alive() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: as above.
        unsafe { libc::kill(target, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// The CPU time process `pid` used so far (user and system), in seconds.
pub(crate) fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // pid (comm) state ppid ... utime(14) stime(15), counted from 1.
    let rest = stat.rsplit_once(')').context("no comm in stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f
        .get(11)
        .and_then(|v| v.parse::<f64>().ok())
        .context("no utime")?
        + f.get(12)
            .and_then(|v| v.parse::<f64>().ok())
            .context("no stime")?;
    // SAFETY: sysconf(3) has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz.max(1.0))
}

/// The resident memory of process `pid` in bytes (`VmRSS` of
/// `/proc/<pid>/status`).
pub(crate) fn rss_of(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmRSS line")?;
    Ok(kb * 1024)
}

/// The processes of one run and where they keep their files.
pub(crate) struct Cluster {
    /// The `hostmesh` binary every component runs.
    pub(crate) bin: PathBuf,
    /// The run's directory (logs, kubeconfig, kubelet data).
    pub(crate) dir: PathBuf,
    /// The kubeconfig the API server wrote.
    pub(crate) kubeconfig: PathBuf,
    /// A client of the API server.
    pub(crate) client: kube::Client,
    pub(crate) apiserver: Component,
    pub(crate) kubelets: Vec<Component>,
    pub(crate) others: Vec<Component>,
    /// The operator, once started.
    pub(crate) operator: Option<Component>,
    /// Where the operator serves `/metrics`.
    pub(crate) operator_http: Option<std::net::SocketAddr>,
}

fn log_file(dir: &Path, name: &str) -> anyhow::Result<(std::fs::File, std::fs::File)> {
    let f = std::fs::File::create(dir.join(format!("{name}.log")))?;
    Ok((f.try_clone()?, f))
}

fn spawn(dir: &Path, name: &str, cmd: &mut Command) -> anyhow::Result<Component> {
    let (out, err) = log_file(dir, name)?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    Ok(Component {
        name: name.to_owned(),
        child,
    })
}

/// `bin`, or for profiling `bin` under the command the environment
/// variable `var` names (`HOSTMESH_SCALE_OPERATOR_WRAPPER="heaptrack -o
/// /tmp/op"`; the component's RSS figures are then the wrapper's). A
/// wrapped component gets a process group of its own, which `stop`
/// signals whole.
fn wrapped(var: &str, bin: &Path) -> Command {
    let wrapper = std::env::var(var).unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    match words.next() {
        Some(w) => {
            use std::os::unix::process::CommandExt as _;
            let mut c = Command::new(w);
            c.args(words).arg(bin).process_group(0);
            c
        }
        None => Command::new(bin),
    }
}

impl Cluster {
    /// Starts the API server (and installs the CRDs); with `controller
    /// manager`, that too. No kubelet and no operator yet.
    pub(crate) async fn start(
        bin: PathBuf,
        dir: PathBuf,
        controller_manager: bool,
    ) -> anyhow::Result<Cluster> {
        let kubeconfig = dir.join("kubeconfig");
        let apiserver = spawn(
            &dir,
            "apiserver",
            wrapped("HOSTMESH_SCALE_APISERVER_WRAPPER", &bin)
                .args(["apiserver", "--listen", "127.0.0.1:0", "--kubeconfig"])
                .arg(&kubeconfig)
                .env("RUST_LOG", "warn"),
        )?;
        let start = Instant::now();
        while !kubeconfig.exists() {
            if start.elapsed() > Duration::from_secs(60) {
                bail!("the API server wrote no kubeconfig within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let client = hostmesh_e2e::client_for(&kubeconfig).await?;
        hostmesh_cli::devenv::install_crds(&client, false).await?;
        let mut others = Vec::new();
        if controller_manager {
            others.push(spawn(
                &dir,
                "controller-manager",
                Command::new(&bin)
                    .arg("controller-manager")
                    .env("KUBECONFIG", &kubeconfig)
                    .env("RUST_LOG", "warn"),
            )?);
        }
        Ok(Cluster {
            bin,
            dir,
            kubeconfig,
            client,
            apiserver,
            kubelets: Vec::new(),
            others,
            operator: None,
            operator_http: None,
        })
    }

    /// Starts `n` process kubelets with host networking, each taking a
    /// share of the pods, and waits until their Nodes are registered.
    pub(crate) async fn start_kubelets(&mut self, n: usize) -> anyhow::Result<()> {
        for i in 0..n {
            let name = format!("kubelet-{i}");
            let k = spawn(
                &self.dir,
                &name,
                Command::new(&self.bin)
                    .arg("kubelet")
                    .arg("--kubeconfig")
                    .arg(&self.kubeconfig)
                    .args(["--node-name", &format!("scale-node-{i}")])
                    .arg("--data-dir")
                    .arg(self.dir.join(&name))
                    .arg("--agent-binary")
                    .arg(&self.bin)
                    .args(["--pod-network", "host"])
                    .env("RUST_LOG", "warn"),
            )?;
            self.kubelets.push(k);
        }
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(self.client.clone());
        let start = Instant::now();
        loop {
            let have = nodes.list(&Default::default()).await?.items.len();
            if have >= n {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(120) {
                bail!("{have}/{n} kubelets registered their Node within 120 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts the operator (its `/metrics` on a free loopback port) and
    /// waits until it answers `/readyz`.
    pub(crate) async fn start_operator(&mut self) -> anyhow::Result<()> {
        let port = hostmesh_testkit::http::free_port();
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let mut cmd = wrapped("HOSTMESH_SCALE_OPERATOR_WRAPPER", &self.bin);
        let op = spawn(
            &self.dir,
            "operator",
            cmd.arg("operator")
                .env("KUBECONFIG", &self.kubeconfig)
                .args(["--log-format", "text", "--http-addr", &addr.to_string()]),
        )?;
        self.operator = Some(op);
        self.operator_http = Some(addr);
        let start = Instant::now();
        loop {
            if let Some((200, _)) = hostmesh_testkit::http::get(addr, "/readyz").await {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("the operator is not ready within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The operator's process.
    pub(crate) fn operator(&self) -> anyhow::Result<&Component> {
        self.operator
            .as_ref()
            .context("the operator is not running")
    }

    /// The operator's log so far.
    pub(crate) fn operator_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("operator.log")).unwrap_or_default()
    }

    /// The summed RSS of the kubelets.
    pub(crate) fn kubelets_rss(&self) -> anyhow::Result<u64> {
        self.kubelets.iter().map(Component::rss).sum()
    }

    /// A counter of the operator's `/metrics`, summed over its labels
    /// (`None` when the operator does not serve it).
    pub(crate) async fn operator_counter(&self, name: &str) -> anyhow::Result<Option<f64>> {
        let addr = self.operator_http.context("the operator is not running")?;
        let (code, body) = hostmesh_testkit::http::get(addr, "/metrics")
            .await
            .context("the operator's /metrics does not answer")?;
        anyhow::ensure!(code == 200, "the operator's /metrics answered {code}");
        let mut found = None;
        for line in body.lines().filter(|l| !l.starts_with('#')) {
            let Some((metric, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let base = metric.split('{').next().unwrap_or(metric);
            if base == name
                && let Ok(v) = value.parse::<f64>()
            {
                *found.get_or_insert(0.0) += v;
            }
        }
        Ok(found)
    }

    /// Stops every process: the operator first (so it deletes nothing
    /// while the rest goes), then the kubelets (which stop their pods),
    /// then the API server.
    pub(crate) fn shutdown(&mut self) {
        if let Some(op) = self.operator.as_mut() {
            op.stop(Duration::from_secs(10));
        }
        for k in &mut self.kubelets {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(k.pid() as i32, libc::SIGTERM) };
        }
        for k in &mut self.kubelets {
            k.stop(Duration::from_secs(60));
        }
        for o in &mut self.others {
            o.stop(Duration::from_secs(10));
        }
        self.apiserver.stop(Duration::from_secs(10));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}
