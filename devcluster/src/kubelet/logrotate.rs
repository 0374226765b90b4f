//! Container log rotation, with the real kubelet's defaults and flags
//! (`containerLogMaxSize` 10Mi, `containerLogMaxFiles` 5,
//! `containerLogMonitorInterval` 10s).
//!
//! A container writes its output straight into `<container>.log` (its
//! stdout and stderr are that file, opened `O_APPEND`), so the file cannot
//! be renamed under it. Every interval the kubelet looks at each running
//! pod's current logs; one larger than the limit is rotated:
//! `<container>.log.N` become `.log.N+1` (the oldest beyond the file limit
//! is deleted), the last `max size` bytes before a cut point are copied to
//! `<container>.log.1`, and the bytes before the cut are removed from the
//! front of the live file (`FALLOC_FL_COLLAPSE_RANGE` at a block boundary,
//! atomic against the container's appends, so nothing is lost; on a file
//! system without it the file is truncated, and what the container wrote
//! during the copy is lost).
//!
//! Invariants:
//! 1. Per container at most `max files` files exist: the current one and
//!    `.log.1 ..= .log.(max files - 1)`, each rotated file at most `max
//!    size` bytes; the current one exceeds `max size` for at most one
//!    interval's output.
//! 2. `kubectl logs` serves the current file (as a real kubelet does);
//!    `--previous` the previous run's, which a restart makes of the
//!    current file (its rotated files are deleted then).
//! 3. Positions in a log are absolute (bytes since the container started):
//!    the file holds `[cut, cut + len)`, and `cut` only grows. A reader
//!    (follow, attach) reads `cut` through [`Cuts::read`], which retries
//!    while a rotation is in flight, so it never misreads a shifted file.

use std::collections::BTreeMap;
use std::io::{Read as _, Seek as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::config::KubeletConfig;
use super::error::{KubeletError, Result};
use super::shared::{Shared, lock};

/// The kubelet's default `containerLogMaxSize` (10Mi).
pub const DEFAULT_MAX_SIZE: u64 = 10 * 1024 * 1024;
/// The kubelet's default `containerLogMaxFiles`.
pub const DEFAULT_MAX_FILES: u32 = 5;

/// Parses a size written as a Kubernetes quantity (`10Mi`, `512Ki`, `1G`,
/// plain bytes) for `flag`.
pub fn parse_size(flag: &str, text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let factor: u64 = match unit {
        "" => 1,
        "k" | "K" => 1000,
        "M" => 1000 * 1000,
        "G" => 1000 * 1000 * 1000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => 0,
    };
    digits
        .parse::<u64>()
        .ok()
        .filter(|_| factor > 0)
        .and_then(|n| n.checked_mul(factor))
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            KubeletError::Config(format!(
                "{flag} {text:?}: give a positive size such as 10Mi, 512Ki or 1048576"
            ))
        })
}

/// Checks the rotation settings of `config`.
pub(crate) fn check_config(config: &KubeletConfig) -> Result<()> {
    if config.container_log_max_size == 0 {
        return Err(KubeletError::Config(
            "container_log_max_size (--container-log-max-size) must be positive".into(),
        ));
    }
    if config.container_log_max_files < 2 {
        return Err(KubeletError::Config(format!(
            "container_log_max_files (--container-log-max-files) is {}; it must be at least 2 (the current file and one rotated)",
            config.container_log_max_files
        )));
    }
    if config.container_log_monitor_interval.is_zero() {
        return Err(KubeletError::Config(
            "container_log_monitor_interval must be positive".into(),
        ));
    }
    Ok(())
}

/// `<container>.log.<n>` beside `current`.
pub(crate) fn rotated_path(current: &Path, n: u32) -> PathBuf {
    let mut name = current.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{n}"));
    current.with_file_name(name)
}

/// Deletes a container's rotated files (a restart starts a new log).
pub(crate) fn remove_rotated(current: &Path, max_files: u32) {
    for n in 1..max_files.max(2) {
        let _ = std::fs::remove_file(rotated_path(current, n));
    }
}

/// How much was cut from the front of each live log, and whether a
/// rotation is in flight (invariant 3).
#[derive(Debug, Default)]
pub(crate) struct Cuts {
    by_path: Mutex<BTreeMap<PathBuf, Cut>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Cut {
    /// Odd while a rotation of the file is in flight.
    generation: u64,
    /// Bytes removed from the front of the file so far.
    bytes: u64,
}

impl Cuts {
    /// Runs `read(cut)` until no rotation overlapped it (bounded: a
    /// rotation is short, and after a few tries the read goes ahead).
    pub(crate) async fn read<T, F, Fut>(&self, path: &Path, mut read: F) -> T
    where
        F: FnMut(u64) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let get = || lock(&self.by_path).get(path).copied().unwrap_or_default();
        let mut last = None;
        for _ in 0..50 {
            let before = get();
            if before.generation % 2 == 1 {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
            let out = read(before.bytes).await;
            if get().generation == before.generation {
                return out;
            }
            last = Some(out);
        }
        match last {
            Some(out) => out,
            None => read(get().bytes).await,
        }
    }

    /// Forgets `path` (its container restarted: a new log from 0).
    pub(crate) fn reset(&self, path: &Path) {
        lock(&self.by_path).remove(path);
    }

    /// Forgets every log under `dir` (its pod is gone).
    pub(crate) fn forget_under(&self, dir: &Path) {
        lock(&self.by_path).retain(|p, _| !p.starts_with(dir));
    }

    fn begin(&self, path: &Path) {
        lock(&self.by_path)
            .entry(path.to_path_buf())
            .or_default()
            .generation += 1;
    }

    fn end(&self, path: &Path, cut: u64) {
        let mut m = lock(&self.by_path);
        let c = m.entry(path.to_path_buf()).or_default();
        c.bytes += cut;
        c.generation += 1;
    }
}

/// The absolute position of the end of the log at `path` (0 when it does
/// not exist yet).
pub(crate) async fn end_position(cuts: &Cuts, path: &Path) -> u64 {
    cuts.read(path, |cut| async move {
        tokio::fs::metadata(path).await.map_or(0, |m| cut + m.len())
    })
    .await
}

/// What the container wrote from absolute position `pos` on: the new
/// position and the bytes (empty when there is nothing new); `None` when
/// the file does not exist. Bytes rotated away before they were read are
/// skipped (they are in `.log.1`, which `kubectl logs` does not serve).
pub(crate) async fn read_from(cuts: &Cuts, path: &Path, pos: u64) -> Option<(u64, Vec<u8>)> {
    use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
    cuts.read(path, |cut| async move {
        let mut file = tokio::fs::File::open(path).await.ok()?;
        let len = file.metadata().await.ok()?.len();
        // Before the cut: skipped. Beyond the end: a new file (restart).
        let at = if pos < cut || pos > cut + len {
            0
        } else {
            pos - cut
        };
        if at == len {
            return Some((cut + len, Vec::new()));
        }
        file.seek(std::io::SeekFrom::Start(at)).await.ok()?;
        let mut buf = Vec::new();
        (&mut file)
            .take(len - at)
            .read_to_end(&mut buf)
            .await
            .ok()?;
        Some((cut + at + buf.len() as u64, buf))
    })
    .await
}

/// Rotates `current` when it is larger than `max_size` (invariant 1);
/// returns whether it did.
pub(crate) fn rotate_if_needed(
    cuts: &Cuts,
    current: &Path,
    max_size: u64,
    max_files: u32,
) -> std::io::Result<bool> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(current)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    let len = meta.len();
    if len <= max_size {
        return Ok(false);
    }
    let _ = std::fs::remove_file(rotated_path(current, max_files - 1));
    for n in (1..max_files - 1).rev() {
        match std::fs::rename(rotated_path(current, n), rotated_path(current, n + 1)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    let block = meta.blksize().max(1);
    let aligned = len / block * block;
    // Cut at a block boundary when there is one (collapse), else at the end.
    let cut = if aligned > 0 { aligned } else { len };
    copy_tail(&file, cut, max_size, &rotated_path(current, 1))?;
    cuts.begin(current);
    let removed = if aligned > 0 && collapse(&file, aligned).is_ok() {
        aligned
    } else {
        // No collapse here: drop everything (what was written since the
        // copy is lost).
        let now = file.metadata()?.len();
        file.set_len(0)?;
        now
    };
    cuts.end(current, removed);
    Ok(true)
}

/// Copies the last `max` bytes before `end` of `file` (from a line start
/// when one is in range) to `to`, through a temporary file.
fn copy_tail(mut file: &std::fs::File, end: u64, max: u64, to: &Path) -> std::io::Result<()> {
    let start = end.saturating_sub(max);
    file.seek(std::io::SeekFrom::Start(start))?;
    let mut buf = vec![0u8; usize::try_from(end - start).unwrap_or(usize::MAX)];
    file.read_exact(&mut buf)?;
    let from = if start > 0 {
        buf.iter()
            .position(|b| *b == b'\n')
            .map(|i| i + 1)
            .filter(|i| *i < buf.len())
            .unwrap_or(0)
    } else {
        0
    };
    let tmp = to.with_extension("rotating");
    let mut out = std::fs::File::create(&tmp)?;
    out.write_all(&buf[from..])?;
    drop(out);
    std::fs::rename(&tmp, to)
}

/// Removes the first `len` bytes of `file` (a multiple of its block size).
fn collapse(file: &std::fs::File, len: u64) -> std::io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    // SAFETY: fallocate(2) on an open descriptor with plain integers.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_COLLAPSE_RANGE, 0, len) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Every interval, rotates the current log of every container on this
/// node that outgrew the limit, until the kubelet shuts down.
pub(crate) async fn run(shared: Arc<Shared>) {
    let every = shared.config.container_log_monitor_interval;
    loop {
        tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let dirs: Vec<PathBuf> = lock(&shared.pods)
            .values()
            .map(|e| e.dir.join("logs"))
            .collect();
        let shared = shared.clone();
        let _ = tokio::task::spawn_blocking(move || sweep(&shared, &dirs)).await;
    }
}

fn sweep(shared: &Shared, dirs: &[PathBuf]) {
    let (max_size, max_files) = (
        shared.config.container_log_max_size,
        shared.config.container_log_max_files,
    );
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if !name.ends_with(".log") || name.ends_with(".previous.log") {
                continue;
            }
            let path = e.path();
            match rotate_if_needed(&shared.log_cuts, &path, max_size, max_files) {
                Ok(true) => tracing::debug!(log = %path.display(), "rotated"),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(log = %path.display(), error = %e, "cannot rotate container log")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_quantities_and_bad_ones_name_the_flag() {
        assert_eq!(parse_size("f", "10Mi").unwrap(), 10 << 20);
        assert_eq!(parse_size("f", "512Ki").unwrap(), 512 << 10);
        assert_eq!(parse_size("f", "2k").unwrap(), 2000);
        assert_eq!(parse_size("f", "4096").unwrap(), 4096);
        for bad in ["", "0", "10Xi", "-1", "Mi"] {
            let err = parse_size("--container-log-max-size", bad).unwrap_err();
            assert!(
                err.to_string().contains("--container-log-max-size"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn rotation_keeps_at_most_max_files_each_at_most_max_size() {
        let tmp = tempfile::tempdir().unwrap();
        let current = tmp.path().join("c.log");
        let cuts = Cuts::default();
        let max = 10_000u64;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&current)
            .unwrap();
        let mut last = String::new();
        for round in 0..8 {
            for i in 0..500 {
                last = format!("round {round} line {i:04} ........................\n");
                file.write_all(last.as_bytes()).unwrap();
            }
            assert!(rotate_if_needed(&cuts, &current, max, 3).unwrap());
        }
        assert!(!rotated_path(&current, 3).exists());
        for n in 1..3 {
            let len = std::fs::metadata(rotated_path(&current, n)).unwrap().len();
            assert!(len <= max, "{n}: {len}");
        }
        // The newest output is in .1 or still in the current file.
        let one = std::fs::read_to_string(rotated_path(&current, 1)).unwrap();
        let now = std::fs::read_to_string(&current).unwrap();
        assert!(one.ends_with(&last) || now.ends_with(&last));
        assert!(
            !std::fs::read_to_string(&current)
                .unwrap()
                .contains("round 0 ")
        );
        file.write_all(b"after\n").unwrap();
        assert!(
            std::fs::read_to_string(&current)
                .unwrap()
                .ends_with("after\n")
        );
        remove_rotated(&current, 3);
        assert!(!rotated_path(&current, 1).exists());
    }
}
