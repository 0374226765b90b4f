//! Polling with a bound: tests wait for a condition, never for a fixed time.

use std::fmt::Debug;
use std::time::Duration;

use tokio::time::Instant;

/// How long any helper here waits before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// How often a condition is looked at again.
const PERIOD: Duration = Duration::from_millis(20);

/// Polls `f` until it returns `Ok`, for at most `bound`: its value, or the
/// last error once the bound has run out. For callers that report a
/// timeout themselves (as an error, not a panic) or need another bound.
pub async fn poll<T, E>(bound: Duration, mut f: impl AsyncFnMut() -> Result<T, E>) -> Result<T, E> {
    let deadline = Instant::now() + bound;
    loop {
        let last = match f().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(PERIOD).await;
    }
}

/// Polls `f` until it returns `Ok`, for at most [`PATIENCE`], and returns
/// that value; panics naming `what` and the last error (what was seen
/// instead) when it never does.
pub async fn eventually_ok<T, E: Debug>(what: &str, f: impl AsyncFnMut() -> Result<T, E>) -> T {
    poll(PATIENCE, f)
        .await
        .unwrap_or_else(|last| panic!("timed out waiting for {what}; last seen: {last:#?}"))
}

/// Polls `f` until it returns `Some`, for at most [`PATIENCE`], and returns
/// that value; panics naming `what` when it never does.
pub async fn eventually_async<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    poll(PATIENCE, async || f().await.ok_or(()))
        .await
        .unwrap_or_else(|()| panic!("timed out waiting for {what}"))
}

/// Polls `cond` until it holds, for at most [`PATIENCE`]; panics naming
/// `what` when it never does.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    eventually_async(what, async || cond().then_some(())).await;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[tokio::test]
    async fn poll_returns_the_value_or_the_last_error() {
        let mut n = 0;
        let got = super::poll(Duration::from_secs(5), async || {
            n += 1;
            if n < 3 { Err(n) } else { Ok("third") }
        })
        .await;
        assert_eq!(got, Ok("third"));
        let mut n = 0;
        let got: Result<(), i32> = super::poll(Duration::ZERO, async || {
            n += 1;
            Err(n)
        })
        .await;
        assert_eq!(got, Err(1), "polled once, the bound is spent");
    }
}
