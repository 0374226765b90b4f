//! Pure formatting of World and ProcMesh views (invariants 1-3 of the
//! module).

use hostmesh_crds::Rank;
use std::fmt::Write as _;

use hostmesh_crds::procmesh::{ProcState, RankStatus};
use hostmesh_crds::runs::Run;
use hostmesh_crds::{ProcMesh, World};
use hostmesh_operator::controllers::procmesh::exit::signal_name;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;

use super::MAX_RUNS_SHOWN;

/// Formats a World and the ProcMeshes that run on it.
pub fn format_world(world: &World, meshes: &[ProcMesh], now: Timestamp) -> String {
    let mut out = String::new();
    let status = world.status.clone().unwrap_or_default();
    let extent = world.spec.full_shape();
    let phase = status.phase.map_or("Unknown", |p| p.as_str());
    let _ = writeln!(
        out,
        "World {}/{}: {phase}",
        world.namespace().unwrap_or_default(),
        world.name_any()
    );
    let _ = writeln!(out, "  shape      {extent} ({} hosts)", extent.num_ranks());
    let _ = writeln!(
        out,
        "  ready      {}/{} hosts",
        status.ready_hosts, status.desired_hosts
    );
    let _ = writeln!(out, "  restarts   {}", status.restarts);
    if let Some(since) = &status.degraded_since {
        let _ = writeln!(out, "  degraded   for {}", age(since, now));
    }
    if let Some(m) = &world.spec.monarch {
        let _ = writeln!(
            out,
            "  monarch    mesh {}, worker port {}",
            m.mesh_name(&world.name_any()),
            m.port()
        );
    }
    stale_note(
        &mut out,
        world.metadata.generation,
        status.observed_generation,
    );
    if let Some(f) = &status.first_failure {
        let mut what = String::new();
        if let Some(code) = f.exit_code {
            let _ = write!(what, ", exit code {code}");
        }
        if let Some(sig) = f.signal {
            let _ = write!(what, ", {}", signal(sig));
        }
        let _ = writeln!(
            out,
            "\nFirst failure: host {} ({}){what}, {} ago",
            f.rank,
            f.pod,
            age(&f.time, now)
        );
        let _ = writeln!(out, "  reason: {}", clean(&f.reason));
        cause_line(&mut out, f.cause, f.evidence.as_ref());
        if let Some(cmd) = f.command.as_deref().filter(|c| !c.is_empty()) {
            let _ = writeln!(out, "  command: {}", clean(cmd));
        }
        if let Some(tail) = f.stderr_tail.as_deref().filter(|t| !t.is_empty()) {
            let _ = writeln!(out, "  stderr (last lines):");
            let last: Vec<&str> = tail.lines().rev().take(10).collect();
            for line in last.into_iter().rev() {
                let _ = writeln!(out, "    | {}", clean(line));
            }
        }
    }
    let _ = writeln!(out, "\nHosts (rank ranges of equal state):");
    let rows: Vec<[String; 3]> = status
        .hosts
        .iter()
        .map(|r| {
            [
                ranks(r),
                format!("{:?}", r.value.state),
                clean(r.value.reason.as_deref().unwrap_or("")),
            ]
        })
        .collect();
    runs_table(
        &mut out,
        ["RANKS", "STATE", "REASON"],
        &rows,
        status.hosts_truncated,
        "hosts",
    );
    conditions(&mut out, &status.conditions, now);
    if !meshes.is_empty() {
        let _ = writeln!(out, "\nProcMeshes:");
        let rows: Vec<Vec<String>> = meshes
            .iter()
            .map(|pm| {
                let s = pm.status.clone().unwrap_or_default();
                vec![
                    pm.name_any(),
                    s.phase.map_or("Unknown", |p| p.as_str()).to_owned(),
                    s.running.to_string(),
                    s.failed.to_string(),
                    s.first_failure
                        .map(|f| format!("rank {}: {}", f.rank, clean(&f.reason)))
                        .unwrap_or_default(),
                ]
            })
            .collect();
        table(
            &mut out,
            &["NAME", "PHASE", "RUNNING", "FAILED", "FIRST FAILURE"],
            &rows,
        );
    }
    out
}

/// `  cause: Infrastructure (DeviceUnhealthy: device ... is Unhealthy)`:
/// whose fault a first failure was, and why we say so.
fn cause_line(
    out: &mut String,
    cause: Option<hostmesh_crds::cause::FailureCause>,
    evidence: Option<&hostmesh_crds::cause::Evidence>,
) {
    let Some(cause) = cause else {
        return;
    };
    let _ = match evidence {
        Some(e) => writeln!(
            out,
            "  cause: {} ({}: {})",
            cause.as_str(),
            clean(&e.reason),
            clean(&e.message)
        ),
        None => writeln!(out, "  cause: {}", cause.as_str()),
    };
}

/// Formats a ProcMesh.
pub fn format_procmesh(pm: &ProcMesh, now: Timestamp) -> String {
    let mut out = String::new();
    let status = pm.status.clone().unwrap_or_default();
    let phase = status.phase.map_or("Unknown", |p| p.as_str());
    let _ = writeln!(
        out,
        "ProcMesh {}/{}: {phase}",
        pm.namespace().unwrap_or_default(),
        pm.name_any()
    );
    let _ = writeln!(out, "  world      {}", pm.spec.world);
    if let Some(extent) = &status.extent {
        let _ = writeln!(out, "  extent     {extent}");
    }
    let _ = writeln!(
        out,
        "  procs      {} running, {} succeeded, {} failed{}",
        status.running,
        status.succeeded,
        status.failed,
        collateral_note(status.failed, status.collateral)
    );
    let _ = writeln!(out, "  restarts   {}", status.restarts);
    let _ = writeln!(out, "  command    {}", clean(&pm.spec.command.join(" ")));
    stale_note(&mut out, pm.metadata.generation, status.observed_generation);
    if let Some(f) = &status.first_failure {
        let mut what = format!("{:?}", f.state);
        if let Some(code) = f.exit_code {
            let _ = write!(what, ", exit code {code}");
        }
        if let Some(sig) = f.signal {
            let _ = write!(what, ", {}", signal(sig));
        }
        let _ = writeln!(
            out,
            "\nFirst failure: rank {} on host {} ({}-host-{}), {what}, {} ago",
            f.rank,
            f.host,
            pm.spec.world,
            f.host,
            age(&Time(f.time.0), now)
        );
        if f.oom_killed {
            let _ = writeln!(out, "  OOM-killed (the cgroup's oom_kill count rose)");
        }
        if !f.reason.is_empty() {
            let _ = writeln!(out, "  reason: {}", clean(&f.reason));
        }
        cause_line(&mut out, f.cause, f.evidence.as_ref());
        if let Some(cmd) = f.command.as_deref().filter(|c| !c.is_empty()) {
            let _ = writeln!(out, "  command: {}", clean(cmd));
        }
        if let Some(head) = f.stderr_head.as_deref().filter(|t| !t.is_empty()) {
            let _ = writeln!(out, "  stderr (first lines):");
            for line in head.lines().take(10) {
                let _ = writeln!(out, "    | {}", clean(line));
            }
        }
        if let Some(tail) = f.stderr_tail.as_deref().filter(|t| !t.is_empty()) {
            let _ = writeln!(out, "  stderr (last lines):");
            for line in tail
                .lines()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
            {
                let _ = writeln!(out, "    | {}", clean(line));
            }
        }
    }
    if let Some(c) = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Stalled" && c.status == "True")
    {
        let _ = writeln!(out, "\nStalled: {}", clean(&c.message));
    }
    let _ = writeln!(out, "\nRanks (rank ranges of equal state):");
    let rows: Vec<[String; 3]> = status
        .ranks
        .iter()
        .map(|r| {
            [
                ranks(r),
                rank_state(&r.value),
                clean(r.value.reason.as_deref().unwrap_or("")),
            ]
        })
        .collect();
    runs_table(
        &mut out,
        ["RANKS", "STATE", "REASON"],
        &rows,
        status.ranks_truncated,
        "ranks",
    );
    incidents(&mut out, &status.incidents);
    conditions(&mut out, &status.conditions, now);
    out
}

/// `" (1 root, 7 collateral)"` when some failures were collateral.
fn collateral_note(failed: Rank, collateral: Rank) -> String {
    if collateral == 0 {
        return String::new();
    }
    format!(
        " ({} independent, {collateral} collateral)",
        failed.saturating_sub(collateral)
    )
}

/// Incidents shown by `hostmesh status` (status keeps up to 16).
const INCIDENTS_SHOWN: usize = 5;

/// The last incidents, newest first: when the root failed, how long each
/// recovery phase took, what was done, and why.
fn incidents(out: &mut String, list: &[hostmesh_crds::incident::Incident]) {
    if list.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nIncidents (newest first; phases since the previous one):"
    );
    let span = |a: Option<&Timestamp>, b: Option<&Timestamp>| match (a, b) {
        (Some(a), Some(b)) => {
            let ms = b.duration_since(*a).as_millis().max(0);
            if ms < 10_000 {
                format!("{ms}ms")
            } else {
                format!("{}s", ms / 1000)
            }
        }
        _ => "-".to_owned(),
    };
    let rows: Vec<Vec<String>> = list
        .iter()
        .rev()
        .take(INCIDENTS_SHOWN)
        .map(|i| {
            let failed = Some(&i.failed_at.0);
            let detected = Some(&i.detected_at.0);
            let decided = i.decided_at.as_ref().map(|t| &t.0);
            let pods = i.pods_ready_at.as_ref().map(|t| &t.0);
            let procs = i.procs_running_at.as_ref().map(|t| &t.0);
            let mut cause = clean(&i.root_cause);
            if i.collateral > 0 {
                let _ = write!(cause, " (+{} collateral)", i.collateral);
            }
            vec![
                i.failed_at.0.strftime("%H:%M:%S%.3f").to_string(),
                span(failed, detected),
                span(detected, decided),
                span(decided, pods),
                span(pods, procs),
                span(failed, procs),
                i.action.map_or("-", |a| a.as_str()).to_owned(),
                cause,
            ]
        })
        .collect();
    table(
        out,
        &[
            "FAILED AT",
            "DETECT",
            "DECIDE",
            "PODS",
            "PROCS",
            "TOTAL",
            "ACTION",
            "ROOT CAUSE",
        ],
        &rows,
    );
}

/// `signal 9 (SIGKILL)`, or `signal N` when N names no standard signal.
fn signal(sig: i32) -> String {
    match signal_name(sig) {
        Some(name) => format!("signal {sig} ({name})"),
        None => format!("signal {sig}"),
    }
}

fn rank_state(v: &RankStatus) -> String {
    let mut s = format!("{:?}", v.state);
    match (v.state, v.exit_code, v.signal) {
        (_, _, Some(sig)) => {
            let _ = match signal_name(sig) {
                Some(name) => write!(s, " ({name})"),
                None => write!(s, " (signal {sig})"),
            };
        }
        (ProcState::Succeeded, _, _) => {}
        (_, Some(code), _) => {
            let _ = write!(s, " (exit {code})");
        }
        _ => {}
    }
    if let Some(root) = v.caused_by {
        let _ = write!(s, " collateral of rank {root}");
    }
    s
}

fn stale_note(out: &mut String, generation: Option<i64>, observed: Option<i64>) {
    if let (Some(g), Some(o)) = (generation, observed)
        && o < g
    {
        let _ = writeln!(
            out,
            "  note       status describes generation {o}; the spec is at {g} (the operator has not caught up)"
        );
    }
}

fn ranks<T>(r: &Run<T>) -> String {
    if r.count <= 1 {
        r.start.to_string()
    } else {
        format!("{}-{}", r.start, r.end() - 1)
    }
}

fn runs_table(
    out: &mut String,
    header: [&str; 3],
    rows: &[[String; 3]],
    truncated: bool,
    what: &str,
) {
    if rows.is_empty() {
        let _ = writeln!(out, "  (none reported yet)");
        return;
    }
    let shown: Vec<Vec<String>> = rows
        .iter()
        .take(MAX_RUNS_SHOWN)
        .map(|r| r.to_vec())
        .collect();
    table(out, &header, &shown);
    if rows.len() > MAX_RUNS_SHOWN {
        let _ = writeln!(
            out,
            "  ... {} more runs (kubectl get -o yaml shows them all)",
            rows.len() - MAX_RUNS_SHOWN
        );
    }
    if truncated {
        let _ = writeln!(
            out,
            "  ... status lists a prefix of the {what} only (too many distinct states); counts above are exact"
        );
    }
}

fn conditions(out: &mut String, conds: &[Condition], now: Timestamp) {
    let _ = writeln!(out, "\nConditions:");
    if conds.is_empty() {
        let _ = writeln!(out, "  (none yet)");
        return;
    }
    let rows: Vec<Vec<String>> = conds
        .iter()
        .map(|c| {
            vec![
                c.type_.clone(),
                c.status.clone(),
                clean(&c.reason),
                age(&c.last_transition_time, now),
                clean(&c.message),
            ]
        })
        .collect();
    table(
        out,
        &["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"],
        &rows,
    );
}

/// Left-aligned columns; the last column is not padded.
fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let n = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(n) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut line = |cells: Vec<&str>| {
        let mut l = String::from(" ");
        for (i, cell) in cells.iter().enumerate() {
            l.push(' ');
            if i + 1 == n {
                l.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                l.push_str(cell);
                l.extend(std::iter::repeat_n(' ', pad + 1));
            }
        }
        let _ = writeln!(out, "{}", l.trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Replaces control characters (invariant 3) and keeps one line.
pub(super) fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned()
}

/// `5s`, `3m`, `2h`, `4d` since `t` (`0s` for times in the future).
fn age(t: &Time, now: Timestamp) -> String {
    let secs = now.as_second().saturating_sub(t.0.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}
