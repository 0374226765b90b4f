//! Suite `runtime`: the actor runtime against raw TCP measured in the same
//! run. Peers are real child processes (this binary re-executed with
//! `HOSTMESH_BENCH_RUNTIME_PEER` set) serving a runtime proc with test actors
//! plus raw TCP echo and sink servers on loopback. The `aead_*` lines
//! measure encrypted links against the same links in the clear (a peer
//! and client built with the runtime's benchmark-only baseline switch).

use std::io::{BufRead as _, Read as _, Write as _};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hostmesh_mesh::Region;
use hostmesh_runtime::actor_mesh::ActorMesh;
use hostmesh_runtime::testing::{Blob, Count, EchoText, ServerConfig, TestActor, start_server};
use hostmesh_runtime::{ActorRef, Proc, ProcId};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};

use crate::report::emit;

const PEER_ENV: &str = "HOSTMESH_BENCH_RUNTIME_PEER";
const SECRET: &str = "bench-secret-0123456789abcdef";
/// The peer spec's word for the encryption baseline.
const PLAINTEXT: &str = "plaintext";
pub(crate) const T: Duration = Duration::from_secs(60);

/// Iteration counts are divided by this (`HOSTMESH_BENCH_QUICK=1`: a smoke
/// run that checks the suite works, figures meaningless).
pub(crate) fn scale(n: usize) -> usize {
    if std::env::var_os("HOSTMESH_BENCH_QUICK").is_some() {
        (n / 100).max(2)
    } else {
        n
    }
}

/// Whether the section `name` runs: all do unless `HOSTMESH_BENCH_ONLY`
/// lists comma-separated prefixes (`call_rtt`, `tell`, `bulk`, `aead`, `cast`,
/// `rss`).
fn want(name: &str) -> bool {
    match std::env::var("HOSTMESH_BENCH_ONLY") {
        Ok(only) => only
            .split(',')
            .any(|p| !p.is_empty() && name.starts_with(p.trim())),
        Err(_) => true,
    }
}

/// Runs the suite (or, in a child, the peer).
pub(crate) fn run() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match std::env::var(PEER_ENV) {
        Ok(spec) => {
            // `<actors>` or `<actors> plaintext` (the encryption baseline).
            let mut words = spec.split_whitespace();
            let actors = words.next().unwrap_or_default();
            let plaintext = words.next() == Some(PLAINTEXT);
            rt.block_on(peer(actors.parse().context("peer actor count")?, plaintext))
        }
        // The client streams from a task in a `batched` scope, as actor
        // tasks do (sends are staged per poll; the raw baseline's
        // `BufWriter` is the counterpart).
        Err(_) => rt.block_on(hostmesh_runtime::batched(suite())),
    }
}

/// A child process: proc with `actors` test actors, raw echo, raw sink;
/// `plaintext`: the benchmark baseline without encryption.
async fn peer(actors: usize, plaintext: bool) -> anyhow::Result<()> {
    let config = ServerConfig {
        name: format!("bench{}", std::process::id()),
        listen: "tcp:127.0.0.1:0".parse()?,
        secret: Some(SECRET.as_bytes().to_vec()),
        issue_from_secret: true,
        max_frame_len: 64 << 20,
        actors,
    };
    let proc = if plaintext {
        plaintext_server(&config).await?
    } else {
        start_server(&config).await?
    };
    let echo = TcpListener::bind("127.0.0.1:0").await?;
    let sink = TcpListener::bind("127.0.0.1:0").await?;
    let (echo_addr, sink_addr) = (echo.local_addr()?, sink.local_addr()?);
    tokio::spawn(serve_raw(echo, raw_echo));
    tokio::spawn(serve_raw(sink, raw_sink));
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "READY {} {echo_addr} {sink_addr}", proc.id())?;
        out.flush()?;
    }
    tokio::task::spawn_blocking(|| std::io::stdin().read_to_end(&mut Vec::new())).await??;
    Ok(())
}

async fn serve_raw<F, Fut>(l: TcpListener, f: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: std::future::Future<Output = std::io::Result<()>> + Send + 'static,
{
    while let Ok((s, _)) = l.accept().await {
        let _ = s.set_nodelay(true);
        tokio::spawn(f(s));
    }
}

/// Length-prefixed echo.
async fn raw_echo(s: TcpStream) -> std::io::Result<()> {
    let (r, mut w) = s.into_split();
    let mut r = BufReader::with_capacity(256 * 1024, r);
    let mut buf = Vec::new();
    loop {
        let len = r.read_u32().await? as usize;
        buf.resize(4 + len, 0);
        buf[..4].copy_from_slice(&(len as u32).to_be_bytes());
        r.read_exact(&mut buf[4..]).await?;
        w.write_all(&buf).await?;
    }
}

/// Reads a count N, then N length-prefixed frames; answers one byte.
async fn raw_sink(s: TcpStream) -> std::io::Result<()> {
    let (r, mut w) = s.into_split();
    let mut r = BufReader::with_capacity(256 * 1024, r);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = r.read_u64().await?;
        for _ in 0..n {
            let len = r.read_u32().await? as usize;
            if buf.len() < len {
                buf.resize(len, 0);
            }
            r.read_exact(&mut buf[..len]).await?;
        }
        w.write_all(&[1]).await?;
    }
}

pub(crate) struct PeerProc {
    child: Child,
    pub(crate) proc: ProcId,
    echo: String,
    sink: String,
}

impl Drop for PeerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `start_server` for the baseline: the same proc, frames in the clear.
async fn plaintext_server(config: &ServerConfig) -> anyhow::Result<Proc> {
    let mut pc = hostmesh_runtime::ProcConfig::default();
    pc.channel.max_frame_len = config.max_frame_len;
    let proc = Proc::builder(config.name.clone())
        .listen(config.listen.clone())
        .config(pc)
        .register::<TestActor>()
        .issued_by(issuer())
        .plaintext_benchmark_baseline()
        .build()
        .await?;
    for i in 0..config.actors {
        proc.spawn(&format!("t{i}"), TestActor::with_label(""))
            .await?;
    }
    Ok(proc)
}

pub(crate) fn start_peer(actors: usize) -> anyhow::Result<PeerProc> {
    start_peer_as(actors, false)
}

/// A peer; `plaintext`: the encryption baseline.
fn start_peer_as(actors: usize, plaintext: bool) -> anyhow::Result<PeerProc> {
    let spec = if plaintext {
        format!("{actors} {PLAINTEXT}")
    } else {
        actors.to_string()
    };
    let mut child = Command::new(std::env::current_exe()?)
        .arg("runtime")
        .env(PEER_ENV, spec)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().context("peer stdout")?).read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    anyhow::ensure!(
        parts.next() == Some("READY"),
        "peer did not start: {line:?}"
    );
    let proc = parts.next().context("proc id")?.parse()?;
    let echo = parts.next().context("echo addr")?.to_string();
    let sink = parts.next().context("sink addr")?.to_string();
    Ok(PeerProc {
        child,
        proc,
        echo,
        sink,
    })
}

fn rss_bytes(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kb * 1024.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub(crate) fn summarize(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

/// The bench World's proc issuer: procs join with credentials, as
/// runtime-aware procs and clients of actors do.
fn issuer() -> hostmesh_runtime::Issuer {
    hostmesh_runtime::Issuer::from_runtime_key(SECRET.as_bytes())
}

pub(crate) async fn client() -> anyhow::Result<Proc> {
    Ok(Proc::builder("bench").issued_by(issuer()).build().await?)
}

/// The baseline's client: authenticated, frames in the clear.
async fn plaintext_client() -> anyhow::Result<Proc> {
    Ok(Proc::builder("bench")
        .issued_by(issuer())
        .plaintext_benchmark_baseline()
        .build()
        .await?)
}

/// Encrypted links against the same links in the clear (the benchmark
/// baseline), alternating rounds, the median of each: call round trip at
/// 1 KiB, 64-byte tells, 1 MiB bulk. Then AES-256-GCM against
/// ChaCha20-Poly1305 sealing 1 MiB in place (why links use AES).
async fn aead() -> anyhow::Result<()> {
    const ROUNDS: usize = 3;
    // [sealed, plaintext] samples of each figure.
    let mut rtt = [Vec::new(), Vec::new()];
    let mut rtt99 = [Vec::new(), Vec::new()];
    let mut tell = [Vec::new(), Vec::new()];
    let mut bulk = [Vec::new(), Vec::new()];
    for _ in 0..ROUNDS {
        for (i, plaintext) in [false, true].into_iter().enumerate() {
            let peer = start_peer_as(1, plaintext)?;
            let c = if plaintext {
                plaintext_client().await?
            } else {
                client().await?
            };
            let t0: ActorRef<TestActor> = ActorRef::attest(peer.proc.actor("t0", 0)?);
            let (p50, p99) = call_rtt(&c, &t0, 1024, scale(20_000)).await?;
            rtt[i].push(p50);
            rtt99[i].push(p99);
            tell[i].push(tell_throughput(&c, &t0, 64, scale(1_000_000)).await?);
            let n = scale(512);
            bulk[i].push(tell_throughput(&c, &t0, 1 << 20, n).await? * (1 << 20) as f64);
            // Tells not acknowledged yet when the round ends bounce: not
            // an error of the run.
            c.set_supervision_sink(|_| {});
            c.shutdown();
        }
    }
    let median = |v: &mut Vec<f64>| summarize(std::mem::take(v)).0;
    for (name, unit, v) in [
        ("aead_call_rtt_1k_p50", "us", &mut rtt),
        ("aead_call_rtt_1k_p99", "us", &mut rtt99),
        ("aead_tell_throughput_64b", "msgs/s", &mut tell),
        ("aead_bulk_throughput_1m", "bytes/s", &mut bulk),
    ] {
        let [sealed, plain] = v;
        emit(name, median(sealed), unit, Some(median(plain)));
    }
    let aes = seal_rate(&ring::aead::AES_256_GCM)?;
    let chacha = seal_rate(&ring::aead::CHACHA20_POLY1305)?;
    emit("aead_seal_1m_aes256gcm", aes, "bytes/s", Some(chacha));
    Ok(())
}

/// Bytes per second `alg` seals in place, 1 MiB records.
fn seal_rate(alg: &'static ring::aead::Algorithm) -> anyhow::Result<f64> {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey};
    let key = LessSafeKey::new(
        UnboundKey::new(alg, &[7u8; 32]).map_err(|_| anyhow::anyhow!("aead key"))?,
    );
    let mut buf = vec![1u8; 1 << 20];
    let n = scale(500) as u64;
    let start = Instant::now();
    for i in 0..n {
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&i.to_be_bytes());
        let tag = key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut buf)
            .map_err(|_| anyhow::anyhow!("seal"))?;
        let _ = std::hint::black_box(tag);
    }
    Ok((n as f64) * (1 << 20) as f64 / start.elapsed().as_secs_f64())
}

async fn suite() -> anyhow::Result<()> {
    let peer = start_peer(1)?;
    let c = client().await?;
    let t0: ActorRef<TestActor> = ActorRef::attest(peer.proc.actor("t0", 0)?);

    // call round trip vs raw echo, 1 KiB (and 64 KiB: no Nagle cliff).
    for (size, name) in [(1024usize, "1k"), (64 * 1024, "64k")] {
        if !want("call_rtt") {
            break;
        }
        let n = scale(if size > 4096 { 3_000 } else { 20_000 });
        let (rt_p50, rt_p99) = call_rtt(&c, &t0, size, n).await?;
        let (raw_p50, raw_p99) = raw_rtt(&peer.echo, size, n).await?;
        emit(&format!("call_rtt_{name}_p50"), rt_p50, "us", Some(raw_p50));
        emit(&format!("call_rtt_{name}_p99"), rt_p99, "us", Some(raw_p99));
    }

    // one-way throughput vs raw frames on one stream.
    if want("tell") {
        let n = scale(1_000_000);
        let rt = tell_throughput(&c, &t0, 64, n).await?;
        let raw = raw_throughput(&peer.sink, 64, n as u64).await?;
        emit("tell_throughput_64b", rt, "msgs/s", Some(raw));
    }
    if want("bulk") {
        let n = scale(512);
        let rt = tell_throughput(&c, &t0, 1 << 20, n).await? * (1 << 20) as f64;
        let raw = raw_throughput(&peer.sink, 1 << 20, n as u64).await? * (1 << 20) as f64;
        emit("bulk_throughput_1m", rt, "bytes/s", Some(raw));
    }
    drop(peer);
    if want("aead") {
        aead().await?;
    }
    if !want("cast") && !want("rss") {
        return Ok(());
    }

    // cast and gather over 4 processes.
    let peers = (0..4)
        .map(|_| start_peer(64))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for (per, iters, names) in [
        (
            4usize,
            500usize,
            vec!["cast_gather_16_p50", "cast_gather_16_p99"],
        ),
        (64, 300, vec!["cast_gather_256_p50", "cast_gather_256_p99"]),
    ] {
        if !want("cast") {
            break;
        }
        let region: Region = format!("proc=4,actor={per}").parse()?;
        let mut ids = Vec::new();
        for p in &peers {
            for i in 0..per {
                ids.push(p.proc.actor(format!("t{i}"), 0)?);
            }
        }
        let mesh = ActorMesh::<TestActor>::attest("bench", region, ids)?;
        for _ in 0..scale(20) {
            mesh.call_all(&c, &EchoText("x".into()), T).await?;
        }
        let iters = scale(iters);
        let mut samples = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            let v = mesh.call_all(&c, &EchoText("x".into()), T).await?;
            samples.push(t.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(v.runs().len() == 1, "every actor answered the same");
        }
        let (p50, p99) = summarize(samples);
        emit(names[0], p50, "ms", None);
        emit(names[1], p99, "ms", None);
    }
    drop(peers);

    // resident set of a proc with 10,000 idle actors.
    if !want("rss") {
        return Ok(());
    }
    let empty = start_peer(0)?;
    let full = start_peer(10_000)?;
    let (e, f) = (rss_bytes(empty.child.id())?, rss_bytes(full.child.id())?);
    emit("rss_10k_actors", f, "bytes", None);
    emit("rss_empty_proc", e, "bytes", None);
    emit("rss_per_idle_actor", (f - e) / 10_000.0, "bytes", None);
    Ok(())
}

pub(crate) async fn call_rtt(
    c: &Proc,
    t: &ActorRef<TestActor>,
    size: usize,
    n: usize,
) -> anyhow::Result<(f64, f64)> {
    let msg = EchoText("x".repeat(size));
    for _ in 0..scale(1000).min(n) {
        t.call(c, &msg, T).await?;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let s = Instant::now();
        let r = t.call(c, &msg, T).await?;
        samples.push(s.elapsed().as_secs_f64() * 1e6);
        anyhow::ensure!(r.len() == size);
    }
    Ok(summarize(samples))
}

async fn raw_rtt(addr: &str, size: usize, n: usize) -> anyhow::Result<(f64, f64)> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let mut out = (size as u32).to_be_bytes().to_vec();
    out.extend(std::iter::repeat_n(b'x', size));
    let mut back = vec![0u8; 4 + size];
    for _ in 0..scale(1000).min(n) {
        s.write_all(&out).await?;
        s.read_exact(&mut back).await?;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(&out).await?;
        s.read_exact(&mut back).await?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(summarize(samples))
}

/// Messages per second of `send` of `size`-byte blobs, flushed by a call.
async fn tell_throughput(
    c: &Proc,
    t: &ActorRef<TestActor>,
    size: usize,
    n: usize,
) -> anyhow::Result<f64> {
    let msg = Blob(vec![7; size].into());
    let before = t.call(c, &Count, T).await?;
    let start = Instant::now();
    for _ in 0..n {
        t.send(c, &msg).await?;
    }
    let after = t.call(c, &Count, T).await?;
    let secs = start.elapsed().as_secs_f64();
    anyhow::ensure!(after - before == n as u64, "all {n} messages handled");
    Ok(n as f64 / secs)
}

/// Frames per second over one raw stream to the sink.
async fn raw_throughput(addr: &str, size: usize, n: u64) -> anyhow::Result<f64> {
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let (mut r, w) = s.into_split();
    let mut w = BufWriter::with_capacity(256 * 1024, w);
    let frame: Vec<u8> = (size as u32)
        .to_be_bytes()
        .into_iter()
        .chain(std::iter::repeat_n(7u8, size))
        .collect();
    let start = Instant::now();
    w.write_u64(n).await?;
    for _ in 0..n {
        w.write_all(&frame).await?;
    }
    w.flush().await?;
    let mut ack = [0u8; 1];
    r.read_exact(&mut ack).await?;
    Ok(n as f64 / start.elapsed().as_secs_f64())
}
