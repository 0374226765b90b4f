//! Pod IP allocation from one loopback block, `127.<block>.x.y`.
//!
//! Invariants:
//! 1. `127.0.0.1` (the node's own address) and addresses whose last octet is
//!    0 or 255 are never handed out.
//! 2. An address is in use from `allocate`/`reserve` until `release`; it is
//!    never given to two pods at once.
//! 3. Allocation goes round the block, so a released address is reused only
//!    after every other free address has been handed out once more.
//! 4. With a claims directory, an address is also claimed machine-wide (an
//!    exclusive lock on `<dir>/<ip>`, held until release or until the process
//!    ends), so kubelets sharing a machine, even configured with the same
//!    block, never hand out the same address.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use super::error::{KubeletError, Result};

/// Allocates pod IPs from `127.<block>.0.0/16`.
#[derive(Debug)]
pub(crate) struct IpPool {
    block: u8,
    in_use: BTreeSet<u16>,
    next: u16,
    claims_dir: Option<PathBuf>,
    claims: BTreeMap<u16, File>,
}

impl IpPool {
    /// A pool over `127.<block>.0.0/16`, claiming addresses machine-wide in
    /// `claims_dir` when given.
    pub(crate) fn new(block: u8, claims_dir: Option<PathBuf>) -> Self {
        Self {
            block,
            in_use: BTreeSet::new(),
            next: 0,
            claims_dir,
            claims: BTreeMap::new(),
        }
    }

    fn addr(&self, index: u16) -> Ipv4Addr {
        let [x, y] = index.to_be_bytes();
        Ipv4Addr::new(127, self.block, x, y)
    }

    fn usable(&self, index: u16) -> bool {
        let [x, y] = index.to_be_bytes();
        y != 0 && y != 255 && !(self.block == 0 && x == 0 && y == 1)
    }

    /// Takes the machine-wide claim on `index` (invariant 4); false when
    /// another kubelet holds it. Without a claims directory, or when the
    /// directory cannot be used, every address is claimable.
    fn claim(&mut self, index: u16) -> bool {
        let Some(dir) = &self.claims_dir else {
            return true;
        };
        let path = dir.join(self.addr(index).to_string());
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
                self.claims.insert(index, file);
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
        for step in 0..=u16::MAX as u32 {
            let index = self.next.wrapping_add(step as u16);
            if self.usable(index) && !self.in_use.contains(&index) && self.claim(index) {
                self.in_use.insert(index);
                self.next = index.wrapping_add(1);
                return Ok(self.addr(index));
            }
        }
        Err(KubeletError::IpsExhausted(self.block))
    }

    /// Takes `ip` if it belongs to this block, is usable and is free (a pod
    /// that already had this address before a kubelet restart keeps it).
    pub(crate) fn reserve(&mut self, ip: Ipv4Addr) -> bool {
        let [a, b, x, y] = ip.octets();
        let index = u16::from_be_bytes([x, y]);
        if a != 127 || b != self.block || !self.usable(index) || self.in_use.contains(&index) {
            return false;
        }
        if !self.claim(index) {
            return false;
        }
        self.in_use.insert(index)
    }

    /// Returns `ip` to the pool (and drops its machine-wide claim).
    pub(crate) fn release(&mut self, ip: Ipv4Addr) {
        let [a, b, x, y] = ip.octets();
        if a == 127 && b == self.block {
            let index = u16::from_be_bytes([x, y]);
            self.in_use.remove(&index);
            self.claims.remove(&index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_hands_out_the_node_address_or_edge_octets() {
        let mut pool = IpPool::new(0, None);
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
    }

    #[test]
    fn released_addresses_come_back_only_after_a_full_round() {
        let mut pool = IpPool::new(7, None);
        let a = pool.allocate().unwrap();
        assert_eq!(a, Ipv4Addr::new(127, 7, 0, 1));
        pool.release(a);
        let b = pool.allocate().unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn reserve_respects_block_and_use() {
        let mut pool = IpPool::new(3, None);
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
        let mut a = IpPool::new(5, Some(dir.path().to_path_buf()));
        let mut b = IpPool::new(5, Some(dir.path().to_path_buf()));
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
        let mut pool = IpPool::new(9, None);
        let usable = 256 * 254;
        for _ in 0..usable {
            pool.allocate().unwrap();
        }
        assert!(matches!(
            pool.allocate(),
            Err(KubeletError::IpsExhausted(9))
        ));
    }
}
