//! Connections that never authenticate are bounded (transport invariant:
//! `admit`): past `max_pending_per_source` from one address the proc closes
//! a new connection at once, idle ones hold no more than their slots, and
//! once they go a real client connects and calls as before.

use std::io::Read as _;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use hostmesh_runtime::channel::ChannelConfig;
use hostmesh_runtime::testing::{EchoText, TestActor};
use hostmesh_runtime::{Proc, ProcConfig};

const SECRET: &[u8] = b"test-secret-0123456789abcdef";
const PER_SOURCE: usize = 4;

/// Whether the server closed `s` (EOF or reset) within `within`.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).expect("read timeout");
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_connections_are_bounded_per_source() {
    let server = Proc::builder("server")
        .listen("tcp:127.0.0.1:0".parse().unwrap())
        .secret(SECRET)
        .config(ProcConfig {
            channel: ChannelConfig {
                // Idle connections stay pending for the whole test.
                handshake_timeout: Duration::from_secs(60),
                max_pending_per_source: PER_SOURCE,
                ..ChannelConfig::default()
            },
            ..ProcConfig::default()
        })
        .build()
        .await
        .unwrap();
    let echo = server
        .spawn("echo", TestActor::with_label(""))
        .await
        .unwrap();
    let addr = server.id().addr().to_string();
    let addr = addr.trim_start_matches("tcp:").to_string();

    let idle: Vec<TcpStream> = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || {
            let mut idle = Vec::new();
            for _ in 0..PER_SOURCE {
                idle.push(TcpStream::connect(&addr).expect("connect"));
            }
            // Accepted in order: give the server time to take all four.
            std::thread::sleep(Duration::from_millis(300));
            idle
        }
    })
    .await
    .unwrap();
    let refused = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || {
            (0..8)
                .filter(|_| {
                    let mut s = TcpStream::connect(&addr).expect("connect");
                    closed_within(&mut s, Duration::from_secs(10))
                })
                .count()
        }
    })
    .await
    .unwrap();
    assert_eq!(
        refused, 8,
        "every connection past the bound is closed at once"
    );
    let mut idle = idle;
    let still_open = tokio::task::spawn_blocking(move || {
        let open = idle
            .iter_mut()
            .map(|s| closed_within(s, Duration::from_millis(100)))
            .filter(|closed| !closed)
            .count();
        drop(idle);
        open
    })
    .await
    .unwrap();
    assert_eq!(
        still_open, PER_SOURCE,
        "the first ones wait for their handshake"
    );

    // The idle ones are gone: a real client gets through again.
    let client = Proc::builder("client")
        .secret(SECRET)
        .build()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match echo
            .call(&client, &EchoText("hi".into()), Duration::from_secs(5))
            .await
        {
            Ok(r) => {
                assert_eq!(r, "hi");
                break;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "no call got through: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
