//! The embedded Kubernetes API server: HTTPS on loopback with a generated
//! CA, an admin bearer token, service account tokens and RBAC, Kubernetes
//! semantics for the resources the
//! operator, the process kubelet, kubectl and Helm use, state in memory and
//! optionally in a directory (docs/apiserver.md).
//!
//! Module map: `tls` (credentials, kubeconfig), `http` (wire, dispatch),
//! `componentstatus` (`kubectl get cs`), `certs` (CertificateSigningRequests,
//! their approval and signers), `aggregator` (APIService
//! objects), `flowcontrol` (the default FlowSchemas and priority levels),
//! `auth` (authentication, RBAC, access reviews), `policy` (default
//! ClusterRoles and bindings, aggregation), `serviceaccount`
//! (TokenRequest, pod admission, namespace defaults), `podsecurity` (Pod
//! Security Standards admission), `route` (paths), `registry` (served resources), `store`
//! (objects, resourceVersions, watch history), `handlers` (verbs; patch
//! and delete in submodules),
//! `lifecycle` (create/update/delete rules), `patch` and `ssa` (patch
//! formats, managedFields), `lists` (list merge semantics), `limits` (request and object size limits), `schema` (CRD
//! validation), `defaults` (built-in defaults), `convert` (shared storage), `watch`, `table`,
//! `scale` (the scale subresource), `ephemeral` (`pods/ephemeralcontainers`), `disruption` (PodDisruptionBudget status,
//! `pods/eviction`), `discovery`, `openapi`, `logs` (kubelet proxy), `connect`
//! (exec, attach and port-forward to the kubelet), `gc`, `persist`, `proto`
//! (protobuf bodies), `times` (Time and MicroTime formats).

mod aggregator;
mod auth;
mod certs;
mod componentstatus;
mod connect;
mod convert;
mod defaults;
mod discovery;
mod disruption;
mod ephemeral;
mod flowcontrol;
mod gc;
mod handlers;
mod http;
mod kubernetes_service;
mod lifecycle;
mod limits;
mod lists;
mod logs;
mod meta;
mod openapi;
mod patch;
mod persist;
mod podsecurity;
mod policy;
mod proto;
mod registry;
mod request;
mod response;
mod route;
mod scale;
mod schema;
mod selector;
mod serviceaccount;
mod ssa;
mod status;
mod store;
mod table;
mod times;
mod tls;
mod transition;
mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Errors starting or stopping the API server.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source} (choose another --listen address or free the port)")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// Certificates could not be made or loaded.
    #[error("TLS setup failed: {0}")]
    Tls(String),
    /// The persisted state cannot be read.
    #[error("{path} is not a valid API server state file ({reason}): move it away to start empty")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Building the kube client failed.
    #[error("cannot build a client for the API server: {0}")]
    Client(String),
}

impl ApiServerError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

impl From<rcgen::Error> for ApiServerError {
    fn from(e: rcgen::Error) -> Self {
        Self::Tls(e.to_string())
    }
}

/// How to run the API server.
#[derive(Clone, Debug)]
pub struct ApiServerConfig {
    /// Where to listen; port 0 picks a free port. Loopback by default.
    pub listen: SocketAddr,
    /// Optional directory for credentials and persisted objects.
    pub data_dir: Option<PathBuf>,
    /// Where to write the kubeconfig (optional).
    pub kubeconfig: Option<PathBuf>,
    /// Watch events kept per resource (older resourceVersions get 410).
    pub history_limit: usize,
    /// How long watch events stay in that history (kube-apiserver compacts
    /// etcd every 5 minutes): a watch from an older resourceVersion gets
    /// 410 Gone.
    pub watch_window: Duration,
    /// How often watchers that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// Watch duration when the client gives no `timeoutSeconds`.
    pub default_watch_timeout: Duration,
    /// Largest accepted request body, in bytes (3 MiB, as kube-apiserver;
    /// larger bodies are 413).
    pub max_body_bytes: usize,
    /// Longest lifetime of a service account token (TokenRequests asking
    /// for more are shortened, as with the real server's
    /// `--service-account-max-token-expiration`); `None`: no limit.
    pub max_token_expiration: Option<Duration>,
    /// How the written kubeconfig authenticates (`kubeconfig_yaml`,
    /// `client()`): the admin token (default) or a client certificate.
    pub kubeconfig_auth: KubeconfigAuth,
}

/// How a kubeconfig of this server authenticates its user,
/// `hostmesh-admin` in `system:masters`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KubeconfigAuth {
    /// The admin bearer token (`user.token`).
    #[default]
    Token,
    /// A client certificate signed by the cluster CA (CN `hostmesh-admin`,
    /// O `system:masters`), as kubeadm's `admin.conf` carries.
    ClientCert,
}

impl Default for ApiServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: None,
            kubeconfig: None,
            history_limit: 10_000,
            watch_window: Duration::from_secs(300),
            bookmark_interval: Duration::from_secs(10),
            default_watch_timeout: Duration::from_secs(1800),
            max_body_bytes: limits::MAX_REQUEST_BODY,
            max_token_expiration: None,
            kubeconfig_auth: KubeconfigAuth::Token,
        }
    }
}

/// Arguments of `hostmesh apiserver`.
#[derive(Clone, Debug, clap::Args)]
pub struct ApiServerArgs {
    /// Address to serve HTTPS on.
    #[arg(
        long,
        env = "HOSTMESH_APISERVER_LISTEN",
        default_value = "127.0.0.1:6443"
    )]
    pub listen: SocketAddr,
    /// Directory for credentials and objects; omit to keep state in memory.
    #[arg(long, env = "HOSTMESH_APISERVER_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Where to write the kubeconfig for clients.
    #[arg(
        long,
        env = "HOSTMESH_APISERVER_KUBECONFIG",
        default_value = "hostmesh-dev.kubeconfig"
    )]
    pub kubeconfig: PathBuf,
    /// How the kubeconfig authenticates `hostmesh-admin` (in
    /// `system:masters`): `token` (a bearer token) or `client-cert` (a
    /// client certificate of the cluster CA).
    #[arg(
        long,
        value_enum,
        env = "HOSTMESH_APISERVER_KUBECONFIG_AUTH",
        default_value = "token"
    )]
    pub kubeconfig_auth: KubeconfigAuth,
}

impl From<ApiServerArgs> for ApiServerConfig {
    fn from(a: ApiServerArgs) -> Self {
        Self {
            listen: a.listen,
            data_dir: a.data_dir,
            kubeconfig: Some(a.kubeconfig),
            kubeconfig_auth: a.kubeconfig_auth,
            ..Self::default()
        }
    }
}

/// The API server (see `start`).
pub struct ApiServer;

/// A running API server.
pub struct ApiServerHandle {
    addr: SocketAddr,
    url: String,
    ca_pem: String,
    token: String,
    kubeconfig_yaml: String,
    kubeconfig_path: Option<PathBuf>,
    shutdown: CancellationToken,
    tasks: tokio::task::JoinSet<()>,
    data_dir: Option<PathBuf>,
    store: Arc<store::Store>,
    creds: tls::Credentials,
}

impl std::fmt::Debug for ApiServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token stays out of logs.
        f.debug_struct("ApiServerHandle")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl ApiServer {
    /// Starts serving; returns once the listener is bound.
    pub async fn start(config: ApiServerConfig) -> Result<ApiServerHandle, ApiServerError> {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| ApiServerError::Bind {
                addr: config.listen,
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ApiServerError::Bind {
                addr: config.listen,
                source,
            })?;
        let creds = tls::Credentials::load_or_generate(config.data_dir.as_deref(), addr.ip())?;
        let acceptor = tokio_rustls::TlsAcceptor::from(creds.server_config()?);
        let host = if addr.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            addr.ip().to_string()
        };
        let url = if host.contains(':') {
            format!("https://[{host}]:{}", addr.port())
        } else {
            format!("https://{host}:{}", addr.port())
        };
        let kubeconfig_yaml = match config.kubeconfig_auth {
            KubeconfigAuth::Token => creds.kubeconfig(&url),
            KubeconfigAuth::ClientCert => {
                let (cert, key) = creds.issue_client_cert(ADMIN, &[auth::MASTERS])?;
                client_cert_kubeconfig(&url, &creds.ca_pem, ADMIN, &cert, &key)
            }
        };
        if let Some(p) = &config.kubeconfig {
            if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| ApiServerError::io(dir, e))?;
            }
            tls::write_private(p, &kubeconfig_yaml)?;
        }

        let store = Arc::new(store::Store::new(config.history_limit, config.watch_window));
        if let Some(dir) = &config.data_dir {
            persist::load(dir, &store)?;
        }
        // Set once, on a store nobody else holds yet.
        let _ = store.root_ca.set(creds.ca_pem.clone());
        bootstrap(&store);
        kubernetes_service::ensure(&mut store.lock(), &host, addr.port());

        let sa_key = tls::unhex(&creds.sa_key)
            .filter(|k| !k.is_empty())
            .ok_or_else(|| ApiServerError::Tls("the service account signing key is not hex: delete sa-signing-key in the data directory to make a new one".into()))?;
        let authn = auth::Authenticator::new(creds.token.clone(), &sa_key);
        let shutdown = CancellationToken::new();
        let ctx = Arc::new(http::Ctx {
            store: store.clone(),
            tokens: serviceaccount::TokenIssuer {
                signer: authn.signer.clone(),
                max_expiration: config.max_token_expiration,
            },
            auth: authn,
            token: creds.token.clone(),
            server_addr: format!("{host}:{}", addr.port()),
            watch: watch::WatchConfig {
                bookmark_interval: config.bookmark_interval,
                default_timeout: config.default_watch_timeout,
            },
            shutdown: shutdown.clone(),
            max_body: config.max_body_bytes,
        });
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(http::serve(listener, acceptor, ctx));
        tasks.spawn(gc::run(store.clone(), shutdown.clone()));
        tasks.spawn(policy::run(store.clone(), shutdown.clone()));
        tasks.spawn(disruption::run(store.clone(), shutdown.clone()));
        tasks.spawn(certs::signer::run(
            store.clone(),
            certs::signer::Ca {
                cert_pem: creds.ca_pem.clone(),
                key_pem: creds.ca_key_pem.clone(),
            },
            shutdown.clone(),
        ));
        if let Some(dir) = config.data_dir.clone() {
            tasks.spawn(persist::run(dir, store.clone(), shutdown.clone()));
        }
        tracing::info!(%url, "API server serving");
        Ok(ApiServerHandle {
            addr,
            url,
            ca_pem: creds.ca_pem.clone(),
            token: creds.token.clone(),
            kubeconfig_yaml,
            kubeconfig_path: config.kubeconfig,
            shutdown,
            tasks,
            data_dir: config.data_dir,
            store,
            creds,
        })
    }
}

/// Creates what a fresh cluster has: the standard namespaces, in every
/// namespace a `default` ServiceAccount and the `kube-root-ca.crt`
/// ConfigMap with the current CA, and the default RBAC objects.
fn bootstrap(store: &store::Store) {
    let mut st = store.lock();
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        if st.get("/namespaces", "", ns).is_none() {
            let obj = json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "uid": meta::new_uid(), "creationTimestamp": meta::now(), "labels": {"kubernetes.io/metadata.name": ns}},
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            });
            st.put("/namespaces", "", ns, obj);
        }
    }
    let namespaces: Vec<String> = st
        .scan("/namespaces", None, None)
        .map(|((_, name), _)| name.clone())
        .collect();
    for ns in namespaces {
        serviceaccount::namespace_defaults(&mut st, &ns, store.root_ca.get().map(String::as_str));
    }
    aggregator::sync(&mut st);
    flowcontrol::bootstrap(&mut st);
    drop(st);
    policy::bootstrap(store);
}

impl ApiServerHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The CA certificate (PEM) clients trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The bearer token clients send.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The kubeconfig YAML for this server.
    pub fn kubeconfig_yaml(&self) -> &str {
        &self.kubeconfig_yaml
    }

    /// Where the kubeconfig was written, if anywhere.
    pub fn kubeconfig_path(&self) -> Option<&Path> {
        self.kubeconfig_path.as_deref()
    }

    /// A client certificate and key (PEM) for `user` in `groups`, signed by
    /// the cluster CA: the server authenticates it as that user (`CN`) and
    /// groups (`O`); `system:masters` makes a superuser.
    pub fn issue_client_cert(
        &self,
        user: &str,
        groups: &[&str],
    ) -> Result<(String, String), ApiServerError> {
        self.creds.issue_client_cert(user, groups)
    }

    /// A kubeconfig (YAML) that authenticates with a new client
    /// certificate for `user` in `groups` instead of the token.
    pub fn kubeconfig_with_client_cert(
        &self,
        user: &str,
        groups: &[&str],
    ) -> Result<String, ApiServerError> {
        let (cert, key) = self.issue_client_cert(user, groups)?;
        Ok(client_cert_kubeconfig(
            &self.url,
            &self.ca_pem,
            user,
            &cert,
            &key,
        ))
    }

    /// A kube client for this server.
    pub fn client(&self) -> Result<kube::Client, ApiServerError> {
        let kc = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml)
            .map_err(|e| ApiServerError::Client(e.to_string()))?;
        let cfg = kube::Config::try_from(kc).map_err(|e| ApiServerError::Client(e.to_string()))?;
        kube::Client::try_from(cfg).map_err(|e| ApiServerError::Client(e.to_string()))
    }

    /// Stops serving: open watches end, state is flushed to the data
    /// directory, and all tasks have finished when this returns.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        while self.tasks.join_next().await.is_some() {}
        if let Some(dir) = &self.data_dir {
            persist::flush(dir, &self.store);
        }
    }
}

/// The user the server's own kubeconfig names.
const ADMIN: &str = "hostmesh-admin";

/// A kubeconfig (YAML) for `url` that authenticates `user` with the
/// client certificate `cert` and its `key` (PEM).
fn client_cert_kubeconfig(url: &str, ca_pem: &str, user: &str, cert: &str, key: &str) -> String {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: hostmesh-dev\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: hostmesh-dev\n  context:\n    cluster: hostmesh-dev\n    user: {user}\n    namespace: default\ncurrent-context: hostmesh-dev\npreferences: {{}}\n",
        ca = b64(ca_pem),
        cert = b64(cert),
        key = b64(key),
    )
}

impl Drop for ApiServerHandle {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
