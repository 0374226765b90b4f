//! Devices the process kubelet hands to containers, with the health a
//! real kubelet reports per device in
//! `status.containerStatuses[].allocatedResourcesStatus` (KEP-4680, beta
//! and on by default since Kubernetes 1.36).
//!
//! The node advertises `nvidia.com/gpu` (`--gpu-capacity N`): devices
//! `gpu-0` .. `gpu-<N-1>`. A container that asks for `nvidia.com/gpu`
//! (limits, else requests) gets that many free devices when its pod is
//! taken, reported `Healthy` until told otherwise.
//!
//! **Test hook.** No device plugin runs here, so a device's health is set
//! by a file: `<data dir>/devices/health`, one device per line,
//! `<resource> <device id> <Healthy|Unhealthy|Unknown>` (blank lines and
//! `#` comments are skipped), read again whenever its modification time
//! changes ([`watch_health_file`]). A device the file does not name is
//! `Healthy`. Every pod holding a device whose health changed writes its
//! status again.
//!
//! Invariants:
//! 1. A device belongs to at most one container of one live pod; it is
//!    free again once that pod's worker is gone.
//! 2. A container gets all the devices it asks for or none (a real
//!    kubelet refuses the pod: `UnexpectedAdmissionError`; here the
//!    container runs without and the kubelet logs why).
//! 3. Health is per device and outlives pods: a device marked Unhealthy
//!    stays so for the next pod that gets it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Container, ResourceHealth, ResourceStatus};

use super::shared::{Shared, lock};

/// The one device resource the process kubelet advertises.
pub(crate) const GPU: &str = "nvidia.com/gpu";
/// How often the health file is looked at.
const POLL: Duration = Duration::from_millis(500);

/// The node's devices: who holds each, and how healthy each is.
#[derive(Debug, Default)]
pub(crate) struct Devices {
    /// `gpu-<i>` for i < capacity.
    capacity: u32,
    /// Device id -> (pod uid, container).
    held: BTreeMap<String, (String, String)>,
    /// Device id -> health, for devices not `Healthy`.
    health: BTreeMap<String, String>,
}

impl Devices {
    /// A node with `capacity` GPUs.
    pub(crate) fn new(capacity: u32) -> Self {
        Devices {
            capacity,
            ..Default::default()
        }
    }

    /// Gives container `container` of pod `uid` `count` free devices, the
    /// lowest ids first (invariants 1, 2).
    pub(crate) fn allocate(
        &mut self,
        uid: &str,
        container: &str,
        count: u32,
    ) -> Result<Vec<String>, String> {
        let free: Vec<String> = (0..self.capacity)
            .map(|i| format!("gpu-{i}"))
            .filter(|id| !self.held.contains_key(id))
            .take(count as usize)
            .collect();
        if free.len() < count as usize {
            return Err(format!(
                "requested number of devices unavailable for {GPU}. Requested: {count}, Available: {}",
                free.len()
            ));
        }
        for id in &free {
            self.held
                .insert(id.clone(), (uid.to_string(), container.to_string()));
        }
        Ok(free)
    }

    /// Frees every device of pod `uid`.
    pub(crate) fn release(&mut self, uid: &str) {
        self.held.retain(|_, (u, _)| u != uid);
    }

    /// The health of device `id`.
    fn health_of(&self, id: &str) -> &str {
        self.health.get(id).map_or("Healthy", String::as_str)
    }

    /// What `allocatedResourcesStatus` says of `ids`.
    pub(crate) fn status(&self, ids: &[String]) -> ResourceStatus {
        ResourceStatus {
            name: GPU.to_string(),
            resources: Some(
                ids.iter()
                    .map(|id| ResourceHealth {
                        resource_id: id.clone(),
                        health: Some(self.health_of(id).to_string()),
                    })
                    .collect(),
            ),
        }
    }

    /// Replaces every device's health with `health` (devices not named
    /// are `Healthy`); returns whether any held device's health changed.
    fn set_health(&mut self, health: BTreeMap<String, String>) -> bool {
        let changed = self
            .held
            .keys()
            .any(|id| self.health.get(id) != health.get(id));
        self.health = health;
        changed
    }
}

/// How many `nvidia.com/gpu` `c` asks for: its limit, else its request.
pub(crate) fn requested(c: &Container) -> u32 {
    let res = c.resources.as_ref();
    res.and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get(GPU))
        .or_else(|| {
            res.and_then(|r| r.requests.as_ref())
                .and_then(|l| l.get(GPU))
        })
        .and_then(|q| q.0.parse().ok())
        .unwrap_or(0)
}

/// Where the test hook's file is.
pub(crate) fn health_file(data_dir: &Path) -> PathBuf {
    data_dir.join("devices").join("health")
}

/// Parses the health file: `<resource> <id> <health>` per line, for
/// `nvidia.com/gpu` (other resources are not served here and ignored).
fn parse(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let [resource, id, health] = words.as_slice() else {
            return Err(format!(
                "line {}: expected `<resource> <device id> <Healthy|Unhealthy|Unknown>`, got {line:?}",
                n + 1
            ));
        };
        if !matches!(*health, "Healthy" | "Unhealthy" | "Unknown") {
            return Err(format!(
                "line {}: health {health:?} is not Healthy, Unhealthy or Unknown",
                n + 1
            ));
        }
        if *resource == GPU && *health != "Healthy" {
            out.insert(id.to_string(), health.to_string());
        }
    }
    Ok(out)
}

/// Reads the health file whenever it changes, until shutdown, and tells
/// the pods holding a device whose health changed (the module's test
/// hook).
pub(crate) async fn watch_health_file(shared: std::sync::Arc<Shared>) {
    let path = health_file(&shared.config.data_dir);
    let mut seen: Option<SystemTime> = None;
    loop {
        tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
        let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        if modified == seen {
            continue;
        }
        seen = modified;
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let health = match parse(&text) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "device health file ignored");
                continue;
            }
        };
        tracing::info!(?health, "device health changed");
        if lock(&shared.devices).set_health(health) {
            shared.device_changes.send_modify(|n| *n += 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_handed_out_whole_and_freed_with_their_pod() {
        let mut d = Devices::new(3);
        assert_eq!(d.allocate("a", "host", 2).unwrap(), ["gpu-0", "gpu-1"]);
        assert!(
            d.allocate("b", "host", 2)
                .unwrap_err()
                .contains("Requested: 2, Available: 1")
        );
        assert_eq!(d.allocate("b", "host", 1).unwrap(), ["gpu-2"]);
        d.release("a");
        assert_eq!(d.allocate("c", "host", 2).unwrap(), ["gpu-0", "gpu-1"]);
    }

    #[test]
    fn health_comes_from_the_file_and_outlives_pods() {
        let mut d = Devices::new(2);
        let ids = d.allocate("a", "host", 2).unwrap();
        let h = parse("# hook\nnvidia.com/gpu gpu-1 Unhealthy\n\nexample.com/fpga f0 Unhealthy\n")
            .unwrap();
        assert!(d.set_health(h.clone()));
        assert!(!d.set_health(h), "no change");
        let s = d.status(&ids);
        assert_eq!(s.name, "nvidia.com/gpu");
        let health: Vec<_> = s
            .resources
            .unwrap()
            .into_iter()
            .map(|r| (r.resource_id, r.health.unwrap()))
            .collect();
        assert_eq!(
            health,
            [
                ("gpu-0".to_string(), "Healthy".to_string()),
                ("gpu-1".to_string(), "Unhealthy".to_string())
            ]
        );
        d.release("a");
        let ids = d.allocate("b", "host", 2).unwrap();
        assert_eq!(
            d.status(&ids).resources.unwrap()[1].health.as_deref(),
            Some("Unhealthy")
        );
    }

    #[test]
    fn a_bad_line_names_itself() {
        assert!(
            parse("nvidia.com/gpu gpu-0")
                .unwrap_err()
                .contains("line 1")
        );
        assert!(
            parse("nvidia.com/gpu gpu-0 Broken")
                .unwrap_err()
                .contains("\"Broken\" is not Healthy")
        );
    }
}
