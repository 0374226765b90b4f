//! Links are encrypted (channel `seal`): a tap between two procs sees none
//! of a message's bytes, and a byte flipped in flight closes the
//! connection with the record error, after which the link reconnects.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hostmesh_runtime::testing::{EchoText, TestActor};
use hostmesh_runtime::{ChannelAddr, Proc};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SECRET: &[u8] = b"test-secret-0123456789abcdef";
const T: Duration = Duration::from_secs(30);
const MARKER: &str = "known-plaintext-that-must-not-cross-the-wire";

/// A TCP relay that records every byte it carries, both ways, and flips
/// one bit of the next chunk from the dialer once `flip` is set.
struct Tap {
    addr: ChannelAddr,
    seen: Arc<Mutex<Vec<u8>>>,
    flip: Arc<AtomicBool>,
}

impl Tap {
    async fn to(target: SocketAddr) -> Tap {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = ChannelAddr::Tcp(l.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let flip = Arc::new(AtomicBool::new(false));
        let (s, f) = (seen.clone(), flip.clone());
        tokio::spawn(async move {
            while let Ok((dialer, _)) = l.accept().await {
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let (dr, dw) = dialer.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(dr, sw, s.clone(), Some(f.clone())));
                tokio::spawn(pump(sr, dw, s.clone(), None));
            }
        });
        Tap { addr, seen, flip }
    }

    fn saw(&self, needle: &[u8]) -> bool {
        let seen = self.seen.lock().unwrap();
        seen.windows(needle.len()).any(|w| w == needle)
    }
}

async fn pump(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    seen: Arc<Mutex<Vec<u8>>>,
    flip: Option<Arc<AtomicBool>>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        seen.lock().unwrap().extend_from_slice(&buf[..n]);
        if flip
            .as_ref()
            .is_some_and(|f| f.swap(false, Ordering::SeqCst))
        {
            // The chunk's last byte: part of a record's tag, never of a
            // length prefix.
            buf[n - 1] ^= 0x40;
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn server(secret: Option<&[u8]>) -> (Proc, SocketAddr) {
    let mut b = Proc::builder("server").listen("tcp:127.0.0.1:0".parse().unwrap());
    if let Some(s) = secret {
        b = b.secret(s);
    }
    let p = b.build().await.unwrap();
    let addr = match p.id().addr() {
        ChannelAddr::Tcp(a) => *a,
        other => panic!("unexpected address {other}"),
    };
    (p, addr)
}

async fn client(secret: Option<&[u8]>) -> Proc {
    let mut b = Proc::builder("client");
    if let Some(s) = secret {
        b = b.secret(s);
    }
    b.build().await.unwrap()
}

#[tokio::test]
async fn a_tap_between_two_procs_sees_none_of_a_message() {
    for secret in [Some(SECRET), None] {
        let (s, addr) = server(secret).await;
        let echo = s.spawn("echo", TestActor::with_label("")).await.unwrap();
        let tap = Tap::to(addr).await;
        let c = client(secret).await;
        assert_eq!(&c.connect(&tap.addr).await.unwrap(), s.id());
        let text = MARKER.repeat(20);
        assert_eq!(
            echo.call(&c, &EchoText(text.clone()), T).await.unwrap(),
            text
        );
        assert!(
            !tap.seen.lock().unwrap().is_empty(),
            "the call went through the tap"
        );
        match secret {
            // Not even a 16-byte piece of it, either way.
            Some(_) => assert!(
                !tap.saw(&MARKER.as_bytes()[..16]),
                "the tap saw the plaintext of an encrypted link"
            ),
            // The control: without a secret there is no key, and the tap
            // reads the message (so the tap does see what crosses it).
            None => assert!(tap.saw(MARKER.as_bytes()), "the tap sees clear frames"),
        }
        s.shutdown();
        c.shutdown();
    }
}

/// Collects what the test's tracing subscriber writes.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn contain(&self, s: &str) -> bool {
        String::from_utf8_lossy(&self.0.lock().unwrap()).contains(s)
    }
}

// One thread: every task of the test logs to its subscriber.
#[tokio::test(flavor = "current_thread")]
async fn a_byte_flipped_in_flight_closes_the_link_with_the_record_error() {
    let logs = Logs::default();
    let sub = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .finish();
    let _guard = tracing::subscriber::set_default(sub);
    let (s, addr) = server(Some(SECRET)).await;
    let echo = s.spawn("echo", TestActor::with_label("")).await.unwrap();
    let tap = Tap::to(addr).await;
    let c = client(Some(SECRET)).await;
    c.connect(&tap.addr).await.unwrap();
    assert_eq!(
        echo.call(&c, &EchoText("first".into()), T).await.unwrap(),
        "first"
    );
    tap.flip.store(true, Ordering::SeqCst);
    // The next record from the client (this call, or an ack before it)
    // arrives altered: the server closes that connection.
    let _ = echo.call(&c, &EchoText("altered".into()), T).await;
    let deadline = tokio::time::Instant::now() + T;
    while !logs.contain("encrypted link broken: record") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no record error logged: {}",
            String::from_utf8_lossy(&logs.0.lock().unwrap())
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(logs.contain("failed authentication"), "names the cause");
    assert!(!tap.flip.load(Ordering::SeqCst), "the tap flipped a byte");
    // The link reconnects (straight to the server's address) and works.
    assert_eq!(
        echo.call(&c, &EchoText("after".into()), T).await.unwrap(),
        "after"
    );
}
