//! Rank epochs and self-fencing on the agent's side (docs/architecture.md,
//! "Rank epochs and fencing"): the agent's epoch, the last time the
//! operator showed it still hears this agent (a `Renew`, or a subscription),
//! and the fence itself: once tripped, the agent stops every proc and
//! accepts no new one, and says why in every push.
//!
//! Invariants:
//! 1. The fence trips at most once and never opens again; the first reason
//!    is kept.
//! 2. It trips when the operator shows a newer epoch for this rank (a
//!    `Renew` or an address book): the agent was replaced.
//! 3. With a fence timeout, it trips when no contact came for that long,
//!    measured on the monotonic clock from the last contact (the agent's
//!    start counts as one). Only a `Renew` carrying this agent's epoch is
//!    contact: the operator sends one only after this agent's heartbeats
//!    reached it.
//! 4. Without a fence timeout (an agent not run by the operator) only
//!    invariant 2 trips it.
//! 5. The epochs the agent learns (its own, the address book's) go into
//!    the epoch table its proc checks peers against, and, with its own
//!    claim, into each new proc's environment (`HOSTMESH_RANK_EPOCH`,
//!    `HOSTMESH_RANK_EPOCHS`), so the runtime handshake refuses a replaced
//!    rank's older copy (`hostmesh_runtime::channel::epoch`).

use hostmesh_mesh::Rank;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use hostmesh_runtime::channel::epoch::{EpochClaim, EpochTable};
use tokio::sync::Notify;
use tokio::time::Instant;

/// A proc's own claim, `<host rank>:<epoch>` (invariant 5).
pub const RANK_EPOCH_ENV: &str = "HOSTMESH_RANK_EPOCH";
/// The epochs known when a proc started, `<rank>=<epoch>,...`.
pub const RANK_EPOCHS_ENV: &str = "HOSTMESH_RANK_EPOCHS";

/// Parses a proc's epoch variables (`None` when unset): its claim and a
/// table seeded with the known epochs; a bad value names the variable.
pub fn proc_epochs(
    claim: Option<&str>,
    known: Option<&str>,
) -> Result<Option<(EpochClaim, EpochTable)>, crate::HostError> {
    let Some(claim) = claim.filter(|c| !c.trim().is_empty()) else {
        return Ok(None);
    };
    let pair = |s: &str, sep: char| -> Option<(Rank, u64)> {
        let (r, e) = s.trim().split_once(sep)?;
        Some((r.trim().parse().ok()?, e.trim().parse().ok()?))
    };
    let (rank, epoch) = pair(claim, ':').ok_or_else(|| {
        crate::HostError::config(
            RANK_EPOCH_ENV,
            format!("{claim:?} is not <host rank>:<epoch>"),
        )
    })?;
    let table = EpochTable::default();
    table.raise(rank, epoch);
    for item in known
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.trim().is_empty())
    {
        let (r, e) = pair(item, '=').ok_or_else(|| {
            crate::HostError::config(RANK_EPOCHS_ENV, format!("{item:?} is not <rank>=<epoch>"))
        })?;
        table.raise(r, e);
    }
    Ok(Some((EpochClaim { rank, epoch }, table)))
}

/// How an epoch the operator holds for this rank compares with the
/// agent's own (the pure rule behind invariant 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EpochVerdict {
    /// The same epoch: the operator means this agent.
    Current,
    /// A newer epoch: this agent was replaced and must fence.
    Replaced,
    /// An older epoch: a message meant for a predecessor; ignored.
    Older,
}

/// Compares `theirs` (what the operator holds for this rank) with `own`.
pub fn judge(own: u64, theirs: u64) -> EpochVerdict {
    match theirs.cmp(&own) {
        std::cmp::Ordering::Equal => EpochVerdict::Current,
        std::cmp::Ordering::Greater => EpochVerdict::Replaced,
        std::cmp::Ordering::Less => EpochVerdict::Older,
    }
}

/// The fence settings of an agent the operator runs.
#[derive(Debug, Clone, Copy)]
pub struct FencePolicy {
    /// This agent's rank epoch.
    pub epoch: u64,
    /// Trip after this long without contact; `None`: never for silence.
    pub timeout: Option<Duration>,
    /// Grace between TERM and KILL when the fence stops the procs.
    pub grace: Duration,
}

impl Default for FencePolicy {
    fn default() -> Self {
        FencePolicy {
            epoch: 0,
            timeout: None,
            grace: Duration::from_secs(5),
        }
    }
}

#[derive(Debug)]
struct State {
    last_contact: Instant,
    fenced: Option<String>,
}

/// One agent's fence (see the module doc).
#[derive(Debug)]
pub struct Fence {
    host_rank: Rank,
    policy: OnceLock<FencePolicy>,
    peers: OnceLock<EpochTable>,
    state: Mutex<State>,
    tripped: Notify,
}

impl Fence {
    /// An open fence for host `host_rank`, its policy the default until
    /// [`Fence::configure`].
    pub(crate) fn new(host_rank: Rank) -> Self {
        Fence {
            host_rank,
            policy: OnceLock::new(),
            peers: OnceLock::new(),
            state: Mutex::new(State {
                last_contact: Instant::now(),
                fenced: None,
            }),
            tripped: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the policy once (later calls are ignored) and counts now as a
    /// contact.
    pub fn configure(&self, policy: FencePolicy) {
        let _ = self.policy.set(policy);
        self.peers().raise(self.host_rank, self.epoch());
        self.lock().last_contact = Instant::now();
    }

    /// The epoch table the agent's proc checks peers against (invariant 5).
    pub fn peers(&self) -> &EpochTable {
        self.peers.get_or_init(EpochTable::default)
    }

    /// Uses `table` (the one the agent's proc was built with) as the peer
    /// table; only before the table is first used.
    pub fn share_peers(&self, table: EpochTable) {
        let _ = self.peers.set(table);
    }

    /// This agent's claim in the runtime handshake (none without an epoch).
    pub fn claim(&self) -> Option<EpochClaim> {
        let epoch = self.epoch();
        (epoch > 0).then_some(EpochClaim {
            rank: self.host_rank,
            epoch,
        })
    }

    /// The epoch variables of a new proc (invariant 5; none without an
    /// epoch): its claim `rank:epoch` and the known epochs `rank=epoch,...`.
    pub(crate) fn proc_env(&self, ranks: usize) -> Vec<(String, String)> {
        let Some(c) = self.claim() else {
            return Vec::new();
        };
        let known = (0..ranks.max(self.host_rank + 1))
            .filter_map(|r| Some(format!("{r}={}", self.peers().current(r)?)))
            .collect::<Vec<_>>()
            .join(",");
        vec![
            (RANK_EPOCH_ENV.to_owned(), format!("{}:{}", c.rank, c.epoch)),
            (RANK_EPOCHS_ENV.to_owned(), known),
        ]
    }

    /// The policy in force.
    pub fn policy(&self) -> FencePolicy {
        self.policy.get().copied().unwrap_or_default()
    }

    /// This agent's rank epoch.
    pub fn epoch(&self) -> u64 {
        self.policy().epoch
    }

    /// Why the fence tripped, once it has.
    pub fn fenced(&self) -> Option<String> {
        self.lock().fenced.clone()
    }

    /// An operator holding `epoch` for this rank reached the agent
    /// (invariants 2, 3). Returns the verdict; `Replaced` trips the fence.
    pub fn contact(&self, epoch: u64) -> EpochVerdict {
        let own = self.epoch();
        let verdict = judge(own, epoch);
        match verdict {
            EpochVerdict::Current => self.lock().last_contact = Instant::now(),
            EpochVerdict::Replaced => {
                self.trip(format!(
                    "replaced: the operator holds epoch {epoch} for host rank {}, this agent is epoch {own}",
                    self.host_rank
                ));
            }
            EpochVerdict::Older => {}
        }
        verdict
    }

    /// An address book with `epochs` by host rank arrived (invariant 2).
    /// It is no contact: the operator sends books whether or not it hears
    /// this agent.
    pub fn address_book(&self, epochs: &[u64]) {
        self.book_epochs(epochs.iter().copied().enumerate());
    }

    /// Some entries of an address book arrived (a patch): each `(rank,
    /// epoch)` as in [`Fence::address_book`].
    pub fn book_epochs(&self, entries: impl IntoIterator<Item = (Rank, u64)>) {
        for (r, e) in entries {
            if e == 0 {
                continue;
            }
            self.peers().raise(r, e);
            if r == self.host_rank && judge(self.epoch(), e) == EpochVerdict::Replaced {
                let _ = self.contact(e);
            }
        }
    }

    /// Trips the fence with `reason` (invariant 1); returns whether this
    /// call tripped it.
    pub fn trip(&self, reason: String) -> bool {
        let mut st = self.lock();
        if st.fenced.is_some() {
            return false;
        }
        tracing::warn!(host_rank = self.host_rank, %reason, "fencing: stopping every proc");
        st.fenced = Some(reason);
        drop(st);
        self.tripped.notify_one();
        true
    }

    /// Trips the fence if no contact came for the timeout (invariant 3);
    /// else returns when to look again (`None`: never for silence).
    pub fn check(&self, now: Instant) -> Option<Instant> {
        let timeout = self.policy().timeout?;
        let last = self.lock().last_contact;
        let deadline = last + timeout;
        if now < deadline {
            return Some(deadline);
        }
        self.trip(format!(
            "no contact from the operator for {:.1}s (fence timeout {:.1}s): it may have replaced this host",
            now.duration_since(last).as_secs_f64(),
            timeout.as_secs_f64()
        ));
        None
    }

    /// Resolves once the fence has tripped.
    pub async fn tripped(&self) {
        loop {
            let notified = self.tripped.notified();
            if self.lock().fenced.is_some() {
                return;
            }
            notified.await;
        }
    }

    /// Runs the silence clock until the fence trips (invariant 3).
    pub async fn watch(&self) {
        loop {
            // `None`: tripped, or no timeout (then only a newer epoch trips it).
            let Some(next) = self.check(Instant::now()) else {
                return self.tripped().await;
            };
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = self.tripped() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_ordered() {
        assert_eq!(judge(3, 3), EpochVerdict::Current);
        assert_eq!(judge(3, 4), EpochVerdict::Replaced);
        assert_eq!(judge(3, 2), EpochVerdict::Older);
        // An agent without an epoch (0) is replaced by any numbered one.
        assert_eq!(judge(0, 1), EpochVerdict::Replaced);
    }

    fn fence(epoch: u64, timeout: Option<Duration>) -> Fence {
        let f = Fence::new(2);
        f.configure(FencePolicy {
            epoch,
            timeout,
            grace: Duration::from_secs(1),
        });
        f
    }

    #[test]
    fn a_newer_epoch_trips_and_the_first_reason_stays() {
        let f = fence(5, None);
        assert_eq!(f.contact(4), EpochVerdict::Older);
        assert_eq!(f.contact(5), EpochVerdict::Current);
        assert!(f.fenced().is_none());
        f.address_book(&[9, 9]); // no entry for rank 2: nothing
        assert!(f.fenced().is_none());
        f.address_book(&[5, 5, 6]);
        let why = f.fenced().expect("fenced");
        assert!(why.contains("epoch 6") && why.contains("rank 2"), "{why}");
        assert!(!f.trip("again".into()));
        assert_eq!(f.fenced().as_deref(), Some(why.as_str()));
    }

    #[test]
    fn silence_trips_only_after_the_timeout_and_contact_resets_it() {
        let timeout = Duration::from_secs(10);
        let f = fence(1, Some(timeout));
        let start = Instant::now();
        let Some(deadline) = f.check(start) else {
            panic!("open")
        };
        assert!(deadline >= start && deadline <= start + timeout);
        assert!(f.check(deadline - Duration::from_millis(1)).is_some());
        // An older epoch's renewal is no contact; the current one is.
        f.contact(0);
        assert_eq!(f.check(start), Some(deadline));
        f.contact(1);
        let Some(renewed) = f.check(Instant::now()) else {
            panic!("open")
        };
        assert!(renewed >= deadline, "contact moves the deadline on");
        assert!(f.check(renewed - Duration::from_millis(1)).is_some());
        assert!(f.fenced().is_none());
        assert!(f.check(renewed).is_none());
        assert!(f.fenced().unwrap().contains("fence timeout 10.0s"));
    }

    #[tokio::test]
    async fn watch_ends_when_silence_trips_it() {
        let timeout = Duration::from_millis(50);
        let start = Instant::now();
        let f = fence(1, Some(timeout));
        f.watch().await;
        assert!(start.elapsed() >= timeout, "not before the timeout");
        assert!(f.fenced().is_some());
    }

    #[test]
    fn epochs_reach_the_peer_table_and_proc_env() {
        let f = fence(5, None);
        assert_eq!(f.claim(), Some(EpochClaim { rank: 2, epoch: 5 }));
        f.address_book(&[3, 0, 5]);
        assert_eq!(f.peers().current(0), Some(3));
        assert_eq!(f.peers().current(1), None, "0 is no epoch");
        let env = f.proc_env(3);
        assert_eq!(env[0], (RANK_EPOCH_ENV.into(), "2:5".into()));
        assert_eq!(env[1], (RANK_EPOCHS_ENV.into(), "0=3,2=5".into()));
        let (claim, table) = proc_epochs(Some("2:5"), Some("0=3,2=5")).unwrap().unwrap();
        assert_eq!(claim, EpochClaim { rank: 2, epoch: 5 });
        assert_eq!(table.current(0), Some(3));
        assert!(
            table
                .admit(Some(&EpochClaim { rank: 0, epoch: 2 }))
                .is_err()
        );
        assert!(proc_epochs(None, Some("0=3")).unwrap().is_none());
        let e = proc_epochs(Some("five"), None).unwrap_err().to_string();
        assert!(e.contains(RANK_EPOCH_ENV), "{e}");
        let e = proc_epochs(Some("2:5"), Some("0:3"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(RANK_EPOCHS_ENV), "{e}");
        // An agent without an epoch gives its procs none.
        assert!(fence(0, None).proc_env(3).is_empty());
    }

    #[test]
    fn without_a_timeout_silence_never_trips() {
        let f = fence(1, None);
        assert_eq!(f.check(Instant::now() + Duration::from_secs(86400)), None);
        assert!(f.fenced().is_none());
    }
}
