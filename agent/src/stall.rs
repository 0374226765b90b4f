//! Stall detection for one proc incarnation: what counts as progress, and
//! when a running proc without progress is stalled (ProcMesh
//! `spec.stallTimeout`, docs/agent.md "Stalls").
//!
//! Progress signals:
//! - a line on the proc's stdout or stderr (only lines matching the
//!   `progress_pattern`, when given), fed by the output pumps (`logs.rs`);
//! - the progress file named in the proc's `HOSTMESH_PROGRESS_FILE`: a proc
//!   that touches or writes it (any change of its mtime) made progress, with
//!   no library needed (`touch "$HOSTMESH_PROGRESS_FILE"`);
//! - CPU time (`/proc/<pid>/stat`) is a weak signal: it never counts as
//!   progress, it is reported next to a stall so a spinning rank reads
//!   differently from a blocked one.
//!
//! Invariants:
//! 1. A proc is stalled exactly when it has been Ready and without progress
//!    for the timeout; the stall ends at the first progress after it.
//! 2. Matching costs a bounded amount per line (lines are at most
//!    [`MAX_LINE`](crate::MAX_LINE) bytes, the regex is linear-time and
//!    size-limited) and at most one match per [`MATCH_EVERY`] once progress
//!    was seen, so a flooding proc cannot make detection expensive.
//! 3. The progress file is the agent's: created empty before the spawn,
//!    removed when the incarnation ends.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use super::protocol::Stall;

/// After a progress line, lines within this long are not matched again.
pub(crate) const MATCH_EVERY: Duration = Duration::from_millis(100);

/// Largest compiled progress pattern, as the API checks it
/// (`hostmesh_crds::procmesh::PROGRESS_PATTERN_SIZE_LIMIT`).
const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// Compiles a progress pattern (bounded size); the error is readable.
pub(crate) fn pattern(p: &str) -> Result<regex::bytes::Regex, String> {
    regex::bytes::RegexBuilder::new(p)
        .size_limit(PATTERN_SIZE_LIMIT)
        .build()
        .map_err(|e| e.to_string())
}

/// The last progress of one proc, fed by its output pumps.
#[derive(Debug)]
pub(crate) struct OutputProgress {
    origin: Instant,
    /// Microseconds after `origin` of the last progress; 0 before any.
    last: AtomicU64,
    pattern: Option<regex::bytes::Regex>,
}

impl OutputProgress {
    /// Progress as of now (a proc starts with a full timeout).
    pub(crate) fn new(pattern: Option<regex::bytes::Regex>) -> Arc<Self> {
        Arc::new(OutputProgress {
            origin: Instant::now(),
            last: AtomicU64::new(0),
            pattern,
        })
    }

    fn since_origin(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.origin).as_micros())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// One output line (invariant 2).
    pub(crate) fn line(&self, line: &[u8]) {
        if let Some(re) = &self.pattern {
            let now = self.since_origin(Instant::now());
            let last = self.last.load(Ordering::Relaxed);
            let recent = last != 0 && now.saturating_sub(last) < MATCH_EVERY.as_micros() as u64;
            if recent || !re.is_match(line) {
                return;
            }
        }
        self.touch();
    }

    /// Progress now.
    pub(crate) fn touch(&self) {
        self.last
            .fetch_max(self.since_origin(Instant::now()), Ordering::Relaxed);
    }

    /// When the last progress was.
    pub(crate) fn last(&self) -> Instant {
        self.origin + Duration::from_micros(self.last.load(Ordering::Relaxed))
    }
}

/// The progress file of one incarnation (invariant 3).
#[derive(Debug)]
pub(crate) struct ProgressFile {
    path: PathBuf,
    mtime: Option<SystemTime>,
}

impl ProgressFile {
    /// Creates `<dir>/<name>.<incarnation>` empty, and `dir` (mode 0700)
    /// if needed. `dir` must be a real directory of this user, and the file
    /// is made anew without following a link, so another user of a shared
    /// `/tmp` cannot point the agent at a file of theirs.
    pub(crate) fn create(dir: &Path, name: &str, incarnation: u32) -> std::io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        let meta = std::fs::symlink_metadata(dir)?;
        // SAFETY: getuid cannot fail and has no memory effects.
        let uid = unsafe { libc::getuid() };
        if !meta.is_dir() || meta.uid() != uid {
            return Err(std::io::Error::other(format!(
                "{} is not a directory owned by uid {uid}",
                dir.display()
            )));
        }
        let path = dir.join(format!("{name}.{incarnation}"));
        let _ = std::fs::remove_file(&path);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        let mtime = mtime(&path);
        Ok(ProgressFile { path, mtime })
    }

    /// Its path (`HOSTMESH_PROGRESS_FILE`).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the proc touched it since the last look.
    fn touched(&mut self) -> bool {
        let now = mtime(&self.path);
        let changed = now.is_some() && now != self.mtime;
        self.mtime = now;
        changed
    }
}

impl Drop for ProgressFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The directory progress files go to: `$TMPDIR/hostmesh-progress-<uid>`.
pub(crate) fn progress_dir() -> PathBuf {
    // SAFETY: getuid cannot fail and has no memory effects.
    let uid = unsafe { libc::getuid() };
    std::env::temp_dir().join(format!("hostmesh-progress-{uid}"))
}

/// CPU time (user + system) of process `pid` so far, from
/// `/proc/<pid>/stat`.
pub(crate) fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields
    // are counted after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After ")" come field 3 (state) onwards; utime is field 14.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|h| *h > 0)?;
    Some(Duration::from_millis((utime + stime) * 1000 / hz))
}

/// How often a watch looks, for a timeout.
pub(crate) fn check_every(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// The stall state of one running proc, advanced by [`StallWatch::check`].
#[derive(Debug)]
pub(crate) struct StallWatch {
    timeout: Duration,
    progress: Arc<OutputProgress>,
    file: Option<ProgressFile>,
    pid: u32,
    /// The last progress seen at the previous check, and the CPU time then.
    mark: (Instant, Option<Duration>),
    /// While stalled: the last progress before the stall.
    stalled_since: Option<Instant>,
}

/// What a check found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StallChange {
    /// A stall started.
    Started(Stall),
    /// The stalled proc made progress again.
    Ended,
}

impl StallWatch {
    /// A watch of process `pid` with `timeout`.
    pub(crate) fn new(
        timeout: Duration,
        progress: Arc<OutputProgress>,
        file: Option<ProgressFile>,
        pid: u32,
    ) -> Self {
        StallWatch {
            timeout,
            mark: (progress.last(), cpu_time(pid)),
            progress,
            file,
            pid,
            stalled_since: None,
        }
    }

    /// Looks at the signals at `now` (invariant 1).
    pub(crate) fn check(&mut self, now: Instant) -> Option<StallChange> {
        if self.file.as_mut().is_some_and(ProgressFile::touched) {
            self.progress.touch();
        }
        let last = self.progress.last();
        if last > self.mark.0 {
            self.mark = (last, cpu_time(self.pid));
        }
        match self.stalled_since {
            Some(since) if last > since => {
                self.stalled_since = None;
                Some(StallChange::Ended)
            }
            Some(_) => None,
            None if now.saturating_duration_since(last) >= self.timeout => {
                self.stalled_since = Some(last);
                let cpu_ms = match (self.mark.1, cpu_time(self.pid)) {
                    (Some(before), Some(after)) => {
                        Some(crate::protocol::duration_ms(after.saturating_sub(before)))
                    }
                    _ => None,
                };
                let ago = now.saturating_duration_since(last);
                let last_progress_ms =
                    super::manager::now_ms().saturating_sub(crate::protocol::duration_ms(ago));
                Some(StallChange::Started(Stall {
                    last_progress_ms,
                    after_ms: crate::protocol::duration_ms(self.timeout),
                    cpu_ms,
                }))
            }
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_makes_only_matching_lines_progress() {
        let p = OutputProgress::new(Some(pattern("^step [0-9]+").unwrap()));
        let before = p.last();
        p.line(b"loading data");
        assert_eq!(
            p.last(),
            before,
            "a line that does not match is no progress"
        );
        p.line(b"step 12 loss 0.3");
        assert!(p.last() > before);
        let any = OutputProgress::new(None);
        let before = any.last();
        any.line(b"anything");
        assert!(any.last() > before);
    }

    #[test]
    fn a_stall_starts_after_the_timeout_and_ends_with_progress() {
        let p = OutputProgress::new(None);
        let pid = std::process::id();
        let mut w = StallWatch::new(Duration::from_secs(2), p.clone(), None, pid);
        let t0 = p.last();
        assert_eq!(w.check(t0 + Duration::from_secs(1)), None);
        let Some(StallChange::Started(s)) = w.check(t0 + Duration::from_secs(2)) else {
            panic!("no stall at the timeout");
        };
        assert_eq!(s.after_ms, 2000);
        assert!(s.cpu_ms.is_some(), "this process's /proc/<pid>/stat reads");
        assert_eq!(w.check(t0 + Duration::from_secs(3)), None, "reported once");
        p.touch();
        assert_eq!(w.check(Instant::now()), Some(StallChange::Ended));
    }

    #[test]
    fn touching_the_progress_file_is_progress() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("progress");
        let f = ProgressFile::create(&dir, "pm.0", 0).unwrap();
        let path = f.path().to_owned();
        let p = OutputProgress::new(None);
        let mut w = StallWatch::new(Duration::from_secs(60), p.clone(), Some(f), 1);
        let before = p.last();
        let later = SystemTime::now() + Duration::from_secs(1);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(later)
            .unwrap();
        w.check(Instant::now());
        assert!(p.last() > before);
        drop(w);
        assert!(!path.exists(), "removed with the incarnation");
        // A link in place of the directory is refused.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(tmp.path(), &link).unwrap();
        assert!(ProgressFile::create(&link, "pm.0", 0).is_err());
    }

    #[test]
    fn cpu_time_of_a_missing_process_is_none() {
        assert!(cpu_time(u32::MAX - 1).is_none());
        assert!(cpu_time(std::process::id()).is_some());
    }
}
