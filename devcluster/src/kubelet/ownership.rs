//! Who owns a pod's volume files, as a real kubelet decides it:
//! `SetVolumeOwnership` for `fsGroup`, and the projected token's owner and
//! mode.
//!
//! Invariants (the real kubelet's rules, `pkg/volume/volume_linux.go` and
//! `pkg/volume/projected/projected.go`):
//! 1. Files are written by the kubelet (owner root when it runs as root)
//!    with the item's `mode`, else the volume's `defaultMode`, else 0644.
//! 2. With `spec.securityContext.fsGroup`, every file and directory of a
//!    volume gets group fsGroup; read-only volumes (secret, configMap,
//!    downwardAPI, projected) add 0440 to each mode, writable ones
//!    (emptyDir) 0660; directories also get setgid and 0110.
//! 3. A projected service-account token is 0600 instead of `defaultMode`
//!    when the pod has an fsGroup or an fsUser (every container runs as the
//!    same `runAsUser`); with an fsUser the token file belongs to that user
//!    (then fsGroup, if any, makes it 0640).
//! 4. Owners are changed only when the kubelet runs as root (only root may
//!    give files away); otherwise the files stay the kubelet's.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;

use super::error::{KubeletError, Result};

/// The pod-level owners of its volume files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ownership {
    /// `spec.securityContext.fsGroup`.
    pub(crate) fs_group: Option<u32>,
    /// The `runAsUser` every container (init ones too) runs as, when they
    /// all name the same one.
    pub(crate) fs_user: Option<u32>,
}

fn id(v: i64, field: &str) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| KubeletError::PodSpec(format!("{field}: {v} is not a valid user or group id")))
}

impl Ownership {
    /// Reads the pod's fsGroup and fsUser.
    pub(crate) fn of(pod: &Pod) -> Result<Self> {
        let Some(spec) = &pod.spec else {
            return Ok(Self::default());
        };
        let pod_sc = spec.security_context.clone().unwrap_or_default();
        let fs_group = pod_sc
            .fs_group
            .map(|g| id(g, "spec.securityContext.fsGroup"))
            .transpose()?;
        let mut users = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .map(|c| {
                c.security_context
                    .as_ref()
                    .and_then(|s| s.run_as_user)
                    .or(pod_sc.run_as_user)
            });
        let first = users.next().flatten();
        let fs_user = match first {
            Some(u) if users.all(|x| x == Some(u)) => Some(id(u, "runAsUser")?),
            _ => None,
        };
        Ok(Self { fs_group, fs_user })
    }

    /// Mode of a projected service-account token (invariant 3).
    pub(crate) fn token_mode(&self, default_mode: i32) -> i32 {
        if self.fs_group.is_some() || self.fs_user.is_some() {
            0o600
        } else {
            default_mode
        }
    }

    /// Gives a token file to the fsUser (invariants 3 and 4).
    pub(crate) fn own_token(&self, file: &Path) -> Result<()> {
        match self.fs_user {
            Some(uid) if is_root() => std::os::unix::fs::lchown(file, Some(uid), None)
                .map_err(|e| KubeletError::io("cannot chown", file, e)),
            _ => Ok(()),
        }
    }

    /// Applies fsGroup to a volume directory and everything in it
    /// (invariant 2); nothing without an fsGroup or without root.
    pub(crate) fn apply(&self, dir: &Path, read_only: bool) -> Result<()> {
        let Some(gid) = self.fs_group else {
            return Ok(());
        };
        if !is_root() {
            return Ok(());
        }
        let mask = if read_only { 0o440 } else { 0o660 };
        // Bounded walk: a volume holds what the kubelet just wrote (or an
        // emptyDir it just created).
        let mut stack = vec![dir.to_path_buf()];
        let mut seen = 0usize;
        while let Some(path) = stack.pop() {
            seen += 1;
            if seen > 100_000 {
                break;
            }
            let meta = std::fs::symlink_metadata(&path)
                .map_err(|e| KubeletError::io("cannot inspect", &path, e))?;
            if meta.file_type().is_symlink() {
                continue;
            }
            std::os::unix::fs::lchown(&path, None, Some(gid))
                .map_err(|e| KubeletError::io("cannot chown", &path, e))?;
            let mut mode = (meta.mode() & 0o7777) | mask;
            if meta.is_dir() {
                mode |= 0o2000 | 0o110;
                for e in std::fs::read_dir(&path)
                    .map_err(|e| KubeletError::io("cannot list", &path, e))?
                    .flatten()
                {
                    stack.push(e.path());
                }
            }
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| KubeletError::io("cannot chmod", &path, e))?;
        }
        Ok(())
    }
}

fn is_root() -> bool {
    crate::private_dir::euid() == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn fs_user_is_the_one_user_every_container_runs_as() {
        let o = Ownership::of(&pod(
            "spec:\n  securityContext: {runAsUser: 1000, fsGroup: 2000}\n  initContainers: [{name: i}]\n  containers: [{name: a}, {name: b, securityContext: {runAsUser: 1000}}]\n",
        ))
        .unwrap();
        assert_eq!(
            o,
            Ownership {
                fs_group: Some(2000),
                fs_user: Some(1000)
            }
        );
        let o = Ownership::of(&pod(
            "spec:\n  securityContext: {runAsUser: 1000}\n  containers: [{name: a}, {name: b, securityContext: {runAsUser: 7}}]\n",
        ))
        .unwrap();
        assert_eq!(o.fs_user, None);
        let o = Ownership::of(&pod("spec:\n  containers: [{name: a}]\n")).unwrap();
        assert_eq!(o, Ownership::default());
        assert_eq!(o.token_mode(0o644), 0o644);
        let err = Ownership::of(&pod(
            "spec:\n  securityContext: {fsGroup: -1}\n  containers: [{name: a}]\n",
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("spec.securityContext.fsGroup"),
            "{err}"
        );
    }
}
