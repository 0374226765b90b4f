//! Per-rank state stored as runs of equal values: `{start, count, ...value}`.
//! A 10,000-rank mesh with one failure is three runs.
//!
//! Invariants:
//! 1. Runs are sorted by `start`, contiguous from rank 0, never empty, and
//!    two neighbouring runs never hold equal values ([`encode`] merges them).
//! 2. The number of runs is at most the number of ranks, and at most
//!    `2 * changes + 1` for a mesh with `changes` ranks that differ from
//!    their neighbourhood.

use serde::{Deserialize, Serialize};

use crate::{MeshError, Rank, Region, Shape, Span, ValueMesh};

/// A range of consecutive ranks holding the same value.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Run<T> {
    /// First rank of the run.
    pub start: Rank,
    /// Number of ranks in the run (at least 1).
    pub count: Rank,
    /// The value every rank of the run holds.
    #[serde(flatten)]
    pub value: T,
}

impl<T> Run<T> {
    /// One past the last rank of the run.
    pub fn end(&self) -> Rank {
        self.start.saturating_add(self.count)
    }
}

/// Encodes per-rank values (rank order) as runs, merging equal neighbours.
pub fn encode<T: PartialEq>(values: impl IntoIterator<Item = T>) -> Vec<Run<T>> {
    let mut out: Vec<Run<T>> = Vec::new();
    for (rank, v) in values.into_iter().enumerate() {
        match out.last_mut() {
            Some(last) if last.value == v => last.count += 1,
            _ => out.push(Run {
                start: rank,
                count: 1,
                value: v,
            }),
        }
    }
    out
}

/// Most runs kept in a status field; beyond it the runs cover a prefix of
/// the ranks and the status says it is truncated (counts stay exact).
pub const MAX_RUNS: usize = 1000;

/// Like [`encode`], but keeps at most `max_runs` runs; the flag is true when
/// runs were dropped (they then cover ranks `0..last.end()` only).
pub fn encode_bounded<T: PartialEq>(
    values: impl IntoIterator<Item = T>,
    max_runs: usize,
) -> (Vec<Run<T>>, bool) {
    let mut out: Vec<Run<T>> = Vec::new();
    for (rank, v) in values.into_iter().enumerate() {
        let full = out.len() >= max_runs;
        match out.last_mut() {
            Some(last) if last.value == v => last.count += 1,
            _ if full => return (out, true),
            _ => out.push(Run {
                start: rank,
                count: 1,
                value: v,
            }),
        }
    }
    (out, false)
}

/// Status runs from a [`ValueMesh`] (the one conversion point between the
/// in-memory spans and the API's runs).
pub fn from_value_mesh<T: Clone>(mesh: &ValueMesh<T>) -> Vec<Run<T>> {
    mesh.runs()
        .iter()
        .map(|r| Run {
            start: r.start,
            count: r.end - r.start,
            value: r.value.clone(),
        })
        .collect()
}

/// A [`ValueMesh`] over `shape` from status runs; fails when the
/// runs do not tile the extent exactly (a truncated or hand-edited status).
pub fn to_value_mesh<T: PartialEq>(
    shape: &Shape,
    runs: Vec<Run<T>>,
) -> Result<ValueMesh<T>, MeshError> {
    let region: Region = shape.extent()?.into();
    let runs = runs
        .into_iter()
        .map(|r| Span {
            start: r.start,
            end: r.end(),
            value: r.value,
        })
        .collect();
    ValueMesh::from_runs(region, runs)
}

/// Expands runs back to one value per rank. Gaps or overlaps (from a
/// hand-edited status) are tolerated: later runs win, gaps are skipped.
pub fn decode<T: Clone>(runs: &[Run<T>]) -> Vec<T> {
    let mut out = Vec::new();
    for r in runs {
        for _ in 0..r.count.min(1 << 24) {
            out.push(r.value.clone());
        }
    }
    out
}

/// The value at `rank`, by binary search over the runs.
pub fn get<T>(runs: &[Run<T>], rank: Rank) -> Option<&T> {
    let idx = runs.partition_point(|r| r.end() <= rank);
    runs.get(idx).filter(|r| r.start <= rank).map(|r| &r.value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_merges_and_decodes_back() {
        let v = vec![1, 1, 2, 2, 2, 1, 3];
        let runs = encode(v.clone());
        assert_eq!(runs.len(), 4);
        assert_eq!((runs[1].start, runs[1].count, runs[1].value), (2, 3, 2));
        assert_eq!(decode(&runs), v);
        for (rank, want) in v.iter().enumerate() {
            assert_eq!(get(&runs, rank), Some(want));
        }
        assert_eq!(get(&runs, 7), None);
        assert!(encode(Vec::<u8>::new()).is_empty());
    }

    #[test]
    fn bounded_encoding_stops_at_the_limit() {
        let alternating: Vec<u64> = (0..10_000).map(|i| i % 2).collect();
        let (runs, truncated) = encode_bounded(alternating.clone(), MAX_RUNS);
        assert!(truncated);
        assert_eq!(runs.len(), MAX_RUNS);
        assert_eq!(runs.last().unwrap().end(), MAX_RUNS);
        let (runs, truncated) = encode_bounded(alternating[..10].to_vec(), MAX_RUNS);
        assert!(!truncated);
        assert_eq!(runs.len(), 10);
    }

    #[test]
    fn value_mesh_round_trip() {
        let extent = Shape::new(vec![crate::Dim::new("host", 4), crate::Dim::new("gpu", 8)]);
        let mut values = vec!["ok"; 32];
        values[9] = "bad";
        let runs = encode(values.clone());
        let mesh = to_value_mesh(&extent, runs.clone()).unwrap();
        assert_eq!(mesh.to_vec(), values);
        assert_eq!(from_value_mesh(&mesh), runs);
        let short = vec![Run {
            start: 0,
            count: 3,
            value: "ok",
        }];
        assert!(to_value_mesh(&extent, short).is_err());
    }

    #[test]
    fn one_failure_in_ten_thousand_is_three_runs() {
        let mut v = vec!["ok"; 10_000];
        v[4321] = "bad";
        let runs = encode(v);
        assert_eq!(runs.len(), 3);
        assert_eq!(runs[1].start, 4321);
    }
}
