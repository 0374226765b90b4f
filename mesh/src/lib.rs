//! hostmesh meshes: the shapes the runtime addresses things by and the API
//! types describe, in one type family.
//!
//! This crate owns:
//! - [`Dim`] and [`Shape`]: the API's named dimensions as a user wrote them
//!   (unvalidated; [`Shape::extent`] turns a valid one into an [`Extent`]);
//! - [`runs`]: per-rank state in status as runs of equal values (`Run`);
//! - [`Extent`]: ordered, named dimensions (`replica=2,host=4`), row-major;
//! - [`Point`]: a rank together with its coordinates in an extent;
//! - [`Region`]: a strided view into a base extent, produced by slicing one
//!   dimension at a time (text form `[offset+]dim=size/stride,...`);
//! - [`ValueMesh`]: one value per rank of a region, stored as runs of equal
//!   values over rank ranges (the CRD status encoding);
//! - [`MeshRef`]: a named list of items laid out over a region, with the text
//!   form `name:item,item@region` and slicing.
//!
//! Invariants:
//! 1. Dimension names are unique within an extent and are non-empty
//!    identifiers (`[A-Za-z0-9_-]`); every size is at least 1.
//! 2. Ranks are row-major: the last dimension varies fastest.
//! 3. A region always names a subset of its base extent's locations; slicing
//!    never grows a region.
//! 4. The runs of a `ValueMesh` are sorted, non-empty, adjacent (no gaps),
//!    cover exactly `0..len`, and no two neighbouring runs hold equal values.

mod extent;
mod mesh_ref;
mod region;
pub mod runs;
pub mod shape;
mod value_mesh;

pub use extent::{Extent, Point};
pub use mesh_ref::MeshRef;
pub use region::Region;
pub use runs::Run;
pub use shape::{Dim, Shape};
pub use value_mesh::{Span, ValueMesh};

/// A rank: a position in a mesh, counted row-major from 0 (the last
/// dimension varies fastest). The one rank type of hostmesh: the API's status
/// runs and incidents, the agent protocol, the hub and the runtime all use it,
/// so no boundary casts between rank widths.
pub type Rank = usize;

/// Errors from building, parsing or slicing meshes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeshError {
    /// A dimension name is empty or has characters outside `[A-Za-z0-9_-]`.
    #[error("invalid dimension name {0:?}: use letters, digits, '_' or '-'")]
    InvalidDimName(String),
    /// The same dimension name appears twice.
    #[error("dimension {0:?} appears more than once: dimension names must be unique")]
    DuplicateDim(String),
    /// A dimension has size 0.
    #[error("dimension {0:?} has size 0: every dimension needs at least one member")]
    ZeroSize(String),
    /// The dimension is not part of the extent or region.
    #[error("no dimension named {dim:?} (dimensions: {known})")]
    UnknownDim {
        /// The name asked for.
        dim: String,
        /// The dimensions that exist, comma separated.
        known: String,
    },
    /// Coordinates do not fit the extent.
    #[error("coordinates {coords:?} do not fit extent {extent}")]
    BadCoords {
        /// The coordinates given.
        coords: Vec<usize>,
        /// The extent, in text form.
        extent: String,
    },
    /// A rank is not below the number of ranks.
    #[error("rank {rank} is out of range: there are {len} ranks")]
    RankOutOfRange {
        /// The rank asked for.
        rank: Rank,
        /// Number of ranks.
        len: Rank,
    },
    /// A slice range is empty or runs past the dimension's size.
    #[error(
        "range {start}..{end} is invalid for dimension {dim:?} of size {size}: it must be non-empty and at most the size"
    )]
    BadRange {
        /// Dimension sliced.
        dim: String,
        /// Range start.
        start: usize,
        /// Range end (exclusive).
        end: usize,
        /// Dimension size.
        size: usize,
    },
    /// Text could not be parsed; the message says what was expected.
    #[error("cannot parse {input:?}: {reason}")]
    Parse {
        /// The text that failed.
        input: String,
        /// What was wrong and what the form should be.
        reason: String,
    },
    /// The number of values or items does not match the number of ranks.
    #[error("got {got} values for {want} ranks: give exactly one per rank")]
    LengthMismatch {
        /// Values given.
        got: usize,
        /// Ranks in the region.
        want: usize,
    },
    /// Runs are unsorted, overlapping, empty, or do not cover all ranks.
    #[error("invalid runs: {0}")]
    BadRuns(String),
    /// The product of the sizes overflows `usize`.
    #[error("the extent is too large: the number of ranks overflows")]
    TooLarge,
}

pub(crate) fn parse_err(input: &str, reason: impl Into<String>) -> MeshError {
    MeshError::Parse {
        input: input.to_string(),
        reason: reason.into(),
    }
}

pub(crate) fn check_dim_name(name: &str) -> Result<(), MeshError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(MeshError::InvalidDimName(name.to_string()));
    }
    Ok(())
}
