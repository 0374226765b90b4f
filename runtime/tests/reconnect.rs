//! A proc that dials a peer again under the same proc id (its name and
//! address) replaces its old connection on the peer's side (channel
//! invariant 2): the peer writes on the newest connection the proc dialed,
//! even when it never noticed the old one die.
//!
//! The server is a real child process (`hostmesh-runtime-testproc`); the
//! client reaches it first through a loopback TCP proxy, which then drops
//! the client's side of the connection and keeps the server's side open and
//! silent (a half-open connection, as after a network fault or a peer that
//! vanished without a FIN).

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use hostmesh_runtime::testing::{EchoText, TestActor};
use hostmesh_runtime::{ActorRef, ChannelAddr, ChannelConfig, Proc, ProcConfig, ProcId};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;
use tokio::sync::Notify;

const SECRET: &str = "reconnect-secret";
const T: Duration = Duration::from_secs(20);

/// Forwards one connection to `upstream` until `cut`; then closes the
/// client's side and keeps the upstream side open, reading and discarding.
async fn proxy_once(listener: TcpListener, upstream: SocketAddr, cut: Arc<Notify>) {
    let (client, _) = listener.accept().await.expect("accept");
    let server = TcpStream::connect(upstream)
        .await
        .expect("connect upstream");
    client.set_nodelay(true).expect("nodelay");
    server.set_nodelay(true).expect("nodelay");
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let (mut up, mut down) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    loop {
        tokio::select! {
            _ = cut.notified() => break,
            r = cr.read(&mut up) => match r {
                Ok(n) if n > 0 => {
                    if sw.write_all(&up[..n]).await.is_err() {
                        return;
                    }
                }
                _ => return,
            },
            r = sr.read(&mut down) => match r {
                Ok(n) if n > 0 => {
                    if cw.write_all(&down[..n]).await.is_err() {
                        return;
                    }
                }
                _ => return,
            },
        }
    }
    drop((cr, cw));
    // The server's side stays open and silent.
    while let Ok(n) = sr.read(&mut down).await {
        if n == 0 {
            break;
        }
    }
    drop(sw);
}

#[tokio::test]
async fn a_peer_dialing_again_under_the_same_id_replaces_its_old_connection() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hostmesh-runtime-testproc"))
        .args([
            "--name",
            "server",
            "--listen",
            "tcp:127.0.0.1:0",
            "--secret",
            SECRET,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the test proc");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(T, lines.next_line())
        .await
        .expect("ready in time")
        .unwrap()
        .expect("a READY line");
    let server: ProcId = line.strip_prefix("READY ").unwrap().parse().unwrap();
    let ChannelAddr::Tcp(server_addr) = server.addr().clone() else {
        panic!("a tcp server address");
    };

    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_addr = proxy.local_addr().unwrap();
    let cut = Arc::new(Notify::new());
    let proxy_task = tokio::spawn(proxy_once(proxy, server_addr, cut.clone()));

    let client = Proc::builder("client")
        .secret(SECRET)
        .config(ProcConfig {
            channel: ChannelConfig {
                reconnect_timeout: Duration::from_secs(2),
                ..ChannelConfig::default()
            },
            ..ProcConfig::default()
        })
        .build()
        .await
        .unwrap();
    // First connection: through the proxy.
    let found = client
        .connect(&ChannelAddr::Tcp(proxy_addr))
        .await
        .expect("connect through the proxy");
    assert_eq!(found, server);
    let t0: ActorRef<TestActor> = ActorRef::attest(server.actor("t0", 0).unwrap());
    let r = t0.call(&client, &EchoText("one".into()), T).await.unwrap();
    assert_eq!(r, "one");

    // The client loses the connection; the server does not notice.
    cut.notify_one();

    // The client redials the server's own address under the same proc id.
    // The server must answer on the new connection, not on the old one.
    let deadline = tokio::time::Instant::now() + T;
    let mut last_err = None;
    loop {
        match t0
            .call(&client, &EchoText("two".into()), Duration::from_secs(2))
            .await
        {
            Ok(r) => {
                assert_eq!(r, "two");
                break;
            }
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the server never answered on the new connection: {e} (first error: {last_err:?})"
                );
                last_err.get_or_insert(e.to_string());
            }
        }
    }
    // And keeps doing so.
    for i in 0..20 {
        let text = format!("again {i}");
        assert_eq!(
            t0.call(&client, &EchoText(text.clone()), T).await.unwrap(),
            text
        );
    }
    proxy_task.abort();
}
