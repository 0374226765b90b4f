//! The JSON-lines result format shared by every suite (DESIGN.md, Benchmarks).

use std::io::Write as _;

/// Prints one result line: `{"bench", "value", "unit", "baseline", "ratio"}`.
/// `ratio` is `value / baseline` when there is a baseline.
pub fn emit(bench: &str, value: f64, unit: &str, baseline: Option<f64>) {
    let ratio = baseline.filter(|b| *b != 0.0).map(|b| value / b);
    let line = serde_json::json!({
        "bench": bench,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "ratio": ratio,
    });
    let mut out = std::io::stdout().lock();
    // A closed stdout (piped into `head`) is not an error worth a panic.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Prints why one run of a scenario failed, on stderr (stdout carries only
/// the JSON lines).
pub fn failure(scenario: &str, run: usize, reason: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{scenario} run {run} FAILED: {reason}");
}

/// Prints a progress line on stderr (stdout carries only the JSON lines).
pub fn progress(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}
