//! Turning a container spec into a [`Launch`]: the program from the command
//! or the image table, `$(VAR)`-expanded arguments, the base environment and
//! the volume mounts.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::config::ImageTable;
use super::env::expand_all;
use super::error::{KubeletError, Result};
use super::process::{Identity, Launch};
use super::volumes::container_mounts;

/// Variables passed from the kubelet's own environment when the container
/// does not set them.
const PASSTHROUGH: &[&str] = &["PATH", "LANG", "LC_ALL", "TZ", "RUST_LOG", "RUST_BACKTRACE"];
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The program and arguments of `container` (at `field`), after expansion
/// with its environment, and whether the program is the image's (from the
/// image table) rather than a command of the container.
pub(crate) fn program(
    container: &Container,
    field: &str,
    images: &ImageTable,
    env: &[(String, String)],
) -> Result<(String, Vec<String>, bool)> {
    let command = expand_all(container.command.as_deref().unwrap_or_default(), env);
    let args = expand_all(container.args.as_deref().unwrap_or_default(), env);
    let image = container.image.clone().unwrap_or_default();
    let entry = images.lookup(&image);
    if let Some((first, rest)) = command.split_first() {
        let mut program = first.clone();
        let mut from_image = false;
        if !program.contains('/')
            && let Some(e) = entry
            && e.program.file_name().is_some_and(|n| n == program.as_str())
        {
            program = e.program.to_string_lossy().into_owned();
            from_image = true;
        }
        let mut all = rest.to_vec();
        all.extend(args);
        return Ok((program, all, from_image));
    }
    match entry {
        Some(e) => {
            let args = if container.args.is_none() {
                e.args.clone()
            } else {
                args
            };
            Ok((e.program.to_string_lossy().into_owned(), args, true))
        }
        None => Err(KubeletError::ImageNotMapped(format!(
            "{field}.image: image {image:?} has no local program; give the container a command, or map the image in the kubelet's image table (--image-table)"
        ))),
    }
}

/// The environment a container starts with: the kubelet's `PATH` and locale,
/// `HOSTNAME`, `HOME`, then the container's own variables.
pub(crate) fn full_env(pod: &Pod, own: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    for key in PASSTHROUGH {
        if let Ok(v) = std::env::var(key) {
            env.push((key.to_string(), v));
        }
    }
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".into(), DEFAULT_PATH.into()));
    }
    env.push(("HOSTNAME".into(), super::net::files::hostname(pod)));
    env.push(("HOME".into(), "/root".into()));
    for (k, v) in own {
        if let Some(slot) = env.iter_mut().find(|(name, _)| *name == k) {
            slot.1 = v;
        } else {
            env.push((k, v));
        }
    }
    env
}

/// The variables that point in-cluster clients at the API server, as a
/// kubelet sets them from the `kubernetes` Service.
pub(crate) fn service_env(service: Option<&(String, u16)>) -> Vec<(String, String)> {
    let Some((host, port)) = service else {
        return Vec::new();
    };
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    vec![
        ("KUBERNETES_SERVICE_HOST".into(), host.clone()),
        ("KUBERNETES_SERVICE_PORT".into(), port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.to_string()),
        ("KUBERNETES_PORT".into(), format!("tcp://{addr}")),
        (
            format!("KUBERNETES_PORT_{port}_TCP"),
            format!("tcp://{addr}"),
        ),
        (format!("KUBERNETES_PORT_{port}_TCP_PROTO"), "tcp".into()),
        (format!("KUBERNETES_PORT_{port}_TCP_PORT"), port.to_string()),
        (format!("KUBERNETES_PORT_{port}_TCP_ADDR"), host.clone()),
    ]
}

/// Everything needed to start `container`, given its resolved variables.
pub(crate) fn build(
    pod: &Pod,
    container: &Container,
    field: &str,
    images: &ImageTable,
    own_env: Vec<(String, String)>,
    volumes: &BTreeMap<String, PathBuf>,
) -> Result<Launch> {
    let env = full_env(pod, own_env);
    let (program, args, image_program) = program(container, field, images, &env)?;
    let mounts = container_mounts(container, field, volumes)?;
    let working_dir = container
        .working_dir
        .as_deref()
        .filter(|w| !w.is_empty())
        .map(PathBuf::from);
    if let Some(w) = &working_dir
        && !w.is_absolute()
    {
        return Err(KubeletError::PodSpec(format!(
            "{field}.workingDir: {:?} must be absolute",
            w
        )));
    }
    let identity = identity(pod, container, field)?;
    Ok(Launch {
        program,
        args,
        env,
        working_dir,
        mounts,
        identity,
        image_program,
        pod_ns: None,
    })
}

/// The user and groups a container runs as, from its `securityContext`
/// (`runAsUser`, `runAsGroup`) or the pod's (those, `supplementalGroups`,
/// `fsGroup`); `None` when neither sets a user or group.
pub(crate) fn identity(pod: &Pod, container: &Container, field: &str) -> Result<Option<Identity>> {
    let pod_sc = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.clone())
        .unwrap_or_default();
    let sc = container.security_context.clone().unwrap_or_default();
    let id = |v: Option<i64>, what: &str| -> Result<Option<u32>> {
        v.map(|v| {
            u32::try_from(v).map_err(|_| {
                KubeletError::PodSpec(format!("{what}: {v} is not a valid user or group id"))
            })
        })
        .transpose()
    };
    let uid = match sc.run_as_user {
        Some(v) => id(Some(v), &format!("{field}.securityContext.runAsUser"))?,
        None => id(pod_sc.run_as_user, "spec.securityContext.runAsUser")?,
    };
    let gid = match sc.run_as_group {
        Some(v) => id(Some(v), &format!("{field}.securityContext.runAsGroup"))?,
        None => id(pod_sc.run_as_group, "spec.securityContext.runAsGroup")?,
    };
    if uid.is_none() && gid.is_none() {
        return Ok(None);
    }
    let gid = gid.unwrap_or(0);
    let mut groups = vec![gid];
    for g in pod_sc.supplemental_groups.iter().flatten() {
        groups.extend(id(Some(*g), "spec.securityContext.supplementalGroups")?);
    }
    groups.extend(id(pod_sc.fs_group, "spec.securityContext.fsGroup")?);
    groups.dedup();
    Ok(Some(Identity {
        uid: uid.unwrap_or(0),
        gid,
        groups,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::config::ImageEntry;

    fn table() -> ImageTable {
        ImageTable::new(vec![ImageEntry {
            image: "ghcr.io/hostmesh/hostmesh*".into(),
            program: "/opt/bin/hostmesh".into(),
            args: vec!["agent".into()],
        }])
    }

    fn c(yaml: &str) -> Container {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn image_entry_supplies_program_and_default_args() {
        let (p, a, _) = program(
            &c("name: x\nimage: ghcr.io/hostmesh/hostmesh:1\n"),
            "f",
            &table(),
            &[],
        )
        .unwrap();
        assert_eq!(
            (p.as_str(), a),
            ("/opt/bin/hostmesh", vec!["agent".to_string()])
        );
        let (_, a, _) = program(
            &c("name: x\nimage: ghcr.io/hostmesh/hostmesh:1\nargs: [crds]\n"),
            "f",
            &table(),
            &[],
        )
        .unwrap();
        assert_eq!(a, vec!["crds"]);
    }

    #[test]
    fn bare_command_of_the_mapped_program_uses_the_table() {
        let env = vec![("D".to_string(), "/x".to_string())];
        let (p, a, _) = program(
            &c("name: x\nimage: ghcr.io/hostmesh/hostmesh:1\ncommand: [hostmesh, install-agent]\nargs: [--to, $(D)/h]\n"),
            "f",
            &table(),
            &env,
        )
        .unwrap();
        assert_eq!(p, "/opt/bin/hostmesh");
        assert_eq!(a, vec!["install-agent", "--to", "/x/h"]);
        let (p, _, _) = program(
            &c("name: x\nimage: busybox\ncommand: [/bin/sh]\n"),
            "f",
            &table(),
            &[],
        )
        .unwrap();
        assert_eq!(p, "/bin/sh");
    }

    #[test]
    fn identity_comes_from_container_then_pod_security_context() {
        let pod: Pod = serde_saphyr::from_str(
            "spec:\n  securityContext: {runAsUser: 1000, runAsGroup: 3000, supplementalGroups: [4000], fsGroup: 2000}\n  containers: [{name: a}]\n",
        )
        .unwrap();
        let a = c("name: a\n");
        let id = identity(&pod, &a, "spec.containers[0]").unwrap().unwrap();
        assert_eq!(
            id,
            Identity {
                uid: 1000,
                gid: 3000,
                groups: vec![3000, 4000, 2000]
            }
        );
        let b = c("name: b\nsecurityContext: {runAsUser: 7}\n");
        assert_eq!(identity(&pod, &b, "f").unwrap().unwrap().uid, 7);
        let none: Pod = serde_saphyr::from_str("spec: {containers: [{name: a}]}\n").unwrap();
        assert_eq!(identity(&none, &a, "f").unwrap(), None);
        let bad = c("name: b\nsecurityContext: {runAsUser: -1}\n");
        let err = identity(&none, &bad, "spec.containers[1]").unwrap_err();
        assert!(
            err.to_string()
                .contains("spec.containers[1].securityContext.runAsUser"),
            "{err}"
        );
    }

    #[test]
    fn service_env_points_at_the_api_server() {
        let env = service_env(Some(&("127.0.0.1".to_string(), 6443)));
        assert!(env.contains(&("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into())));
        assert!(env.contains(&(
            "KUBERNETES_PORT_6443_TCP".into(),
            "tcp://127.0.0.1:6443".into()
        )));
        assert!(service_env(None).is_empty());
    }

    #[test]
    fn unmapped_image_without_command_names_the_fix() {
        let err = program(
            &c("name: x\nimage: nginx:1\n"),
            "spec.containers[1]",
            &table(),
            &[],
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("spec.containers[1].image") && text.contains("--image-table"),
            "{text}"
        );
    }
}
