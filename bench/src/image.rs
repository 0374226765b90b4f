//! Suite `image`: the hostmesh image as a cluster pulls and runs it. Builds
//! (or reuses) the static binary and the image with `image/build.sh` (podman
//! or buildah, offline), then measures (median of several rounds):
//!
//! - `image_size_bytes` (bytes): the image's size as podman reports it;
//!   baseline: the static binary inside it (the ratio is the image's
//!   overhead: CA bundle and metadata);
//! - `install_agent_copy_ms` (ms): `hostmesh install-agent --to DIR/hostmesh`
//!   run as a process, DIR on another filesystem (tmpfs `/dev/shm`) so it
//!   copies as in a pod (an emptyDir is never the image's filesystem);
//!   baseline: `cp` of the same file to the same filesystem;
//! - `install_agent_container_ms` (ms): the `hostmesh-install` init container
//!   end to end under podman and runc (`install-agent` into a volume);
//!   baseline: the same container running `--version` (container start and
//!   teardown without the copy).
//!
//! Needs podman (and runc); exits with an error naming what is missing.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};

use crate::report::emit;

const ROUNDS: usize = 5;
const TAG: &str = "localhost/hostmesh:bench";

/// Runs the suite.
pub(crate) fn run() -> anyhow::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("workspace root")?
        .to_path_buf();
    let status = Command::new("bash")
        .arg(root.join("image/build.sh"))
        .arg(TAG)
        .stdout(Stdio::null())
        .status()
        .context("run image/build.sh")?;
    ensure!(status.success(), "image/build.sh failed ({status})");
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let binary = target_dir
        .join(format!("{}-unknown-linux-gnu", std::env::consts::ARCH))
        .join("release/hostmesh");
    let binary_size = std::fs::metadata(&binary)
        .with_context(|| format!("{}", binary.display()))?
        .len();

    let size = podman(&["image", "inspect", TAG, "--format", "{{.Size}}"])?;
    let size: f64 = size.trim().parse().context("podman image size")?;
    emit("image_size_bytes", size, "bytes", Some(binary_size as f64));

    copy_bench(&binary)?;
    container_bench()?;
    Ok(())
}

/// `install-agent` as a process against `cp`, onto tmpfs.
fn copy_bench(binary: &Path) -> anyhow::Result<()> {
    let shm = Path::new("/dev/shm");
    ensure!(
        shm.is_dir() && std::fs::metadata(shm)?.dev() != std::fs::metadata(binary)?.dev(),
        "needs /dev/shm on a filesystem other than {} (so install-agent copies, not links)",
        binary.display()
    );
    let dir = tempfile::tempdir_in(shm)?;
    let dest = dir.path().join("bin/hostmesh");
    let mut install = Vec::new();
    let mut cp = Vec::new();
    for _ in 0..ROUNDS {
        let _ = std::fs::remove_dir_all(dir.path().join("bin"));
        install.push(time(
            Command::new(binary)
                .args(["install-agent", "--to"])
                .arg(&dest),
        )?);
        ensure!(
            std::fs::metadata(&dest)?.len() == std::fs::metadata(binary)?.len(),
            "install-agent left a partial copy"
        );
        let _ = std::fs::remove_dir_all(dir.path().join("bin"));
        std::fs::create_dir_all(dir.path().join("bin"))?;
        cp.push(time(Command::new("cp").arg(binary).arg(&dest))?);
    }
    emit(
        "install_agent_copy_ms",
        ms(median(install)),
        "ms",
        Some(ms(median(cp))),
    );
    Ok(())
}

/// The init container under podman + runc, against the same container
/// without the copy.
fn container_bench() -> anyhow::Result<()> {
    let vol = tempfile::tempdir()?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(vol.path(), std::fs::Permissions::from_mode(0o777))?;
    }
    let mount = format!("{}:/hostmesh/bin", vol.path().display());
    let run = |args: &[&str]| {
        let mut c = Command::new("podman");
        c.args([
            "--runtime",
            "runc",
            "run",
            "--rm",
            "--network",
            "none",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "--user",
            "65532:65532",
            "--cap-drop",
            "all",
            "--read-only",
            "-v",
            &mount,
            "--entrypoint",
            "hostmesh",
            TAG,
        ])
        .args(args);
        c
    };
    // One unmeasured run of each warms podman's storage and caches.
    time(&mut run(&["--version"]))?;
    let mut install = Vec::new();
    let mut bare = Vec::new();
    for _ in 0..ROUNDS {
        let _ = std::fs::remove_file(vol.path().join("hostmesh"));
        install.push(time(&mut run(&[
            "install-agent",
            "--to",
            "/hostmesh/bin/hostmesh",
        ]))?);
        ensure!(
            vol.path().join("hostmesh").exists(),
            "the init container wrote no agent"
        );
        bare.push(time(&mut run(&["--version"]))?);
    }
    emit(
        "install_agent_container_ms",
        ms(median(install)),
        "ms",
        Some(ms(median(bare))),
    );
    Ok(())
}

fn podman(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("podman")
        .args(args)
        .output()
        .context("podman is needed (apt-get install -y podman runc)")?;
    if !out.status.success() {
        bail!(
            "podman {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Wall time of one successful run of `cmd`.
fn time(cmd: &mut Command) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("run {cmd:?}"))?;
    let took = start.elapsed();
    ensure!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(took)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
