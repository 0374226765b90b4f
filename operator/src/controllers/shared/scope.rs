//! Failure scope by a named dimension (`failurePolicy.scope`,
//! `restartPolicy.scope`): the slice of a shape a rank belongs to.
//!
//! The slice of rank `r` along dimension `d` is every rank that shares
//! `r`'s coordinates in `d` and in every dimension before it: with
//! row-major ranks, the contiguous range of `stride(d)` ranks holding `r`,
//! where `stride(d)` is the product of the sizes after `d`. The last
//! dimension's slice is the rank alone; the first's is its first-level
//! group.

use std::collections::BTreeSet;
use std::ops::Range;

use hostmesh_crds::{Rank, Shape};

/// The ranks of `shape` in the slice of `rank` along `dim`; `None` when
/// `dim` is not a dimension of `shape`.
pub fn slice(shape: &Shape, rank: Rank, dim: &str) -> Option<Range<Rank>> {
    let dims = shape.dims();
    let i = dims.iter().position(|d| d.name == dim)?;
    let stride: Rank = dims[i + 1..]
        .iter()
        .map(|d| d.size as Rank)
        .fold(1, Rank::saturating_mul)
        .max(1);
    let start = rank / stride * stride;
    Some(start..start.saturating_add(stride).min(shape.num_ranks()))
}

/// Every rank of the slices along `dim` that hold one of `ranks` (the
/// ranks themselves when `dim` is `None` or not a dimension).
pub fn widen(shape: &Shape, ranks: &[Rank], dim: Option<&str>) -> Vec<Rank> {
    let mut out = BTreeSet::new();
    for &r in ranks {
        match dim.and_then(|d| slice(shape, r, d)) {
            Some(s) => out.extend(s),
            None => {
                out.insert(r);
            }
        }
    }
    out.into_iter().collect()
}

/// `replica=1` for the slice of `rank` along `dim`: the coordinates that
/// name it, for messages.
pub fn describe(shape: &Shape, rank: Rank, dim: &str) -> String {
    let Ok(extent) = shape.extent() else {
        return format!("rank {rank}");
    };
    let Ok(point) = extent.point(rank) else {
        return format!("rank {rank}");
    };
    let mut parts = Vec::new();
    for d in shape.dims() {
        parts.push(format!("{}={}", d.name, point.coord(&d.name).unwrap_or(0)));
        if d.name == dim {
            break;
        }
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostmesh_crds::Dim;

    fn shape() -> Shape {
        Shape::new(vec![
            Dim::new("replica", 4),
            Dim::new("host", 8),
            Dim::new("gpu", 2),
        ])
    }

    #[test]
    fn a_slice_is_the_ranks_sharing_the_leading_coordinates() {
        let s = shape();
        // replica: the 8 hosts x 2 gpus of the replica.
        assert_eq!(slice(&s, 37, "replica"), Some(32..48));
        assert_eq!(slice(&s, 37, "host"), Some(36..38));
        assert_eq!(slice(&s, 37, "gpu"), Some(37..38), "the rank alone");
        assert_eq!(slice(&s, 37, "node"), None);
        assert_eq!(describe(&s, 37, "host"), "replica=2,host=2");
        let hosts = Shape::new(vec![Dim::new("replica", 2), Dim::new("host", 2)]);
        assert_eq!(widen(&hosts, &[2], Some("replica")), [2, 3]);
        assert_eq!(widen(&hosts, &[0, 3], Some("replica")), [0, 1, 2, 3]);
        assert_eq!(widen(&hosts, &[3], None), [3]);
    }
}
