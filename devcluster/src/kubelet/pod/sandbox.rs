//! A pod worker's sandbox: made before the pod's volumes and first
//! container, with the `kubernetes` Service served inside when the API
//! server has one, and the `/etc` files every container gets.

use std::path::Path;

use k8s_openapi::api::core::v1::Service;

use super::*;
use crate::kubelet::net::{DnsPod, SandboxSpec, files};
use crate::kubelet::volumes::Mount;

/// Where the `/etc` files of a pod live: `<pod dir>/etc`.
fn etc_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join("etc")
}

impl Worker {
    /// Makes the pod's sandbox and writes its `/etc` files, once.
    pub(super) async fn ensure_sandbox(&mut self) -> Result<()> {
        if !self.sandboxed || self.sandbox.is_some() {
            return Ok(());
        }
        let Some(node) = self.shared.network.as_ref() else {
            return Ok(());
        };
        let hostname = files::hostname(&self.pod);
        let host_resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        let resolv = files::resolv_conf(&self.pod, &host_resolv)?;
        let etc = etc_dir(&self.dir);
        std::fs::create_dir_all(&etc).map_err(|e| KubeletError::io("cannot create", &etc, e))?;
        for (name, body) in [
            ("hosts", files::hosts(&self.pod, self.ip)),
            ("resolv.conf", resolv),
            ("hostname", format!("{hostname}\n")),
        ] {
            let path = etc.join(name);
            std::fs::write(&path, body).map_err(|e| KubeletError::io("cannot write", &path, e))?;
        }
        let api = api_service(&self.shared).await;
        let spec = SandboxSpec {
            pod: DnsPod {
                namespace: self.ns.clone(),
                name: self.name.clone(),
            },
            ip: self.ip,
            hostname: &hostname,
            api: api.as_ref(),
            dns: self.shared.config.cluster_dns.as_ref(),
        };
        let sandbox =
            Sandbox::create(node, spec)
                .await
                .map_err(|source| KubeletError::Sandbox {
                    pod: self.key(),
                    source,
                })?;
        tracing::debug!(pod = %self.key(), ip = %self.ip, "sandbox ready");
        self.sandbox = Some(sandbox);
        self.api = api;
        Ok(())
    }

    /// Joins `launch` to the pod's sandbox: its namespaces, and the `/etc`
    /// files mounted over the container's (a container's own mount of one
    /// of these paths wins).
    pub(super) fn join_sandbox(&self, launch: &mut Launch) {
        let Some(sandbox) = &self.sandbox else { return };
        launch.pod_ns = Some(sandbox.ns.clone());
        let etc = etc_dir(&self.dir);
        for name in ["hosts", "resolv.conf", "hostname"] {
            let target = Path::new("/etc").join(name);
            if !launch.mounts.iter().any(|m| m.target == target) {
                launch.mounts.push(Mount {
                    source: etc.join(name),
                    target,
                    read_only: false,
                });
            }
        }
    }

    /// Host and port containers find the API server at: the `kubernetes`
    /// Service inside the sandbox, else the kubelet's own address.
    pub(super) fn api_address(&self) -> Option<(String, u16)> {
        match &self.api {
            Some(api) => Some((api.cluster_ip.to_string(), api.port)),
            None => self.shared.config.kubernetes_service.clone(),
        }
    }
}

/// The `kubernetes` Service (`default/kubernetes`, port `https`) as pods
/// reach it, forwarded to the API server address the kubelet uses; read
/// once, `None` (and read again for the next pod) while the API server has
/// no such Service.
async fn api_service(shared: &Shared) -> Option<ApiService> {
    let mut cached = shared.api_service.lock().await;
    if let Some(api) = cached.as_ref() {
        return Some(api.clone());
    }
    let (host, port) = shared.config.kubernetes_service.as_ref()?;
    let upstream = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let services: Api<Service> = Api::namespaced(shared.client.clone(), "default");
    let svc = match bounded(
        || "get service default/kubernetes".into(),
        services.get_opt("kubernetes"),
    )
    .await
    {
        Ok(Some(s)) => s,
        Ok(None) => {
            tracing::warn!(
                "no default/kubernetes Service: pods get the API server's own address, which they cannot reach"
            );
            return None;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the kubernetes Service");
            return None;
        }
    };
    let spec = svc.spec.unwrap_or_default();
    let cluster_ip = spec.cluster_ip.as_deref().and_then(|ip| ip.parse().ok())?;
    let ports = spec.ports.unwrap_or_default();
    let port = ports
        .iter()
        .find(|p| p.name.as_deref() == Some("https"))
        .or(ports.first())
        .map(|p| p.port)
        .and_then(|p| u16::try_from(p).ok())?;
    let api = ApiService {
        cluster_ip,
        port,
        upstream,
    };
    tracing::info!(cluster_ip = %api.cluster_ip, port, upstream = %api.upstream, "pods reach the API server through the kubernetes Service");
    *cached = Some(api.clone());
    Some(api)
}
