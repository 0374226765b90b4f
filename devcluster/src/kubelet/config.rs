//! Kubelet configuration: the library's [`KubeletConfig`], the image table
//! that maps container images to local programs, and the `hostmesh kubelet`
//! command line ([`KubeletArgs`]).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;
use serde::Deserialize;

use super::error::{KubeletError, Result};
use super::net::{ClusterDns, DEFAULT_HOST_POD_RANGE, DEFAULT_POD_RANGE, Ipv4Net, PodNetwork};

/// The image pattern of the hostmesh agent image.
pub const HOSTMESH_IMAGE_PATTERN: &str = "ghcr.io/hostmesh/hostmesh*";

/// One row of the image table: images matching `image` run `program`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ImageEntry {
    /// An image reference, or a prefix ending in `*` (`ghcr.io/x/y*` matches
    /// every tag and digest of `ghcr.io/x/y`).
    pub image: String,
    /// The local program standing for the image's entrypoint.
    pub program: PathBuf,
    /// Default arguments (the image's `CMD`), used when the container gives
    /// neither `command` nor `args`.
    #[serde(default)]
    pub args: Vec<String>,
}

impl ImageEntry {
    fn matches(&self, image: &str) -> bool {
        match self.image.strip_suffix('*') {
            Some(prefix) => image.starts_with(prefix),
            None => self.image == image,
        }
    }
}

/// Maps container images to local programs; the first matching row wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageTable {
    entries: Vec<ImageEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageTableFile {
    images: Vec<ImageEntry>,
}

impl ImageTable {
    /// A table with the given rows, in order.
    pub fn new(entries: Vec<ImageEntry>) -> Self {
        Self { entries }
    }

    /// Parses an image table file (YAML or JSON):
    ///
    /// ```yaml
    /// images:
    ///   - image: ghcr.io/example/trainer*
    ///     program: /usr/bin/python3
    ///     args: [-m, trainer]
    /// ```
    pub fn parse(text: &str) -> Result<Self> {
        let file: ImageTableFile = serde_saphyr::from_str(text).map_err(|e| {
            KubeletError::Config(format!(
                "image table: {e}; expected `images:` with a list of {{image, program, args}}"
            ))
        })?;
        for (i, entry) in file.images.iter().enumerate() {
            if entry.image.is_empty() {
                return Err(KubeletError::Config(format!(
                    "image table: images[{i}].image is empty"
                )));
            }
            if entry.program.as_os_str().is_empty() {
                return Err(KubeletError::Config(format!(
                    "image table: images[{i}].program is empty; give the path of a local program"
                )));
            }
        }
        Ok(Self::new(file.images))
    }

    /// Reads and parses an image table file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| KubeletError::io("cannot read image table", path, e))?;
        Self::parse(&text)
    }

    /// Appends a row (it matches after every existing row).
    pub fn push(&mut self, entry: ImageEntry) {
        self.entries.push(entry);
    }

    /// The row for `image`, if any.
    pub fn lookup(&self, image: &str) -> Option<&ImageEntry> {
        self.entries.iter().find(|e| e.matches(image))
    }
}

/// How the process kubelet runs.
#[derive(Clone)]
pub struct KubeletConfig {
    /// The Node's name.
    pub node_name: String,
    /// Where pod volumes and container logs live (`<data_dir>/pods/<uid>`).
    pub data_dir: PathBuf,
    /// Image to program table. The hostmesh agent image is always appended
    /// (mapped to `hostmesh_binary`).
    pub images: ImageTable,
    /// The `hostmesh` binary the agent image maps to; `None` means the
    /// running executable.
    pub hostmesh_binary: Option<PathBuf>,
    /// `nvidia.com/gpu` capacity advertised by the Node (0: not advertised).
    pub gpu_capacity: u32,
    /// `pods` capacity advertised by the Node.
    pub max_pods: u32,
    /// Bind pods that have no node and use the default scheduler to this
    /// Node (turn off on clusters with a scheduler).
    pub bind_unscheduled: bool,
    /// How pods are networked: each in its own sandbox (default), or in the
    /// machine's network namespace on loopback addresses.
    pub pod_network: PodNetwork,
    /// Where pod IPs come from. Sandbox: the cluster's pod range, of which
    /// the kubelet claims one free /24 (its `podCIDR`); a given range that
    /// overlaps a route of the machine is refused at start, and `None`
    /// picks the first free /16 of `10.244.0.0/16`, `10.245.0.0/16`, ...
    /// (`KubeletHandle::pod_range` says which and why). Host: a loopback
    /// range (`127.X.0.0/16`; `None`: `127.0.0.0/16`).
    pub pod_ip_range: Option<Ipv4Net>,
    /// The cluster DNS server pods' sockets are handed to (see
    /// [`ClusterDns`]); `None`: no DNS sockets are bound in pods (their
    /// `resolv.conf` still names the cluster DNS address).
    pub cluster_dns: Option<std::sync::Arc<dyn ClusterDns>>,
    /// The Node's address (`status.hostIP` of its pods).
    pub node_ip: Ipv4Addr,
    /// Node lease duration; the lease is renewed every quarter of it.
    pub lease_duration: Duration,
    /// First restart back-off of a crashed container; doubles per restart.
    pub restart_backoff: Duration,
    /// Longest restart back-off.
    pub max_restart_backoff: Duration,
    /// Longest grace period given to containers when the kubelet itself
    /// shuts down (pod deletions honour the pod's full grace period).
    pub shutdown_grace: Duration,
    /// Taints of the Node (a kubelet joining a real cluster taints itself so
    /// only pods that tolerate it land there).
    pub taints: Vec<Taint>,
    /// Bearer token that `pods/log` requests from the API server must carry;
    /// `None` turns the log endpoint off. `hostmesh kubelet` uses the token
    /// of its kubeconfig (the embedded API server sends that same token).
    pub log_token: Option<String>,
    /// Port of the log endpoint on the node IP (0: any free port).
    pub log_port: u16,
    /// Host and port of the API server as the kubelet reaches it.
    /// Sandboxed pods reach it through the `kubernetes` Service, which the
    /// kubelet forwards here; with `--pod-network=host` containers get it
    /// directly as `KUBERNETES_SERVICE_HOST`/`_PORT`. `hostmesh kubelet`
    /// takes it from its kubeconfig.
    pub kubernetes_service: Option<(String, u16)>,
    /// Run pods owned by DaemonSets. Off by default: a kubelet joining a
    /// real cluster would otherwise run that cluster's daemons (proxies,
    /// network agents) as root on this machine.
    pub run_daemonsets: bool,
    /// Directory where pod subnets (sandbox) or pod IPs (host) are claimed
    /// machine-wide (a locked file each), so kubelets on one machine never
    /// share a subnet or an address; `None` turns the claims off. Every
    /// kubelet on a machine must use the same directory.
    pub ip_claims_dir: Option<PathBuf>,
    /// CA (PEM) whose client certificates may use the kubelet endpoint, as
    /// a real kube-apiserver does (`--client-ca-file`); the endpoint then
    /// serves HTTPS (`serving`). `None`: plain HTTP with the bearer token.
    pub client_ca: Option<String>,
    /// Publish a `Hostname` address in the Node (off when the node name
    /// does not resolve to `node_ip`, so an API server preferring
    /// `Hostname` falls through to `InternalIP`).
    pub advertise_hostname: bool,
    /// A container's log is rotated once it is larger than this many bytes
    /// (the kubelet's `containerLogMaxSize`, default 10Mi).
    pub container_log_max_size: u64,
    /// Most log files kept per container, the current one included (the
    /// kubelet's `containerLogMaxFiles`, default 5, at least 2).
    pub container_log_max_files: u32,
    /// How often log sizes are checked (the kubelet's
    /// `containerLogMonitorInterval`, default 10s).
    pub container_log_monitor_interval: Duration,
}

impl std::fmt::Debug for KubeletConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The log token stays out of logs.
        f.debug_struct("KubeletConfig")
            .field("node_name", &self.node_name)
            .field("data_dir", &self.data_dir)
            .field("images", &self.images)
            .field("hostmesh_binary", &self.hostmesh_binary)
            .field("gpu_capacity", &self.gpu_capacity)
            .field("bind_unscheduled", &self.bind_unscheduled)
            .field("pod_network", &self.pod_network)
            .field("pod_ip_range", &self.pod_ip_range)
            .field("cluster_dns", &self.cluster_dns.is_some())
            .field("node_ip", &self.node_ip)
            .field("taints", &self.taints)
            .field("log_token", &self.log_token.as_ref().map(|_| "<redacted>"))
            .field("log_port", &self.log_port)
            .field("client_ca", &self.client_ca.is_some())
            .field("advertise_hostname", &self.advertise_hostname)
            .finish_non_exhaustive()
    }
}

impl KubeletConfig {
    /// A configuration with defaults for everything but the node name and
    /// the data directory.
    pub fn new(node_name: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        Self {
            node_name: node_name.into(),
            data_dir: data_dir.into(),
            images: ImageTable::default(),
            hostmesh_binary: None,
            gpu_capacity: 0,
            max_pods: 110,
            bind_unscheduled: true,
            pod_network: PodNetwork::Sandbox,
            pod_ip_range: None,
            cluster_dns: None,
            node_ip: Ipv4Addr::LOCALHOST,
            lease_duration: Duration::from_secs(40),
            restart_backoff: Duration::from_secs(1),
            max_restart_backoff: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
            taints: Vec::new(),
            log_token: None,
            log_port: 0,
            kubernetes_service: None,
            run_daemonsets: false,
            ip_claims_dir: Some(default_claims_dir()),
            client_ca: None,
            advertise_hostname: true,
            container_log_max_size: super::logrotate::DEFAULT_MAX_SIZE,
            container_log_max_files: super::logrotate::DEFAULT_MAX_FILES,
            container_log_monitor_interval: Duration::from_secs(10),
        }
    }

    /// Switches to `--pod-network=host` with pod IPs from `127.<block>.0.0/16`.
    pub fn host_network(mut self, block: u8) -> Self {
        self.pod_network = PodNetwork::Host;
        self.pod_ip_range = Some(Ipv4Net::new(Ipv4Addr::new(127, block, 0, 0), 16).expect("a /16"));
        self
    }

    /// Points the kubelet at an embedded API server: `pods/log` requests
    /// from it are accepted (its token) and containers get its address as
    /// `KUBERNETES_SERVICE_HOST`/`_PORT`.
    pub fn for_api_server(mut self, api: &crate::apiserver::ApiServerHandle) -> Self {
        self.log_token = Some(api.token().to_string());
        // A server listening on every address is reached (and its
        // certificate names it) on loopback.
        let ip = match api.addr().ip() {
            std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
            ip => ip,
        };
        self.kubernetes_service = Some((ip.to_string(), api.addr().port()));
        self
    }

    /// Checks the configuration and returns the full image table (the
    /// user's rows, then the hostmesh agent image).
    pub(crate) fn validate(&self) -> Result<ImageTable> {
        if self.node_name.is_empty()
            || self.node_name.len() > 253
            || !self
                .node_name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        {
            return Err(KubeletError::Config(format!(
                "node name {:?} is not a valid DNS subdomain (lowercase letters, digits, '-', '.')",
                self.node_name
            )));
        }
        if self.restart_backoff.is_zero() || self.max_restart_backoff < self.restart_backoff {
            return Err(KubeletError::Config(
                "restart_backoff must be positive and at most max_restart_backoff".into(),
            ));
        }
        if self.lease_duration < Duration::from_secs(4) {
            return Err(KubeletError::Config(
                "lease_duration must be at least 4s".into(),
            ));
        }
        if let Some(range) = self.pod_ip_range {
            check_pod_ip_range(self.pod_network, range)?;
        }
        super::logrotate::check_config(self)?;
        let hostmesh = match &self.hostmesh_binary {
            Some(path) => path.clone(),
            None => std::env::current_exe().map_err(|e| {
                KubeletError::Config(format!(
                    "cannot find the running executable for the hostmesh image ({e}); set hostmesh_binary"
                ))
            })?,
        };
        let mut table = self.images.clone();
        table.push(ImageEntry {
            image: HOSTMESH_IMAGE_PATTERN.into(),
            program: hostmesh,
            args: Vec::new(),
        });
        Ok(table)
    }
}

/// `hostmesh kubelet`: run the process kubelet until Ctrl-C.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeletArgs {
    /// Name of the Node to register.
    #[arg(long, env = "HOSTMESH_NODE_NAME", default_value = "hostmesh-node")]
    pub node_name: String,
    /// Kubeconfig of the cluster to join (default: $KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Directory for pod volumes and container logs (default: /tmp/hostmesh-kubelet/<node name>).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// YAML file mapping images to local programs (`images: [{image, program, args}]`).
    #[arg(long)]
    pub image_table: Option<PathBuf>,
    /// The hostmesh binary that the hostmesh agent image maps to (default: this executable).
    #[arg(long, alias = "hostmesh-binary")]
    pub agent_binary: Option<PathBuf>,
    /// `nvidia.com/gpu` capacity to advertise (0: none).
    #[arg(long, default_value_t = 0)]
    pub gpu_capacity: u32,
    /// Bind unscheduled pods to this node (`--bind-unscheduled=false` on clusters with a scheduler).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub bind_unscheduled: bool,
    /// Pod networking: `sandbox` (each pod in its own network namespace; needs root) or `host` (the machine's network namespace, loopback addresses).
    #[arg(long, value_enum, default_value_t = PodNetwork::Sandbox)]
    pub pod_network: PodNetwork,
    /// Pod range: the cluster's (sandbox; the kubelet claims a free /24 of it; default: the first of 10.244.0.0/16, 10.245.0.0/16, ... that no route of this machine overlaps), or a loopback /16 (host, default 127.0.0.0/16).
    #[arg(long)]
    pub pod_ip_range: Option<String>,
    /// Taint the Node (`key[=value][:effect]`, effect NoSchedule by default); repeatable.
    #[arg(long = "taint")]
    pub taints: Vec<String>,
    /// Also run pods owned by DaemonSets (off: a real cluster's daemons stay off this machine).
    #[arg(long)]
    pub run_daemonsets: bool,
    /// CA whose client certificates may use the kubelet endpoint (kube-apiserver's
    /// `--kubelet-client-certificate` is signed by it; kubeadm: /etc/kubernetes/pki/ca.crt).
    /// The endpoint then serves HTTPS, as a real kubelet does.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// The Node's InternalIP, where the API server reaches the kubelet endpoint
    /// (default: the address this machine uses to reach the API server).
    #[arg(long)]
    pub node_ip: Option<Ipv4Addr>,
    /// Rotate a container's log once it is larger than this (a quantity: `10Mi`, `512Ki`, bytes).
    #[arg(long, default_value = "10Mi")]
    pub container_log_max_size: String,
    /// Log files kept per container, the current one included (at least 2).
    #[arg(long, default_value_t = super::logrotate::DEFAULT_MAX_FILES)]
    pub container_log_max_files: u32,
}

/// Where claims live by default: `/run/hostmesh/pod-network` for root (the
/// sandbox network needs it anyway; it goes with the bridges on reboot),
/// else the temp directory.
fn default_claims_dir() -> PathBuf {
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } == 0 && Path::new("/run").is_dir() {
        PathBuf::from("/run/hostmesh/pod-network")
    } else {
        std::env::temp_dir().join("hostmesh-pod-ips")
    }
}

/// Parses `--pod-ip-range` for `network`; `None` stays `None` (the kubelet
/// settles the range at start: see [`KubeletConfig::pod_ip_range`]).
pub fn parse_pod_ip_range(network: PodNetwork, range: Option<&str>) -> Result<Option<Ipv4Net>> {
    let Some(text) = range else {
        return Ok(None);
    };
    let net: Ipv4Net = text
        .parse()
        .map_err(|e| KubeletError::Config(format!("--pod-ip-range: {e}")))?;
    check_pod_ip_range(network, net)?;
    Ok(Some(net))
}

/// The loopback range of `--pod-network=host` when none is given.
pub(crate) fn default_host_pod_range() -> Ipv4Net {
    DEFAULT_HOST_POD_RANGE
        .parse()
        .expect("the default host pod range parses")
}

fn check_pod_ip_range(network: PodNetwork, net: Ipv4Net) -> Result<()> {
    let loopback = Ipv4Net::new(Ipv4Addr::new(127, 0, 0, 0), 8).expect("a /8");
    let link_local = Ipv4Net::new(Ipv4Addr::new(169, 254, 0, 0), 16).expect("a /16");
    match network {
        PodNetwork::Host if !loopback.contains(net.addr()) || net.prefix() < 8 => {
            Err(KubeletError::Config(format!(
                "--pod-ip-range {net}: with --pod-network=host pods use loopback addresses; give a range such as 127.16.0.0/16"
            )))
        }
        PodNetwork::Sandbox if net.overlaps(&loopback) || net.overlaps(&link_local) => {
            Err(KubeletError::Config(format!(
                "--pod-ip-range {net}: sandboxed pods need addresses outside loopback and link-local; give a range such as {DEFAULT_POD_RANGE}"
            )))
        }
        PodNetwork::Sandbox if net.prefix() > 24 => Err(KubeletError::Config(format!(
            "--pod-ip-range {net}: the range must hold at least one /24 (each kubelet claims one)"
        ))),
        _ => Ok(()),
    }
}

/// Parses a taint written `key[=value][:effect]`.
pub fn parse_taint(text: &str) -> Result<Taint> {
    let (kv, effect) = match text.rsplit_once(':') {
        Some((kv, effect)) => (kv, effect.to_string()),
        None => (text, "NoSchedule".to_string()),
    };
    if !matches!(
        effect.as_str(),
        "NoSchedule" | "PreferNoSchedule" | "NoExecute"
    ) {
        return Err(KubeletError::Config(format!(
            "--taint {text:?}: effect {effect:?} must be NoSchedule, PreferNoSchedule or NoExecute"
        )));
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (kv, None),
    };
    if key.is_empty() {
        return Err(KubeletError::Config(format!(
            "--taint {text:?}: the key is empty"
        )));
    }
    Ok(Taint {
        key: key.into(),
        value,
        effect,
        time_added: None,
    })
}

impl KubeletArgs {
    /// The library configuration these arguments describe.
    pub fn to_config(&self) -> Result<KubeletConfig> {
        let data_dir = self
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("/tmp/hostmesh-kubelet").join(&self.node_name));
        let mut config = KubeletConfig::new(&self.node_name, data_dir);
        if let Some(path) = &self.image_table {
            config.images = ImageTable::load(path)?;
        }
        config.hostmesh_binary = self.agent_binary.clone();
        config.gpu_capacity = self.gpu_capacity;
        config.bind_unscheduled = self.bind_unscheduled;
        config.pod_network = self.pod_network;
        config.pod_ip_range = parse_pod_ip_range(self.pod_network, self.pod_ip_range.as_deref())?;
        config.run_daemonsets = self.run_daemonsets;
        config.container_log_max_size =
            super::logrotate::parse_size("--container-log-max-size", &self.container_log_max_size)?;
        config.container_log_max_files = self.container_log_max_files;
        if let Some(path) = &self.client_ca_file {
            let pem = std::fs::read_to_string(path)
                .map_err(|e| KubeletError::io("cannot read --client-ca-file", path, e))?;
            config.client_ca = Some(pem);
        }
        if let Some(ip) = self.node_ip {
            config.node_ip = ip;
        }
        config.taints = self
            .taints
            .iter()
            .map(|t| parse_taint(t))
            .collect::<Result<_>>()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_table_matches_first_row_and_prefixes() {
        let table = ImageTable::parse(
            "images:\n  - image: ghcr.io/x/trainer*\n    program: /usr/bin/python3\n    args: [-m, t]\n  - image: busybox:1.36\n    program: /bin/sh\n",
        )
        .unwrap();
        let t = table.lookup("ghcr.io/x/trainer:1.4").unwrap();
        assert_eq!(t.program, PathBuf::from("/usr/bin/python3"));
        assert_eq!(t.args, vec!["-m", "t"]);
        assert!(table.lookup("busybox:1.36").is_some());
        assert!(table.lookup("busybox:1.37").is_none());
    }

    #[test]
    fn image_table_errors_name_the_field() {
        let err = ImageTable::parse("images:\n  - image: a\n    program: ''\n").unwrap_err();
        assert!(err.to_string().contains("images[0].program"), "{err}");
        let err = ImageTable::parse("imgs: []\n").unwrap_err();
        assert!(err.to_string().contains("images"), "{err}");
    }

    #[test]
    fn hostmesh_image_is_always_mapped() {
        let mut config = KubeletConfig::new("node-a", "/tmp/x");
        config.hostmesh_binary = Some("/opt/hostmesh".into());
        let table = config.validate().unwrap();
        let e = table.lookup("ghcr.io/hostmesh/hostmesh:0.1.0").unwrap();
        assert_eq!(e.program, PathBuf::from("/opt/hostmesh"));
    }

    #[test]
    fn pod_ip_ranges_and_taints_parse() {
        let host = PodNetwork::Host;
        let sandbox = PodNetwork::Sandbox;
        assert_eq!(
            parse_pod_ip_range(host, Some("127.16.0.0/16")).unwrap(),
            Some("127.16.0.0/16".parse().unwrap())
        );
        // No range: settled at start (a free one picked, or host's default).
        assert_eq!(parse_pod_ip_range(sandbox, None).unwrap(), None);
        assert_eq!(parse_pod_ip_range(host, None).unwrap(), None);
        assert_eq!(default_host_pod_range().to_string(), "127.0.0.0/16");
        for (network, bad) in [
            (host, "10.0.0.0/16"),
            (host, "127.1.2.0/16"),
            (host, "nope"),
            (sandbox, "127.0.0.0/16"),
            (sandbox, "169.254.0.0/16"),
            (sandbox, "10.0.0.0/25"),
        ] {
            let err = parse_pod_ip_range(network, Some(bad)).unwrap_err();
            assert!(err.to_string().contains("--pod-ip-range"), "{err}");
        }
        let t = parse_taint("hostmesh.dev/process-kubelet").unwrap();
        assert_eq!(
            (t.key.as_str(), t.value, t.effect.as_str()),
            ("hostmesh.dev/process-kubelet", None, "NoSchedule")
        );
        let t = parse_taint("k=v:NoExecute").unwrap();
        assert_eq!(
            (t.value.as_deref(), t.effect.as_str()),
            (Some("v"), "NoExecute")
        );
        assert!(parse_taint("k:Sometimes").is_err());
    }

    #[test]
    fn bad_node_name_is_rejected() {
        let config = KubeletConfig::new("Node_A", "/tmp/x");
        let err = config.validate().unwrap_err();
        assert!(err.to_string().contains("node name"), "{err}");
    }
}
