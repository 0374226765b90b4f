//! `hostmesh up` on a machine other users share (issue 17, item 5): while
//! the quickstart World runs, an unprivileged local user (uid 65534, the
//! `nobody` of most systems) finds no World token on disk (the agent gets
//! it as a variable) and cannot read a service-account token, and cannot replace the agent binary; the state
//! directories are 0700; Ctrl-C's teardown leaves no file behind.
//!
//! The test proves its probe can succeed (uid 65534 reads a file in a
//! directory others may enter), so a refusal comes from the permissions
//! and not from a probe that cannot run.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const NOBODY: u32 = 65534;

/// Runs `sh -c script` as uid/gid 65534 with no supplementary groups (std
/// drops them when root changes the uid); true when it exits 0.
fn as_nobody(script: &str, arg: &Path) -> bool {
    Command::new("/bin/sh")
        .args(["-c", script, "sh"])
        .arg(arg)
        .uid(NOBODY)
        .gid(NOBODY)
        .current_dir("/")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run /bin/sh as uid 65534")
        .success()
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .mode()
        & 0o7777
}

/// Every path under `dir` (bounded walk).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if out.len() > 10_000 {
            break;
        }
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_local_user_reaches_no_token_and_no_agent_binary_and_teardown_leaves_nothing() {
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "hostmesh up needs root (mount namespaces); CI runs as root"
        );
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    // The probe works: nobody reads a world-readable file in an open directory.
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(open.join("control"), b"x").unwrap();
    assert!(
        as_nobody("cat \"$1\"", &open.join("control")),
        "uid 65534 cannot read a 0644 file in a 0755 directory: the probe is broken"
    );

    let data = tmp.path().join("data");
    let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/quickstart.yaml");
    let log = std::fs::File::create(tmp.path().join("up.out")).unwrap();
    let mut up = Command::new(env!("CARGO_BIN_EXE_hostmesh"))
        .args(["up", quickstart, "--data-dir"])
        .arg(&data)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start hostmesh up");
    let out = || std::fs::read_to_string(tmp.path().join("up.out")).unwrap_or_default();
    let ready = hostmesh_testkit::wait::poll(Duration::from_secs(180), async || {
        if out().contains("everything is Ready") {
            Ok(())
        } else if up.try_wait().ok().flatten().is_some() {
            Err(true)
        } else {
            Err(false)
        }
    })
    .await;
    if ready.is_err() {
        let _ = up.kill();
        let _ = up.wait();
        panic!("hostmesh up not Ready:\n{}", out());
    }

    let all = walk(&data);
    let named = |suffix: &str| -> Vec<PathBuf> {
        all.iter()
            .filter(|p| p.to_string_lossy().ends_with(suffix))
            .cloned()
            .collect()
    };
    let sa_tokens: Vec<PathBuf> = all
        .iter()
        .filter(|p| {
            p.ends_with("token")
                && p.parent()
                    .and_then(|d| d.file_name())
                    .is_some_and(|n| n.to_string_lossy().starts_with("kube-api-access-"))
        })
        .cloned()
        .collect();
    // Any other file named `token` would be a World token on disk.
    let world_tokens: Vec<&PathBuf> = all
        .iter()
        .filter(|p| p.ends_with("token") && !sa_tokens.contains(p))
        .collect();
    let binaries = named("/volumes/hostmesh-bin/hostmesh");
    let checks = std::panic::catch_unwind(|| {
        // The agent gets the World token as a variable from the Secret,
        // never as a file on the node (agent `keys.rs`).
        assert!(world_tokens.is_empty(), "no World token file: {all:?}");
        assert_eq!(
            sa_tokens.len(),
            2,
            "one service-account token per host: {all:?}"
        );
        assert_eq!(binaries.len(), 2, "one agent binary per host: {all:?}");
        // The state directories are 0700.
        let pods = data.join("kubelet/pods");
        for dir in [data.clone(), data.join("kubelet"), pods.clone()] {
            assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        }
        for pod in std::fs::read_dir(&pods).unwrap().flatten() {
            assert_eq!(mode(&pod.path()), 0o700, "{}", pod.path().display());
        }
        for t in &sa_tokens {
            assert!(
                !std::fs::read(t).unwrap().is_empty(),
                "{} holds a token",
                t.display()
            );
            assert!(
                !as_nobody("cat \"$1\"", t),
                "uid 65534 read {}",
                t.display()
            );
        }
        for b in &binaries {
            assert!(
                !as_nobody("printf x >> \"$1\"", b),
                "uid 65534 wrote {}",
                b.display()
            );
            let dir = b.parent().unwrap();
            assert!(
                !as_nobody("printf x > \"$1/hostmesh.new\"", dir),
                "uid 65534 created a file beside {}",
                b.display()
            );
            assert!(
                !as_nobody("mv \"$1/hostmesh\" \"$1/old\"", dir),
                "uid 65534 moved {}",
                b.display()
            );
        }
    });

    // Ctrl-C: the teardown removes every file (the run did not fail).
    // SAFETY: kill(2) on our child's pid, not yet reaped.
    unsafe { libc::kill(up.id() as i32, libc::SIGINT) };
    let status = up.wait().expect("hostmesh up exits");
    if let Err(e) = checks {
        std::panic::resume_unwind(e);
    }
    assert!(
        status.success(),
        "Ctrl-C ends it cleanly: {status}\n{}",
        out()
    );
    let left: Vec<PathBuf> = walk(&data);
    assert!(
        left.is_empty() && !data.exists(),
        "left after teardown: {left:?}"
    );
}
