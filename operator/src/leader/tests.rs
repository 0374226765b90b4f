//! Unit tests of the pure parts of leader election.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::*;

const LEASE: Duration = Duration::from_secs(15);

fn held_by(holder: &str) -> LeaseRecord {
    LeaseRecord {
        holder: Some(holder.into()),
        duration_seconds: Some(15),
        renew_time: Some(Timestamp::UNIX_EPOCH),
        transitions: 0,
    }
}

fn config() -> LeaseConfig {
    LeaseConfig {
        name: "hostmesh-operator".into(),
        namespace: "hostmesh-system".into(),
        identity: "a".into(),
        lease_duration: LEASE,
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
        owner: None,
    }
}

#[test]
fn free_lease_is_acquired_at_once() {
    let t = Instant::now();
    assert_eq!(
        decide(&LeaseRecord::default(), t, t, "a", LEASE),
        Decision::Acquire
    );
}

#[test]
fn own_lease_is_renewed() {
    let t = Instant::now();
    assert_eq!(decide(&held_by("a"), t, t, "a", LEASE), Decision::Renew);
}

#[test]
fn live_lease_of_another_is_waited_for_until_expiry_on_our_clock() {
    let seen = Instant::now();
    let rec = held_by("b");
    assert_eq!(
        decide(&rec, seen, seen + Duration::from_secs(5), "a", LEASE),
        Decision::Wait {
            holder: "b".into(),
            remaining: Duration::from_secs(10)
        }
    );
    // Exactly at expiry, the lease can be taken.
    assert_eq!(
        decide(&rec, seen, seen + LEASE, "a", LEASE),
        Decision::Acquire
    );
}

#[test]
fn lease_duration_from_the_record_wins_over_ours() {
    let seen = Instant::now();
    let mut rec = held_by("b");
    rec.duration_seconds = Some(1);
    assert_eq!(
        decide(&rec, seen, seen + Duration::from_secs(1), "a", LEASE),
        Decision::Acquire
    );
    rec.duration_seconds = Some(0);
    assert!(matches!(
        decide(&rec, seen, seen + Duration::from_secs(1), "a", LEASE),
        Decision::Wait { .. }
    ));
}

#[test]
fn leader_steps_down_at_the_renew_deadline_before_the_lease_expires() {
    let c = config();
    let renewed = Instant::now();
    assert!(!should_step_down(
        renewed,
        renewed + Duration::from_secs(9),
        c.renew_deadline
    ));
    assert!(should_step_down(
        renewed,
        renewed + c.renew_deadline,
        c.renew_deadline
    ));
    // Invariant 3: a standby that saw the same renewal at the same time
    // cannot take over before the leader has stepped down.
    let standby_takeover = renewed + c.lease_duration;
    assert!(should_step_down(
        renewed,
        standby_takeover,
        c.renew_deadline
    ));
}

#[test]
fn next_spec_counts_transitions_only_when_the_holder_changes() {
    let now = Timestamp::from_second(1_000).expect("valid");
    let first = next_spec(None, "a", LEASE, now);
    assert_eq!(first.holder_identity.as_deref(), Some("a"));
    assert_eq!(first.lease_duration_seconds, Some(15));
    assert_eq!(first.lease_transitions, Some(0));
    assert_eq!(first.acquire_time, Some(MicroTime(now)));

    let later = Timestamp::from_second(1_002).expect("valid");
    let renewed = next_spec(Some(&first), "a", LEASE, later);
    assert_eq!(renewed.lease_transitions, Some(0));
    assert_eq!(renewed.acquire_time, Some(MicroTime(now)), "kept on renew");
    assert_eq!(renewed.renew_time, Some(MicroTime(later)));

    let taken = next_spec(Some(&renewed), "b", LEASE, later);
    assert_eq!(taken.holder_identity.as_deref(), Some("b"));
    assert_eq!(taken.lease_transitions, Some(1));
    assert_eq!(taken.acquire_time, Some(MicroTime(later)));

    let released = LeaseSpec {
        holder_identity: None,
        ..taken
    };
    let after_release = next_spec(Some(&released), "a", LEASE, later);
    assert_eq!(after_release.lease_transitions, Some(2));
}

#[test]
fn timing_rules_are_checked_with_the_flag_names() {
    assert!(config().validate().is_ok());
    let mut c = config();
    c.renew_deadline = LEASE;
    let msg = c.validate().expect_err("deadline too long").to_string();
    assert!(msg.contains("--leader-elect-renew-deadline"), "{msg}");
    let mut c = config();
    c.retry_period = Duration::from_secs(10);
    let msg = c.validate().expect_err("retry too long").to_string();
    assert!(msg.contains("--leader-elect-retry-period"), "{msg}");
    let mut c = config();
    c.lease_duration = Duration::from_millis(500);
    c.renew_deadline = Duration::from_millis(400);
    c.retry_period = Duration::from_millis(100);
    let msg = c.validate().expect_err("sub-second lease").to_string();
    assert!(msg.contains("at least 1s"), "{msg}");
}

#[test]
fn durations_parse_with_units_and_reject_garbage() {
    assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
    assert_eq!(parse_duration("15"), Ok(Duration::from_secs(15)));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert!(
        parse_duration("1d")
            .expect_err("unit")
            .contains("use ms, s, m or h")
    );
    assert!(
        parse_duration("s")
            .expect_err("no number")
            .contains("`15s`")
    );
    assert!(parse_duration("-1s").is_err());
}

#[test]
fn election_off_needs_no_namespace_and_on_resolves_identity() {
    let args = LeaderElectionArgs {
        leader_elect: false,
        leader_elect_lease: "hostmesh-operator".into(),
        leader_elect_namespace: None,
        leader_elect_identity: None,
        leader_elect_lease_duration: LEASE,
        leader_elect_renew_deadline: Duration::from_secs(10),
        leader_elect_retry_period: Duration::from_secs(2),
        pod_name: None,
        pod_namespace: None,
        pod_uid: None,
    };
    assert_eq!(args.config().expect("off"), None);
    let on = LeaderElectionArgs {
        leader_elect: true,
        leader_elect_namespace: Some("ops".into()),
        ..args
    };
    let c = on.config().expect("valid").expect("on");
    assert_eq!(c.namespace, "ops");
    assert!(!c.identity.is_empty());
    assert_eq!(c.owner, None, "outside a Pod the Lease gets no owner");
}

fn args_in_pod(pod_namespace: &str, lease_namespace: &str) -> LeaderElectionArgs {
    LeaderElectionArgs {
        leader_elect: true,
        leader_elect_lease: "hostmesh-operator".into(),
        leader_elect_namespace: Some(lease_namespace.into()),
        leader_elect_identity: Some("op-0".into()),
        leader_elect_lease_duration: LEASE,
        leader_elect_renew_deadline: Duration::from_secs(10),
        leader_elect_retry_period: Duration::from_secs(2),
        pod_name: Some("op-0".into()),
        pod_namespace: Some(pod_namespace.into()),
        pod_uid: Some("uid-0".into()),
    }
}

#[test]
fn in_a_pod_the_pod_owns_the_lease_only_in_its_own_namespace() {
    let c = args_in_pod("ops", "ops").config().unwrap().unwrap();
    assert_eq!(
        c.owner,
        Some(OwnerPod {
            name: "op-0".into(),
            uid: "uid-0".into()
        })
    );
    // An owner in another namespace counts as absent to the garbage
    // collector, which would delete the Lease at once.
    let elsewhere = args_in_pod("ops", "leases").config().unwrap().unwrap();
    assert_eq!(elsewhere.owner, None);
    // A UID without the Pod's name is a configuration error naming the fix.
    let no_name = LeaderElectionArgs {
        pod_name: None,
        ..args_in_pod("ops", "ops")
    };
    let msg = no_name.config().expect_err("no pod name").to_string();
    assert!(
        msg.contains("--pod-name") && msg.contains("POD_NAME"),
        "{msg}"
    );
}

fn owner(kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: if kind == "Pod" { "v1" } else { "apps/v1" }.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        ..OwnerReference::default()
    }
}

#[test]
fn the_holders_pod_replaces_the_previous_pod_owner_and_others_stay() {
    let me = OwnerPod {
        name: "op-new".into(),
        uid: "u-new".into(),
    };
    // A new Lease: the Pod alone.
    assert_eq!(
        next_owners(None, Some(&me)),
        Some(vec![owner("Pod", "op-new", "u-new")])
    );
    // Taken over from the Pod of the last holder (a rolling upgrade): re-pointed
    // in place; an owner of another kind someone added stays.
    let before = vec![
        owner("Pod", "op-old", "u-old"),
        owner("Deployment", "keep", "u-d"),
    ];
    assert_eq!(
        next_owners(Some(before.as_slice()), Some(&me)),
        Some(vec![
            owner("Pod", "op-new", "u-new"),
            owner("Deployment", "keep", "u-d")
        ])
    );
    // A renewal changes nothing, even fields we would not write.
    let mine = vec![OwnerReference {
        controller: Some(false),
        ..owner("Pod", "op-new", "u-new")
    }];
    assert_eq!(
        next_owners(Some(mine.as_slice()), Some(&me)),
        Some(mine.clone())
    );
    // Outside a Pod, a holder drops the Pod owner an earlier holder left
    // (that Pod's end must not take the Lease of a live holder with it).
    assert_eq!(next_owners(Some(mine.as_slice()), None), None);
    assert_eq!(
        next_owners(Some(before.as_slice()), None),
        Some(vec![owner("Deployment", "keep", "u-d")])
    );
    assert_eq!(next_owners(None, None), None);
}

#[test]
fn always_leader_handle_reports_leader() {
    let h = LeaderHandle::always_leader();
    assert!(h.is_leader());
    assert_eq!(*h.role_channel().borrow(), Role::Leader);
}
