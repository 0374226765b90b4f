//! Scenario `up_kill`: `hostmesh up` (World `w` of 2 hosts, ProcMesh `pm`
//! of 2 procs per host, its own `--data-dir` in a temp dir) is killed with
//! SIGKILL once it says everything is Ready.
//!
//! Before the kill the suite records every descendant of the `up` process
//! (pid and start time, so a reused pid is never mistaken for one of them).
//! Passes when, within [`GONE_BOUND`], none of them is left (`up`'s reaper
//! among them, which exits once it has cleaned up), no process carries the
//! data dir in its environment or command line, no mount lies under the
//! data dir, no file is left in it (the files left are counted and
//! reported, tokens among them), and its pod bridge (named in its log) is
//! gone. Whatever is left is SIGKILLed (only the
//! recorded descendants) and the temp dir removed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hostmesh_e2e::{hostmesh_bin, signal, world_yaml};

use super::Timing;
use super::fixture::{BOUND, mesh_yaml};

/// How long the processes `up` started may take to go after its death.
pub(crate) const GONE_BOUND: Duration = Duration::from_secs(15);

/// A process identity: pid and start time (clock ticks after boot).
type Ident = (i32, u64);

/// Runs the scenario; the timing's detect is from the kill until the last
/// recorded process is gone, its extras the files and tokens left (also
/// when they make the run a failure).
pub(crate) async fn up_kill(_run: &str) -> anyhow::Result<Timing> {
    let tmp = tempfile::Builder::new()
        .prefix("hostmesh-chaos-up-")
        .tempdir()?;
    let data = tmp.path().join("data");
    let manifest = tmp.path().join("manifest.yaml");
    std::fs::write(
        &manifest,
        format!(
            "{}\n---\n{}",
            world_yaml("w", &[("host", 2)], ""),
            mesh_yaml()
        ),
    )?;
    let log_path = tmp.path().join("up.log");
    let log = std::fs::File::create(&log_path)?;
    let mut up = Command::new(hostmesh_bin())
        .arg("up")
        .arg(&manifest)
        .arg("--data-dir")
        .arg(&data)
        // The kubelet names its bridge at info.
        .env("RUST_LOG", "info,hickory_server=warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting hostmesh up")?;
    let up_pid = i32::try_from(up.id())?;
    let outcome = killed_and_checked(up_pid, &log_path, &data).await;
    // Never leave `up` itself behind, whatever happened.
    let _ = up.kill();
    let _ = up.wait();
    outcome
}

async fn killed_and_checked(up_pid: i32, log: &Path, data: &Path) -> anyhow::Result<Timing> {
    let ready = hostmesh_testkit::wait::poll(BOUND, async || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains("everything is Ready") {
            Ok(())
        } else if text.contains("error:") {
            Err(Some(text))
        } else {
            Err(None)
        }
    })
    .await;
    if let Err(e) = ready {
        let text = e.unwrap_or_else(|| std::fs::read_to_string(log).unwrap_or_default());
        bail!("hostmesh up not Ready in {BOUND:?}: {text}");
    }
    let started = descendants(up_pid);
    let bridge = pod_bridge(&data.join("hostmesh.log"));
    anyhow::ensure!(bridge.is_some(), "no pod bridge named in up's log");
    // 2 agents and 4 procs at least (the exact set depends on the kubelet).
    anyhow::ensure!(
        started.len() >= 6,
        "only {} processes under hostmesh up: {started:?}",
        started.len()
    );
    let t0 = Instant::now();
    signal(up_pid, "KILL")?;
    let gone = hostmesh_testkit::wait::poll(GONE_BOUND, async || {
        started.iter().all(|p| !alive(*p)).then_some(()).ok_or(())
    })
    .await;
    let gone_s = t0.elapsed().as_secs_f64();
    let mut problems = Vec::new();
    let left: Vec<Ident> = started.iter().copied().filter(|p| alive(*p)).collect();
    if gone.is_err() {
        problems.push(format!(
            "{} processes it started still run {GONE_BOUND:?} after: {}",
            left.len(),
            describe(&left)
        ));
    }
    for (pid, _) in &left {
        let _ = signal(*pid, "KILL");
    }
    let strays = mentioning(data, &started, up_pid);
    if !strays.is_empty() {
        problems.push(format!(
            "processes mentioning the data dir: {}",
            describe(&strays)
        ));
    }
    let mounts = mounts_under(data);
    if !mounts.is_empty() {
        problems.push(format!("mounts under the data dir: {mounts:?}"));
    }
    // The same interface index: a kubelet that claimed the /24 since has
    // a new bridge of that name.
    if let Some((name, index)) = &bridge
        && link_index(name).as_ref() == Some(index)
    {
        problems.push(format!("the pod bridge {name} is left"));
    }
    let files = files_under(data);
    let tokens: Vec<&String> = files.iter().filter(|f| is_token(f)).collect();
    if !files.is_empty() {
        problems.push(format!(
            "{} files left in the data dir, {} of them tokens: {:?}",
            files.len(),
            tokens.len(),
            tokens
        ));
    }
    let extra = vec![
        ("files_left", files.len() as f64, "files"),
        ("tokens_left", tokens.len() as f64, "files"),
    ];
    Ok(Timing {
        detect: Some(gone_s),
        extra,
        failure: (!problems.is_empty()).then(|| problems.join("; ")),
        ..Timing::default()
    })
}

/// The pod bridge `up`'s kubelet logged (`pod network ready
/// bridge=hmbr...`) and its interface index.
fn pod_bridge(log: &Path) -> Option<(String, String)> {
    let text = std::fs::read_to_string(log).ok()?;
    let name = text
        .lines()
        .filter(|l| l.contains("pod network ready"))
        .flat_map(|l| l.split_whitespace())
        .find_map(|w| w.strip_prefix("bridge="))?
        .to_owned();
    let index = link_index(&name)?;
    Some((name, index))
}

/// A network interface's index, when it exists.
fn link_index(name: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex"))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// `(pid, start time)` of every live process, with its parent.
fn process_table() -> BTreeMap<Ident, i32> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Some((ppid, start)) = stat(pid) {
            out.insert((pid, start), ppid);
        }
    }
    out
}

/// Parent pid and start time from `/proc/<pid>/stat`, for a live
/// (non-zombie) process.
fn stat(pid: i32) -> Option<(i32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    // state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    // utime stime cutime cstime priority nice threads itrealvalue starttime
    if matches!(rest.first(), Some(&"Z") | Some(&"X")) {
        return None;
    }
    Some((rest.get(1)?.parse().ok()?, rest.get(19)?.parse().ok()?))
}

fn alive((pid, start): Ident) -> bool {
    stat(pid).is_some_and(|(_, s)| s == start)
}

/// Every live descendant of `root`.
fn descendants(root: i32) -> BTreeSet<Ident> {
    let table = process_table();
    let mut found: BTreeSet<Ident> = BTreeSet::new();
    let mut parents: BTreeSet<i32> = [root].into();
    // Bounded: each pass adds a generation; the table is finite.
    for _ in 0..64 {
        let next: BTreeSet<Ident> = table
            .iter()
            .filter(|(id, ppid)| parents.contains(ppid) && !found.contains(id))
            .map(|(id, _)| *id)
            .collect();
        if next.is_empty() {
            break;
        }
        parents = next.iter().map(|(p, _)| *p).collect();
        found.extend(next);
    }
    found
}

/// Live processes other than `known` and `up` whose environment or command
/// line names `data`.
fn mentioning(data: &Path, known: &BTreeSet<Ident>, up: i32) -> Vec<Ident> {
    let needle = data.as_os_str().as_encoded_bytes();
    process_table()
        .into_keys()
        .filter(|id| !known.contains(id) && id.0 != up && id.0 != std::process::id() as i32)
        .filter(|(pid, _)| {
            ["environ", "cmdline"].iter().any(|f| {
                std::fs::read(format!("/proc/{pid}/{f}"))
                    .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
            })
        })
        .collect()
}

fn describe(ids: &[Ident]) -> String {
    ids.iter()
        .map(|(pid, _)| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("{pid} ({})", comm.trim())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Mount points under `dir` in this process's mount namespace.
fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

/// Every regular file under `dir`, relative to it (bounded walk).
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    let mut visited = 0usize;
    while let Some(d) = stack.pop() {
        visited += 1;
        if visited > 100_000 {
            break;
        }
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(t) = e.file_type() else { continue };
            let p = e.path();
            if t.is_dir() {
                stack.push(p);
            } else {
                out.push(
                    p.strip_prefix(dir)
                        .unwrap_or(&p)
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    out.sort();
    out
}

/// A file that holds a credential: a World or service-account token, a
/// private key, or the kubeconfig.
fn is_token(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    name == "token" || name == "kubeconfig" || name.ends_with(".key") || name.contains("key.pem")
}
