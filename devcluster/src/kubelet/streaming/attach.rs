//! attach: the process kubelet's containers run with stdin on `/dev/null`
//! and no terminal (the pod spec's `stdin` and `tty` are not honoured), so
//! attaching shows what the container writes from now on (its log, as
//! `kubectl attach` does for a container without stdin) until the
//! container ends or the client leaves; input sent to it is discarded.

use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::streams::channel::{ExecOutcome, STDOUT};

use super::super::logrotate;
use super::super::logs::log_path;
use super::super::shared::lock;
use super::Session;
use super::exec::ExecIo;

/// Streams the container's new output until it ends or `gone` fires.
pub(super) async fn run(session: &Session, io: ExecIo, gone: CancellationToken) -> ExecOutcome {
    let key = (session.ns.clone(), session.pod.clone());
    let Some(dir) = lock(&session.shared.pods).get(&key).map(|e| e.dir.clone()) else {
        return ExecOutcome::Error(format!("pod {}/{} is not on this node", key.0, key.1));
    };
    // Input is accepted and dropped (the container has no stdin).
    if let Some(mut stdin) = io.stdin {
        tokio::spawn(async move { while stdin.recv().await.is_some() {} });
    }
    let path = log_path(&dir, &session.container, false);
    let cuts = &session.shared.log_cuts;
    let mut offset = logrotate::end_position(cuts, &path).await;
    loop {
        tokio::select! {
            _ = gone.cancelled() => return ExecOutcome::Exited(0),
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        let running = lock(&session.shared.pods).get(&key).is_some_and(|e| {
            lock(&e.targets)
                .get(&session.container)
                .is_some_and(|t| t.pid == session.target.pid)
        });
        // Positions are absolute: rotation cuts the file's front.
        if let Some((next, buf)) = logrotate::read_from(cuts, &path, offset).await {
            offset = next;
            if !buf.is_empty()
                && io.stdout
                && io.out.send((STDOUT, Bytes::from(buf))).await.is_err()
            {
                return ExecOutcome::Exited(0);
            }
        }
        if !running {
            return ExecOutcome::Exited(0);
        }
    }
}
