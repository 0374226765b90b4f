//! [`MeshRef`]: named items laid over a region, with the `name:a,b@region`
//! text form and slicing.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{MeshError, Rank, Region, parse_err};

/// A named mesh of items (host addresses, proc ids, ...), one per rank of a
/// region. Text form `name:item,item@region`, for example
/// `hosts:tcp:10.0.0.1:26602,tcp:10.0.0.2:26602@host=2/1`. Items must not
/// contain `,` or `@` in their text form; the name must not contain `:`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MeshRef<T> {
    name: String,
    region: Region,
    items: Vec<T>,
}

impl<T: Clone> MeshRef<T> {
    /// Builds a mesh; there must be one item per rank of the region.
    pub fn new(name: impl Into<String>, region: Region, items: Vec<T>) -> Result<Self, MeshError> {
        let name = name.into();
        if name.is_empty() || name.contains([':', ',', '@']) {
            return Err(parse_err(
                &name,
                "a mesh name must be non-empty and must not contain ':', ',' or '@'",
            ));
        }
        if items.len() != region.num_ranks() {
            return Err(MeshError::LengthMismatch {
                got: items.len(),
                want: region.num_ranks(),
            });
        }
        Ok(MeshRef {
            name,
            region,
            items,
        })
    }

    /// The mesh's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The region the items are laid over.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// The items in rank order.
    pub fn items(&self) -> &[T] {
        &self.items
    }

    /// The item of one rank.
    pub fn get(&self, rank: Rank) -> Option<&T> {
        self.items.get(rank)
    }

    /// Number of ranks.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the mesh has no items (never true for a valid region).
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The sub-mesh over `region`, which must lie inside this mesh's region.
    pub fn sliced(&self, region: Region) -> Result<Self, MeshError> {
        let ranks = self.region.remap(&region).ok_or_else(|| {
            parse_err(
                &region.to_string(),
                format!("region is not inside this mesh's region {}", self.region),
            )
        })?;
        let items = ranks.into_iter().map(|r| self.items[r].clone()).collect();
        MeshRef::new(self.name.clone(), region, items)
    }

    /// The sub-mesh where `dim` is restricted to `range`.
    pub fn range(&self, dim: &str, range: Range<usize>) -> Result<Self, MeshError> {
        self.sliced(self.region.range(dim, range)?)
    }

    /// The sub-mesh at one index of `dim`.
    pub fn at(&self, dim: &str, index: usize) -> Result<Self, MeshError> {
        self.range(dim, index..index + 1)
    }
}

impl<T: fmt::Display> fmt::Display for MeshRef<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.name)?;
        for (i, item) in self.items.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{item}")?;
        }
        write!(f, "@{}", self.region)
    }
}

impl<T> FromStr for MeshRef<T>
where
    T: FromStr + Clone,
    T::Err: fmt::Display,
{
    type Err = MeshError;
    fn from_str(s: &str) -> Result<Self, MeshError> {
        let (name, rest) = s
            .split_once(':')
            .ok_or_else(|| parse_err(s, "missing mesh name: expected name:item,item@region"))?;
        let (items, region) = rest
            .rsplit_once('@')
            .ok_or_else(|| parse_err(s, "missing region: expected name:item,item@region"))?;
        let items = items
            .split(',')
            .map(|i| {
                i.trim()
                    .parse::<T>()
                    .map_err(|e| parse_err(s, format!("item {i:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        MeshRef::new(name.trim(), region.parse()?, items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slicing_as_in_the_reference() {
        let hosts: MeshRef<String> = "test:local:1,local:2,local:3,local:4@replica=2/2,host=2/1"
            .parse()
            .unwrap();
        assert_eq!(
            hosts.at("replica", 1).unwrap().to_string(),
            "test:local:3,local:4@2+replica=1/2,host=2/1"
        );
        assert_eq!(
            hosts.at("host", 0).unwrap().to_string(),
            "test:local:1,local:3@replica=2/2,host=1/1"
        );
        let round: MeshRef<String> = hosts.to_string().parse().unwrap();
        assert_eq!(round, hosts);
        let sub = hosts.at("replica", 1).unwrap();
        let sub_round: MeshRef<String> = sub.to_string().parse().unwrap();
        assert_eq!(sub_round, sub);
    }

    #[test]
    fn bad_refs_are_errors() {
        assert!("noname".parse::<MeshRef<String>>().is_err());
        assert!("m:a,b".parse::<MeshRef<String>>().is_err());
        assert!(matches!(
            "m:a,b@x=3".parse::<MeshRef<String>>(),
            Err(MeshError::LengthMismatch { got: 2, want: 3 })
        ));
        assert!("m:a,x@n=2".parse::<MeshRef<u16>>().is_err());
    }
}
