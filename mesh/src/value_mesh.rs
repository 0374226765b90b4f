//! [`ValueMesh`]: one value per rank, stored as runs of equal values.

use serde::{Deserialize, Serialize};

use super::{MeshError, Rank, Region};

/// Ranks `start..end` (end exclusive) all holding `value`: the in-memory
/// form of a [`Run`](crate::runs::Run) (which counts instead).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Span<T> {
    /// First rank of the run.
    pub start: Rank,
    /// One past the last rank of the run.
    pub end: Rank,
    /// The value every rank of the run holds.
    pub value: T,
}

/// One value per rank of a region, stored compactly as runs of equal values
/// (invariant 4 of the module): 10,000 ranks that agree but for one take
/// three runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    try_from = "ValueMeshRepr<T>",
    into = "ValueMeshRepr<T>",
    bound(
        serialize = "T: Serialize + Clone + PartialEq",
        deserialize = "T: Deserialize<'de> + PartialEq"
    )
)]
pub struct ValueMesh<T> {
    region: Region,
    runs: Vec<Span<T>>,
}

#[derive(Serialize, Deserialize)]
struct ValueMeshRepr<T> {
    region: Region,
    runs: Vec<Span<T>>,
}

impl<T: PartialEq> TryFrom<ValueMeshRepr<T>> for ValueMesh<T> {
    type Error = MeshError;
    fn try_from(r: ValueMeshRepr<T>) -> Result<Self, MeshError> {
        ValueMesh::from_runs(r.region, r.runs)
    }
}

impl<T> From<ValueMesh<T>> for ValueMeshRepr<T> {
    fn from(m: ValueMesh<T>) -> Self {
        ValueMeshRepr {
            region: m.region,
            runs: m.runs,
        }
    }
}

impl<T: PartialEq> ValueMesh<T> {
    /// Every rank of `region` holds `value`.
    pub fn filled(region: Region, value: T) -> Self {
        let n = region.num_ranks();
        ValueMesh {
            region,
            runs: vec![Span {
                start: 0,
                end: n,
                value,
            }],
        }
    }

    /// One value per rank, in rank order.
    pub fn from_values(region: Region, values: Vec<T>) -> Result<Self, MeshError> {
        if values.len() != region.num_ranks() {
            return Err(MeshError::LengthMismatch {
                got: values.len(),
                want: region.num_ranks(),
            });
        }
        let mut runs: Vec<Span<T>> = Vec::new();
        for (rank, value) in values.into_iter().enumerate() {
            match runs.last_mut() {
                Some(last) if last.value == value => last.end = rank + 1,
                _ => runs.push(Span {
                    start: rank,
                    end: rank + 1,
                    value,
                }),
            }
        }
        Ok(ValueMesh { region, runs })
    }

    /// From runs; they must be sorted, non-empty and cover every rank with
    /// no gap or overlap. Neighbouring equal runs are merged.
    pub fn from_runs(region: Region, runs: Vec<Span<T>>) -> Result<Self, MeshError> {
        let n = region.num_ranks();
        let mut next = 0;
        let mut merged: Vec<Span<T>> = Vec::with_capacity(runs.len());
        for run in runs {
            if run.start != next {
                return Err(MeshError::BadRuns(format!(
                    "a run starts at rank {} but the next uncovered rank is {next}",
                    run.start
                )));
            }
            if run.end <= run.start {
                return Err(MeshError::BadRuns(format!(
                    "run {}..{} is empty",
                    run.start, run.end
                )));
            }
            next = run.end;
            match merged.last_mut() {
                Some(last) if last.value == run.value => last.end = run.end,
                _ => merged.push(run),
            }
        }
        if next != n {
            return Err(MeshError::BadRuns(format!(
                "runs cover ranks 0..{next} but the region has {n} ranks"
            )));
        }
        Ok(ValueMesh {
            region,
            runs: merged,
        })
    }

    /// Sets one rank's value, splitting and merging runs as needed
    /// (a binary search plus at most two insertions).
    pub fn set(&mut self, rank: Rank, value: T) -> Result<(), MeshError>
    where
        T: Clone,
    {
        let i = self.run_index(rank)?;
        if self.runs[i].value == value {
            return Ok(());
        }
        let Span { start, end, .. } = self.runs[i];
        // Split the run into [start, rank), [rank, rank+1), [rank+1, end).
        let mut replacement = Vec::with_capacity(3);
        if start < rank {
            replacement.push(Span {
                start,
                end: rank,
                value: self.runs[i].value.clone(),
            });
        }
        replacement.push(Span {
            start: rank,
            end: rank + 1,
            value,
        });
        if rank + 1 < end {
            replacement.push(Span {
                start: rank + 1,
                end,
                value: self.runs[i].value.clone(),
            });
        }
        self.runs.splice(i..=i, replacement);
        // Merge the new single-rank run with equal neighbours.
        let mid = if start < rank { i + 1 } else { i };
        if mid + 1 < self.runs.len() && self.runs[mid + 1].value == self.runs[mid].value {
            let end = self.runs[mid + 1].end;
            self.runs[mid].end = end;
            self.runs.remove(mid + 1);
        }
        if mid > 0 && self.runs[mid - 1].value == self.runs[mid].value {
            let end = self.runs[mid].end;
            self.runs[mid - 1].end = end;
            self.runs.remove(mid);
        }
        Ok(())
    }
}

impl<T> ValueMesh<T> {
    fn run_index(&self, rank: Rank) -> Result<usize, MeshError> {
        let len = self.len();
        if rank >= len {
            return Err(MeshError::RankOutOfRange { rank, len });
        }
        Ok(self.runs.partition_point(|r| r.end <= rank))
    }

    /// The region the values are laid over.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Number of ranks.
    pub fn len(&self) -> Rank {
        self.region.num_ranks()
    }

    /// Whether there are no ranks (never true: every region has a rank).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value of one rank.
    pub fn get(&self, rank: Rank) -> Option<&T> {
        self.run_index(rank).ok().map(|i| &self.runs[i].value)
    }

    /// The runs, in rank order.
    pub fn runs(&self) -> &[Span<T>] {
        &self.runs
    }

    /// Every rank with its value, in rank order.
    pub fn iter(&self) -> impl Iterator<Item = (Rank, &T)> + '_ {
        self.runs
            .iter()
            .flat_map(|r| (r.start..r.end).map(move |rank| (rank, &r.value)))
    }

    /// Every value in rank order.
    pub fn to_vec(&self) -> Vec<T>
    where
        T: Clone,
    {
        self.iter().map(|(_, v)| v.clone()).collect()
    }

    /// Applies `f` to every value (runs are re-merged where values now agree).
    pub fn map<U: PartialEq>(&self, mut f: impl FnMut(&T) -> U) -> ValueMesh<U> {
        let runs = self
            .runs
            .iter()
            .map(|r| Span {
                start: r.start,
                end: r.end,
                value: f(&r.value),
            })
            .collect();
        ValueMesh::from_runs(self.region.clone(), runs)
            .unwrap_or_else(|_| unreachable!("runs of a valid mesh stay valid under map"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(n: usize) -> Region {
        Region::from(super::super::Extent::new([("rank", n)]).unwrap())
    }

    #[test]
    fn ten_thousand_ranks_with_one_failure_is_three_runs() {
        let mut m = ValueMesh::filled(region(10_000), "Running");
        m.set(4321, "Failed").unwrap();
        assert_eq!(m.runs().len(), 3);
        assert_eq!(m.get(4320), Some(&"Running"));
        assert_eq!(m.get(4321), Some(&"Failed"));
        assert_eq!(m.get(4322), Some(&"Running"));
        m.set(4321, "Running").unwrap();
        assert_eq!(m.runs().len(), 1, "setting back re-merges");
        m.set(0, "A").unwrap();
        m.set(9_999, "B").unwrap();
        assert_eq!(m.runs().len(), 3);
        assert!(m.set(10_000, "C").is_err());
    }

    #[test]
    fn set_matches_a_plain_vector() {
        let mut values = vec![0u8; 64];
        let mut m = ValueMesh::from_values(region(64), values.clone()).unwrap();
        // A deterministic pseudo-random walk of updates.
        let mut x: u32 = 7;
        for _ in 0..2_000 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let rank = (x >> 8) as usize % 64;
            let v = (x >> 20) as u8 % 3;
            values[rank] = v;
            m.set(rank, v).unwrap();
            assert_eq!(m.to_vec(), values);
            assert_eq!(
                m,
                ValueMesh::from_values(region(64), values.clone()).unwrap(),
                "runs stay maximal"
            );
        }
    }

    #[test]
    fn runs_are_validated_and_serde_round_trips() {
        let r = region(5);
        let run = |start, end, value| Span { start, end, value };
        let m = ValueMesh::from_runs(
            r.clone(),
            vec![run(0, 2, 'a'), run(2, 3, 'a'), run(3, 5, 'b')],
        )
        .unwrap();
        assert_eq!(m.runs().len(), 2);
        assert_eq!(m.to_vec(), vec!['a', 'a', 'a', 'b', 'b']);
        assert!(ValueMesh::from_runs(r.clone(), vec![run(0, 2, 'a')]).is_err());
        assert!(ValueMesh::from_runs(r.clone(), vec![run(1, 5, 'a')]).is_err());
        assert!(ValueMesh::from_runs(r.clone(), vec![run(0, 0, 'a'), run(0, 5, 'b')]).is_err());
        assert!(ValueMesh::from_values(r, vec!['a']).is_err());
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<ValueMesh<char>>(&json).unwrap(), m);
        let bytes = postcard::to_allocvec(&m).unwrap();
        assert_eq!(postcard::from_bytes::<ValueMesh<char>>(&bytes).unwrap(), m);
        let bad = json.replace("\"end\":5", "\"end\":4");
        assert!(serde_json::from_str::<ValueMesh<char>>(&bad).is_err());
    }
}
