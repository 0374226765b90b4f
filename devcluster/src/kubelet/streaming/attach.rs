//! attach: the process kubelet's containers run with stdin on `/dev/null`
//! and no terminal (the pod spec's `stdin` and `tty` are not honoured), so
//! attaching shows what the container writes from now on (its log, as
//! `kubectl attach` does for a container without stdin) until the
//! container ends or the client leaves; input sent to it is discarded.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
use tokio_util::sync::CancellationToken;

use crate::streams::channel::{Outcome, STDOUT};

use super::super::logs::log_path;
use super::super::shared::lock;
use super::Session;
use super::exec::ExecIo;

/// Streams the container's new output until it ends or `gone` fires.
pub(super) async fn run(session: &Session, io: ExecIo, gone: CancellationToken) -> Outcome {
    let key = (session.ns.clone(), session.pod.clone());
    let Some(dir) = lock(&session.shared.pods).get(&key).map(|e| e.dir.clone()) else {
        return Outcome::Error(format!("pod {}/{} is not on this node", key.0, key.1));
    };
    // Input is accepted and dropped (the container has no stdin).
    if let Some(mut stdin) = io.stdin {
        tokio::spawn(async move { while stdin.recv().await.is_some() {} });
    }
    let path = log_path(&dir, &session.container, false);
    let mut offset = tokio::fs::metadata(&path)
        .await
        .map(|m| m.len())
        .unwrap_or(0);
    loop {
        tokio::select! {
            _ = gone.cancelled() => return Outcome::Exited(0),
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        let running = lock(&session.shared.pods).get(&key).is_some_and(|e| {
            lock(&e.targets)
                .get(&session.container)
                .is_some_and(|t| t.pid == session.target.pid)
        });
        if let Ok(mut f) = tokio::fs::File::open(&path).await {
            let len = f.metadata().await.map(|m| m.len()).unwrap_or(0);
            if len > offset && f.seek(std::io::SeekFrom::Start(offset)).await.is_ok() {
                let mut buf = Vec::new();
                if (&mut f)
                    .take(len - offset)
                    .read_to_end(&mut buf)
                    .await
                    .is_ok()
                {
                    offset += buf.len() as u64;
                    if io.stdout && io.out.send((STDOUT, Bytes::from(buf))).await.is_err() {
                        return Outcome::Exited(0);
                    }
                }
            }
        }
        if !running {
            return Outcome::Exited(0);
        }
    }
}
