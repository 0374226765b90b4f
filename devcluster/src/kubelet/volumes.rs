//! Pod volumes as directories under the pod's data directory, and the bind
//! mounts that put them at each container's mount paths.
//!
//! Invariants:
//! 1. `emptyDir` volumes are empty directories created once per pod and kept
//!    across container restarts; they go away with the pod.
//! 2. `secret` and `configMap` volumes hold one file per key (or per listed
//!    item, at its path), written when the pod starts, with the item's mode,
//!    else `defaultMode`, else 0644; `fsGroup` and the projected token's
//!    owner and mode follow the real kubelet (`ownership`).
//! 3. A key or path that would escape the volume directory is rejected.
//! 4. Volumes live under the pod's directory, which only the kubelet's user
//!    can enter (0700): an `emptyDir` is 0777 as in Kubernetes, for the
//!    containers that see it through their mounts, not for other users of
//!    the machine.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeFile, KeyToPath, Pod, ProjectedVolumeSource,
};

use super::env::{Lookups, PodFacts, TokenSpec, field_value, token_key};
use super::error::{KubeletError, Result};
use super::ownership::Ownership;

/// A bind mount of a volume directory (or a file in it) into a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mount {
    /// Directory or file on the host.
    pub(crate) source: PathBuf,
    /// Absolute path inside the container's mount namespace.
    pub(crate) target: PathBuf,
    /// Mounted read-only.
    pub(crate) read_only: bool,
}

fn relative_ok(path: &str) -> bool {
    !path.is_empty()
        && Path::new(path)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

fn write_file(dir: &Path, rel: &str, data: &[u8], mode: i32, field: &str) -> Result<()> {
    if !relative_ok(rel) {
        return Err(KubeletError::PodSpec(format!(
            "{field}: path {rel:?} must be relative and must not contain '..'"
        )));
    }
    let path = dir.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| KubeletError::io("cannot create", parent, e))?;
    }
    std::fs::write(&path, data).map_err(|e| KubeletError::io("cannot write", &path, e))?;
    std::fs::set_permissions(
        &path,
        std::fs::Permissions::from_mode((mode & 0o7777) as u32),
    )
    .map_err(|e| KubeletError::io("cannot chmod", &path, e))?;
    Ok(())
}

fn write_keys(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    default_mode: i32,
    field: &str,
) -> Result<()> {
    match items {
        Some(items) => {
            for (i, item) in items.iter().enumerate() {
                let Some(value) = data.get(&item.key) else {
                    return Err(KubeletError::MissingReference(format!(
                        "{field}.items[{i}].key: key {:?} not found",
                        item.key
                    )));
                };
                let mode = item.mode.unwrap_or(default_mode);
                write_file(
                    dir,
                    &item.path,
                    value,
                    mode,
                    &format!("{field}.items[{i}].path"),
                )?;
            }
        }
        None => {
            for (k, v) in data {
                write_file(dir, k, v, default_mode, field)?;
            }
        }
    }
    Ok(())
}

fn secret_data(lookups: &Lookups, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
    let secret = lookups.secrets.get(name)?.as_ref()?;
    let mut m: BTreeMap<String, Vec<u8>> = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    for (k, v) in secret.string_data.iter().flatten() {
        m.insert(k.clone(), v.clone().into_bytes());
    }
    Some(m)
}

fn config_map_data(lookups: &Lookups, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
    let cm = lookups.config_maps.get(name)?.as_ref()?;
    let mut m: BTreeMap<String, Vec<u8>> = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
        .collect();
    for (k, v) in cm.binary_data.iter().flatten() {
        m.insert(k.clone(), v.0.clone());
    }
    Some(m)
}

fn write_downward(
    dir: &Path,
    pod: &Pod,
    facts: &PodFacts,
    items: &[DownwardAPIVolumeFile],
    default_mode: i32,
    field: &str,
) -> Result<()> {
    for (i, item) in items.iter().enumerate() {
        let at = format!("{field}.items[{i}]");
        let value = match (&item.field_ref, &item.resource_field_ref) {
            (Some(f), _) => field_value(pod, facts, &f.field_path).ok_or_else(|| {
                KubeletError::PodSpec(format!(
                    "{at}.fieldRef.fieldPath: unsupported field {:?}",
                    f.field_path
                ))
            })?,
            (None, Some(_)) => {
                return Err(KubeletError::PodSpec(format!(
                    "{at}.resourceFieldRef: not supported by the process kubelet"
                )));
            }
            (None, None) => {
                return Err(KubeletError::PodSpec(format!("{at}: set fieldRef")));
            }
        };
        write_file(
            dir,
            &item.path,
            value.as_bytes(),
            item.mode.unwrap_or(default_mode),
            &format!("{at}.path"),
        )?;
    }
    Ok(())
}

fn write_projected(
    dir: &Path,
    pod: &Pod,
    facts: &PodFacts,
    lookups: &Lookups,
    projected: &ProjectedVolumeSource,
    field: &str,
    owners: &Ownership,
) -> Result<()> {
    let default_mode = projected.default_mode.unwrap_or(0o644);
    for (i, src) in projected.sources.iter().flatten().enumerate() {
        let at = format!("{field}.projected.sources[{i}]");
        if let Some(s) = &src.secret {
            match secret_data(lookups, &s.name) {
                Some(data) => write_keys(
                    dir,
                    &data,
                    s.items.as_ref(),
                    default_mode,
                    &format!("{at}.secret"),
                )?,
                None if s.optional == Some(true) => {}
                None => {
                    return Err(KubeletError::MissingReference(format!(
                        "{at}.secret.name: secret {:?} not found",
                        s.name
                    )));
                }
            }
        } else if let Some(c) = &src.config_map {
            match config_map_data(lookups, &c.name) {
                Some(data) => write_keys(
                    dir,
                    &data,
                    c.items.as_ref(),
                    default_mode,
                    &format!("{at}.configMap"),
                )?,
                None if c.optional == Some(true) => {}
                None => {
                    return Err(KubeletError::MissingReference(format!(
                        "{at}.configMap.name: config map {:?} not found",
                        c.name
                    )));
                }
            }
        } else if let Some(d) = &src.downward_api {
            write_downward(
                dir,
                pod,
                facts,
                d.items.as_deref().unwrap_or_default(),
                default_mode,
                &format!("{at}.downwardAPI"),
            )?;
        } else if let Some(t) = &src.service_account_token {
            let key = token_key(&TokenSpec {
                audience: t.audience.clone().unwrap_or_default(),
                expiration_seconds: t.expiration_seconds,
            });
            // A pod that never talks to the API server must still run when
            // the server issues no token: the file is then empty.
            let token = lookups
                .tokens
                .get(&key)
                .cloned()
                .flatten()
                .unwrap_or_default();
            write_file(
                dir,
                &t.path,
                token.as_bytes(),
                owners.token_mode(default_mode),
                &format!("{at}.serviceAccountToken.path"),
            )?;
            owners.own_token(&dir.join(&t.path))?;
        } else {
            return Err(KubeletError::PodSpec(format!(
                "{at}: only secret, configMap, downwardAPI and serviceAccountToken sources are supported"
            )));
        }
    }
    Ok(())
}

/// Creates every volume of `pod` under `dir` and returns each volume's host
/// directory by name.
pub(crate) fn prepare_volumes(
    pod: &Pod,
    dir: &Path,
    lookups: &Lookups,
    facts: &PodFacts,
) -> Result<BTreeMap<String, PathBuf>> {
    let mut out = BTreeMap::new();
    let Some(spec) = &pod.spec else {
        return Ok(out);
    };
    let owners = Ownership::of(pod)?;
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let field = format!("spec.volumes[{i}]");
        if !relative_ok(&v.name) || v.name.contains('/') {
            return Err(KubeletError::PodSpec(format!(
                "{field}.name: {:?} is not a valid volume name",
                v.name
            )));
        }
        let path = dir.join(&v.name);
        let fresh = |path: &Path| -> Result<()> {
            if path.exists() {
                std::fs::remove_dir_all(path)
                    .map_err(|e| KubeletError::io("cannot clear", path, e))?;
            }
            std::fs::create_dir_all(path).map_err(|e| KubeletError::io("cannot create", path, e))
        };
        if v.empty_dir.is_some() {
            std::fs::create_dir_all(&path)
                .map_err(|e| KubeletError::io("cannot create", &path, e))?;
            // World-writable like Kubernetes' emptyDir, so containers running
            // as another user can use it.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
                .map_err(|e| KubeletError::io("cannot chmod", &path, e))?;
            owners.apply(&path, false)?;
            out.insert(v.name.clone(), path);
        } else if let Some(s) = &v.secret {
            let name = s.secret_name.clone().unwrap_or_default();
            let data = match secret_data(lookups, &name) {
                Some(data) => data,
                None if s.optional == Some(true) => BTreeMap::new(),
                None => {
                    return Err(KubeletError::MissingReference(format!(
                        "{field}.secret.secretName: secret {name:?} not found"
                    )));
                }
            };
            fresh(&path)?;
            write_keys(
                &path,
                &data,
                s.items.as_ref(),
                s.default_mode.unwrap_or(0o644),
                &format!("{field}.secret"),
            )?;
            owners.apply(&path, true)?;
            out.insert(v.name.clone(), path);
        } else if let Some(c) = &v.config_map {
            let data = match config_map_data(lookups, &c.name) {
                Some(data) => data,
                None if c.optional == Some(true) => BTreeMap::new(),
                None => {
                    return Err(KubeletError::MissingReference(format!(
                        "{field}.configMap.name: config map {:?} not found",
                        c.name
                    )));
                }
            };
            fresh(&path)?;
            write_keys(
                &path,
                &data,
                c.items.as_ref(),
                c.default_mode.unwrap_or(0o644),
                &format!("{field}.configMap"),
            )?;
            owners.apply(&path, true)?;
            out.insert(v.name.clone(), path);
        } else if let Some(p) = &v.projected {
            fresh(&path)?;
            write_projected(&path, pod, facts, lookups, p, &field, &owners)?;
            owners.apply(&path, true)?;
            out.insert(v.name.clone(), path);
        } else if let Some(d) = &v.downward_api {
            fresh(&path)?;
            write_downward(
                &path,
                pod,
                facts,
                d.items.as_deref().unwrap_or_default(),
                d.default_mode.unwrap_or(0o644),
                &format!("{field}.downwardAPI"),
            )?;
            owners.apply(&path, true)?;
            out.insert(v.name.clone(), path);
        } else if let Some(h) = &v.host_path {
            let host = PathBuf::from(&h.path);
            if !host.is_absolute() {
                return Err(KubeletError::PodSpec(format!(
                    "{field}.hostPath.path: {:?} must be absolute",
                    h.path
                )));
            }
            if h.type_.as_deref() == Some("DirectoryOrCreate") {
                std::fs::create_dir_all(&host)
                    .map_err(|e| KubeletError::io("cannot create", &host, e))?;
            }
            out.insert(v.name.clone(), host);
        } else {
            return Err(KubeletError::PodSpec(format!(
                "{field}: volume {:?} has a type the process kubelet does not support; use emptyDir, secret, configMap, projected, downwardAPI or hostPath",
                v.name
            )));
        }
    }
    Ok(out)
}

/// The bind mounts of `container` (at `field`), parents before children.
pub(crate) fn container_mounts(
    container: &Container,
    field: &str,
    volumes: &BTreeMap<String, PathBuf>,
) -> Result<Vec<Mount>> {
    let mut mounts = Vec::new();
    for (i, m) in container.volume_mounts.iter().flatten().enumerate() {
        let at = format!("{field}.volumeMounts[{i}]");
        let Some(source) = volumes.get(&m.name) else {
            return Err(KubeletError::PodSpec(format!(
                "{at}.name: no volume named {:?} in spec.volumes",
                m.name
            )));
        };
        let target = PathBuf::from(&m.mount_path);
        if !target.is_absolute() || target.components().any(|c| c == Component::ParentDir) {
            return Err(KubeletError::PodSpec(format!(
                "{at}.mountPath: {:?} must be an absolute path without '..'",
                m.mount_path
            )));
        }
        let source = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) if relative_ok(sub) => source.join(sub),
            Some(sub) => {
                return Err(KubeletError::PodSpec(format!(
                    "{at}.subPath: {sub:?} must be relative and must not contain '..'"
                )));
            }
            None => source.clone(),
        };
        mounts.push(Mount {
            source,
            target,
            read_only: m.read_only == Some(true),
        });
    }
    mounts.sort_by_key(|m| m.target.components().count());
    Ok(mounts)
}

/// Makes sure every mount target exists before the container starts. A
/// target under another mount of the same container is created inside that
/// mount's source (where the container will see it); other targets are
/// created on the host filesystem (empty directories, or empty files for
/// file mounts).
pub(crate) fn create_mount_targets(mounts: &[Mount]) -> Result<()> {
    for (i, m) in mounts.iter().enumerate() {
        if !m.source.exists() {
            // A subPath that does not exist yet is created as a directory, as Kubernetes does.
            std::fs::create_dir_all(&m.source)
                .map_err(|e| KubeletError::io("cannot create", &m.source, e))?;
        }
        let parent = mounts[..i]
            .iter()
            .rev()
            .find(|p| m.target.starts_with(&p.target) && m.target != p.target);
        let host_target = match parent {
            Some(p) => p
                .source
                .join(m.target.strip_prefix(&p.target).unwrap_or(&m.target)),
            None => m.target.clone(),
        };
        if m.source.is_dir() {
            std::fs::create_dir_all(&host_target)
                .map_err(|e| KubeletError::io("cannot create mount point", &host_target, e))?;
        } else if !host_target.exists() {
            if let Some(dir) = host_target.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| KubeletError::io("cannot create mount point", dir, e))?;
            }
            std::fs::write(&host_target, b"")
                .map_err(|e| KubeletError::io("cannot create mount point", &host_target, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn facts() -> PodFacts {
        PodFacts {
            pod_ip: "127.0.0.9".parse().unwrap(),
            host_ip: std::net::Ipv4Addr::LOCALHOST,
            node_name: "n1".into(),
        }
    }

    #[test]
    fn projected_volumes_hold_tokens_ca_and_namespace() {
        let tmp = tempfile::tempdir().unwrap();
        let pod: Pod = serde_saphyr::from_str(
            r#"
metadata: {name: p, namespace: team}
spec:
  containers: [{name: c}]
  volumes:
  - name: kube-api-access
    projected:
      sources:
      - serviceAccountToken: {path: token, expirationSeconds: 3607}
      - configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}
      - downwardAPI: {items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]}
  - name: info
    downwardAPI: {items: [{path: ip, fieldRef: {fieldPath: status.podIP}}]}
"#,
        )
        .unwrap();
        let mut l = Lookups::default();
        let cm = ConfigMap {
            data: Some([("ca.crt".to_string(), "PEM".to_string())].into()),
            ..Default::default()
        };
        l.config_maps.insert("kube-root-ca.crt".into(), Some(cm));
        let spec = TokenSpec {
            audience: String::new(),
            expiration_seconds: Some(3607),
        };
        l.tokens.insert(token_key(&spec), Some("tok".into()));
        let vols = prepare_volumes(&pod, tmp.path(), &l, &facts()).unwrap();
        let api = &vols["kube-api-access"];
        assert_eq!(std::fs::read_to_string(api.join("token")).unwrap(), "tok");
        assert_eq!(std::fs::read_to_string(api.join("ca.crt")).unwrap(), "PEM");
        assert_eq!(
            std::fs::read_to_string(api.join("namespace")).unwrap(),
            "team"
        );
        assert_eq!(
            std::fs::read_to_string(vols["info"].join("ip")).unwrap(),
            "127.0.0.9"
        );
        l.config_maps.insert("kube-root-ca.crt".into(), None);
        let err = prepare_volumes(&pod, tmp.path(), &l, &facts()).unwrap_err();
        assert!(
            err.to_string()
                .contains("spec.volumes[0].projected.sources[1].configMap.name"),
            "{err}"
        );
    }
    use crate::kubelet::env::{PodFacts, TokenSpec, token_key};
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};

    #[test]
    fn writes_secret_items_with_modes_and_config_maps() {
        let tmp = tempfile::tempdir().unwrap();
        let pod: Pod = serde_saphyr::from_str(
            r#"
spec:
  containers: [{name: c}]
  volumes:
  - {name: scratch, emptyDir: {}}
  - name: tok
    secret: {secretName: s, items: [{key: token, path: sub/token, mode: 0o400}]}
  - name: conf
    configMap: {name: cm, defaultMode: 0o600}
"#,
        )
        .unwrap();
        let mut l = Lookups::default();
        let s = Secret {
            data: Some([("token".to_string(), ByteString(b"abc".to_vec()))].into()),
            ..Default::default()
        };
        l.secrets.insert("s".into(), Some(s));
        let cm = ConfigMap {
            data: Some([("a.conf".to_string(), "x=1".to_string())].into()),
            ..Default::default()
        };
        l.config_maps.insert("cm".into(), Some(cm));
        let vols = prepare_volumes(&pod, tmp.path(), &l, &facts()).unwrap();
        assert!(vols["scratch"].is_dir());
        let token = vols["tok"].join("sub/token");
        assert_eq!(std::fs::read(&token).unwrap(), b"abc");
        assert_eq!(
            std::fs::metadata(&token).unwrap().permissions().mode() & 0o777,
            0o400
        );
        let conf = vols["conf"].join("a.conf");
        assert_eq!(std::fs::read_to_string(&conf).unwrap(), "x=1");
        assert_eq!(
            std::fs::metadata(&conf).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    // The real kubelet's rules (`ownership` invariants 2 and 3): group
    // fsGroup, read-only volumes gain 0440, directories setgid, the token
    // 0600 for the fsUser, made 0640 by the fsGroup.
    #[test]
    fn fs_group_and_fs_user_own_volume_files_as_a_kubelet_makes_them() {
        use std::os::unix::fs::MetadataExt as _;
        if crate::private_dir::euid() != 0 {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let pod: Pod = serde_saphyr::from_str(
            r#"
spec:
  securityContext: {runAsUser: 1000, fsGroup: 2000}
  containers: [{name: c}]
  volumes:
  - {name: scratch, emptyDir: {}}
  - name: tok
    secret: {secretName: s, defaultMode: 0o400}
  - name: api
    projected:
      defaultMode: 0o644
      sources:
      - serviceAccountToken: {path: token}
"#,
        )
        .unwrap();
        let mut l = Lookups::default();
        let s = Secret {
            data: Some([("token".to_string(), ByteString(b"abc".to_vec()))].into()),
            ..Default::default()
        };
        l.secrets.insert("s".into(), Some(s));
        let spec = TokenSpec {
            audience: String::new(),
            expiration_seconds: None,
        };
        l.tokens.insert(token_key(&spec), Some("jwt".into()));
        let vols = prepare_volumes(&pod, tmp.path(), &l, &facts()).unwrap();
        let meta = |p: &Path| std::fs::metadata(p).unwrap();
        let secret = meta(&vols["tok"].join("token"));
        assert_eq!(
            (secret.uid(), secret.gid(), secret.mode() & 0o7777),
            (0, 2000, 0o440)
        );
        let dir = meta(&vols["tok"]);
        assert_eq!((dir.gid(), dir.mode() & 0o2000), (2000, 0o2000));
        let token = meta(&vols["api"].join("token"));
        assert_eq!(
            (token.uid(), token.gid(), token.mode() & 0o7777),
            (1000, 2000, 0o640)
        );
        let scratch = meta(&vols["scratch"]);
        assert_eq!((scratch.gid(), scratch.mode() & 0o7777), (2000, 0o2777));
    }

    #[test]
    fn escaping_paths_and_unknown_volumes_are_rejected() {
        let tmp = tempfile::tempdir().unwrap();
        let pod: Pod = serde_saphyr::from_str(
            "spec:\n  containers: [{name: c}]\n  volumes:\n  - name: v\n    configMap: {name: cm, items: [{key: k, path: ../evil}]}\n",
        )
        .unwrap();
        let mut l = Lookups::default();
        let cm = ConfigMap {
            data: Some([("k".to_string(), "v".to_string())].into()),
            ..Default::default()
        };
        l.config_maps.insert("cm".into(), Some(cm));
        let err = prepare_volumes(&pod, tmp.path(), &l, &facts()).unwrap_err();
        assert!(
            err.to_string()
                .contains("spec.volumes[0].configMap.items[0].path"),
            "{err}"
        );

        let pod: Pod = serde_saphyr::from_str(
            "spec:\n  containers: [{name: c}]\n  volumes:\n  - {name: v, nfs: {server: s, path: /}}\n",
        )
        .unwrap();
        let err = prepare_volumes(&pod, tmp.path(), &l, &facts()).unwrap_err();
        assert!(err.to_string().contains("spec.volumes[0]"), "{err}");
    }

    #[test]
    fn mounts_are_ordered_and_checked() {
        let c: Container = serde_saphyr::from_str(
            "name: c\nvolumeMounts:\n- {name: a, mountPath: /x/y/z}\n- {name: a, mountPath: /x, readOnly: true}\n",
        )
        .unwrap();
        let vols: BTreeMap<String, PathBuf> = [("a".to_string(), PathBuf::from("/data/a"))].into();
        let m = container_mounts(&c, "spec.containers[0]", &vols).unwrap();
        assert_eq!(m[0].target, PathBuf::from("/x"));
        assert!(m[0].read_only);
        let c: Container =
            serde_saphyr::from_str("name: c\nvolumeMounts:\n- {name: b, mountPath: /x}\n").unwrap();
        let err = container_mounts(&c, "spec.containers[0]", &vols).unwrap_err();
        assert!(
            err.to_string()
                .contains("spec.containers[0].volumeMounts[0].name"),
            "{err}"
        );
        let c: Container =
            serde_saphyr::from_str("name: c\nvolumeMounts:\n- {name: a, mountPath: rel}\n")
                .unwrap();
        assert!(container_mounts(&c, "f", &vols).is_err());
    }

    #[test]
    fn nested_targets_are_created_inside_the_parent_volume() {
        let tmp = tempfile::tempdir().unwrap();
        let outer = tmp.path().join("outer");
        let inner = tmp.path().join("inner");
        std::fs::create_dir_all(&outer).unwrap();
        std::fs::create_dir_all(&inner).unwrap();
        let root = tmp.path().join("root");
        let mounts = vec![
            Mount {
                source: outer.clone(),
                target: root.join("a"),
                read_only: false,
            },
            Mount {
                source: inner,
                target: root.join("a/b"),
                read_only: false,
            },
        ];
        create_mount_targets(&mounts).unwrap();
        assert!(root.join("a").is_dir());
        assert!(outer.join("b").is_dir());
        assert!(!root.join("a/b").exists());
    }
}
