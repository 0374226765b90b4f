//! exec and attach over WebSocket (`v5.channel.k8s.io`,
//! `v4.channel.k8s.io`): channel-tagged binary messages in, output and the
//! final status out, then a normal close.

use bytes::{BufMut as _, Bytes, BytesMut};
use futures::{SinkExt as _, StreamExt as _};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, frame::coding::CloseCode};

use crate::streams::channel::{self, CLOSE, ERROR, RESIZE, STDIN, TermSize, V5};

use super::Session;
use super::exec::ExecIo;

fn tagged(channel: u8, data: &[u8]) -> Message {
    let mut b = BytesMut::with_capacity(data.len() + 1);
    b.put_u8(channel);
    b.extend_from_slice(data);
    Message::Binary(b.freeze())
}

/// Serves one exec or attach session on an upgraded connection.
pub(super) async fn serve(session: Session, io: TokioIo<Upgraded>, what: &str) {
    let ws = WebSocketStream::from_raw_socket(io, Role::Server, None).await;
    let (mut sink, mut source) = ws.split();
    let v5 = session.protocol == V5;
    let opts = session.opts.clone();
    let (stdin_tx, stdin_rx) = if opts.stdin {
        let (t, r) = mpsc::channel::<Bytes>(16);
        (Some(t), Some(r))
    } else {
        (None, None)
    };
    let (resize_tx, resize_rx) = if opts.tty {
        let (t, r) = mpsc::channel::<TermSize>(4);
        (Some(t), Some(r))
    } else {
        (None, None)
    };
    let gone = session.ended();
    let g = gone.clone();
    let reader = tokio::spawn(async move {
        let mut stdin_tx = stdin_tx;
        while let Some(msg) = source.next().await {
            let data = match msg {
                Ok(Message::Binary(b)) => b,
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => continue,
            };
            match data.first() {
                Some(&STDIN) => {
                    if let Some(tx) = &stdin_tx
                        && data.len() > 1
                        && tx.send(data.slice(1..)).await.is_err()
                    {
                        stdin_tx = None;
                    }
                }
                Some(&RESIZE) => {
                    if let (Some(tx), Ok(size)) =
                        (&resize_tx, serde_json::from_slice::<TermSize>(&data[1..]))
                    {
                        let _ = tx.try_send(size);
                    }
                }
                Some(&CLOSE) if v5 && data.get(1) == Some(&STDIN) => stdin_tx = None,
                _ => {}
            }
        }
        // The client went away (or closed after the status).
        g.cancel();
    });
    let (out_tx, mut out_rx) = mpsc::channel::<(u8, Bytes)>(16);
    let io = ExecIo {
        stdin: stdin_rx,
        out: out_tx,
        stdout: opts.stdout,
        stderr: opts.stderr,
        resize: resize_rx,
    };
    let run = super::run(&session, what, io, gone.clone());
    tokio::pin!(run);
    let mut outcome = None;
    let mut client_ok = true;
    loop {
        tokio::select! {
            o = &mut run, if outcome.is_none() => outcome = Some(o),
            m = out_rx.recv() => match m {
                Some((ch, data)) => {
                    if client_ok && sink.send(tagged(ch, &data)).await.is_err() {
                        client_ok = false;
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
    if client_ok {
        let status = channel::status(&outcome, &session.opts.command);
        let _ = sink
            .send(tagged(
                ERROR,
                &serde_json::to_vec(&status).unwrap_or_default(),
            ))
            .await;
        let _ = sink
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            })))
            .await;
        // Give the client a moment to answer the close.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            let _ = sink.flush().await;
        })
        .await;
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), reader).await;
    gone.cancel();
}
