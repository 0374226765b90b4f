//! [`Region`]: a strided view into a base extent, and slicing.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{Extent, MeshError, Point, Rank, parse_err};

/// A set of locations in a base extent, described by an offset and one
/// `(size, stride)` per dimension. Its own ranks are row-major over its sizes.
///
/// Text form: `[offset+]dim=size/stride,...`; when parsing, `dim=size` with
/// no strides anywhere means a whole (row-major, offset 0) extent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Region {
    extent: Extent,
    offset: usize,
    strides: Vec<usize>,
}

impl From<Extent> for Region {
    fn from(extent: Extent) -> Self {
        let strides = extent.strides();
        Region {
            extent,
            offset: 0,
            strides,
        }
    }
}

impl Region {
    /// The extent of this region (its labels and sizes).
    pub fn extent(&self) -> &Extent {
        &self.extent
    }

    /// Offset of rank 0 in the base extent.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Stride of each dimension in the base extent.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Number of ranks in this region.
    pub fn num_ranks(&self) -> Rank {
        self.extent.num_ranks()
    }

    /// Location in the base extent of one of this region's ranks.
    pub fn location(&self, rank: Rank) -> Result<usize, MeshError> {
        let p = self.extent.point(rank)?;
        Ok(self.offset
            + p.coords()
                .iter()
                .zip(&self.strides)
                .map(|(c, s)| c * s)
                .sum::<usize>())
    }

    /// The point of one of this region's ranks.
    pub fn point(&self, rank: Rank) -> Result<Point, MeshError> {
        self.extent.point(rank)
    }

    /// This region's rank of a base-extent location, if the region holds it.
    pub fn rank_of_location(&self, location: usize) -> Option<Rank> {
        let mut rem = location.checked_sub(self.offset)?;
        let mut coords = Vec::with_capacity(self.strides.len());
        // Strides produced by slicing decrease along the dimensions, so the
        // coordinates fall out of successive division.
        for (stride, size) in self.strides.iter().zip(self.extent.sizes()) {
            let c = rem / stride;
            if c >= *size {
                return None;
            }
            coords.push(c);
            rem %= stride;
        }
        if rem != 0 {
            return None;
        }
        self.extent.rank_of(&coords).ok()
    }

    /// The sub-region where dimension `dim` is restricted to `range`.
    pub fn range(&self, dim: &str, range: Range<usize>) -> Result<Region, MeshError> {
        let i = self
            .extent
            .position(dim)
            .ok_or_else(|| self.extent.unknown_dim(dim))?;
        let size = self.extent.sizes()[i];
        if range.start >= range.end || range.end > size {
            return Err(MeshError::BadRange {
                dim: dim.to_string(),
                start: range.start,
                end: range.end,
                size,
            });
        }
        let mut sizes = self.extent.sizes().to_vec();
        sizes[i] = range.end - range.start;
        let extent = Extent::new(self.extent.labels().iter().cloned().zip(sizes))?;
        Ok(Region {
            extent,
            offset: self.offset + range.start * self.strides[i],
            strides: self.strides.clone(),
        })
    }

    /// The sub-region at one index of dimension `dim`.
    pub fn at(&self, dim: &str, index: usize) -> Result<Region, MeshError> {
        self.range(dim, index..index + 1)
    }

    /// For each rank of `sub`, the rank of the same location in `self`;
    /// `None` when `sub` is not contained in `self`.
    pub fn remap(&self, sub: &Region) -> Option<Vec<usize>> {
        (0..sub.num_ranks())
            .map(|r| sub.location(r).ok().and_then(|l| self.rank_of_location(l)))
            .collect()
    }

    /// Whether every location of `sub` is in `self`.
    pub fn contains(&self, sub: &Region) -> bool {
        self.remap(sub).is_some()
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.offset != 0 {
            write!(f, "{}+", self.offset)?;
        }
        let e = &self.extent;
        for (i, ((l, s), st)) in e
            .labels()
            .iter()
            .zip(e.sizes())
            .zip(&self.strides)
            .enumerate()
        {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{l}={s}/{st}")?;
        }
        Ok(())
    }
}

impl FromStr for Region {
    type Err = MeshError;
    fn from_str(s: &str) -> Result<Self, MeshError> {
        let t = s.trim();
        let (offset, dims) = match t.split_once('+') {
            Some((o, rest)) => (
                o.trim()
                    .parse::<usize>()
                    .map_err(|_| parse_err(s, format!("offset {o:?} is not a whole number")))?,
                rest,
            ),
            None => (0, t),
        };
        if dims.trim().is_empty() {
            return Ok(Region {
                extent: Extent::unit(),
                offset,
                strides: Vec::new(),
            });
        }
        let mut named = Vec::new();
        let mut strides = Vec::new();
        for part in dims.split(',') {
            let (name, rest) = part.split_once('=').ok_or_else(|| {
                parse_err(s, format!("{part:?} is not of the form name=size/stride"))
            })?;
            let (size, stride) = match rest.split_once('/') {
                Some((a, b)) => (a, Some(b)),
                None => (rest, None),
            };
            let num = |v: &str, what: &str| {
                v.trim().parse::<usize>().map_err(|_| {
                    parse_err(s, format!("{what} {v:?} of {name:?} is not a whole number"))
                })
            };
            named.push((name.trim().to_string(), num(size, "size")?));
            strides.push(stride.map(|st| num(st, "stride")).transpose()?);
        }
        let extent = Extent::new(named)?;
        let strides = if strides.iter().all(Option::is_none) {
            extent.strides()
        } else if strides.iter().all(Option::is_some) {
            let strides: Vec<usize> = strides.into_iter().flatten().collect();
            if strides.contains(&0) || strides.windows(2).any(|w| w[0] < w[1]) {
                return Err(parse_err(
                    s,
                    "strides must be positive and must not increase from one dimension to the next",
                ));
            }
            strides
        } else {
            return Err(parse_err(
                s,
                "give a stride for every dimension (name=size/stride) or for none",
            ));
        };
        Ok(Region {
            extent,
            offset,
            strides,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slicing_matches_reference_text() {
        let r: Region = "replica=2/2,host=2/1".parse().unwrap();
        let s = r.at("replica", 1).unwrap();
        assert_eq!(s.to_string(), "2+replica=1/2,host=2/1");
        assert_eq!(s.to_string().parse::<Region>().unwrap(), s);
        assert_eq!(r.remap(&s).unwrap(), vec![2, 3]);
        let h = r.at("host", 1).unwrap();
        assert_eq!(h.to_string(), "1+replica=2/2,host=1/1");
        assert_eq!(r.remap(&h).unwrap(), vec![1, 3]);
        // Slicing a slice composes; the result is still inside the base.
        let hh = s.at("host", 0).unwrap();
        assert_eq!(r.remap(&hh).unwrap(), vec![2]);
        assert!(h.remap(&s).is_none());
    }

    #[test]
    fn plain_extent_form_parses() {
        let r: Region = "replica=2,host=4".parse().unwrap();
        assert_eq!(r.to_string(), "replica=2/4,host=4/1");
        assert_eq!(
            r,
            Region::from("replica=2,host=4".parse::<Extent>().unwrap())
        );
    }

    #[test]
    fn bad_ranges_and_text_are_errors() {
        let r: Region = "a=4".parse().unwrap();
        assert!(matches!(
            r.range("a", 2..5),
            Err(MeshError::BadRange { .. })
        ));
        assert!(matches!(
            r.range("a", 2..2),
            Err(MeshError::BadRange { .. })
        ));
        assert!(matches!(
            r.range("b", 0..1),
            Err(MeshError::UnknownDim { .. })
        ));
        assert!("a=2/1,b=2".parse::<Region>().is_err());
        assert!("x+a=2".parse::<Region>().is_err());
        assert!("a=2/1,b=2/2".parse::<Region>().is_err());
    }
}
