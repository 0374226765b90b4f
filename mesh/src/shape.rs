//! API shapes: [`Dim`] and [`Shape`], the ordered named dimensions of a
//! World or a ProcMesh spec (`replica=2,host=4`) as a user wrote them. A
//! [`Shape`] is not validated (validation reports its problems by field);
//! [`Shape::extent`] turns a valid one into the [`Extent`] that maps ranks to
//! coordinates.
//!
//! Invariants:
//! 1. A shape is an ordered list (the API server does not keep map order);
//!    the last dimension varies fastest.
//! 2. `rank = sum(coord[i] * stride[i])` with `stride[last] = 1`.

use serde::{Deserialize, Serialize};

use crate::{Extent, MeshError, Rank};

/// Largest size of one dimension.
pub const MAX_DIM_SIZE: u32 = 16_384;
/// Largest number of dimensions in a shape.
pub const MAX_DIMS: usize = 8;
/// The DNS-label pattern dimension names must match.
pub const DNS_LABEL_PATTERN: &str = "^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$";

/// One named dimension of a mesh.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Dim {
    /// Dimension name: a DNS label (lower-case letters, digits and `-`,
    /// starting with a letter), e.g. `host` or `gpu`.
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = DNS_LABEL_PATTERN), length(min = 1, max = 63))
    )]
    pub name: String,
    /// Number of positions along this dimension (at least 1).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = MAX_DIM_SIZE)))]
    pub size: u32,
}

impl Dim {
    /// A dimension named `name` of size `size`.
    pub fn new(name: impl Into<String>, size: u32) -> Self {
        Dim {
            name: name.into(),
            size,
        }
    }
}

/// An ordered shape: a list of dimensions.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Shape {
    dims: Vec<Dim>,
}

impl Shape {
    /// A shape from its dimensions, in order.
    pub fn new(dims: Vec<Dim>) -> Self {
        Shape { dims }
    }

    /// The runtime's [`Extent`] of a valid shape; fails on an invalid one
    /// (a bad name, a duplicate, a size of 0, more ranks than `usize`).
    pub fn extent(&self) -> Result<Extent, MeshError> {
        Extent::new(self.dims.iter().map(|d| (d.name.clone(), d.size as usize)))
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[Dim] {
        &self.dims
    }

    /// Number of ranks (product of sizes; 1 for an empty shape). Saturates
    /// instead of overflowing, so hostile sizes cannot panic.
    pub fn num_ranks(&self) -> Rank {
        self.dims
            .iter()
            .fold(1, |acc: Rank, d| acc.saturating_mul(d.size as Rank))
    }

    /// This shape followed by `inner`'s dimensions.
    pub fn concat(&self, inner: &Shape) -> Shape {
        let mut dims = self.dims.clone();
        dims.extend(inner.dims.iter().cloned());
        Shape { dims }
    }
}

impl std::fmt::Display for Shape {
    /// `replica=2,host=4,gpu=8`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}={}", d.name, d.size)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk(dims: &[(&str, u32)]) -> Shape {
        Shape::new(dims.iter().map(|(n, s)| Dim::new(*n, *s)).collect())
    }

    #[test]
    fn extent_keeps_order_and_rank_count() {
        let s = mk(&[("replica", 2), ("host", 4), ("gpu", 8)]);
        let e = s.extent().unwrap();
        assert_eq!(s.num_ranks(), 64);
        assert_eq!(e.num_ranks(), s.num_ranks());
        assert_eq!(e.labels(), ["replica", "host", "gpu"]);
        assert_eq!(e.point(9).unwrap().coords(), [0, 1, 1]);
        assert!(mk(&[("host", 0)]).extent().is_err());
    }

    #[test]
    fn display_and_concat() {
        let w = mk(&[("replica", 2), ("host", 4)]);
        let p = mk(&[("gpu", 8)]);
        assert_eq!(w.concat(&p).to_string(), "replica=2,host=4,gpu=8");
        assert_eq!(Shape::default().num_ranks(), 1);
    }

    #[test]
    fn huge_sizes_saturate() {
        let e = mk(&[("a", u32::MAX), ("b", u32::MAX), ("c", u32::MAX)]);
        assert_eq!(e.num_ranks(), Rank::MAX);
    }
}
