//! Which pod range a sandboxed kubelet uses: the one it was given, checked
//! against the machine's routes, or, with none given, the first free /16 of
//! a fixed list of private ranges.
//!
//! Invariants:
//! 1. A range overlaps the machine when a route of any table overlaps it
//!    (the `local` table holds a route for every address of the machine, so
//!    addresses count too), leaving out default routes and routes through
//!    our own bridges (`hmbr*`: kubelets of this machine, which share the
//!    range by claiming distinct /24s).
//! 2. A given range that overlaps the machine is refused, naming the range
//!    and the route; it is never replaced by another.
//! 3. With no range given, the kubelet takes the first of [`candidates`]
//!    that overlaps nothing, and says which it took and why the earlier ones
//!    were passed over ([`PodRange`]'s `Display`). The order is fixed, so
//!    kubelets of one machine that see the same routes take the same range.
//! 4. No candidate overlaps the Service range `10.96.0.0/12` (ClusterIPs and
//!    the cluster DNS live there, on every pod's `lo`), loopback or
//!    link-local.

use std::net::Ipv4Addr;

use super::netlink::Route;
use super::{BRIDGE_PREFIX, Ipv4Net};
use crate::kubelet::error::{KubeletError, Result};

/// How many passed-over candidates a message names before "and N more".
const NAMED_SKIPS: usize = 3;

/// The /16s tried when no range is given, in order (invariants 3, 4):
/// `10.244.0.0/16` (the usual pod range) to `10.255.0.0/16`, then
/// `172.16.0.0/16` to `172.31.0.0/16`, then the rest of `10.0.0.0/8` outside
/// the Service range `10.96.0.0/12`, then `192.168.0.0/16` (home networks
/// live there).
pub(crate) fn candidates() -> impl Iterator<Item = Ipv4Net> {
    let sixteen = |a: u8, b: u8| Ipv4Net::new(Ipv4Addr::new(a, b, 0, 0), 16).expect("a /16");
    let services = Ipv4Net::new(Ipv4Addr::new(10, 96, 0, 0), 12).expect("a /12");
    (244..=255)
        .map(move |b| sixteen(10, b))
        .chain((16..=31).map(move |b| sixteen(172, b)))
        .chain(
            (0..244)
                .map(move |b| sixteen(10, b))
                .filter(move |n| !n.overlaps(&services)),
        )
        .chain(std::iter::once(sixteen(192, 168)))
}

/// A pod range and the (widest) route of the machine that overlaps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeOverlap {
    /// The pod range.
    pub range: Ipv4Net,
    /// The route's destination.
    pub route: Ipv4Net,
    /// The route's output interface, when it has one.
    pub dev: Option<String>,
}

impl std::fmt::Display for RangeOverlap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} overlaps the route to {}", self.range, self.route)?;
        if let Some(dev) = &self.dev {
            write!(f, " (dev {dev})")?;
        }
        Ok(())
    }
}

/// How the kubelet came by its pod range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeOrigin {
    /// Given (`--pod-ip-range`, `KubeletConfig::pod_ip_range`).
    Given,
    /// Picked from [`candidates`]; `skipped` are the earlier candidates,
    /// each with the widest route that overlaps it (empty: the first
    /// candidate was free).
    Picked {
        /// The candidates passed over, in order.
        skipped: Vec<RangeOverlap>,
    },
}

/// The pod range of a sandboxed kubelet (every pod routes it through its
/// gateway; the node's /24 is cut from it), and why it is that one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRange {
    /// The range.
    pub range: Ipv4Net,
    /// Given or picked, and what was passed over.
    pub origin: RangeOrigin,
}

impl std::fmt::Display for PodRange {
    /// `10.245.0.0/16 (picked: 10.244.0.0/16 overlaps the route to
    /// 10.244.0.0/24 (dev cni0) on this machine)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.origin {
            RangeOrigin::Given => write!(f, "{} (given)", self.range),
            RangeOrigin::Picked { skipped } if skipped.is_empty() => write!(
                f,
                "{} (the default: no route of this machine overlaps it)",
                self.range
            ),
            RangeOrigin::Picked { skipped } => write!(
                f,
                "{} (picked: {} on this machine)",
                self.range,
                summary(skipped)
            ),
        }
    }
}

/// The first [`NAMED_SKIPS`] overlaps joined, then how many more there are.
fn summary(overlaps: &[RangeOverlap]) -> String {
    let mut text = overlaps
        .iter()
        .take(NAMED_SKIPS)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if overlaps.len() > NAMED_SKIPS {
        text.push_str(&format!(
            ", and {} more ranges overlap routes",
            overlaps.len() - NAMED_SKIPS
        ));
    }
    text
}

/// The widest route of `routes` that overlaps `range` (invariant 1; the
/// route of a link's subnet, say, rather than the `local` route of its
/// address).
pub(crate) fn overlap(range: Ipv4Net, routes: &[Route]) -> Option<RangeOverlap> {
    routes
        .iter()
        .filter(|r| r.dest.prefix() > 0 && r.dest.overlaps(&range))
        .filter(|r| {
            !r.dev
                .as_deref()
                .is_some_and(|d| d.starts_with(BRIDGE_PREFIX))
        })
        .min_by_key(|r| r.dest.prefix())
        .map(|r| RangeOverlap {
            range,
            route: r.dest,
            dev: r.dev.clone(),
        })
}

/// The pod range to use given the machine's `routes`: `given` when it
/// overlaps nothing (refused otherwise, invariant 2), else the first free
/// candidate (invariant 3).
pub(crate) fn choose(given: Option<Ipv4Net>, routes: &[Route]) -> Result<PodRange> {
    if let Some(range) = given {
        return match overlap(range, routes) {
            Some(o) => Err(KubeletError::Config(format!(
                "the pod range {o} already on this machine; choose another --pod-ip-range"
            ))),
            None => Ok(PodRange {
                range,
                origin: RangeOrigin::Given,
            }),
        };
    }
    let mut skipped = Vec::new();
    for range in candidates() {
        match overlap(range, routes) {
            Some(o) => skipped.push(o),
            None => {
                return Ok(PodRange {
                    range,
                    origin: RangeOrigin::Picked { skipped },
                });
            }
        }
    }
    Err(KubeletError::Config(format!(
        "no free pod range: every private /16 tried overlaps a route of this machine ({}); \
         give one with --pod-ip-range",
        summary(&skipped)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(dest: &str, dev: &str) -> Route {
        Route {
            dest: dest.parse().unwrap(),
            dev: Some(dev.into()),
        }
    }

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn candidates_start_at_the_usual_range_and_avoid_services_loopback_and_link_local() {
        let all: Vec<Ipv4Net> = candidates().collect();
        assert_eq!(all[0], net("10.244.0.0/16"));
        assert_eq!(all[1], net("10.245.0.0/16"));
        assert_eq!(all[12], net("172.16.0.0/16"));
        assert_eq!(all.last(), Some(&net("192.168.0.0/16")));
        // 12 + 16 + (244 - 16) + 1, each once.
        assert_eq!(all.len(), 257);
        let unique: std::collections::BTreeSet<_> = all.iter().collect();
        assert_eq!(unique.len(), all.len());
        for forbidden in ["10.96.0.0/12", "127.0.0.0/8", "169.254.0.0/16"] {
            assert!(
                all.iter().all(|c| !c.overlaps(&net(forbidden))),
                "{forbidden}"
            );
        }
    }

    #[test]
    fn only_foreign_overlapping_routes_conflict() {
        let routes = vec![
            route("0.0.0.0/0", "eth0"),
            route("10.244.3.0/24", "hmbr10.244.3"),
            route("192.168.0.0/24", "eth0"),
            route("10.0.0.0/8", "tun0"),
        ];
        let found = overlap(net("10.244.0.0/16"), &routes).unwrap();
        assert_eq!(found.dev.as_deref(), Some("tun0"));
        assert_eq!(overlap(net("172.16.0.0/16"), &routes), None);
    }

    #[test]
    fn the_widest_overlapping_route_is_named() {
        // As the kernel lists a link's routes: the address first (`local`
        // table), then the subnet.
        let routes = vec![
            route("10.244.0.1/32", "cni0"),
            route("10.244.0.0/24", "cni0"),
        ];
        let found = overlap(net("10.244.0.0/16"), &routes).unwrap();
        assert_eq!(found.route, net("10.244.0.0/24"));
    }

    #[test]
    fn with_nothing_in_the_way_the_default_is_the_usual_range() {
        let routes = vec![
            route("0.0.0.0/0", "eth0"),
            route("192.0.2.0/24", "eth0"),
            route("10.244.0.0/24", "hmbr10.244.0"),
        ];
        let chosen = choose(None, &routes).unwrap();
        assert_eq!(chosen.range, net("10.244.0.0/16"));
        assert_eq!(chosen.origin, RangeOrigin::Picked { skipped: vec![] });
        assert!(chosen.to_string().contains("the default"), "{chosen}");
    }

    #[test]
    fn the_default_steps_around_a_flannel_bridge_and_says_why() {
        let routes = vec![
            route("10.244.0.0/24", "cni0"),
            // An address of the machine: its `local` table route.
            route("10.245.7.9/32", "eth1"),
        ];
        let chosen = choose(None, &routes).unwrap();
        assert_eq!(chosen.range, net("10.246.0.0/16"));
        assert_eq!(
            chosen.to_string(),
            "10.246.0.0/16 (picked: 10.244.0.0/16 overlaps the route to 10.244.0.0/24 (dev cni0), \
             10.245.0.0/16 overlaps the route to 10.245.7.9/32 (dev eth1) on this machine)"
        );
    }

    #[test]
    fn a_given_range_is_kept_or_refused_never_replaced() {
        let routes = vec![route("10.244.0.0/24", "cni0")];
        let err = choose(Some(net("10.244.0.0/16")), &routes)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "invalid kubelet configuration: the pod range 10.244.0.0/16 overlaps the route to 10.244.0.0/24 (dev cni0) \
             already on this machine; choose another --pod-ip-range"
        );
        let kept = choose(Some(net("10.250.0.0/16")), &routes).unwrap();
        assert_eq!(kept.range, net("10.250.0.0/16"));
        assert_eq!(kept.origin, RangeOrigin::Given);
    }

    #[test]
    fn a_route_over_every_candidate_is_an_error_naming_the_way_out() {
        let routes = vec![
            route("10.0.0.0/8", "tun0"),
            route("172.16.0.0/12", "tun1"),
            route("192.168.0.0/16", "wlan0"),
        ];
        let err = choose(None, &routes).unwrap_err().to_string();
        assert!(err.contains("no free pod range"), "{err}");
        assert!(
            err.contains("10.244.0.0/16 overlaps the route to 10.0.0.0/8 (dev tun0)"),
            "{err}"
        );
        assert!(err.contains("and 254 more"), "{err}");
        assert!(err.contains("--pod-ip-range"), "{err}");
    }
}
