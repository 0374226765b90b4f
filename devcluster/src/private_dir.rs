//! Directories only their owner can enter, for state that holds
//! credentials (pod volumes with tokens, the kubeconfig, logs) on a machine
//! other users share.
//!
//! Invariants:
//! 1. After [`ensure`] returns `Ok`, the directory exists, is a real
//!    directory (not a symlink), is owned by this process's effective user,
//!    and has mode 0700. A directory that is a symlink or belongs to another
//!    user is refused (never chmodded or written into): another user could
//!    otherwise have prepared it to receive our files.
//! 2. Missing parents are created with the default mode; only the last
//!    component is made private (it is the one that gates access). Its
//!    parent must not let just anyone rename it away: a parent every user
//!    may write without the sticky bit (which `/tmp` has) is refused. The
//!    parent's owner and group are trusted: a checkout's owner running
//!    `sudo hostmesh up` owns `.hostmesh`'s parent, and with user private
//!    groups (umask 002) the group is that user alone.
//! 3. [`remove`] never follows a symlink out of the tree it removes.

use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// Why a private directory could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PrivateDirError {
    /// A file system call failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The path exists but is not a directory this user owns.
    #[error(
        "{path} {what}; it would hold credentials, so it must be a directory owned by uid {uid}: remove it or choose another directory"
    )]
    NotOurs {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
        /// This process's effective uid.
        uid: u32,
    },
}

/// This process's effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

/// Creates `path` (and missing parents) and makes it private: mode 0700,
/// owned by this user (invariant 1).
pub fn ensure(path: &Path) -> Result<(), PrivateDirError> {
    let io = |action, source| PrivateDirError::Io {
        action,
        path: path.to_path_buf(),
        source,
    };
    let uid = euid();
    let not_ours = |what: String| PrivateDirError::NotOurs {
        path: path.to_path_buf(),
        what,
        uid,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| PrivateDirError::Io {
            action: "cannot create",
            path: parent.to_path_buf(),
            source: e,
        })?;
        let pm = std::fs::metadata(parent).map_err(|e| PrivateDirError::Io {
            action: "cannot inspect",
            path: parent.to_path_buf(),
            source: e,
        })?;
        let sticky = pm.mode() & 0o1000 != 0;
        if pm.mode() & 0o002 != 0 && !sticky {
            return Err(not_ours(format!(
                "is in {}, which every user may write without the sticky bit",
                parent.display()
            )));
        }
    }
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("cannot create", e)),
    }
    let meta = std::fs::symlink_metadata(path).map_err(|e| io("cannot inspect", e))?;
    if meta.file_type().is_symlink() {
        return Err(not_ours("is a symbolic link".into()));
    }
    if !meta.is_dir() {
        return Err(not_ours("is not a directory".into()));
    }
    if meta.uid() != uid {
        return Err(not_ours(format!("belongs to uid {}", meta.uid())));
    }
    if meta.mode() & 0o7777 != 0o700 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io("cannot chmod", e))?;
    }
    Ok(())
}

/// Removes `path` and everything under it; a missing path is fine
/// (invariant 3: `remove_dir_all` does not follow symlinks).
pub fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => match std::fs::remove_dir_all(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        },
        Ok(_) => match std::fs::remove_file(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn makes_new_and_existing_directories_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        ensure(&dir).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir), 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        ensure(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
    }

    #[test]
    fn refuses_a_symlink_or_a_file() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = ensure(&link).unwrap_err().to_string();
        assert!(err.contains("is a symbolic link"), "{err}");
        let file = tmp.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let err = ensure(&file).unwrap_err().to_string();
        assert!(err.contains("is not a directory"), "{err}");
    }

    #[test]
    fn refuses_another_user_s_directory() {
        if euid() != 0 {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("theirs");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        let err = ensure(&dir).unwrap_err().to_string();
        assert!(err.contains("belongs to uid 65534"), "{err}");
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = ensure(&open.join("mine")).unwrap_err().to_string();
        assert!(err.contains("without the sticky bit"), "{err}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        ensure(&open.join("mine")).unwrap();
    }

    #[test]
    fn remove_takes_trees_files_and_missing_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = tmp.path().join("t");
        std::fs::create_dir_all(tree.join("x/y")).unwrap();
        std::fs::write(tree.join("x/y/f"), b"1").unwrap();
        remove(&tree).unwrap();
        assert!(!tree.exists());
        remove(&tree).unwrap();
        let f = tmp.path().join("f");
        std::fs::write(&f, b"1").unwrap();
        remove(&f).unwrap();
        assert!(!f.exists());
    }
}
