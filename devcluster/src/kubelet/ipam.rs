//! Pod IP allocation from one range: the kubelet's /24 on its bridge
//! (sandbox network) or a loopback block (`--pod-network=host`).
//!
//! Invariants:
//! 1. Reserved addresses (the bridge's gateway, `127.0.0.1`) and addresses
//!    whose last octet is 0 or 255 are never handed out.
//! 2. An address is in use from `allocate`/`reserve` until `release`; it is
//!    never given to two pods at once.
//! 3. Allocation goes round the range, so a released address is reused only
//!    after every other free address has been handed out once more.
//! 4. With a claims directory, an address is also claimed machine-wide (an
//!    exclusive lock on `<dir>/<ip>`, held until release or until the process
//!    ends), so kubelets sharing a machine, even configured with the same
//!    range, never hand out the same address. (The sandbox network needs no
//!    per-address claims: its whole /24 is claimed, see `net::bridge`.)

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use super::error::{KubeletError, Result};
use super::net::Ipv4Net;

/// Allocates pod IPs from one range.
#[derive(Debug)]
pub(crate) struct IpPool {
    range: Ipv4Net,
    reserved: BTreeSet<Ipv4Addr>,
    in_use: BTreeSet<u32>,
    next: u32,
    claims_dir: Option<PathBuf>,
    claims: BTreeMap<u32, File>,
}

impl IpPool {
    /// A pool over `range` that never hands out `reserved`, claiming
    /// addresses machine-wide in `claims_dir` when given.
    pub(crate) fn new(range: Ipv4Net, reserved: &[Ipv4Addr], claims_dir: Option<PathBuf>) -> Self {
        Self {
            range,
            reserved: reserved.iter().copied().collect(),
            in_use: BTreeSet::new(),
            next: 0,
            claims_dir,
            claims: BTreeMap::new(),
        }
    }

    fn usable(&self, offset: u32) -> bool {
        let ip = self.range.nth(offset);
        let last = ip.octets()[3];
        u64::from(offset) < self.range.size()
            && last != 0
            && last != 255
            && !self.reserved.contains(&ip)
    }

    /// Takes the machine-wide claim on `offset` (invariant 4); false when
    /// another kubelet holds it. Without a claims directory, or when the
    /// directory cannot be used, every address is claimable.
    fn claim(&mut self, offset: u32) -> bool {
        let Some(dir) = &self.claims_dir else {
            return true;
        };
        let path = dir.join(self.range.nth(offset).to_string());
        let file = match std::fs::create_dir_all(dir).and_then(|()| {
            File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
        }) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot claim pod IP machine-wide");
                return true;
            }
        };
        match file.try_lock() {
            Ok(()) => {
                self.claims.insert(offset, file);
                true
            }
            Err(std::fs::TryLockError::WouldBlock) => false,
            Err(std::fs::TryLockError::Error(e)) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot claim pod IP machine-wide");
                true
            }
        }
    }

    /// Hands out a free address.
    pub(crate) fn allocate(&mut self) -> Result<Ipv4Addr> {
        let size = self.range.size();
        for step in 0..size {
            let offset = ((u64::from(self.next) + step) % size) as u32;
            if self.usable(offset) && !self.in_use.contains(&offset) && self.claim(offset) {
                self.in_use.insert(offset);
                self.next = ((u64::from(offset) + 1) % size) as u32;
                return Ok(self.range.nth(offset));
            }
        }
        Err(KubeletError::IpsExhausted(self.range.to_string()))
    }

    /// Takes `ip` if it belongs to this range, is usable and is free (a pod
    /// that already had this address before a kubelet restart keeps it).
    pub(crate) fn reserve(&mut self, ip: Ipv4Addr) -> bool {
        let Some(offset) = self.range.offset_of(ip) else {
            return false;
        };
        if !self.usable(offset) || self.in_use.contains(&offset) || !self.claim(offset) {
            return false;
        }
        self.in_use.insert(offset)
    }

    /// Returns `ip` to the pool (and drops its machine-wide claim).
    pub(crate) fn release(&mut self, ip: Ipv4Addr) {
        if let Some(offset) = self.range.offset_of(ip) {
            self.in_use.remove(&offset);
            self.claims.remove(&offset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback(block: u8) -> IpPool {
        let range = Ipv4Net::new(Ipv4Addr::new(127, block, 0, 0), 16).unwrap();
        IpPool::new(range, &[Ipv4Addr::LOCALHOST], None)
    }

    #[test]
    fn never_hands_out_reserved_addresses_or_edge_octets() {
        let mut pool = loopback(0);
        let first: Vec<Ipv4Addr> = (0..300).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(first[0], Ipv4Addr::new(127, 0, 0, 2));
        assert!(
            first
                .iter()
                .all(|ip| ip.octets()[3] != 0 && ip.octets()[3] != 255)
        );
        assert!(!first.contains(&Ipv4Addr::LOCALHOST));
        let unique: BTreeSet<_> = first.iter().collect();
        assert_eq!(unique.len(), first.len());

        let subnet = Ipv4Net::new(Ipv4Addr::new(10, 244, 3, 0), 24).unwrap();
        let gateway = Ipv4Addr::new(10, 244, 3, 1);
        let mut pool = IpPool::new(subnet, &[gateway], None);
        let all: Vec<Ipv4Addr> = (0..253).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(all[0], Ipv4Addr::new(10, 244, 3, 2));
        assert!(!all.contains(&gateway));
        assert!(matches!(
            pool.allocate(),
            Err(KubeletError::IpsExhausted(_))
        ));
    }

    #[test]
    fn released_addresses_come_back_only_after_a_full_round() {
        let mut pool = loopback(7);
        let a = pool.allocate().unwrap();
        assert_eq!(a, Ipv4Addr::new(127, 7, 0, 1));
        pool.release(a);
        let b = pool.allocate().unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn reserve_respects_range_and_use() {
        let mut pool = loopback(3);
        assert!(pool.reserve(Ipv4Addr::new(127, 3, 1, 9)));
        assert!(!pool.reserve(Ipv4Addr::new(127, 3, 1, 9)));
        assert!(!pool.reserve(Ipv4Addr::new(127, 4, 1, 9)));
        assert!(!pool.reserve(Ipv4Addr::new(127, 3, 1, 255)));
        pool.release(Ipv4Addr::new(127, 3, 1, 9));
        assert!(pool.reserve(Ipv4Addr::new(127, 3, 1, 9)));
    }

    #[test]
    fn pools_sharing_a_claims_dir_never_share_an_address() {
        let dir = tempfile::tempdir().unwrap();
        let range = Ipv4Net::new(Ipv4Addr::new(127, 5, 0, 0), 16).unwrap();
        let mut a = IpPool::new(range, &[], Some(dir.path().to_path_buf()));
        let mut b = IpPool::new(range, &[], Some(dir.path().to_path_buf()));
        let first = a.allocate().unwrap();
        let second = b.allocate().unwrap();
        assert_ne!(first, second);
        assert!(
            !b.reserve(first),
            "a claimed address cannot be reserved elsewhere"
        );
        a.release(first);
        assert!(b.reserve(first), "released claims are free again");
    }

    #[test]
    fn exhaustion_is_an_error() {
        let mut pool = loopback(9);
        let usable = 256 * 254;
        for _ in 0..usable {
            pool.allocate().unwrap();
        }
        assert!(
            matches!(pool.allocate(), Err(KubeletError::IpsExhausted(r)) if r == "127.9.0.0/16")
        );
    }
}
