//! A SPDY session over one upgraded connection, on the side that accepts
//! streams (the kubelet): streams the peer opens arrive on a channel with
//! their headers, an inbox of their data and a writer.
//!
//! Invariants:
//! 1. Every SYN_STREAM is answered: a SYN_REPLY before anything else is
//!    written on the stream (spdystream drops data on a stream it has no
//!    reply for), or RST_STREAM REFUSED_STREAM beyond `max_streams` live
//!    streams (whose writer is still held) or once nobody takes new
//!    streams.
//! 2. A stream's inbox ends at the peer's FIN or RST_STREAM, or when the
//!    session ends; data for a stream whose inbox was dropped is discarded.
//! 3. The session ends (GOAWAY, then the connection is shut down) when the
//!    peer closes the connection or sends GOAWAY, on `shutdown`, or once
//!    every writer and the stream channel are dropped. Nothing it started
//!    outlives it.
//! 4. Reading from the connection waits while a stream's inbox is full, so
//!    a slow consumer slows its peer instead of growing a buffer.

use std::collections::HashMap;

use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

use super::frame::{Codec, FLAG_FIN, Headers, MAX_DATA, RST_CANCEL, RST_REFUSED, SpdyFrame};

/// Frames one stream's inbox buffers before reading waits (invariant 4).
const INBOX: usize = 16;

/// A stream the peer opened.
pub(crate) struct Stream {
    /// Stream id.
    pub(crate) id: u32,
    /// Its SYN_STREAM headers.
    pub(crate) headers: Headers,
    /// Data from the peer; ends at FIN or reset (invariant 2).
    pub(crate) inbox: mpsc::Receiver<Bytes>,
    /// Writes to the peer.
    pub(crate) writer: StreamWriter,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("id", &self.id)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

/// The session is gone; nothing more can be written.
#[derive(Debug, thiserror::Error)]
#[error("the SPDY session is closed")]
pub(crate) struct Closed;

/// Writes one stream's data.
#[derive(Clone, Debug)]
pub(crate) struct StreamWriter {
    id: u32,
    out: mpsc::Sender<SpdyFrame>,
}

impl StreamWriter {
    /// Sends `data` (split into frames of at most `MAX_DATA` bytes).
    pub(crate) async fn write(&self, data: Bytes) -> Result<(), Closed> {
        let mut data = data;
        while !data.is_empty() {
            let chunk = data.split_to(data.len().min(MAX_DATA));
            self.send(SpdyFrame::Data {
                id: self.id,
                flags: 0,
                data: chunk,
            })
            .await?;
        }
        Ok(())
    }

    /// Half-closes the stream (FIN): the peer reads to its end.
    pub(crate) async fn finish(&self) -> Result<(), Closed> {
        self.send(SpdyFrame::Data {
            id: self.id,
            flags: FLAG_FIN,
            data: Bytes::new(),
        })
        .await
    }

    /// Aborts the stream (RST_STREAM CANCEL).
    pub(crate) async fn reset(&self) -> Result<(), Closed> {
        self.send(SpdyFrame::RstStream {
            id: self.id,
            status: RST_CANCEL,
        })
        .await
    }

    async fn send(&self, f: SpdyFrame) -> Result<(), Closed> {
        self.out.send(f).await.map_err(|_| Closed)
    }
}

/// Runs a session on `io` until it ends (invariant 3); streams the peer
/// opens are sent to the returned channel.
pub(crate) fn serve<IO>(
    io: IO,
    max_streams: usize,
    shutdown: CancellationToken,
) -> (mpsc::Receiver<Stream>, tokio::task::JoinHandle<()>)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (streams_tx, streams_rx) = mpsc::channel(max_streams.max(1));
    let task = tokio::spawn(drive(io, max_streams, shutdown, streams_tx));
    (streams_rx, task)
}

async fn drive<IO>(
    io: IO,
    max_streams: usize,
    shutdown: CancellationToken,
    streams_tx: mpsc::Sender<Stream>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut framed = Framed::with_capacity(io, Codec::new(), 64 * 1024);
    let (out_tx, mut out_rx) = mpsc::channel::<SpdyFrame>(64);
    // The session holds a writer while someone takes new streams; streams
    // hold theirs. Once the stream channel and every stream are gone,
    // `out_rx` ends (invariant 3).
    let mut own_writer = Some(out_tx);
    let mut streams_tx = Some(streams_tx);
    let mut inboxes: HashMap<u32, mpsc::Sender<Bytes>> = HashMap::new();
    let mut last_seen = 0u32;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            out = out_rx.recv() => {
                let Some(frame) = out else { break };
                if framed.feed(frame).await.is_err() {
                    return;
                }
                while let Ok(more) = out_rx.try_recv() {
                    if framed.feed(more).await.is_err() {
                        return;
                    }
                }
                if framed.flush().await.is_err() {
                    return;
                }
            }
            _ = async { streams_tx.as_ref().expect("checked").closed().await }, if streams_tx.is_some() => {
                streams_tx = None;
                own_writer = None;
            }
            frame = framed.next() => {
                let frame = match frame {
                    Some(Ok(f)) => f,
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "SPDY session read failed");
                        break;
                    }
                    None => break,
                };
                match frame {
                    SpdyFrame::SynStream { id, flags, headers, .. } => {
                        last_seen = last_seen.max(id);
                        let (Some(tx), Some(out)) = (streams_tx.as_ref(), own_writer.clone()) else {
                            let _ = framed.send(SpdyFrame::RstStream { id, status: RST_REFUSED }).await;
                            continue;
                        };
                        inboxes.retain(|_, s| !s.is_closed());
                        // Streams whose writer is still held (ours is not one).
                        let live = out.strong_count().saturating_sub(2);
                        if live >= max_streams {
                            tracing::warn!(max_streams, "refusing a SPDY stream beyond the bound");
                            let _ = framed.send(SpdyFrame::RstStream { id, status: RST_REFUSED }).await;
                            continue;
                        }
                        // Invariant 1: the reply goes out before the stream
                        // is handed over, so it precedes the stream's data.
                        if framed.send(SpdyFrame::SynReply { id, flags: 0, headers: vec![] }).await.is_err() {
                            return;
                        }
                        let (in_tx, in_rx) = mpsc::channel(INBOX);
                        if flags & FLAG_FIN == 0 {
                            inboxes.insert(id, in_tx);
                        }
                        let stream = Stream {
                            id,
                            headers,
                            inbox: in_rx,
                            writer: StreamWriter { id, out },
                        };
                        if tx.send(stream).await.is_err() {
                            inboxes.remove(&id);
                        }
                    }
                    SpdyFrame::Data { id, flags, data } => {
                        if let Some(inbox) = inboxes.get(&id) {
                            if !data.is_empty() && inbox.send(data).await.is_err() {
                                inboxes.remove(&id);
                            }
                            if flags & FLAG_FIN != 0 {
                                inboxes.remove(&id);
                            }
                        }
                    }
                    SpdyFrame::Headers { id, flags, .. } | SpdyFrame::SynReply { id, flags, .. } => {
                        if flags & FLAG_FIN != 0 {
                            inboxes.remove(&id);
                        }
                    }
                    SpdyFrame::RstStream { id, .. } => {
                        inboxes.remove(&id);
                    }
                    SpdyFrame::Ping(id) => {
                        // The accepting side's pings are even: echo the peer's.
                        if id % 2 == 1 && framed.send(SpdyFrame::Ping(id)).await.is_err() {
                            return;
                        }
                    }
                    SpdyFrame::GoAway { .. } => break,
                    SpdyFrame::Settings { .. } | SpdyFrame::WindowUpdate { .. } => {}
                }
            }
        }
    }
    inboxes.clear();
    drop(streams_tx);
    let _ = framed
        .send(SpdyFrame::GoAway {
            last_good: last_seen,
            status: 0,
        })
        .await;
    let _ = futures::SinkExt::<SpdyFrame>::close(&mut framed).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::streams::spdy::frame::header;

    /// A peer that opens streams, as kubectl's spdystream does.
    struct Peer {
        framed: Framed<tokio::io::DuplexStream, Codec>,
    }

    impl Peer {
        async fn open(&mut self, id: u32, headers: &[(&str, &str)]) {
            let headers = headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            self.framed
                .send(SpdyFrame::SynStream {
                    id,
                    associated: 0,
                    priority: 0,
                    flags: 0,
                    headers,
                })
                .await
                .unwrap();
        }

        async fn next(&mut self) -> SpdyFrame {
            tokio::time::timeout(std::time::Duration::from_secs(30), self.framed.next())
                .await
                .expect("a frame in time")
                .expect("open")
                .expect("valid")
        }
    }

    #[tokio::test]
    async fn streams_are_replied_fed_and_closed() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let (mut streams, task) = serve(a, 2, CancellationToken::new());
        let mut peer = Peer {
            framed: Framed::new(b, Codec::new()),
        };
        peer.open(1, &[("streamtype", "stdin")]).await;
        assert!(matches!(
            peer.next().await,
            SpdyFrame::SynReply { id: 1, .. }
        ));
        let mut s = streams.recv().await.unwrap();
        assert_eq!(header(&s.headers, "streamtype"), Some("stdin"));
        peer.framed
            .send(SpdyFrame::Data {
                id: 1,
                flags: FLAG_FIN,
                data: Bytes::from_static(b"in"),
            })
            .await
            .unwrap();
        assert_eq!(s.inbox.recv().await.unwrap(), Bytes::from_static(b"in"));
        assert!(s.inbox.recv().await.is_none(), "FIN ends the inbox");
        s.writer.write(Bytes::from_static(b"out")).await.unwrap();
        s.writer.finish().await.unwrap();
        assert_eq!(
            peer.next().await,
            SpdyFrame::Data {
                id: 1,
                flags: 0,
                data: Bytes::from_static(b"out")
            }
        );
        assert!(matches!(
            peer.next().await,
            SpdyFrame::Data {
                id: 1,
                flags: FLAG_FIN,
                ..
            }
        ));
        // Pings from the peer come back.
        peer.framed.send(SpdyFrame::Ping(5)).await.unwrap();
        assert_eq!(peer.next().await, SpdyFrame::Ping(5));
        // Beyond the bound, streams are refused.
        peer.open(3, &[]).await;
        peer.open(5, &[]).await;
        assert!(matches!(
            peer.next().await,
            SpdyFrame::SynReply { id: 3, .. }
        ));
        let _s3 = streams.recv().await.unwrap();
        assert_eq!(
            peer.next().await,
            SpdyFrame::RstStream {
                id: 5,
                status: RST_REFUSED
            }
        );
        // Dropping everything ends the session with GOAWAY.
        drop((s, _s3, streams));
        assert!(matches!(peer.next().await, SpdyFrame::GoAway { .. }));
        task.await.unwrap();
    }
}
