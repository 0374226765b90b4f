//! No process outlives its proc (issue 30: a `setsid` daemon started by a
//! proc outlived the ProcMesh, the pod and the World).
//!
//! A proc's process group catches what stays in it; a daemon leaves it
//! (`setsid`, `setpgid`) and, once its parent exits, is re-parented out of
//! the proc's tree. So the `hostmesh agent` process makes itself a child
//! subreaper ([`become_subreaper`]): everything its procs start stays in
//! its subtree, and it finds a proc's descendants by walking
//! `/proc/<pid>/task/<tid>/children`.
//!
//! Invariants:
//! 1. A proc's descendants are its main process's subtree (whatever their
//!    session or group), and the processes the agent adopted (children it
//!    did not spawn, re-parented to it) whose environment names the proc
//!    (`HOSTMESH_PROC_NAME`), with their subtrees. They get the signals the
//!    proc's group gets: TERM when it is stopped, KILL after the grace and
//!    when its main process ends.
//! 2. Every process the agent spawns directly is in [`DIRECT`] from before
//!    it can exit until it is reaped: the spawner holds the set's lock
//!    across the clone. The reaper ([`reap_adopted`]) reaps only children
//!    that are not in it, so it never takes the exit status another part of
//!    the agent waits for.
//! 3. When the agent stops or fences with subreaping on, every process left
//!    in its subtree is killed ([`kill_all`]): nothing adopted that no proc
//!    could be told apart by (a daemon that cleared its environment or
//!    changed its user) survives it.
//! 4. Subreaping is the `hostmesh agent` process's (its entry point turns it
//!    on); agents run inside a test process leave that process alone, and
//!    find descendants only while they are still below the proc.
//! 5. A process adopted after its proc ended (a daemon whose parent exited
//!    only after the proc's end was swept) is killed, with its subtree, at
//!    the next reap ([`reap_adopted`]: on SIGCHLD, or every
//!    [`REAP_INTERVAL`]): a proc is live from before its spawn
//!    ([`Live`]) until its end was swept, and an adopted process whose
//!    environment names no live proc of this agent has outlived its proc.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The pids the agent spawned itself and has not reaped yet (invariant 2).
pub(crate) static DIRECT: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

static SUBREAPER: AtomicBool = AtomicBool::new(false);

/// The procs of this agent that are live (invariant 5), by name, counted
/// (a proc restarted in place may overlap its previous run).
static LIVE: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());

/// Marks proc `name` live while it exists (invariant 5): create it before
/// the proc is spawned, drop it after its end was swept.
pub(crate) struct Live(String);

impl Live {
    pub(crate) fn new(name: &str) -> Live {
        *live().entry(name.to_owned()).or_default() += 1;
        Live(name.to_owned())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let mut live = live();
        if let Some(n) = live.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                live.remove(&self.0);
            }
        }
    }
}

fn live() -> std::sync::MutexGuard<'static, BTreeMap<String, usize>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// How often adopted children are looked for without a SIGCHLD.
const REAP_INTERVAL: Duration = Duration::from_secs(5);

/// Locks [`DIRECT`] (a poisoned lock still holds a valid set).
pub(crate) fn direct() -> std::sync::MutexGuard<'static, BTreeSet<i32>> {
    DIRECT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes a pid from [`DIRECT`] when dropped: for children another part
/// of the agent (tokio) reaps.
pub(crate) struct Registered(pub(crate) Option<i32>);

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            direct().remove(&pid);
        }
    }
}

/// Makes this process a child subreaper (invariant 4) and starts reaping
/// what it adopts; must be called inside a tokio runtime. `hostmesh
/// agent`'s entry point ([`crate::run_agent`]) calls it; a process that
/// runs an [`crate::Agent`] as its main job may too.
pub fn become_subreaper() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    SUBREAPER.store(true, Ordering::SeqCst);
    tokio::spawn(async {
        let mut chld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()).ok();
        loop {
            match chld.as_mut() {
                Some(s) => {
                    let _ = tokio::time::timeout(REAP_INTERVAL, s.recv()).await;
                }
                None => tokio::time::sleep(REAP_INTERVAL).await,
            }
            reap_adopted();
        }
    });
    Ok(())
}

/// Whether this process is a child subreaper (set by [`become_subreaper`]).
pub(crate) fn subreaping() -> bool {
    SUBREAPER.load(Ordering::SeqCst)
}

/// The direct children of `pid` (every thread's `children` file).
fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let path = t.path().join("children");
        if let Ok(text) = std::fs::read_to_string(path) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    out
}

/// `roots` and every process below them (bounded, each once).
fn subtree(roots: Vec<i32>) -> Vec<i32> {
    const MAX: usize = 100_000;
    let mut seen = HashSet::new();
    let mut todo = roots;
    let mut out = Vec::new();
    while let Some(p) = todo.pop() {
        if out.len() >= MAX || !seen.insert(p) {
            continue;
        }
        out.push(p);
        todo.extend(children(p));
    }
    out
}

/// The value of `HOSTMESH_PROC_NAME` in `pid`'s environment, if readable.
fn proc_name_of(pid: i32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    raw.split(|b| *b == 0).find_map(|kv| {
        kv.strip_prefix(crate::env::PROC_NAME_VAR.as_bytes())
            .and_then(|v| v.strip_prefix(b"="))
            .map(|v| String::from_utf8_lossy(v).into_owned())
    })
}

/// Children of this process the agent did not spawn (invariant 2).
fn adopted() -> Vec<i32> {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let direct = direct();
    children(me)
        .into_iter()
        .filter(|p| !direct.contains(p))
        .collect()
}

/// The descendants of proc `name` (invariant 1), excluding its main
/// process: `main` only while it is not reaped yet (a reaped pid may be
/// another process's already).
pub(crate) fn of_proc(main: Option<u32>, name: &str) -> Vec<i32> {
    let mut roots = main
        .and_then(|m| i32::try_from(m).ok())
        .map(children)
        .unwrap_or_default();
    roots.extend(
        adopted()
            .into_iter()
            .filter(|p| proc_name_of(*p).as_deref() == Some(name)),
    );
    subtree(roots)
}

/// Sends `signal` to every descendant of proc `name` (invariant 1);
/// `main` as in [`of_proc`].
pub(crate) fn signal_proc(main: Option<u32>, name: &str, signal: i32) -> usize {
    let pids = of_proc(main, name);
    for p in &pids {
        send(*p, signal);
    }
    pids.len()
}

/// Sends `signal` to the descendants of proc `name` outside its main
/// process's group (`setsid` daemons, processes that made their own
/// group): the group itself gets the signal once from the caller, and a
/// second TERM to a shell running its trap kills it before the trap ends.
pub(crate) fn signal_proc_outside_group(main: u32, name: &str, signal: i32) -> usize {
    let group = main as i32;
    let pids: Vec<i32> = of_proc(Some(main), name)
        .into_iter()
        // SAFETY: getpgid has no memory effects; a gone process yields -1.
        .filter(|p| *p != group && unsafe { libc::getpgid(*p) } != group)
        .collect();
    for p in &pids {
        send(*p, signal);
    }
    pids.len()
}

/// Kills every process in this process's subtree but the ones it spawned
/// itself and still waits for (invariant 3); only when subreaping.
pub(crate) fn kill_all() -> usize {
    if !subreaping() {
        return 0;
    }
    let pids = subtree(adopted());
    for p in &pids {
        send(*p, libc::SIGKILL);
    }
    if !pids.is_empty() {
        tracing::info!(
            processes = pids.len(),
            "killed processes the procs left behind"
        );
    }
    pids.len()
}

fn send(pid: i32, signal: i32) {
    if pid <= 1 {
        return;
    }
    // SAFETY: kill has no memory effects; a gone process yields ESRCH.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Reaps the adopted children that exited (invariant 2), and kills those
/// that outlived their proc (invariant 5).
pub(crate) fn reap_adopted() {
    let orphans: Vec<i32> = adopted()
        .into_iter()
        .filter(|p| proc_name_of(*p).is_some_and(|name| !live().contains_key(&name)))
        .collect();
    if !orphans.is_empty() {
        let pids = subtree(orphans);
        for p in &pids {
            send(*p, libc::SIGKILL);
        }
        tracing::info!(
            processes = pids.len(),
            "killed processes that outlived their proc"
        );
    }
    // The lock is held across the reap: a pid the spawner registers is
    // never reaped here.
    let direct = direct();
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    for p in children(me) {
        if direct.contains(&p) {
            continue;
        }
        let mut status = 0;
        // SAFETY: waitpid on one of our children, with a valid pointer.
        unsafe {
            libc::waitpid(p, &mut status, libc::WNOHANG);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_and_subtree_follow_the_process_tree() {
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .spawn()
            .unwrap();
        let pid = sh.id() as i32;
        let mut kids = Vec::new();
        for _ in 0..100 {
            kids = children(pid);
            if kids.len() == 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(kids.len(), 2, "{kids:?}");
        let all = subtree(vec![pid]);
        assert_eq!(all.len(), 3, "{all:?}");
        for k in &kids {
            send(*k, libc::SIGKILL);
        }
        let _ = sh.kill();
        let _ = sh.wait();
    }
}
