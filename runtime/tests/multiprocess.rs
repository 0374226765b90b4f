//! Multi-process tests: real child procs (`hostmesh-runtime-testproc`) on
//! loopback. Cross-process calls and proc-to-proc calls, a peer killed
//! mid-conversation, panics reported as supervision events, malformed and
//! oversize frames, and casts to a slice of an actor mesh.

use std::process::Stdio;
use std::time::Duration;

use hostmesh_mesh::Region;
use hostmesh_runtime::actor_mesh::{ActorMesh, ProcMesh};
use hostmesh_runtime::testing::{
    Count, EchoText, Forward, PanicNow, Sleep, Tell, TestActor, WhoAmI,
};
use hostmesh_runtime::{
    ActorRef, ActorStatus, ChannelConfig, Proc, ProcConfig, ProcId, RuntimeError, SupervisionEvent,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

const SECRET: &str = "multiprocess-secret";
const T: Duration = Duration::from_secs(20);

struct Peer {
    child: Child,
    id: ProcId,
}

async fn start_peer(name: &str, extra: &[&str]) -> Peer {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hostmesh-runtime-testproc"))
        .args([
            "--name",
            name,
            "--listen",
            "tcp:127.0.0.1:0",
            "--secret",
            SECRET,
        ])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the test proc");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(T, lines.next_line())
        .await
        .expect("test proc became ready in time")
        .unwrap()
        .expect("a READY line");
    let id: ProcId = line
        .strip_prefix("READY ")
        .expect("READY prefix")
        .parse()
        .unwrap();
    Peer { child, id }
}

impl Peer {
    fn actor(&self, name: &str) -> ActorRef<TestActor> {
        ActorRef::attest(self.id.actor(name, 0).unwrap())
    }
}

async fn client() -> Proc {
    let config = ProcConfig {
        channel: ChannelConfig {
            reconnect_timeout: Duration::from_millis(500),
            ..ChannelConfig::default()
        },
        ..ProcConfig::default()
    };
    Proc::builder("client")
        .secret(SECRET)
        .config(config)
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn calls_cross_processes_and_procs_call_each_other() {
    let a = start_peer("a", &[]).await;
    let b = start_peer("b", &[]).await;
    let c = client().await;
    let ta = a.actor("t0");
    assert_eq!(
        ta.call(&c, &EchoText("hello".into()), T).await.unwrap(),
        "hello"
    );
    assert_eq!(&ta.call(&c, &WhoAmI, T).await.unwrap(), ta.id());
    // a calls b on our behalf: a dials b with the shared secret.
    let fwd = Forward {
        to: b.actor("t0"),
        text: "via a".into(),
    };
    assert_eq!(ta.call(&c, &fwd, T).await.unwrap(), "via a");
    // Ordering per sender-receiver pair across processes.
    for i in 1..=1000u64 {
        ta.send(&c, &Tell(i)).await.unwrap();
    }
    assert_eq!(ta.call(&c, &Count, T).await.unwrap(), 1000 * 1001 / 2);
    drop((a, b));
}

#[tokio::test]
async fn killed_peer_gives_errors_and_events_not_a_hang() {
    let mut a = start_peer("victim", &["--actors", "2"]).await;
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel::<SupervisionEvent>();
    let c = client().await;
    c.set_supervision_sink(move |e| {
        let _ = tx.send(e);
    });
    let t = a.actor("t0");
    assert_eq!(t.call(&c, &EchoText("x".into()), T).await.unwrap(), "x");
    // Poll the long call once: its envelope is then queued on the link.
    let mut long = std::pin::pin!(t.call(&c, &Sleep(600_000), Duration::from_secs(600)));
    assert!(futures::FutureExt::now_or_never(long.as_mut()).is_none());
    // The link is FIFO and the peer delivers in order, so once t1 answers,
    // t0 holds the long call.
    let t1 = a.actor("t1");
    assert_eq!(t1.call(&c, &EchoText("y".into()), T).await.unwrap(), "y");
    a.child.kill().await.unwrap();
    let e = tokio::time::timeout(T, long)
        .await
        .expect("the pending call ends")
        .unwrap_err();
    assert!(
        matches!(
            e,
            RuntimeError::ConnectionLost { .. } | RuntimeError::CallFailed { .. }
        ),
        "pending call fails with the lost connection: {e}"
    );
    // A send to the dead proc comes back as an undeliverable event.
    t.send(&c, &Tell(1)).await.unwrap();
    let ev = tokio::time::timeout(T, events.recv())
        .await
        .expect("an event")
        .unwrap();
    assert!(
        matches!(&ev.status, ActorStatus::Failed(m) if m.contains("undeliverable")),
        "{ev}"
    );
    // And a new call fails rather than hanging.
    let e = t
        .call(&c, &EchoText("y".into()), Duration::from_secs(600))
        .await
        .unwrap_err();
    assert!(matches!(e, RuntimeError::CallFailed { .. }), "{e}");
}

#[tokio::test]
async fn panicking_remote_handler_reports_the_panic_message() {
    let a = start_peer("p", &["--actors", "0"]).await;
    let c = client().await;
    let region: Region = "host=1".parse().unwrap();
    let procs = ProcMesh::new("m", region, vec![a.id.clone()]).unwrap();
    let (owner, mut events) = c.open_port::<SupervisionEvent>();
    let mesh: ActorMesh<TestActor> = procs
        .spawn_supervised(&c, "worker", &String::new(), Some(owner), T)
        .await
        .unwrap();
    let w = mesh.get(0).unwrap();
    let e = w
        .call(&c, &PanicNow("remote kaboom".into()), T)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("remote kaboom"), "{e}");
    let ev = tokio::time::timeout(T, events.recv())
        .await
        .expect("event in time")
        .unwrap();
    assert_eq!(&ev.actor, w.id());
    assert!(
        matches!(&ev.status, ActorStatus::Failed(m) if m.contains("panicked") && m.contains("remote kaboom")),
        "{ev}"
    );
    drop(a);
}

async fn assert_closed_by_peer(s: &mut TcpStream) {
    let mut buf = [0u8; 256];
    let r = tokio::time::timeout(T, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(r.is_ok(), "the peer closed the bad connection");
}

#[tokio::test]
async fn malformed_and_oversize_frames_close_only_their_connection() {
    let a = start_peer("strict", &["--max-frame", "65536"]).await;
    let c = client().await;
    let t = a.actor("t0");
    assert_eq!(
        t.call(&c, &EchoText("before".into()), T).await.unwrap(),
        "before"
    );
    let addr = match a.id.addr() {
        hostmesh_runtime::ChannelAddr::Tcp(s) => *s,
        other => panic!("unexpected address {other}"),
    };
    // Garbage bytes.
    let mut g = TcpStream::connect(addr).await.unwrap();
    g.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_closed_by_peer(&mut g).await;
    // A valid header announcing an oversize frame.
    let mut o = TcpStream::connect(addr).await.unwrap();
    let mut hdr = vec![b'H', b'M', hostmesh_runtime::channel::WIRE_VERSION, 1];
    hdr.extend_from_slice(&(1u32 << 30).to_be_bytes());
    o.write_all(&hdr).await.unwrap();
    assert_closed_by_peer(&mut o).await;
    // A wrong protocol version: refused, and told why in its version.
    let mut v = TcpStream::connect(addr).await.unwrap();
    v.write_all(b"HM\x09\x01\x00\x00\x00\x01x").await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(T, v.read_to_end(&mut reply))
        .await
        .expect("the peer closed the bad connection")
        .unwrap();
    assert_eq!(&reply[..4], b"HM\x09\x01", "a Hello frame of version 9");
    let why = String::from_utf8_lossy(&reply[8..]);
    assert!(why.contains("the dialer 9"), "{why}");
    // A connection that stays silent does not block others.
    let _silent = TcpStream::connect(addr).await.unwrap();
    // The authenticated connection still works.
    assert_eq!(
        t.call(&c, &EchoText("after".into()), T).await.unwrap(),
        "after"
    );
    // An envelope over the peer's maximum closes that connection: the
    // call fails, another client is unaffected, and the link reconnects.
    let c2 = client().await;
    assert_eq!(
        t.call(&c2, &EchoText("other".into()), T).await.unwrap(),
        "other"
    );
    let big = hostmesh_runtime::testing::Blob(vec![7; 200_000].into());
    let e = t.call(&c, &big, T).await;
    assert!(e.is_err(), "oversize message rejected");
    assert_eq!(
        t.call(&c2, &EchoText("still".into()), T).await.unwrap(),
        "still"
    );
    assert_eq!(
        t.call(&c, &EchoText("again".into()), T).await.unwrap(),
        "again"
    );
    drop(a);
}

#[tokio::test]
async fn cast_to_a_slice_reaches_exactly_that_slice() {
    let mut peers = Vec::new();
    for i in 0..4 {
        // Proc 2 alone refuses the label "picky" (see the spawn below).
        let refuse: &[&str] = if i == 2 { &["--refuse", "picky"] } else { &[] };
        let args = [&["--actors", "0"][..], refuse].concat();
        peers.push(start_peer(&format!("h{i}"), &args).await);
    }
    let c = client().await;
    let region: Region = "host=2,gpu=2".parse().unwrap();
    let procs = ProcMesh::new(
        "pm",
        region.clone(),
        peers.iter().map(|p| p.id.clone()).collect(),
    )
    .unwrap();
    let mesh: ActorMesh<TestActor> = procs.spawn(&c, "w", &String::new(), T).await.unwrap();
    assert_eq!(mesh.len(), 4);
    let whoami = mesh.call_all(&c, &WhoAmI, T).await.unwrap();
    for (rank, id) in whoami.iter() {
        assert_eq!(
            id.proc(),
            &peers[rank].id,
            "rank {rank} lives on proc {rank}"
        );
    }
    let slice = mesh.range("host", 1..2).unwrap();
    assert_eq!(slice.len(), 2);
    slice.cast(&c, &Tell(5)).await.unwrap();
    let gpu0 = mesh.range("gpu", 0..1).unwrap();
    gpu0.cast(&c, &Tell(1)).await.unwrap();
    let counts = mesh.call_all(&c, &Count, T).await.unwrap();
    // ranks: (h0,g0)=0 (h0,g1)=1 (h1,g0)=2 (h1,g1)=3
    assert_eq!(counts.to_vec(), vec![1, 0, 6, 5]);
    // A spawn that fails on one proc only names that rank, and only it:
    // the other three accepted the params.
    let e = procs
        .spawn::<TestActor>(&c, "again", &"picky".to_string(), T)
        .await
        .unwrap_err();
    match &e {
        RuntimeError::Ranks {
            op: "spawn",
            failed,
            total: 4,
        } => {
            assert_eq!(
                failed.iter().map(|f| f.0).collect::<Vec<_>>(),
                vec![2],
                "only rank 2 refused: {e}"
            );
            assert!(failed[0].1.contains("refuses"), "{failed:?}");
        }
        other => panic!("expected a rank error, got {other}"),
    }
    // Params every proc refuses name every rank.
    let e = procs
        .spawn::<TestActor>(&c, "refused", &"refuse".to_string(), T)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, RuntimeError::Ranks { op: "spawn", failed, total: 4 }
            if failed.iter().map(|f| f.0).collect::<Vec<_>>() == [0, 1, 2, 3]),
        "{e}"
    );
    drop(peers);
}
