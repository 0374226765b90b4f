//! A Monarch World's workers in its status (docs/monarch.md): how the
//! agent's report of a host's worker changes that host's state, and the
//! World's `firstFailure`.
//!
//! Invariants:
//! 1. A worker that ended makes its host Failed, with the exit in words
//!    (code, or signal by name); the World's failure policy then acts on it
//!    like on any failed host. Only a host whose pod is alive (Starting,
//!    NotReady, Ready) is changed: a terminating pod stays Terminating, so
//!    one exit is acted on once.
//! 2. A worker that does not listen yet keeps its host not Ready with a
//!    reason naming the pid, the port and for how long.
//! 3. `firstFailure` is the first host that failed since the World was last
//!    Ready: it is kept while later hosts fail, and replaced only by a
//!    failure after the World's `Ready` condition last turned true.

use hostmesh_agent::protocol::{ProcPhase, ProcReport};
use hostmesh_crds::Rank;
use hostmesh_crds::conditions::{self, READY};
use hostmesh_crds::procmesh::{head, tail};
use hostmesh_crds::world::{HostFailure, HostState, HostStatus, WorldStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::controllers::procmesh::exit;
use crate::controllers::shared::cause;
use hostmesh_crds::cause::{Attribution, MAX_EVIDENCE};
use hostmesh_crds::procmesh::ProcState;

/// Longest host reason kept in status.
const MAX_REASON: usize = 320;
/// Longest stderr tail kept in `firstFailure`.
const MAX_TAIL: usize = 2048;
/// Longest command line kept in `firstFailure`.
const MAX_COMMAND: usize = 512;

/// How an ended worker ended, in words; `None` while it runs.
fn ended(report: &ProcReport) -> Option<String> {
    let program = report.command.first().map_or("", String::as_str);
    Some(match &report.status {
        ProcPhase::Stopped { exit_code, .. } => exit::exited(*exit_code, program),
        ProcPhase::Killed { signal, .. } => exit::killed(*signal),
        ProcPhase::Failed { reason } => reason.clone(),
        ProcPhase::Timeout { after_ms } => format!("stopped after {after_ms} ms"),
        _ => return None,
    })
}

/// The host state `observed` as the worker `report` changes it
/// (invariants 1, 2); `port` is the worker's, `now` the plan's time.
pub fn host_status(
    observed: HostStatus,
    report: Option<&ProcReport>,
    port: u16,
    now: Timestamp,
) -> HostStatus {
    let Some(report) = report else {
        return observed;
    };
    if !matches!(
        observed.state,
        HostState::Starting | HostState::NotReady | HostState::Ready
    ) {
        return observed;
    }
    let pid = report
        .pid
        .map_or_else(String::new, |p| format!(" (pid {p})"));
    if let Some(how) = ended(report) {
        let last = stderr_tail(report).and_then(|t| {
            t.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string)
        });
        let why = match last {
            Some(l) => format!("monarch worker{pid} {how}; stderr: {l}"),
            None => format!("monarch worker{pid} {how}"),
        };
        return HostStatus::new(HostState::Failed, Some(head(&why, MAX_REASON).to_string()));
    }
    if report.status == ProcPhase::Starting && observed.state != HostState::Ready {
        let since = Timestamp::from_millisecond(report.started_at_ms as i64).unwrap_or(now);
        let secs = now.duration_since(since).as_secs().max(0);
        return HostStatus::new(
            observed.state,
            Some(format!(
                "monarch worker{pid} not listening on :{port} for {secs}s"
            )),
        );
    }
    observed
}

fn stderr_tail(report: &ProcReport) -> Option<String> {
    match &report.status {
        ProcPhase::Stopped { stderr_tail, .. } | ProcPhase::Killed { stderr_tail, .. }
            if !stderr_tail.is_empty() =>
        {
            // Keep the end: the last lines say why.
            Some(tail(&stderr_tail.join("\n"), MAX_TAIL))
        }
        _ => None,
    }
}

/// Whose fault an ended worker's end was: the worker is the user's program,
/// so its end is read as a proc's (`shared::cause` invariant 6); `None`
/// while it runs.
pub fn attribution(report: &ProcReport) -> Option<Attribution> {
    let tail = stderr_tail(report);
    let (state, code, signal, reason) = match &report.status {
        ProcPhase::Stopped { exit_code, .. } => (ProcState::Failed, Some(*exit_code), None, None),
        ProcPhase::Killed { signal, .. } => (ProcState::Killed, None, Some(*signal), None),
        ProcPhase::Failed { reason } => (ProcState::Failed, None, None, Some(reason.as_str())),
        ProcPhase::Timeout { .. } => (ProcState::Timeout, None, None, None),
        _ => return None,
    };
    let mut a = cause::of_exit(
        state,
        code,
        signal,
        reason,
        report.oom_killed,
        &[tail.as_deref()],
    );
    a.evidence.message = head(
        &format!("monarch worker: {}", a.evidence.message),
        MAX_EVIDENCE,
    )
    .to_string();
    Some(a)
}

/// The failure record of host `rank` (pod `pod`) in state `host`, with the
/// worker's exit when `report` says it ended.
pub fn failure(
    rank: Rank,
    pod: String,
    host: &HostStatus,
    report: Option<&ProcReport>,
    now: &Time,
) -> HostFailure {
    let ended = report.filter(|r| ended(r).is_some());
    let (exit_code, signal) = match ended.map(|r| &r.status) {
        Some(ProcPhase::Stopped { exit_code, .. }) => (Some(*exit_code), None),
        Some(ProcPhase::Killed { signal, .. }) => (None, Some(*signal)),
        _ => (None, None),
    };
    HostFailure {
        rank,
        pod,
        time: now.clone(),
        reason: host
            .reason
            .clone()
            .unwrap_or_else(|| format!("{:?}", host.state)),
        exit_code,
        signal,
        stderr_tail: ended.and_then(stderr_tail),
        command: ended.map(|r| exit::command_line(&r.command, &[], MAX_COMMAND)),
        cause: host.cause,
        evidence: host.evidence.clone(),
    }
}

/// Fills failure `f` of a host whose container ended from how it ended:
/// its exit code (and signal, when 128+n names one), the container log's
/// tail the kubelet kept as its message, and its command line.
pub fn fill_from_container(f: &mut HostFailure, c: super::observe::FailedContainer) {
    f.exit_code = Some(c.exit_code);
    f.signal = c.signal;
    f.stderr_tail = c.message.map(|m| tail(&m, MAX_TAIL));
    f.command = (!c.command.is_empty()).then(|| exit::command_line(&c.command, &[], MAX_COMMAND));
}

/// Invariant 3: the World's `firstFailure` given the previous status and
/// this pass's failures (lowest rank first).
pub fn first_failure(prev: &WorldStatus, failures: Vec<HostFailure>) -> Option<HostFailure> {
    let Some(newest) = failures.into_iter().next() else {
        return prev.first_failure.clone();
    };
    let Some(recorded) = &prev.first_failure else {
        return Some(newest);
    };
    let ready_since = conditions::get(&prev.conditions, READY)
        .filter(|c| c.status == "True")
        .map(|c| c.last_transition_time.0);
    match ready_since {
        Some(t) if t > recorded.time.0 => Some(newest),
        _ => Some(recorded.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(status: ProcPhase) -> ProcReport {
        ProcReport {
            proc_id: "tcp:10.0.0.1:26602/monarch-worker".into(),
            name: "monarch-worker".into(),
            rank: 1,
            pid: Some(42),
            command: vec!["python".into(), "-u".into(), "-c".into(), "print(1)".into()],
            status,
            started_at_ms: 1_000_000,
            restarts: 0,
            stop_requested: false,
            seq: 3,
            ..Default::default()
        }
    }

    fn host(state: HostState) -> HostStatus {
        HostStatus::new(state, None)
    }

    #[test]
    fn a_killed_worker_fails_its_live_host_once() {
        let r = report(ProcPhase::Killed {
            signal: 9,
            core_dumped: false,
            stderr_tail: vec!["serving".into(), "".into()],
        });
        let now = Timestamp::from_second(2000).unwrap();
        let h = host_status(host(HostState::NotReady), Some(&r), 26600, now);
        assert_eq!(h.state, HostState::Failed);
        let why = h.reason.clone().unwrap();
        assert!(why.contains("pid 42") && why.contains("SIGKILL"), "{why}");
        assert!(why.ends_with("stderr: serving"), "{why}");
        let gone = host_status(host(HostState::Terminating), Some(&r), 26600, now);
        assert_eq!(gone.state, HostState::Terminating, "invariant 1");
        let f = failure(1, "w-host-1".into(), &h, Some(&r), &Time(now));
        assert_eq!((f.rank, f.signal, f.exit_code), (1, Some(9), None));
        assert_eq!(f.stderr_tail.as_deref(), Some("serving\n"));
        assert!(f.command.unwrap().starts_with("python -u -c 'print(1)'"));
    }

    #[test]
    fn a_worker_that_does_not_listen_says_so() {
        let now = Timestamp::from_second(1040).unwrap();
        let h = host_status(
            host(HostState::Starting),
            Some(&report(ProcPhase::Starting)),
            26600,
            now,
        );
        assert_eq!(h.state, HostState::Starting);
        assert_eq!(
            h.reason.as_deref(),
            Some("monarch worker (pid 42) not listening on :26600 for 40s")
        );
        let ready = report(ProcPhase::Ready {
            pid: 42,
            addr: Some("tcp://10.0.0.1:26600".into()),
        });
        assert_eq!(
            host_status(host(HostState::Ready), Some(&ready), 26600, now),
            host(HostState::Ready)
        );
        let exited = report(ProcPhase::Stopped {
            exit_code: 1,
            stderr_tail: vec![],
        });
        let h = host_status(host(HostState::Ready), Some(&exited), 26600, now);
        assert_eq!(
            h.reason.as_deref(),
            Some("monarch worker (pid 42) exited with code 1")
        );
    }

    #[test]
    fn the_first_failure_stands_until_the_world_was_ready_again() {
        let at = |s| Time(Timestamp::from_second(s).unwrap());
        let f = |rank, s| {
            failure(
                rank,
                format!("p{rank}"),
                &host(HostState::Failed),
                None,
                &at(s),
            )
        };
        let mut prev = WorldStatus::default();
        assert_eq!(first_failure(&prev, vec![]), None);
        prev.first_failure = first_failure(&prev, vec![f(2, 10)]);
        assert_eq!(prev.first_failure.as_ref().unwrap().rank, 2);
        assert_eq!(first_failure(&prev, vec![f(0, 20)]).unwrap().rank, 2);
        conditions::set(
            &mut prev.conditions,
            READY,
            true,
            "AllHostsReady",
            "",
            None,
            &at(30),
        );
        assert_eq!(first_failure(&prev, vec![f(0, 40)]).unwrap().rank, 0);
        assert_eq!(
            first_failure(&prev, vec![]).unwrap().rank,
            2,
            "kept without news"
        );
    }
}
