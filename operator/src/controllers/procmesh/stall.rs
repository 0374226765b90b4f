//! Stalls of a ProcMesh (`spec.stallTimeout`): the `Stalled` condition
//! naming the stalled ranks as runs, the rank states a stall makes, the
//! Events, and the stacks of every rank kept in ConfigMap
//! `<procmesh>-stacks` for `hostmesh stacks` (docs/api.md, "Stalls").
//!
//! Invariants:
//! 1. A rank is stalled when its current incarnation runs and its agent
//!    reports it stalled; with `restartPolicy.onStall: Failure` its state is
//!    `Stalled` (a failure the restart policy handles), with `Report` it
//!    stays Running with the stall in its reason.
//! 2. Stacks are captured once per stall episode (the set of stalled ranks
//!    and when each last made progress), before the reconcile restarts or
//!    stops anything, so they show the hung state. The episode is recorded
//!    in the ConfigMap's annotation, so a restarted operator does not
//!    capture the same episode again.
//! 3. The ConfigMap stays under [`MAX_CONFIGMAP_BYTES`]: at most
//!    [`MAX_STACK_RANKS`] ranks (stalled ranks first, then the others by
//!    rank), each at most [`MAX_RANK_BYTES`], and ranks that do not fit are
//!    named in the summary instead.
//! 4. Without `stallTimeout` the ProcMesh has no `Stalled` condition.

use hostmesh_crds::Rank;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use hostmesh_agent::protocol::Stall;
use hostmesh_crds::conditions;
use hostmesh_crds::procmesh::{ProcMeshStatus, ProcState, RankStatus, StallAction};
use hostmesh_crds::{ProcMesh, runs};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::Api;

use crate::controllers::shared::{ControllerContext, PlannedEvent, Severity};
use crate::hub::{ProcObs, WorldKey};

/// The condition type.
pub const STALLED: &str = "Stalled";
/// Annotation of the stacks ConfigMap: the stall episode it holds.
pub const EPISODE_ANNOTATION: &str = "hostmesh.dev/stall-episode";
/// Most ranks whose stacks are kept.
pub const MAX_STACK_RANKS: usize = 256;
/// Most bytes of stacks kept per rank.
pub const MAX_RANK_BYTES: usize = 16 * 1024;
/// Most bytes of the whole ConfigMap data (the API's limit is 1 MiB).
pub const MAX_CONFIGMAP_BYTES: usize = 900 * 1024;
/// Longest wait for an agent's stacks.
pub const CAPTURE_TIMEOUT: Duration = Duration::from_secs(20);

/// Name of the stacks ConfigMap of ProcMesh `name`.
pub fn configmap_name(name: &str) -> String {
    format!("{name}-stacks")
}

/// The stalled ranks of the current incarnations (invariant 1).
pub fn stalled(
    states: &BTreeMap<Rank, ProcObs>,
    incarnation: impl Fn(Rank) -> u32,
) -> BTreeMap<Rank, (&ProcObs, &Stall)> {
    states
        .iter()
        .filter(|(r, o)| o.state == ProcState::Running && o.incarnation >= incarnation(**r))
        .filter_map(|(r, o)| Some((*r, (o, o.stall.as_ref()?))))
        .collect()
}

/// A stall in words: how long without progress and the CPU used meanwhile.
pub fn describe(s: &Stall, now_ms: u64) -> String {
    let silent = Duration::from_millis(now_ms.saturating_sub(s.last_progress_ms).max(s.after_ms));
    let cpu = match s.cpu_ms {
        Some(ms) => {
            let busy = ms as f64 / s.after_ms.max(1) as f64;
            let kind = if busy >= 0.5 { "spinning" } else { "blocked" };
            format!(
                ", {:.2}s CPU in the last {}s: {kind}",
                ms as f64 / 1000.0,
                s.after_ms / 1000
            )
        }
        None => String::new(),
    };
    format!("no progress for {}s{cpu}", silent.as_secs())
}

/// The rank status a report makes, given the stall policy (invariant 1):
/// `observed` is what the report says without the stall.
pub fn observed(pm: &ProcMesh, o: &ProcObs, mut observed: RankStatus) -> RankStatus {
    let Some(s) = o.stall.as_ref().filter(|_| o.state == ProcState::Running) else {
        return observed;
    };
    let why = describe(s, s.last_progress_ms + s.after_ms);
    if pm.spec.restart_policy.on_stall == StallAction::Failure {
        observed.state = ProcState::Stalled;
        observed.reason = Some(why);
    } else {
        observed.reason = Some(format!("stalled: {why}"));
    }
    observed
}

/// Ranks as runs in words: `5, 7-9`.
pub fn rank_list(ranks: impl IntoIterator<Item = Rank>, total: Rank) -> String {
    let set: std::collections::BTreeSet<Rank> = ranks.into_iter().collect();
    runs::encode((0..total).map(|r| set.contains(&r)))
        .into_iter()
        .filter(|run| run.value)
        .map(|run| match run.count {
            1 => run.start.to_string(),
            _ => format!("{}-{}", run.start, run.end() - 1),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Sets the `Stalled` condition on `status` (invariant 4) and returns the
/// Event to publish when the stall ended.
pub fn set_condition(
    pm: &ProcMesh,
    status: &mut ProcMeshStatus,
    stalled: &BTreeMap<Rank, (&ProcObs, &Stall)>,
    total: Rank,
    now: Timestamp,
) -> Option<PlannedEvent> {
    if pm.spec.stall_timeout.is_none() {
        status.conditions.retain(|c| c.type_ != STALLED);
        return None;
    }
    let was = conditions::is_true(&status.conditions, STALLED);
    let now_t = Time(now);
    let generation = pm.metadata.generation;
    if stalled.is_empty() {
        conditions::set(
            &mut status.conditions,
            STALLED,
            false,
            "NoStall",
            "",
            generation,
            &now_t,
        );
        return was.then(|| PlannedEvent {
            severity: Severity::Normal,
            reason: "StallEnded",
            note: "every rank made progress again, or was restarted".into(),
        });
    }
    let msg = message(pm, stalled, total, now);
    conditions::set(
        &mut status.conditions,
        STALLED,
        true,
        "NoProgress",
        &msg,
        generation,
        &now_t,
    );
    None
}

fn message(
    pm: &ProcMesh,
    stalled: &BTreeMap<Rank, (&ProcObs, &Stall)>,
    total: Rank,
    now: Timestamp,
) -> String {
    let now_ms = u64::try_from(now.as_millisecond()).unwrap_or(0);
    let ranks = rank_list(stalled.keys().copied(), total);
    let mut msg = format!("ranks {ranks} stalled");
    for (r, (_, s)) in stalled.iter().take(3) {
        let _ = write!(msg, "; rank {r}: {}", describe(s, now_ms));
    }
    let _ = write!(
        msg,
        "; stacks: hostmesh stacks procmesh/{} (ConfigMap {})",
        pm.name_any(),
        configmap_name(&pm.name_any())
    );
    msg
}

/// The episode key of a set of stalls (invariant 2): a digest of each
/// stalled rank, its incarnation and its last progress.
pub fn episode(stalled: &BTreeMap<Rank, (&ProcObs, &Stall)>) -> String {
    let mut text = String::new();
    for (r, (o, s)) in stalled {
        let _ = write!(text, "{r}:{}:{};", o.incarnation, s.last_progress_ms);
    }
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The ranks whose stacks are asked for: stalled ones first, then the
/// others by rank, at most [`MAX_STACK_RANKS`] (invariant 3).
pub fn ranks_to_capture(stalled: &[Rank], total: Rank) -> Vec<Rank> {
    let mut out: Vec<Rank> = stalled.iter().copied().take(MAX_STACK_RANKS).collect();
    let mut r = 0;
    while out.len() < MAX_STACK_RANKS && r < total {
        if !stalled.contains(&r) {
            out.push(r);
        }
        r += 1;
    }
    out
}

/// The ConfigMap data for captured stacks, within its bounds (invariant 3).
pub fn configmap_data(
    summary_head: &str,
    order: &[Rank],
    stacks: &BTreeMap<Rank, crate::hub::RankStacks>,
    total: Rank,
) -> BTreeMap<String, String> {
    let mut data = BTreeMap::new();
    let mut used = summary_head.len() + 1024;
    let mut summary = summary_head.to_string();
    let mut left_out = Vec::new();
    for r in order {
        let text = match stacks.get(r) {
            Some(Ok(s)) => {
                let cut = if s.truncated {
                    " (cut at its bound)"
                } else {
                    ""
                };
                format!("rank {r} ({}) by {}{cut}\n{}", s.name, s.method, s.text)
            }
            Some(Err(e)) => format!("rank {r}: no stacks: {e}\n"),
            None => format!("rank {r}: no stacks\n"),
        };
        let text = hostmesh_crds::procmesh::head(&text, MAX_RANK_BYTES).to_string();
        if used + text.len() + 16 > MAX_CONFIGMAP_BYTES {
            left_out.push(*r);
            continue;
        }
        used += text.len() + 16;
        let _ = writeln!(
            summary,
            "rank {r}: {}",
            match stacks.get(r) {
                Some(Ok(s)) => s.method.clone(),
                Some(Err(e)) => format!("none ({})", hostmesh_crds::procmesh::head(e, 120)),
                None => "none".into(),
            }
        );
        data.insert(format!("rank-{r}"), text);
    }
    let kept = order.len() - left_out.len();
    if kept < total {
        let _ = writeln!(
            summary,
            "stacks of {kept} of {total} ranks kept (stalled ranks first, at most {MAX_STACK_RANKS} ranks, {} KiB in all)",
            MAX_CONFIGMAP_BYTES / 1024
        );
    }
    data.insert(
        "summary".into(),
        hostmesh_crds::procmesh::head(&summary, 64 * 1024).to_string(),
    );
    data
}

/// On a new stall episode: captures the stacks of every rank (bounded),
/// writes ConfigMap `<name>-stacks` and returns the Event to publish
/// (invariant 2). Failures are logged: diagnosis never blocks recovery.
pub async fn capture_on_new_episode(
    ctx: &ControllerContext,
    pm: &ProcMesh,
    world: &WorldKey,
    mesh_id: &str,
    stalled: &BTreeMap<Rank, (&ProcObs, &Stall)>,
    total: Rank,
) -> Option<PlannedEvent> {
    if stalled.is_empty() {
        return None;
    }
    let ns = pm.namespace().unwrap_or_default();
    let name = configmap_name(&pm.name_any());
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let key = episode(stalled);
    let existing = match api.get_opt(&name).await {
        Ok(cm) => cm,
        Err(e) => {
            tracing::warn!(procmesh = %pm.name_any(), error = %e, "cannot read the stacks ConfigMap");
            return None;
        }
    };
    if existing
        .as_ref()
        .and_then(|c| c.annotations().get(EPISODE_ANNOTATION))
        .is_some_and(|k| *k == key)
    {
        return None;
    }
    let stalled_ranks: Vec<Rank> = stalled.keys().copied().collect();
    let order = ranks_to_capture(&stalled_ranks, total);
    let per_rank = (MAX_CONFIGMAP_BYTES / order.len().max(1)).clamp(512, MAX_RANK_BYTES);
    tracing::info!(procmesh = %pm.name_any(), stalled = stalled.len(), ranks = order.len(), "stall: capturing stacks");
    let stacks = ctx
        .hub
        .capture_stacks(world, mesh_id, &order, per_rank, CAPTURE_TIMEOUT)
        .await;
    let now = Timestamp::now();
    let head = format!(
        "captured {now} for a stall of ranks {}\n{}\n",
        rank_list(stalled_ranks.iter().copied(), total),
        message(pm, stalled, total, now)
    );
    let data = configmap_data(&head, &order, &stacks, total);
    let cm = super::addresses::owned_configmap(
        pm,
        &name,
        Some(BTreeMap::from([(EPISODE_ANNOTATION.to_string(), key)])),
        data,
    );
    let written = super::addresses::create_or_replace(&api, existing, cm).await;
    let kept = match written {
        Ok(_) => format!(
            "stacks of every rank in ConfigMap {name} (hostmesh stacks procmesh/{})",
            pm.name_any()
        ),
        Err(e) => {
            tracing::warn!(procmesh = %pm.name_any(), error = %e, "cannot write the stacks ConfigMap");
            format!("stacks not kept: {e}")
        }
    };
    Some(PlannedEvent {
        severity: Severity::Warning,
        reason: "Stalled",
        // Event notes are limited to 1 KiB.
        note: hostmesh_crds::procmesh::head(
            &format!("{}; {kept}", message(pm, stalled, total, now)),
            1000,
        )
        .to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostmesh_agent::protocol::ProcStacks;

    fn obs(stall: Option<Stall>) -> ProcObs {
        ProcObs {
            state: ProcState::Running,
            stall,
            ..Default::default()
        }
    }

    fn stall(cpu_ms: Option<u64>) -> Stall {
        Stall {
            last_progress_ms: 1_000_000,
            after_ms: 2000,
            cpu_ms,
        }
    }

    #[test]
    fn ranks_read_as_runs() {
        assert_eq!(rank_list([5, 7, 8, 9, 12], 16), "5, 7-9, 12");
        assert_eq!(rank_list([], 4), "");
    }

    #[test]
    fn cpu_tells_blocked_from_spinning() {
        assert!(describe(&stall(Some(10)), 1_002_000).contains("blocked"));
        assert!(describe(&stall(Some(1900)), 1_002_000).contains("spinning"));
        assert_eq!(describe(&stall(None), 1_005_000), "no progress for 5s");
    }

    #[test]
    fn on_stall_decides_whether_a_stall_is_a_failure() {
        let mut pm = crate::controllers::procmesh::desired::tests::mk_pm(", stallTimeout: 2s");
        let o = obs(Some(stall(Some(0))));
        let running = RankStatus {
            state: ProcState::Running,
            ..Default::default()
        };
        let s = observed(&pm, &o, running.clone());
        assert_eq!(s.state, ProcState::Stalled);
        assert!(s.state.is_failure());
        assert!(s.reason.unwrap().starts_with("no progress for 2s"));
        pm.spec.restart_policy.on_stall = StallAction::Report;
        let s = observed(&pm, &o, running.clone());
        assert_eq!(s.state, ProcState::Running);
        assert!(s.reason.unwrap().starts_with("stalled: no progress for 2s"));
        assert_eq!(observed(&pm, &obs(None), running.clone()), running);
    }

    #[test]
    fn the_condition_names_the_stalled_ranks_and_ends() {
        let pm = crate::controllers::procmesh::desired::tests::mk_pm(", stallTimeout: 2s");
        let mut status = ProcMeshStatus::default();
        let states: BTreeMap<Rank, ProcObs> = [
            (3, obs(None)),
            (5, obs(Some(stall(Some(0))))),
            (6, obs(Some(stall(Some(0))))),
        ]
        .into();
        let s = stalled(&states, |_| 0);
        assert_eq!(s.keys().copied().collect::<Vec<_>>(), [5, 6]);
        let now = Timestamp::from_millisecond(1_003_000).unwrap();
        assert!(set_condition(&pm, &mut status, &s, 8, now).is_none());
        let c = conditions::get(&status.conditions, STALLED).unwrap();
        assert_eq!(c.status, "True");
        assert!(
            c.message
                .starts_with("ranks 5-6 stalled; rank 5: no progress for 3s"),
            "{}",
            c.message
        );
        assert!(
            c.message.contains("hostmesh stacks procmesh/train"),
            "{}",
            c.message
        );
        // A newer incarnation asked for: the old one's stall does not count.
        assert!(stalled(&states, |_| 1).is_empty());
        let ended = set_condition(&pm, &mut status, &BTreeMap::new(), 8, now).unwrap();
        assert_eq!(ended.reason, "StallEnded");
        assert!(!conditions::is_true(&status.conditions, STALLED));
        // Without stallTimeout, no condition at all (invariant 4).
        let plain = crate::controllers::procmesh::desired::tests::mk_pm("");
        set_condition(&plain, &mut status, &BTreeMap::new(), 8, now);
        assert!(conditions::get(&status.conditions, STALLED).is_none());
    }

    #[test]
    fn episodes_change_with_a_new_stall_only() {
        let a: BTreeMap<Rank, ProcObs> = [(5, obs(Some(stall(None))))].into();
        let mut b = a.clone();
        b.insert(6, obs(Some(stall(None))));
        let ka = episode(&stalled(&a, |_| 0));
        assert_eq!(ka, episode(&stalled(&a.clone(), |_| 0)));
        assert_ne!(ka, episode(&stalled(&b, |_| 0)));
    }

    #[test]
    fn the_configmap_stays_within_its_bounds() {
        let total: Rank = 10_000;
        let order = ranks_to_capture(&[7777], total);
        assert_eq!(order.len(), MAX_STACK_RANKS);
        assert_eq!(order[0], 7777, "stalled ranks first");
        let stacks: BTreeMap<Rank, crate::hub::RankStacks> = order
            .iter()
            .map(|r| {
                (
                    *r,
                    Ok(ProcStacks {
                        name: format!("pm.x.{r}"),
                        rank: *r,
                        method: "kernel".into(),
                        text: "x".repeat(100_000),
                        truncated: true,
                    }),
                )
            })
            .collect();
        let data = configmap_data("head\n", &order, &stacks, total);
        let bytes: usize = data.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(bytes <= MAX_CONFIGMAP_BYTES, "{bytes}");
        assert!(data.contains_key("rank-7777"));
        assert!(data["summary"].contains(&format!("of {total} ranks kept")));
        assert!(data.values().all(|v| v.len() <= 64 * 1024));
    }
}
