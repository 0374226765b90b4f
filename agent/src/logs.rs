//! Forwarding proc output to the agent's own stdout and stderr, each line
//! prefixed with the proc's mesh and rank (`[train/43] ...`), and keeping a
//! bounded stderr tail for the proc's final status.
//!
//! Invariants:
//! 1. Reading a proc's pipe never waits on the agent's output: each proc
//!    stream has a bounded queue; a line that does not fit is dropped and
//!    counted, and the count appears in the output as a gap line (and in a
//!    warning log) once there is room again.
//! 2. One writer thread per output drains the queues round-robin, a few lines
//!    from each in turn, so a flooding proc cannot starve a quiet one.
//! 3. Lines are cut at [`MAX_LINE`] bytes; a longer line is forwarded in
//!    pieces; a stream's queue holds at most `capacity` lines and
//!    [`MAX_QUEUE_BYTES`] bytes.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};

/// Longest line forwarded in one piece, in bytes.
pub const MAX_LINE: usize = 16 * 1024;

/// Bytes buffered per proc stream, whatever the line count (so a proc
/// writing long lines holds at most this much agent memory).
pub const MAX_QUEUE_BYTES: usize = 256 * 1024;

/// Lines taken from one queue before the writer moves to the next.
const BATCH_PER_QUEUE: usize = 32;

enum Entry {
    Line(Vec<u8>),
    Gap(u64),
}

struct Queue {
    prefix: String,
    entries: VecDeque<Entry>,
    bytes: usize,
    pending_drop: u64,
    ended: bool,
}

#[derive(Default)]
struct State {
    queues: BTreeMap<u64, Queue>,
    next_id: u64,
    cursor: u64,
    closed: bool,
}

struct LogShared {
    state: Mutex<State>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    wake: Condvar,
    capacity: usize,
    dropped: AtomicU64,
}

impl LogShared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One output of the agent (its stdout or its stderr) shared by all procs.
#[derive(Clone)]
pub struct LogHub {
    shared: Arc<LogShared>,
}

impl std::fmt::Debug for LogHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogHub")
            .field("capacity", &self.shared.capacity)
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl LogHub {
    /// Starts a writer thread forwarding to `out`; each proc stream buffers
    /// at most `capacity` lines.
    pub fn start(name: &str, capacity: usize, out: Box<dyn Write + Send>) -> std::io::Result<Self> {
        let shared = Arc::new(LogShared {
            state: Mutex::new(State::default()),
            thread: Mutex::new(None),
            wake: Condvar::new(),
            capacity: capacity.max(1),
            dropped: AtomicU64::new(0),
        });
        let s = shared.clone();
        let handle = std::thread::Builder::new()
            .name(format!("hostmesh-log-{name}"))
            .spawn(move || writer(s, out))?;
        *shared.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        Ok(LogHub { shared })
    }

    /// Lines dropped so far over all procs (invariant 1).
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Registers a stream whose lines are prefixed with `prefix`.
    pub(crate) fn source(&self, prefix: String) -> LogSource {
        let mut st = self.shared.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.queues.insert(
            id,
            Queue {
                prefix,
                entries: VecDeque::new(),
                bytes: 0,
                pending_drop: 0,
                ended: false,
            },
        );
        LogSource {
            shared: self.shared.clone(),
            id,
        }
    }

    /// Stops the writer thread after it has written what is queued, waiting
    /// at most `timeout` for it (the output may be blocked).
    pub async fn close(&self, timeout: std::time::Duration) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_all();
        let handle = self
            .shared
            .thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(h) = handle {
            let join = tokio::task::spawn_blocking(move || h.join());
            let _ = tokio::time::timeout(timeout, join).await;
        }
    }
}

/// A proc stream feeding a [`LogHub`]; ends when dropped.
pub(crate) struct LogSource {
    shared: Arc<LogShared>,
    id: u64,
}

impl LogSource {
    /// Queues one line (without its newline), or counts it as dropped.
    pub(crate) fn push(&self, line: &[u8]) {
        let mut st = self.shared.lock();
        let Some(q) = st.queues.get_mut(&self.id) else {
            return;
        };
        if q.entries.len() >= self.shared.capacity || q.bytes + line.len() > MAX_QUEUE_BYTES {
            q.pending_drop += 1;
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if q.pending_drop > 0 {
            let n = std::mem::take(&mut q.pending_drop);
            q.entries.push_back(Entry::Gap(n));
        }
        q.bytes += line.len();
        q.entries.push_back(Entry::Line(line.to_vec()));
        drop(st);
        self.shared.wake.notify_one();
    }
}

impl Drop for LogSource {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        if let Some(q) = st.queues.get_mut(&self.id) {
            q.ended = true;
        }
        drop(st);
        self.shared.wake.notify_one();
    }
}

fn writer(shared: Arc<LogShared>, mut out: Box<dyn Write + Send>) {
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        {
            let mut st = shared.lock();
            loop {
                let work = st
                    .queues
                    .values()
                    .any(|q| !q.entries.is_empty() || q.pending_drop > 0 || q.ended);
                if work || st.closed {
                    break;
                }
                st = shared.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.closed && st.queues.values().all(|q| q.entries.is_empty()) {
                return;
            }
            let cursor = st.cursor;
            let ids: Vec<u64> = st
                .queues
                .range(cursor..)
                .chain(st.queues.range(..cursor))
                .map(|(id, _)| *id)
                .collect();
            for id in ids {
                let Some(q) = st.queues.get_mut(&id) else {
                    continue;
                };
                for _ in 0..BATCH_PER_QUEUE {
                    match q.entries.pop_front() {
                        Some(Entry::Line(l)) => {
                            q.bytes -= l.len();
                            buf.extend_from_slice(q.prefix.as_bytes());
                            buf.extend_from_slice(&l);
                            buf.push(b'\n');
                        }
                        Some(Entry::Gap(n)) => gap(&mut buf, &q.prefix, n),
                        None => break,
                    }
                }
                if q.entries.is_empty() && q.pending_drop > 0 {
                    let n = std::mem::take(&mut q.pending_drop);
                    gap(&mut buf, &q.prefix, n);
                }
                if q.ended && q.entries.is_empty() {
                    st.queues.remove(&id);
                }
            }
            st.cursor = cursor.wrapping_add(1);
        }
        if !buf.is_empty() {
            // A closed or failing output must not stop the agent: the lines
            // are lost, nothing else is.
            let _ = out.write_all(&buf).and_then(|()| out.flush());
            buf.clear();
        }
    }
}

fn gap(buf: &mut Vec<u8>, prefix: &str, n: u64) {
    tracing::warn!(
        proc = prefix.trim(),
        dropped = n,
        "proc output faster than the agent can forward it; lines dropped"
    );
    buf.extend_from_slice(
        format!("{prefix}[hostmesh: {n} lines dropped, output too fast]\n").as_bytes(),
    );
}

/// Most lines of a stream's head kept ([`Tail::head`]).
pub(crate) const HEAD_LINES: usize = 10;
/// Most bytes of a stream's head kept.
pub(crate) const HEAD_BYTES: usize = 2048;

/// The last lines of a stream, bounded in lines and bytes, and its first
/// lines ([`HEAD_LINES`], [`HEAD_BYTES`]): an exception is often printed
/// first and buried under later output.
#[derive(Debug)]
pub(crate) struct Tail {
    lines: VecDeque<String>,
    bytes: usize,
    max_lines: usize,
    max_bytes: usize,
    head: Vec<String>,
    head_bytes: usize,
    /// Lines pushed so far.
    pushed: usize,
}

impl Tail {
    /// An empty tail keeping at most `max_lines` lines and `max_bytes` bytes.
    pub(crate) fn new(max_lines: usize, max_bytes: usize) -> Self {
        Tail {
            lines: VecDeque::new(),
            bytes: 0,
            max_lines: max_lines.max(1),
            max_bytes: max_bytes.max(1),
            head: Vec::new(),
            head_bytes: 0,
            pushed: 0,
        }
    }

    /// Adds a line; the oldest lines go when a bound is exceeded. A single
    /// line longer than the byte bound keeps only its end (its start in the
    /// head).
    pub(crate) fn push(&mut self, line: &[u8]) {
        let mut s = String::from_utf8_lossy(line).into_owned();
        if self.head.len() < HEAD_LINES && self.head_bytes < HEAD_BYTES {
            let mut cut = s.len().min(HEAD_BYTES - self.head_bytes);
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            self.head_bytes += cut;
            self.head.push(s[..cut].to_owned());
        }
        self.pushed += 1;
        if s.len() > self.max_bytes {
            let mut cut = s.len() - self.max_bytes;
            while !s.is_char_boundary(cut) {
                cut += 1;
            }
            s = s[cut..].to_owned();
        }
        self.bytes += s.len();
        self.lines.push_back(s);
        while self.lines.len() > self.max_lines || self.bytes > self.max_bytes {
            match self.lines.pop_front() {
                Some(old) => self.bytes -= old.len(),
                None => break,
            }
        }
    }

    /// The kept lines, oldest first.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.lines.iter().cloned().collect()
    }

    /// The first lines that are no longer in the tail (empty while the
    /// whole stream fits the tail).
    pub(crate) fn head(&self) -> Vec<String> {
        let first_in_tail = self.pushed - self.lines.len();
        self.head.iter().take(first_in_tail).cloned().collect()
    }
}

/// Reads `pipe` line by line into `source` (and `tail`, and the stall
/// watch's `progress`, if given) until end of file (invariant 3).
pub(crate) async fn pump<R: AsyncRead + Unpin>(
    pipe: R,
    source: LogSource,
    tail: Option<Arc<Mutex<Tail>>>,
    progress: Option<Arc<crate::stall::OutputProgress>>,
) {
    let mut reader = BufReader::with_capacity(MAX_LINE, pipe);
    let mut line: Vec<u8> = Vec::new();
    loop {
        let (consumed, complete) = match reader.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(buf) => {
                let room = MAX_LINE - line.len();
                match buf.iter().take(room).position(|&b| b == b'\n') {
                    Some(i) => {
                        line.extend_from_slice(&buf[..i]);
                        (i + 1, true)
                    }
                    None => {
                        let n = buf.len().min(room);
                        line.extend_from_slice(&buf[..n]);
                        (n, line.len() >= MAX_LINE)
                    }
                }
            }
        };
        reader.consume(consumed);
        if complete {
            emit(&source, tail.as_deref(), progress.as_deref(), &line);
            line.clear();
        }
    }
    if !line.is_empty() {
        emit(&source, tail.as_deref(), progress.as_deref(), &line);
    }
}

fn emit(
    source: &LogSource,
    tail: Option<&Mutex<Tail>>,
    progress: Option<&crate::stall::OutputProgress>,
    line: &[u8],
) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if let Some(p) = progress {
        p.line(line);
    }
    source.push(line);
    if let Some(t) = tail {
        t.lock().unwrap_or_else(|p| p.into_inner()).push(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_is_bounded_in_lines_and_bytes() {
        let mut t = Tail::new(3, 10);
        for l in ["a", "b", "c", "d"] {
            t.push(l.as_bytes());
        }
        assert_eq!(t.lines(), vec!["b", "c", "d"]);
        t.push(b"0123456789");
        assert_eq!(t.lines(), vec!["0123456789"]);
        t.push("xxxxxxxxxxxxxxé".as_bytes());
        assert!(t.lines()[0].len() <= 10);
        assert!(t.lines()[0].ends_with('é'));
    }

    #[test]
    fn head_keeps_the_first_lines_the_tail_lost() {
        let mut t = Tail::new(2, 1000);
        t.push(b"Traceback: ValueError");
        t.push(b"b");
        assert!(t.head().is_empty(), "all of it is in the tail");
        for i in 0..100 {
            t.push(format!("noise {i}").as_bytes());
        }
        assert_eq!(t.head().len(), HEAD_LINES);
        assert_eq!(t.head()[0], "Traceback: ValueError");
        assert_eq!(t.lines(), vec!["noise 98", "noise 99"]);
        let mut big = Tail::new(2, 1000);
        for _ in 0..5 {
            big.push(&[b'x'; 4000]);
        }
        let bytes: usize = big.head().iter().map(String::len).sum();
        assert!(bytes <= HEAD_BYTES, "{bytes}");
    }
}
