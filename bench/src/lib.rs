//! The parts of the benchmark suites that more than the `hostmesh-bench`
//! binary uses: the result format and the `chaos` suite, whose scenarios CI
//! also runs as a test (`bench/tests/chaos.rs`).

pub mod chaos;
pub mod report;
