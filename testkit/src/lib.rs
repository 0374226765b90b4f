//! Test helpers shared by every suite, so each is written once: an
//! embedded API server with or without the hostmesh CRDs ([`cluster`]),
//! polling with a generous bound instead of sleeping ([`wait`]), a raw
//! HTTP GET ([`http`]), process checks ([`process`]), a real `hostmesh
//! agent` child process at a loopback address of this process's own
//! ([`agent`]), Python virtualenvs with PyPI packages ([`pyvenv`]), a
//! Python with real Helm for the chart tests ([`helm`]), py-spy for the
//! stack-capture tests ([`pyspy`]) and one with Monarch ([`monarch`]).
//!
//! Every helper panics with what it waited for when its bound runs out:
//! they are for tests, where a panic is the failure report. The
//! exceptions, [`poll`] and [`agent`]'s spawn, return the error instead,
//! for harnesses that report failures as errors.

pub mod agent;
pub mod cluster;
pub mod helm;
pub mod http;
pub mod monarch;
pub mod process;
pub mod pyspy;
pub mod pyvenv;
pub mod wait;

pub use wait::{PATIENCE, eventually, eventually_async, eventually_ok, poll};
