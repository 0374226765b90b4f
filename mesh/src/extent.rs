//! [`Extent`] (ordered named dimensions) and [`Point`] (rank and coordinates).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{MeshError, Rank, check_dim_name, parse_err};

/// Ordered named dimensions, row-major (the last dimension varies fastest).
///
/// Text form: `replica=2,host=4`. An extent with no dimensions has one rank.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "ExtentRepr", into = "ExtentRepr")]
pub struct Extent {
    labels: Vec<String>,
    sizes: Vec<usize>,
}

#[derive(Serialize, Deserialize)]
struct ExtentRepr {
    labels: Vec<String>,
    sizes: Vec<usize>,
}

impl TryFrom<ExtentRepr> for Extent {
    type Error = MeshError;
    fn try_from(r: ExtentRepr) -> Result<Self, MeshError> {
        if r.labels.len() != r.sizes.len() {
            return Err(MeshError::LengthMismatch {
                got: r.sizes.len(),
                want: r.labels.len(),
            });
        }
        Extent::new(r.labels.into_iter().zip(r.sizes))
    }
}

impl From<Extent> for ExtentRepr {
    fn from(e: Extent) -> Self {
        ExtentRepr {
            labels: e.labels,
            sizes: e.sizes,
        }
    }
}

impl Extent {
    /// Builds an extent from `(name, size)` pairs in order.
    pub fn new<S: Into<String>>(
        dims: impl IntoIterator<Item = (S, usize)>,
    ) -> Result<Self, MeshError> {
        let mut labels = Vec::new();
        let mut sizes = Vec::new();
        for (name, size) in dims {
            let name = name.into();
            check_dim_name(&name)?;
            if labels.contains(&name) {
                return Err(MeshError::DuplicateDim(name));
            }
            if size == 0 {
                return Err(MeshError::ZeroSize(name));
            }
            labels.push(name);
            sizes.push(size);
        }
        let e = Extent { labels, sizes };
        e.checked_len().ok_or(MeshError::TooLarge)?;
        Ok(e)
    }

    /// The extent with no dimensions (one rank).
    pub fn unit() -> Self {
        Extent {
            labels: Vec::new(),
            sizes: Vec::new(),
        }
    }

    fn checked_len(&self) -> Option<usize> {
        self.sizes.iter().try_fold(1usize, |a, s| a.checked_mul(*s))
    }

    /// Dimension names in order.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// Dimension sizes in order.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// Number of dimensions.
    pub fn num_dims(&self) -> usize {
        self.labels.len()
    }

    /// Number of ranks (product of the sizes).
    pub fn num_ranks(&self) -> Rank {
        self.sizes.iter().product()
    }

    /// Size of the named dimension.
    pub fn size(&self, dim: &str) -> Option<usize> {
        self.position(dim).map(|i| self.sizes[i])
    }

    /// Index of the named dimension.
    pub fn position(&self, dim: &str) -> Option<usize> {
        self.labels.iter().position(|l| l == dim)
    }

    pub(crate) fn unknown_dim(&self, dim: &str) -> MeshError {
        MeshError::UnknownDim {
            dim: dim.to_string(),
            known: self.labels.join(","),
        }
    }

    /// Row-major strides of this extent.
    pub fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1; self.sizes.len()];
        for i in (0..self.sizes.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.sizes[i + 1];
        }
        strides
    }

    /// The rank of the given coordinates.
    pub fn rank_of(&self, coords: &[usize]) -> Result<Rank, MeshError> {
        if coords.len() != self.sizes.len() || coords.iter().zip(&self.sizes).any(|(c, s)| c >= s) {
            return Err(MeshError::BadCoords {
                coords: coords.to_vec(),
                extent: self.to_string(),
            });
        }
        Ok(coords.iter().zip(self.strides()).map(|(c, s)| c * s).sum())
    }

    /// The point (coordinates) of a rank.
    pub fn point(&self, rank: Rank) -> Result<Point, MeshError> {
        let len = self.num_ranks();
        if rank >= len {
            return Err(MeshError::RankOutOfRange { rank, len });
        }
        let mut coords = vec![0; self.sizes.len()];
        let mut rem = rank;
        for (i, stride) in self.strides().into_iter().enumerate() {
            coords[i] = rem / stride;
            rem %= stride;
        }
        Ok(Point {
            rank,
            coords,
            extent: self.clone(),
        })
    }

    /// All points in rank order.
    pub fn points(&self) -> impl Iterator<Item = Point> + '_ {
        (0..self.num_ranks()).filter_map(|r| self.point(r).ok())
    }

    /// This extent followed by `other`'s dimensions (a per-host extent after
    /// a host extent). Overlapping names are an error.
    pub fn concat(&self, other: &Extent) -> Result<Extent, MeshError> {
        Extent::new(
            self.labels
                .iter()
                .cloned()
                .zip(self.sizes.iter().copied())
                .chain(
                    other
                        .labels
                        .iter()
                        .cloned()
                        .zip(other.sizes.iter().copied()),
                ),
        )
    }
}

impl fmt::Display for Extent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (l, s)) in self.labels.iter().zip(&self.sizes).enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{l}={s}")?;
        }
        Ok(())
    }
}

impl FromStr for Extent {
    type Err = MeshError;
    fn from_str(s: &str) -> Result<Self, MeshError> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(Extent::unit());
        }
        let mut dims = Vec::new();
        for part in s.split(',') {
            let (name, size) = part
                .split_once('=')
                .ok_or_else(|| parse_err(s, format!("{part:?} is not of the form name=size")))?;
            let size = size.trim().parse::<usize>().map_err(|_| {
                parse_err(
                    s,
                    format!("size {size:?} of {name:?} is not a whole number"),
                )
            })?;
            dims.push((name.trim().to_string(), size));
        }
        Extent::new(dims)
    }
}

/// A rank of an extent together with its coordinates.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Point {
    rank: Rank,
    coords: Vec<usize>,
    extent: Extent,
}

impl Point {
    /// The rank (row-major index).
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Coordinates, one per dimension of the extent.
    pub fn coords(&self) -> &[usize] {
        &self.coords
    }

    /// The extent this point belongs to.
    pub fn extent(&self) -> &Extent {
        &self.extent
    }

    /// The coordinate along a named dimension.
    pub fn coord(&self, dim: &str) -> Option<usize> {
        self.extent.position(dim).map(|i| self.coords[i])
    }

    /// Builds a point from coordinates.
    pub fn from_coords(extent: &Extent, coords: Vec<usize>) -> Result<Point, MeshError> {
        let rank = extent.rank_of(&coords)?;
        Ok(Point {
            rank,
            coords,
            extent: extent.clone(),
        })
    }
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (l, c)) in self.extent.labels.iter().zip(&self.coords).enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{l}={c}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_coords_round_trip() {
        let e: Extent = "replica=2,host=3,gpu=4".parse().unwrap();
        assert_eq!(e.num_ranks(), 24);
        assert_eq!(e.strides(), vec![12, 4, 1]);
        for r in 0..24 {
            let p = e.point(r).unwrap();
            assert_eq!(e.rank_of(p.coords()).unwrap(), r);
        }
        let p = e.point(17).unwrap();
        assert_eq!(p.coords(), &[1, 1, 1]);
        assert_eq!(p.coord("gpu"), Some(1));
        assert_eq!(p.to_string(), "replica=1,host=1,gpu=1");
        assert!(e.point(24).is_err());
        assert!(e.rank_of(&[2, 0, 0]).is_err());
    }

    #[test]
    fn text_and_serde_round_trip() {
        let e: Extent = "replica=2,host=4".parse().unwrap();
        assert_eq!(e.to_string(), "replica=2,host=4");
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(serde_json::from_str::<Extent>(&json).unwrap(), e);
        let bad = r#"{"labels":["a","a"],"sizes":[1,2]}"#;
        assert!(serde_json::from_str::<Extent>(bad).is_err());
    }

    #[test]
    fn bad_extents_are_named() {
        assert!(matches!(
            "a=1,a=2".parse::<Extent>(),
            Err(MeshError::DuplicateDim(d)) if d == "a"
        ));
        assert!(matches!(
            "a=0".parse::<Extent>(),
            Err(MeshError::ZeroSize(_))
        ));
        assert!(matches!(
            "a=x".parse::<Extent>(),
            Err(MeshError::Parse { .. })
        ));
        assert!(matches!(
            "a b=1".parse::<Extent>(),
            Err(MeshError::InvalidDimName(_))
        ));
        let host: Extent = "host=2".parse().unwrap();
        assert!(host.concat(&"host=3".parse().unwrap()).is_err());
        assert_eq!(
            host.concat(&"gpu=8".parse().unwrap()).unwrap().to_string(),
            "host=2,gpu=8"
        );
    }
}
