//! `hostmesh up`, the README's first command, run as a new user would: the
//! binary and the quickstart in a fresh directory that only its owner can
//! enter (as `mktemp -d` and many home directories are), until Ready.
//! The restricted `hostmesh-install` init container (a non-root user) must
//! still install the agent from there.

use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

#[test]
fn up_runs_the_quickstart_from_a_directory_only_its_owner_can_enter() {
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "hostmesh up needs root (mount namespaces); CI runs as root"
        );
        return;
    }
    let home = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let repo = home.path().join("checkout");
    std::fs::create_dir_all(repo.join("examples")).unwrap();
    let bin = repo.join("hostmesh");
    std::fs::copy(env!("CARGO_BIN_EXE_hostmesh"), &bin).expect("copy the binary");
    let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/quickstart.yaml");
    std::fs::copy(quickstart, repo.join("examples/quickstart.yaml")).unwrap();
    let out = Command::new(&bin)
        .args(["up", "examples/quickstart.yaml", "--exit-when-ready"])
        .current_dir(&repo)
        .output()
        .expect("run hostmesh up");
    let log = std::fs::read_to_string(repo.join(".hostmesh/hostmesh.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "hostmesh up failed: {}\n{}\n--- log tail ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        &log[log.len().saturating_sub(4000)..]
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("everything is Ready"), "{stdout}");
}

/// Deleting an applied object with kubectl is reported and `up` keeps
/// serving (it used to tear the whole cluster down); Ctrl-C still ends it.
#[test]
fn up_reports_a_deleted_object_and_keeps_serving() {
    use std::io::{BufRead as _, BufReader};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/quickstart.yaml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hostmesh"))
        .args(["up", quickstart])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start hostmesh up");
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    let wait_for = |needle: &str, seen: &mut Vec<String>| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
                let hit = line.contains(needle);
                seen.push(line);
                if hit {
                    return true;
                }
            }
        }
        false
    };
    let ready = wait_for("everything is Ready", &mut seen);
    let kubeconfig = dir.path().join(".hostmesh/kubeconfig");
    let kubectl = |args: &[&str]| {
        Command::new("kubectl")
            .env("KUBECONFIG", &kubeconfig)
            .args(args)
            .output()
            .expect("kubectl runs")
    };
    let deleted = ready && kubectl(&["delete", "procmesh", "hello"]).status.success();
    let reported = deleted && wait_for("Deleted", &mut seen);
    let serving = reported && kubectl(&["get", "world", "quickstart"]).status.success();
    let alive = child.try_wait().ok().flatten().is_none();
    // SAFETY: kill(2) on the child's pid, which it has not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().expect("hostmesh up exits");
    assert!(
        ready && deleted && reported && serving && alive,
        "ready {ready} deleted {deleted} reported {reported} serving {serving} alive {alive}:\n{}",
        seen.join("\n")
    );
    assert!(status.success(), "Ctrl-C ends it cleanly: {status}");
}

/// `hostmesh up --serve-monarch-mesh` installs Monarch's MonarchMesh CRD and
/// runs its controller: a MonarchMesh in the manifest becomes a World whose
/// agents run the worker command (here a plain listener on the worker port,
/// which is what makes a host Ready) and `up` waits for the mesh to be Ready.
#[test]
fn up_serves_monarch_mesh_when_asked() {
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = dir.path().join("mesh.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: monarch.pytorch.org/v1alpha1\nkind: MonarchMesh\nmetadata: {name: upmesh}\n\
         spec:\n  replicas: 1\n  port: 26600\n  podTemplate:\n    spec:\n      containers:\n      \
         - {name: worker, image: monarch:up, command: [python3, -m, http.server, '26600']}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hostmesh"))
        .args([
            "up",
            "--serve-monarch-mesh",
            "--exit-when-ready",
            "--timeout",
            "2m",
        ])
        .arg(&manifest)
        .current_dir(dir.path())
        .output()
        .expect("run hostmesh up");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log =
        std::fs::read_to_string(dir.path().join(".hostmesh/hostmesh.log")).unwrap_or_default();
    assert!(
        out.status.success() && stdout.contains("everything is Ready"),
        "hostmesh up failed: {stdout}\n{}\n--- log tail ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        &log[log.len().saturating_sub(4000)..]
    );
    assert!(stdout.contains("MonarchMesh"), "{stdout}");
}

/// A batch job on `hostmesh up` (`examples/batch.yaml`): the World has
/// `finishWhen: ProcMeshesFinished` and `ttlSecondsAfterFinished: 5`, its
/// ProcMesh's ranks exit 0. The World reaches `Complete=True`, its host
/// pods go, and the World is deleted by its TTL; `up` says so and keeps
/// serving until Ctrl-C.
#[test]
fn up_runs_a_batch_job_to_completion_and_its_ttl_deletes_the_world() {
    use std::io::{BufRead as _, BufReader};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let batch = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/batch.yaml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hostmesh"))
        .args(["up", batch])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start hostmesh up");
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    let wait_for = |needle: &str, seen: &mut Vec<String>| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
                let hit = line.contains(needle);
                seen.push(line);
                if hit {
                    return true;
                }
            }
        }
        false
    };
    let kubeconfig = dir.path().join(".hostmesh/kubeconfig");
    let kubectl = |args: &[&str]| {
        let out = Command::new("kubectl")
            .env("KUBECONFIG", &kubeconfig)
            .args(args)
            .output()
            .expect("kubectl runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let finished = wait_for("everything finished", &mut seen);
    // `kubectl wait --for=condition=Complete` works, as for a Job; the
    // World may already be gone (TTL) by the time it asks.
    let complete = finished && {
        let out = kubectl(&[
            "wait",
            "--for=condition=Complete",
            "world/batch",
            "--timeout=5s",
        ]);
        out.contains("condition met") || kubectl(&["get", "world", "batch"]).is_empty()
    };
    // Its host pods go (Complete frees the hosts) and the TTL deletes the
    // World and its ProcMesh.
    let poll = |what: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if what() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    };
    let pods_gone = complete
        && poll(&|| {
            kubectl(&[
                "get",
                "pods",
                "-l",
                "hostmesh.dev/world=batch",
                "-o",
                "name",
            ])
            .trim()
            .is_empty()
        });
    let world_gone = pods_gone && wait_for("Deleted (finished)", &mut seen);
    let mesh_gone = world_gone
        && poll(&|| {
            kubectl(&["get", "worlds,procmeshes", "-o", "name"])
                .trim()
                .is_empty()
        });
    let alive = child.try_wait().ok().flatten().is_none();
    // SAFETY: kill(2) on the child's pid, which it has not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().expect("hostmesh up exits");
    let log =
        std::fs::read_to_string(dir.path().join(".hostmesh/hostmesh.log")).unwrap_or_default();
    assert!(
        finished && complete && pods_gone && world_gone && mesh_gone && alive,
        "finished {finished} complete {complete} pods gone {pods_gone} world gone {world_gone} mesh gone {mesh_gone} alive {alive}:\n{}\n--- log tail ---\n{}",
        seen.join("\n"),
        &log[log.len().saturating_sub(4000)..]
    );
    assert!(status.success(), "Ctrl-C ends it cleanly: {status}");
}
