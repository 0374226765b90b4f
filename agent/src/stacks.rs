//! Stack capture of a running proc, for stall diagnosis (`CaptureStacks`):
//! `py-spy dump --pid` when `py-spy` is on the proc's own `PATH` (read from
//! `/proc/<pid>/environ`), else the kernel's view of every thread of the
//! proc and of its descendants: `/proc/<pid>/task/<tid>/stack` when
//! readable (root), else the wait channel and the system call.
//!
//! Invariants:
//! 1. Bounded in bytes: every capture is cut at `max_bytes` (at most
//!    [`MAX_STACK_BYTES`]); py-spy's output is read only that far.
//! 2. Bounded in time: py-spy runs at most [`PY_SPY_TIMEOUT`] and is killed
//!    after; the kernel view reads at most [`MAX_PROCESSES`] processes of
//!    at most [`MAX_THREADS`] threads each.
//! 3. Never fatal: an unreadable file is a line saying so.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncReadExt as _;

/// Most bytes of stack text per proc.
pub const MAX_STACK_BYTES: usize = 64 * 1024;
/// Longest a py-spy dump may take.
pub const PY_SPY_TIMEOUT: Duration = Duration::from_secs(5);
/// Most processes (the proc and its descendants) in a kernel view.
pub const MAX_PROCESSES: usize = 8;
/// Most threads per process in a kernel view.
pub const MAX_THREADS: usize = 64;

/// A captured stack: how, the text, whether it was cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Captured {
    pub(crate) method: &'static str,
    pub(crate) text: String,
    pub(crate) truncated: bool,
}

/// Captures the stacks of process `pid` (invariants 1-3).
pub(crate) async fn capture(pid: u32, max_bytes: usize) -> Captured {
    let max = max_bytes.clamp(256, MAX_STACK_BYTES);
    let mut note = String::new();
    if let Some(py_spy) = py_spy_for(pid) {
        match py_spy_dump(&py_spy, pid, max).await {
            Ok(text) => return cut("py-spy", text, max),
            Err(e) => {
                let _ = writeln!(note, "py-spy ({}) failed: {e}", py_spy.display());
            }
        }
    }
    let (method, text) = kernel_view(pid);
    cut(method, note + &text, max)
}

fn cut(method: &'static str, text: String, max: usize) -> Captured {
    if text.len() <= max {
        return Captured {
            method,
            text,
            truncated: false,
        };
    }
    let head = head(&text, max);
    Captured {
        method,
        text: head.to_owned(),
        truncated: true,
    }
}

fn head(s: &str, max: usize) -> &str {
    let mut cut = max.min(s.len());
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// `py-spy` on the proc's `PATH`, if any.
fn py_spy_for(pid: u32) -> Option<PathBuf> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let path = environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"PATH="))?;
    use std::os::unix::ffi::OsStrExt as _;
    use std::os::unix::fs::PermissionsExt as _;
    path.split(|b| *b == b':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(std::ffi::OsStr::from_bytes(d)).join("py-spy"))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

async fn py_spy_dump(py_spy: &Path, pid: u32, max: usize) -> Result<String, String> {
    // Registered as the agent's own child until it is reaped, so the
    // reaper of adopted orphans leaves it to tokio (`descendants`).
    let mut child = {
        let mut direct = crate::descendants::direct();
        let child = tokio::process::Command::new(py_spy)
            .args(["dump", "--pid", &pid.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| e.to_string())?;
        if let Some(id) = child.id() {
            direct.insert(id as i32);
        }
        child
    };
    let _registered = crate::descendants::Registered(child.id().map(|id| id as i32));
    let out = child.stdout.take().ok_or("no stdout")?;
    let err = child.stderr.take().ok_or("no stderr")?;
    let run = async {
        let mut text = Vec::new();
        let mut errtext = Vec::new();
        let mut out = out.take(max as u64 + 1);
        let mut err = err.take(4096);
        let _ = tokio::join!(out.read_to_end(&mut text), err.read_to_end(&mut errtext));
        // Closed before the wait: py-spy blocked on a full pipe (output
        // past the bound) ends on the broken pipe.
        drop((out, err));
        let status = child.wait().await.map_err(|e| e.to_string())?;
        let cut_short = text.len() > max;
        if (status.success() || cut_short) && !text.is_empty() {
            Ok(String::from_utf8_lossy(&text).into_owned())
        } else {
            let msg = String::from_utf8_lossy(&errtext);
            let msg = msg.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            Err(format!("{status}: {msg}"))
        }
    };
    match tokio::time::timeout(PY_SPY_TIMEOUT, run).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {PY_SPY_TIMEOUT:?}; killed")),
    }
}

/// The kernel's view of `pid` and its descendants, and which method it
/// came from (`kernel` when some kernel stack was readable, else `wchan`).
pub(crate) fn kernel_view(pid: u32) -> (&'static str, String) {
    let mut out = String::new();
    let mut any_stack = false;
    let mut todo = vec![pid];
    let mut seen = 0;
    while let Some(p) = todo.pop() {
        if seen == MAX_PROCESSES {
            let _ = writeln!(
                out,
                "(more descendants not shown: at most {MAX_PROCESSES} processes)"
            );
            break;
        }
        seen += 1;
        any_stack |= process_view(p, &mut out);
        todo.extend(children(p).into_iter().rev());
    }
    (if any_stack { "kernel" } else { "wchan" }, out)
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// One process's threads; returns whether a kernel stack was readable.
fn process_view(pid: u32, out: &mut String) -> bool {
    let comm = read(&format!("/proc/{pid}/comm")).unwrap_or_default();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            let s = String::from_utf8_lossy(&c).replace('\0', " ");
            head(s.trim(), 200).to_owned()
        })
        .unwrap_or_default();
    let cpu = crate::stall::cpu_time(pid)
        .map(|d| format!("{:.2}s", d.as_secs_f64()))
        .unwrap_or_else(|| "?".into());
    let _ = writeln!(out, "process {pid} ({}) cpu {cpu}: {cmdline}", comm.trim());
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        let _ = writeln!(out, "  (gone)");
        return false;
    };
    let mut tids: Vec<u32> = tasks
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    let mut any_stack = false;
    for tid in tids.iter().take(MAX_THREADS) {
        let base = format!("/proc/{pid}/task/{tid}");
        let comm = read(&format!("{base}/comm")).unwrap_or_default();
        let state = read(&format!("{base}/status"))
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("State:").map(|v| v.trim().to_owned()))
            })
            .unwrap_or_else(|| "?".into());
        let _ = writeln!(out, "  thread {tid} ({}) {state}", comm.trim());
        match read(&format!("{base}/stack")).filter(|s| !s.trim().is_empty()) {
            Some(stack) => {
                any_stack = true;
                for l in stack.lines() {
                    let _ = writeln!(out, "    {l}");
                }
            }
            None => {
                let wchan = read(&format!("{base}/wchan")).unwrap_or_else(|| "?".into());
                let syscall = read(&format!("{base}/syscall"))
                    .map(|s| describe_syscall(s.trim()))
                    .unwrap_or_else(|| "unreadable".into());
                let _ = writeln!(out, "    wchan {} syscall {syscall}", wchan.trim());
            }
        }
    }
    if tids.len() > MAX_THREADS {
        let _ = writeln!(
            out,
            "  ({} more threads not shown)",
            tids.len() - MAX_THREADS
        );
    }
    any_stack
}

/// `/proc/<pid>/syscall` in words: the call's number (and name for the
/// common blocking ones), or running / blocked.
fn describe_syscall(s: &str) -> String {
    let Some(nr) = s.split_whitespace().next() else {
        return "?".into();
    };
    let name = match nr {
        "0" => "read",
        "1" => "write",
        "7" => "poll",
        "23" => "select",
        "35" => "nanosleep",
        "43" => "accept",
        "45" => "recvfrom",
        "47" => "recvmsg",
        "61" => "wait4",
        "202" => "futex",
        "230" => "clock_nanosleep",
        "232" => "epoll_wait",
        "270" => "pselect6",
        "271" => "ppoll",
        "281" => "epoll_pwait",
        "running" => return "running (on CPU)".into(),
        "-1" => return "none (blocked in the kernel, not in a system call)".into(),
        _ => return format!("#{nr}"),
    };
    format!("{name} (#{nr})")
}

/// Direct children of `pid` (all its threads'), at most a few dozen.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out: Vec<u32> = tasks
        .filter_map(|e| e.ok())
        .take(MAX_THREADS)
        .filter_map(|e| {
            read(&format!(
                "/proc/{pid}/task/{}/children",
                e.file_name().to_str()?
            ))
        })
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out.truncate(MAX_PROCESSES);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn kernel_view_of_a_sleeping_child_is_bounded() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 60"])
            .spawn()
            .unwrap();
        let pid = child.id();
        let c = capture(pid, 300).await;
        let _ = child.kill();
        let _ = child.wait();
        assert!(matches!(c.method, "kernel" | "wchan"), "{c:?}");
        assert!(c.text.starts_with(&format!("process {pid} (sh)")), "{c:?}");
        assert!(c.text.len() <= 300, "{}", c.text.len());
    }

    #[test]
    fn syscalls_in_words() {
        assert_eq!(describe_syscall("61 0x1 0x2"), "wait4 (#61)");
        assert_eq!(describe_syscall("running"), "running (on CPU)");
        assert_eq!(describe_syscall("999 0"), "#999");
    }
}
