//! IPv4 prefixes (`10.244.0.0/16`): parsing, containment, overlap, and the
//! /24 subnets a pod range is cut into.

use std::net::Ipv4Addr;

/// An IPv4 prefix whose host bits are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ipv4Net {
    addr: Ipv4Addr,
    prefix: u8,
}

impl Ipv4Net {
    /// The prefix `addr/prefix`; `None` when `prefix > 32` or host bits are set.
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Option<Self> {
        if prefix > 32 || u32::from(addr) & !mask(prefix) != 0 {
            return None;
        }
        Some(Self { addr, prefix })
    }

    /// The first address.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Number of addresses (2^(32-prefix)).
    pub(crate) fn size(&self) -> u64 {
        1u64 << (32 - self.prefix)
    }

    /// The address `offset` addresses after the first.
    pub(crate) fn nth(&self, offset: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr).wrapping_add(offset))
    }

    /// Offset of `ip` in this prefix, when it belongs to it.
    pub(crate) fn offset_of(&self, ip: Ipv4Addr) -> Option<u32> {
        self.contains(ip)
            .then(|| u32::from(ip) - u32::from(self.addr))
    }

    /// Whether `ip` is in this prefix.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.prefix) == u32::from(self.addr)
    }

    /// Whether the two prefixes share an address.
    pub fn overlaps(&self, other: &Ipv4Net) -> bool {
        let m = mask(self.prefix.min(other.prefix));
        u32::from(self.addr) & m == u32::from(other.addr) & m
    }

    /// The subnets of length `prefix` inside this prefix, in order (none
    /// when `prefix` is shorter than this prefix).
    pub(crate) fn subnets(&self, prefix: u8) -> impl Iterator<Item = Ipv4Net> + use<> {
        let base = u32::from(self.addr);
        let count = if prefix < self.prefix || prefix > 32 {
            0
        } else {
            1u64 << (prefix - self.prefix)
        };
        let step = if prefix >= 32 {
            1
        } else {
            1u64 << (32 - prefix)
        };
        (0..count).map(move |i| Ipv4Net {
            addr: Ipv4Addr::from(base.wrapping_add((i * step) as u32)),
            prefix,
        })
    }
}

fn mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    }
}

impl std::fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl std::str::FromStr for Ipv4Net {
    type Err = String;

    /// Parses `a.b.c.d/n`; the error says what is wrong.
    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, bits) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not a CIDR range such as 10.244.0.0/16"))?;
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|_| format!("{s:?}: {addr:?} is not an IPv4 address"))?;
        let prefix: u8 = bits
            .parse()
            .ok()
            .filter(|p| *p <= 32)
            .ok_or_else(|| format!("{s:?}: the prefix length {bits:?} is not 0..=32"))?;
        Ipv4Net::new(addr, prefix).ok_or_else(|| {
            format!(
                "{s:?}: host bits are set; the range starts at {}",
                Ipv4Addr::from(u32::from(addr) & mask(prefix))
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn parses_and_rejects_with_reasons() {
        assert_eq!(net("10.244.0.0/16").to_string(), "10.244.0.0/16");
        assert!(
            "10.244.1.0/16"
                .parse::<Ipv4Net>()
                .unwrap_err()
                .contains("host bits")
        );
        assert!(
            "10.244.0.0"
                .parse::<Ipv4Net>()
                .unwrap_err()
                .contains("CIDR")
        );
        assert!(
            "10.244.0.0/33"
                .parse::<Ipv4Net>()
                .unwrap_err()
                .contains("prefix")
        );
    }

    #[test]
    fn overlap_and_containment() {
        let pods = net("10.244.0.0/16");
        assert!(pods.overlaps(&net("10.0.0.0/8")));
        assert!(pods.overlaps(&net("10.244.7.0/24")));
        assert!(!pods.overlaps(&net("10.96.0.0/12")));
        assert!(pods.contains("10.244.255.1".parse().unwrap()));
        assert!(!pods.contains("10.245.0.1".parse().unwrap()));
        assert_eq!(pods.offset_of("10.244.1.2".parse().unwrap()), Some(258));
    }

    #[test]
    fn cuts_into_subnets() {
        let subnets: Vec<_> = net("10.244.0.0/22").subnets(24).collect();
        assert_eq!(subnets.len(), 4);
        assert_eq!(subnets[3], net("10.244.3.0/24"));
        assert_eq!(net("10.244.0.0/24").subnets(16).count(), 0);
    }
}
