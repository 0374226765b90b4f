//! One agent binary per node, shared by its host pods. A host pod's init
//! container runs the hostmesh image's `install-agent --to PATH` into an
//! emptyDir; on a real node the image's layers are shared and only that
//! copy costs a pod its own binary. Here the copy would be a full binary
//! per pod (a hard link cannot cross the bind mount the container sees its
//! volume through), so the kubelet places the node's one copy at PATH's
//! host path itself, as a hard link, before the init container runs;
//! `install-agent` then finds the same bytes in place and copies nothing
//! (`hostmesh_agent::install`, invariant 2).
//!
//! Invariants:
//! 1. The node's copy is made once per kubelet start, in
//!    `<data dir>/agent/`, of what `install-agent` would install
//!    (`hostmesh_agent::install::agent_source`: the agent-only build beside
//!    the hostmesh image's program when it is of the same build, else the
//!    program itself); a hard link when the data directory is on the same
//!    filesystem, else one copy (mode 0555).
//! 2. Only a container that runs the hostmesh image's program with
//!    `install-agent --to PATH`, PATH inside a writable volume mount and
//!    not there yet, gets the link; anything that fails is logged and left
//!    to `install-agent`, which then copies as on any node.

use std::path::{Path, PathBuf};

use super::process::Launch;

use hostmesh_agent::install::AGENT_BINARY;

/// The node's copy and the program it stands for.
#[derive(Debug)]
pub(crate) struct AgentCopy {
    /// The hostmesh image's program (as the image table maps it).
    program: PathBuf,
    /// The node's copy.
    path: PathBuf,
}

impl AgentCopy {
    /// Makes the node's copy for the hostmesh image's `program` in
    /// `data_dir` (invariant 1); `None` (logged) when it cannot.
    pub(crate) fn make(data_dir: &Path, program: &Path) -> Option<AgentCopy> {
        use std::os::unix::fs::PermissionsExt as _;
        let source = hostmesh_agent::install::agent_source(program);
        let dir = data_dir.join("agent");
        let path = dir.join(AGENT_BINARY);
        let made = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
            let _ = std::fs::remove_file(&path);
            if std::fs::hard_link(&source, &path).is_err() {
                std::fs::copy(&source, &path)?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o555))?;
            }
            Ok(())
        })();
        match made {
            Ok(()) => Some(AgentCopy {
                program: program.to_path_buf(),
                path,
            }),
            Err(e) => {
                tracing::warn!(source = %source.display(), error = %e, "cannot keep a node copy of the agent binary; every host pod copies its own");
                None
            }
        }
    }

    /// Links the node's copy where `launch`'s `install-agent --to` puts
    /// the agent (invariant 2).
    pub(crate) fn place(&self, launch: &Launch) {
        if !launch.image_program || Path::new(&launch.program) != self.program {
            return;
        }
        let Some(to) = install_target(&launch.args) else {
            return;
        };
        let Some(mount) = launch
            .mounts
            .iter()
            .filter(|m| !m.read_only && to.starts_with(&m.target) && to != m.target)
            .max_by_key(|m| m.target.as_os_str().len())
        else {
            return;
        };
        let Ok(rel) = to.strip_prefix(&mount.target) else {
            return;
        };
        let host = mount.source.join(rel);
        if host.exists() {
            return;
        }
        let linked = host
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::hard_link(&self.path, &host));
        if let Err(e) = linked {
            tracing::debug!(to = %host.display(), error = %e, "cannot link the node's agent copy; install-agent copies it");
        }
    }
}

/// The `PATH` of `install-agent --to PATH` (or `--to=PATH`), absolute.
fn install_target(args: &[String]) -> Option<PathBuf> {
    if args.first().map(String::as_str) != Some("install-agent") {
        return None;
    }
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let to = match a.strip_prefix("--to=") {
            Some(v) => v.to_owned(),
            None if a == "--to" => it.next()?.clone(),
            None => continue,
        };
        let to = PathBuf::from(to);
        return to.is_absolute().then_some(to);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::volumes::Mount;

    /// Bytes that carry this build's id, as a binary linking the agent does.
    fn built(what: &str) -> Vec<u8> {
        format!(
            "{what} hostmesh-agent-build:{};",
            hostmesh_agent::install::BUILD
        )
        .into_bytes()
    }

    fn launch(program: &Path, args: &[&str], mounts: Vec<Mount>) -> Launch {
        Launch {
            program: program.to_string_lossy().into_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: Vec::new(),
            working_dir: None,
            mounts,
            identity: None,
            image_program: true,
            pod_ns: None,
        }
    }

    #[test]
    fn install_agent_finds_the_node_copy_linked_in_its_volume() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("bin/hostmesh");
        std::fs::create_dir_all(program.parent().unwrap()).unwrap();
        std::fs::write(&program, built("full")).unwrap();
        std::fs::write(program.with_file_name(AGENT_BINARY), built("agent")).unwrap();
        let copy = AgentCopy::make(&dir.path().join("data"), &program).unwrap();
        assert_eq!(std::fs::read(&copy.path).unwrap(), built("agent"));
        let (vol_a, vol_b) = (dir.path().join("pod-a/vol"), dir.path().join("pod-b/vol"));
        for vol in [&vol_a, &vol_b] {
            std::fs::create_dir_all(vol).unwrap();
            let mount = Mount {
                source: vol.clone(),
                target: "/hostmesh/bin".into(),
                read_only: false,
            };
            copy.place(&launch(
                &program,
                &["install-agent", "--to", "/hostmesh/bin/hostmesh"],
                vec![mount],
            ));
        }
        let (a, b) = (vol_a.join("hostmesh"), vol_b.join("hostmesh"));
        assert_eq!(std::fs::read(&a).unwrap(), built("agent"));
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_eq!(ino(&a), ino(&b), "one inode for the node's pods");
        assert_eq!(ino(&a), ino(&copy.path));
    }

    #[test]
    fn only_the_hostmesh_images_install_agent_gets_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("hostmesh");
        std::fs::write(&program, built("full")).unwrap();
        let copy = AgentCopy::make(&dir.path().join("data"), &program).unwrap();
        assert_eq!(
            std::fs::read(&copy.path).unwrap(),
            built("full"),
            "no agent-only build: the program"
        );
        let stale = "agent hostmesh-agent-build:0000000000000000;";
        std::fs::write(program.with_file_name(AGENT_BINARY), stale).unwrap();
        let copy = AgentCopy::make(&dir.path().join("data"), &program).unwrap();
        assert_eq!(
            std::fs::read(&copy.path).unwrap(),
            built("full"),
            "an agent-only build of other sources: the program"
        );
        let vol = dir.path().join("vol");
        std::fs::create_dir_all(&vol).unwrap();
        let mount = |ro| Mount {
            source: vol.clone(),
            target: "/v".into(),
            read_only: ro,
        };
        let other = dir.path().join("other");
        copy.place(&launch(
            &other,
            &["install-agent", "--to", "/v/h"],
            vec![mount(false)],
        ));
        copy.place(&launch(
            &program,
            &["agent", "--to", "/v/h"],
            vec![mount(false)],
        ));
        copy.place(&launch(
            &program,
            &["install-agent", "--to", "/v/h"],
            vec![mount(true)],
        ));
        copy.place(&launch(
            &program,
            &["install-agent", "--to", "/elsewhere/h"],
            vec![mount(false)],
        ));
        assert!(!vol.join("h").exists());
        copy.place(&launch(
            &program,
            &["install-agent", "--to=/v/h"],
            vec![mount(false)],
        ));
        assert!(vol.join("h").exists());
    }
}
