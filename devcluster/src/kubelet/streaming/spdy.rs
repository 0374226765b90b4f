//! exec and attach over SPDY/3.1 (`v4.channel.k8s.io`), what kubectl falls
//! back to and what a real kube-apiserver speaks to the kubelet: the client
//! opens one stream per role (`streamtype` error, stdin, stdout, stderr,
//! resize); the status goes on the error stream, which then ends.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;

use crate::streams::channel::{self, STDERR, STDOUT, TermSize};
use crate::streams::spdy::frame::header;
use crate::streams::spdy::session::{self, Stream};

use super::exec::ExecIo;
use super::{MAX_STREAMS, Session};

/// How long the client has to open its streams (the kubelet's default
/// stream creation timeout).
const STREAM_CREATION: Duration = Duration::from_secs(30);

/// Serves one exec or attach session on an upgraded connection.
pub(super) async fn serve(session: Session, io: TokioIo<Upgraded>, what: &str) {
    let gone = session.ended();
    let (mut incoming, task) = session::serve(io, MAX_STREAMS, gone.clone());
    let opts = session.opts.clone();
    let expected = 1
        + usize::from(opts.stdin)
        + usize::from(opts.stdout)
        + usize::from(opts.stderr)
        + usize::from(opts.tty);
    let mut streams: HashMap<String, Stream> = HashMap::new();
    let collected = tokio::time::timeout(STREAM_CREATION, async {
        while streams.len() < expected {
            let Some(s) = incoming.recv().await else {
                return false;
            };
            let kind = header(&s.headers, "streamtype").unwrap_or("").to_string();
            streams.insert(kind, s);
        }
        true
    })
    .await;
    let Some(error) = streams.remove("error").filter(|_| collected == Ok(true)) else {
        tracing::debug!(pod = %session.pod, "the client did not open the exec streams in time");
        gone.cancel();
        drop((streams, incoming));
        let _ = task.await;
        return;
    };
    let stdin = streams.remove("stdin").map(|s| s.inbox);
    let stdout = streams.remove("stdout").map(|s| s.writer);
    let stderr = streams.remove("stderr").map(|s| s.writer);
    let resize = streams.remove("resize").map(|mut s| {
        let (tx, rx) = mpsc::channel::<TermSize>(4);
        tokio::spawn(async move {
            // A stream of JSON documents, one per size.
            let mut buf: Vec<u8> = Vec::new();
            while let Some(d) = s.inbox.recv().await {
                buf.extend_from_slice(&d);
                let mut it = serde_json::Deserializer::from_slice(&buf).into_iter::<TermSize>();
                let mut used = 0;
                while let Some(Ok(size)) = it.next() {
                    used = it.byte_offset();
                    if tx.send(size).await.is_err() {
                        return;
                    }
                }
                buf.drain(..used);
                if buf.len() > 4096 {
                    return;
                }
            }
        });
        rx
    });
    let (out_tx, mut out_rx) = mpsc::channel::<(u8, Bytes)>(16);
    let io = ExecIo {
        stdin,
        out: out_tx,
        stdout: stdout.is_some(),
        stderr: stderr.is_some(),
        resize,
    };
    let run = super::run(&session, what, io, gone.clone());
    tokio::pin!(run);
    let mut outcome = None;
    loop {
        tokio::select! {
            o = &mut run, if outcome.is_none() => outcome = Some(o),
            m = out_rx.recv() => match m {
                Some((ch, data)) => {
                    let w = if ch == STDOUT { &stdout } else if ch == STDERR { &stderr } else { &None };
                    if let Some(w) = w
                        && w.write(data).await.is_err()
                    {
                        gone.cancel();
                    }
                }
                None => break,
            },
        }
    }
    let outcome = match outcome {
        Some(o) => o,
        None => run.await,
    };
    for w in [&stdout, &stderr].into_iter().flatten() {
        let _ = w.finish().await;
    }
    let status = channel::status(&outcome, &session.opts.command);
    let _ = error
        .writer
        .write(Bytes::from(serde_json::to_vec(&status).unwrap_or_default()))
        .await;
    let _ = error.writer.finish().await;
    drop((error, stdout, stderr, streams, incoming));
    let _ = task.await;
    gone.cancel();
}
