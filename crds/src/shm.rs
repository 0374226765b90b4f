//! `World.spec.sharedMemorySize`: a memory-backed `emptyDir` of that size
//! mounted at `/dev/shm` in the host container, where NCCL and PyTorch's
//! data loaders put their shared memory (a container runtime's default
//! `/dev/shm` is 64 MiB). Monarch's `ImageSpec(shared_memory_size=...)`
//! writes the same volume into a pod template.
//!
//! Invariants:
//! 1. The size is a Kubernetes quantity above zero (`16Gi`, `512Mi`,
//!    `1e9`): the schema's pattern and [`check`] agree.
//! 2. Nothing else is mounted at `/dev/shm` in the host container when the
//!    field is set: two sources for one path is an error naming both.

use crate::field::FieldError;
use crate::world::WorldSpec;

/// Where the volume is mounted.
pub const MOUNT_PATH: &str = "/dev/shm";
/// The volume's name in the host pod.
pub const VOLUME: &str = "hostmesh-shm";
/// The quantity pattern of the schema (a positive decimal with an optional
/// binary or decimal suffix, or an exponent).
pub const QUANTITY_PATTERN: &str =
    r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[kMGTPE]|[eE][+]?[0-9]+)?$";

/// Invariants 1 and 2. The host container is the template's container
/// named `host`, else its first (the operator's rule).
pub fn check(spec: &WorldSpec) -> Vec<FieldError> {
    let Some(size) = spec.shared_memory_size.as_deref() else {
        return Vec::new();
    };
    let mut errs = Vec::new();
    let pattern = regex::Regex::new(QUANTITY_PATTERN).expect("a valid pattern");
    let digits_nonzero = size
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .any(|c| c.is_ascii_digit() && c != '0');
    if !pattern.is_match(size) || !digits_nonzero {
        errs.push(FieldError::new(
            "spec.sharedMemorySize",
            format!(
                "{size:?} is not a memory size above zero; use a Kubernetes quantity such as \"16Gi\" or \"512Mi\""
            ),
        ));
    }
    let containers = spec
        .template
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let host = containers
        .iter()
        .position(|c| c.name == "host")
        .unwrap_or(0);
    if let Some(c) = containers.get(host)
        && let Some(m) = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path.trim_end_matches('/') == MOUNT_PATH)
    {
        errs.push(FieldError::new(
            "spec.sharedMemorySize",
            format!(
                "is set while the host container {:?} already mounts volume {:?} at {MOUNT_PATH}; keep one of them",
                c.name, m.name
            ),
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(size: &str, mount: bool) -> WorldSpec {
        let mounts = if mount {
            ", volumeMounts: [{name: shm, mountPath: /dev/shm/}]"
        } else {
            ""
        };
        serde_saphyr::from_str(&format!(
            "hosts: 1\nsharedMemorySize: {size:?}\ntemplate: {{spec: {{containers: [{{name: host, image: x{mounts}}}]}}}}\n"
        ))
        .unwrap()
    }

    #[test]
    fn sizes_are_positive_quantities() {
        for ok in ["16Gi", "512Mi", "1e9", "1.5Gi", "64M", "100"] {
            assert!(check(&spec(ok, false)).is_empty(), "{ok}");
        }
        for bad in ["0", "0Gi", "-1Gi", "16GB", "lots", ""] {
            let e = check(&spec(bad, false));
            assert_eq!(e.len(), 1, "{bad}");
            assert_eq!(e[0].field, "spec.sharedMemorySize");
            assert!(e[0].message.contains("\"16Gi\""), "{}", e[0].message);
        }
    }

    #[test]
    fn a_template_mount_at_dev_shm_conflicts() {
        let e = check(&spec("1Gi", true));
        assert_eq!(e.len(), 1);
        assert!(e[0].message.contains("volume \"shm\""), "{}", e[0].message);
        let mut unset = spec("1Gi", true);
        unset.shared_memory_size = None;
        assert!(
            check(&unset).is_empty(),
            "the template's own mount alone is fine"
        );
    }
}
