//! Polling with a bound: tests wait for a condition, never for a fixed time.

use std::time::Duration;

use tokio::time::Instant;

/// How long any helper here waits before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// How often a condition is looked at again.
const PERIOD: Duration = Duration::from_millis(20);

/// Polls `cond` until it holds, for at most [`PATIENCE`]; panics naming
/// `what` when it never does.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(PERIOD).await;
    }
}

/// Polls `f` until it returns `Some`, for at most [`PATIENCE`], and returns
/// that value; panics naming `what` when it never does.
pub async fn eventually_async<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(PERIOD).await;
    }
}
