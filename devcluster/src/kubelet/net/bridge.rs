//! The node's share of the pod network: one /24 of the pod range, claimed
//! machine-wide, and the bridge that carries it.
//!
//! Invariants:
//! 1. A kubelet holds one /24 of the pod range from start to stop, claimed
//!    with an exclusive lock on `<claims dir>/subnet-<a.b.c.0>`; kubelets
//!    sharing a machine (and a claims directory) never share a /24.
//! 2. The bridge is named after its /24 (`hmbr<a.b.c>`, at most 15
//!    characters) and carries `<a.b.c>.1/24`, the pods' gateway. A bridge of
//!    that name found when the claim is taken was left by a kubelet that
//!    died holding it, and is deleted.
//! 3. The pod range overlaps no route of the machine (other than our own
//!    bridges' and default routes): a given one that does is refused at
//!    start, naming both; with none given a free one is picked (`range`).
//! 4. `stop` deletes the bridge, then releases the claim; a dead kubelet's
//!    bridge is deleted by whoever takes its claim next (a new kubelet, or
//!    `hostmesh up`'s reaper through [`delete_unclaimed`]).

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use super::netlink::Netlink;
use super::range::{self, PodRange, RangeOrigin};
use super::{BRIDGE_PREFIX, Ipv4Net, nsthread};
use crate::kubelet::error::{KubeletError, Result};

/// The node's /24 and its bridge.
#[derive(Debug)]
pub(crate) struct NodeNetwork {
    /// The whole pod range (routed from every pod through its gateway).
    pub(crate) range: Ipv4Net,
    /// The range and why it is that one (given, or picked and what was
    /// passed over).
    pub(crate) pod_range: PodRange,
    /// This node's /24 (the Node's `spec.podCIDR`).
    pub(crate) subnet: Ipv4Net,
    /// `<subnet>.1`, the bridge's address.
    pub(crate) gateway: Ipv4Addr,
    /// The bridge's name.
    pub(crate) bridge: String,
    /// The bridge's link index.
    pub(crate) bridge_index: u32,
    /// The claim file of the /24 (`None` without a claims directory).
    pub(crate) claim_path: Option<PathBuf>,
    claim: std::sync::Mutex<Option<File>>,
}

/// The bridge name of `subnet` (invariant 2).
pub(crate) fn bridge_name(subnet: Ipv4Net) -> String {
    let [a, b, c, _] = subnet.addr().octets();
    format!("{BRIDGE_PREFIX}{a}.{b}.{c}")
}

fn missing_privilege(what: &str, e: &std::io::Error) -> KubeletError {
    KubeletError::Config(format!(
        "pod sandboxes need network namespaces and CAP_NET_ADMIN (run the kubelet as root): {what}: {e}; \
         to run pods in the machine's network namespace on loopback addresses instead, use --pod-network=host \
         (KubeletConfig::pod_network = PodNetwork::Host)"
    ))
}

fn claim_path(dir: &Path, subnet: Ipv4Net) -> PathBuf {
    dir.join(format!("subnet-{}", subnet.addr()))
}

fn claim(dir: &Path, subnet: Ipv4Net) -> Result<Option<File>> {
    std::fs::create_dir_all(dir).map_err(|e| KubeletError::io("cannot create", dir, e))?;
    let path = claim_path(dir, subnet);
    lock_claim(&path)
}

fn lock_claim(path: &Path) -> Result<Option<File>> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| KubeletError::io("cannot open", path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(KubeletError::io("cannot lock", path, e)),
    }
}

impl NodeNetwork {
    /// Checks that sandboxes can be made here, settles the pod range
    /// (`given`, or a free one picked: invariant 3), claims a free /24 of it
    /// and creates its bridge.
    pub(crate) async fn start(given: Option<Ipv4Net>, claims_dir: Option<PathBuf>) -> Result<Self> {
        // Fails early, and clearly, where namespaces cannot be made.
        nsthread::new_pod_namespaces("probe")
            .await
            .map_err(|e| missing_privilege("cannot create a network and UTS namespace", &e))?;
        let nl =
            Netlink::host().map_err(|e| missing_privilege("cannot open a netlink socket", &e))?;
        let routes = nl
            .routes()
            .await
            .map_err(|e| KubeletError::io("cannot read the machine's routes", "netlink", e))?;
        let pod_range = range::choose(given, &routes)?;
        let range = pod_range.range;
        match &pod_range.origin {
            RangeOrigin::Given => tracing::info!(%range, "pod range as given"),
            RangeOrigin::Picked { .. } => {
                tracing::info!(%range, why = %pod_range, "picked a free pod range (none given)")
            }
        }
        for subnet in range.subnets(24) {
            let name = bridge_name(subnet);
            let claim = match &claims_dir {
                Some(dir) => match claim(dir, subnet)? {
                    Some(f) => Some(f),
                    None => continue,
                },
                None => None,
            };
            let existing = nl
                .index(&name)
                .await
                .map_err(|e| KubeletError::io("cannot look up", &name, e))?;
            if existing.is_some() {
                if claim.is_none() {
                    // Without claims an existing bridge may be in use.
                    continue;
                }
                tracing::info!(bridge = %name, "deleting the bridge a stopped kubelet left");
                nl.delete(&name)
                    .await
                    .map_err(|e| KubeletError::io("cannot delete stale bridge", &name, e))?;
            }
            let gateway = subnet.nth(1);
            let bridge_index =
                nl.create_bridge(&name, gateway, 24)
                    .await
                    .map_err(|e| match e.kind() {
                        std::io::ErrorKind::PermissionDenied => {
                            missing_privilege("cannot create the bridge", &e)
                        }
                        _ => KubeletError::io("cannot create bridge", &name, e),
                    })?;
            tracing::info!(bridge = %name, %subnet, "pod network ready");
            return Ok(Self {
                range,
                pod_range,
                subnet,
                gateway,
                bridge: name,
                bridge_index,
                claim_path: claims_dir.as_deref().map(|d| claim_path(d, subnet)),
                claim: std::sync::Mutex::new(claim),
            });
        }
        Err(KubeletError::Config(format!(
            "every /24 of the pod range {range} is taken by other kubelets on this machine; stop some or give a larger --pod-ip-range"
        )))
    }

    /// Deletes the bridge, then releases the claim (invariant 4).
    pub(crate) async fn stop(&self) {
        match Netlink::host() {
            Ok(nl) => match nl.delete(&self.bridge).await {
                Ok(_) => tracing::info!(bridge = %self.bridge, "deleted the pod bridge"),
                Err(e) => {
                    tracing::warn!(bridge = %self.bridge, error = %e, "cannot delete the pod bridge")
                }
            },
            Err(e) => tracing::warn!(error = %e, "cannot open netlink to delete the pod bridge"),
        }
        self.claim.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// Deletes bridge `name` that a dead kubelet left, when its claim file
/// `claim` is free (invariant 1: a live kubelet holding it keeps its
/// bridge); true when a bridge was deleted. The claim is held while the
/// bridge goes, so no new kubelet creates it meanwhile.
pub(crate) async fn delete_unclaimed(name: &str, claim: &Path) -> Result<bool> {
    if !name.starts_with(super::BRIDGE_PREFIX) {
        return Err(KubeletError::Config(format!(
            "{name:?} is not a pod bridge (they are named {}<a.b.c>)",
            super::BRIDGE_PREFIX
        )));
    }
    let Some(_held) = lock_claim(claim)? else {
        return Ok(false);
    };
    let nl = Netlink::host().map_err(|e| KubeletError::io("cannot open", "netlink", e))?;
    nl.delete(name)
        .await
        .map_err(|e| KubeletError::io("cannot delete", name, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_privileges_name_what_is_missing_and_the_way_out() {
        let e = std::io::Error::from_raw_os_error(libc::EPERM);
        let msg = missing_privilege("cannot create a network and UTS namespace", &e).to_string();
        for part in [
            "CAP_NET_ADMIN",
            "network and UTS namespace",
            "--pod-network=host",
            "ermitted",
        ] {
            assert!(msg.contains(part), "{part}: {msg}");
        }
    }

    #[test]
    fn bridge_names_fit_an_interface_name() {
        let longest = Ipv4Net::new(Ipv4Addr::new(255, 255, 255, 0), 24).unwrap();
        assert!(bridge_name(longest).len() <= 15, "{}", bridge_name(longest));
    }
}
