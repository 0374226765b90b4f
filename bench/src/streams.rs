//! Suite `streams`: `kubectl port-forward` through the embedded API server
//! and the process kubelet, in process, against a direct TCP connection to
//! the same pod in the same run.
//!
//! - `portforward_download_mib_s`: MiB/s read from a pod's server through
//!   `kubectl port-forward` (WebSocket tunnel, SPDY to the kubelet);
//!   baseline: the same transfer over a direct connection to the pod IP.
//! - `portforward_upload_mib_s`: the same, writing to the pod.
//! - `portforward_spdy_download_mib_s`: download with kubectl's SPDY
//!   fallback (`KUBECTL_PORT_FORWARD_WEBSOCKETS=false`); same baseline.
//! - `exec_roundtrip_ms`: one `kubectl exec pod -- true` (median of 10);
//!   baseline: `kubectl get pod` (the client's start-up and one request).
//!
//! The pod's server is Python (`socket.sendall`/`recv_into` of 1 MiB
//! buffers), far faster than the forwarded path, on both sides of the ratio.

use std::process::Stdio;
use std::time::{Duration, Instant};

use hostmesh_devcluster::apiserver::{ApiServer, ApiServerConfig};
use hostmesh_devcluster::kubelet::{Kubelet, KubeletConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

use crate::report::emit;

/// Bytes moved per measurement.
const SIZE: usize = 256 << 20;
const ROUNDS: usize = 3;

const SERVER: &str = r#"
import socket, sys, threading
size = int(sys.argv[2])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(16)
block = bytes(1 << 20)
def serve(c):
    cmd = c.recv(1)
    if cmd == b"D":
        left = size
        while left > 0:
            n = min(left, len(block)); c.sendall(block[:n]); left -= n
    elif cmd == b"U":
        buf = bytearray(1 << 20)
        while c.recv_into(buf):
            pass
        c.sendall(b"k")
    c.close()
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Runs the suite.
pub(crate) fn run() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(suite())
}

async fn download(addr: (&str, u16)) -> anyhow::Result<Duration> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let start = Instant::now();
    s.write_all(b"D").await?;
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0;
    while got < SIZE {
        let n = s.read(&mut buf).await?;
        anyhow::ensure!(n > 0, "the stream ended after {got} of {SIZE} bytes");
        got += n;
    }
    Ok(start.elapsed())
}

async fn upload(addr: (&str, u16)) -> anyhow::Result<Duration> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let start = Instant::now();
    s.write_all(b"U").await?;
    let block = vec![0u8; 1 << 20];
    for _ in 0..SIZE / block.len() {
        s.write_all(&block).await?;
    }
    s.shutdown().await?;
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack).await?;
    Ok(start.elapsed())
}

fn mib_s(d: Duration) -> f64 {
    (SIZE as f64 / (1 << 20) as f64) / d.as_secs_f64()
}

/// Best of `ROUNDS` (the least disturbed run).
async fn best<F, Fut>(mut f: F) -> anyhow::Result<f64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Duration>>,
{
    let mut out: f64 = 0.0;
    for _ in 0..ROUNDS {
        out = out.max(mib_s(f().await?));
    }
    Ok(out)
}

struct PortForward {
    child: tokio::process::Child,
    port: u16,
}

async fn forward(
    kubeconfig: &std::path::Path,
    port: u16,
    websockets: bool,
) -> anyhow::Result<PortForward> {
    let mut child = tokio::process::Command::new("kubectl")
        .args(["port-forward", "pod/sink", &format!(":{port}")])
        .env("KUBECONFIG", kubeconfig)
        .env(
            "KUBECTL_PORT_FORWARD_WEBSOCKETS",
            if websockets { "true" } else { "false" },
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    let local = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                let p = rest
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .parse::<u16>()?;
                return Ok::<u16, anyhow::Error>(p);
            }
        }
        anyhow::bail!("kubectl port-forward ended before forwarding")
    })
    .await??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(PortForward { child, port: local })
}

async fn kubectl_ms(kubeconfig: &std::path::Path, args: &[&str]) -> anyhow::Result<f64> {
    let mut v = Vec::new();
    for _ in 0..10 {
        let start = Instant::now();
        let out = tokio::process::Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .output()
            .await?;
        anyhow::ensure!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        v.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

async fn suite() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    let server = ApiServer::start(ApiServerConfig {
        kubeconfig: Some(kubeconfig.clone()),
        ..ApiServerConfig::default()
    })
    .await?;
    let client = server.client()?;
    let mut config =
        KubeletConfig::new("bench-streams", dir.path().join("kubelet")).for_api_server(&server);
    config.hostmesh_binary = Some("/bin/true".into());
    let kubelet = Kubelet::start(client.clone(), config).await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sink"},
        "spec": {"containers": [{
            "name": "main", "image": "busybox",
            "command": [python, "-c", SERVER, port.to_string(), SIZE.to_string()],
        }]},
    }))?;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let pod_ip = loop {
        anyhow::ensure!(Instant::now() < deadline, "the sink pod did not start");
        let p = pods.get("sink").await?;
        let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone());
        if let Some(ip) = ip
            && tokio::net::TcpStream::connect((ip.as_str(), port))
                .await
                .is_ok()
        {
            break ip;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let direct_down = best(|| download((pod_ip.as_str(), port))).await?;
    let direct_up = best(|| upload((pod_ip.as_str(), port))).await?;

    let mut fwd = forward(&kubeconfig, port, true).await?;
    let down = best(|| download(("127.0.0.1", fwd.port))).await?;
    let up = best(|| upload(("127.0.0.1", fwd.port))).await?;
    fwd.child.kill().await?;
    emit(
        "portforward_download_mib_s",
        down,
        "MiB/s",
        Some(direct_down),
    );
    emit("portforward_upload_mib_s", up, "MiB/s", Some(direct_up));

    let mut fwd = forward(&kubeconfig, port, false).await?;
    let spdy_down = best(|| download(("127.0.0.1", fwd.port))).await?;
    fwd.child.kill().await?;
    emit(
        "portforward_spdy_download_mib_s",
        spdy_down,
        "MiB/s",
        Some(direct_down),
    );

    let exec = kubectl_ms(&kubeconfig, &["exec", "sink", "--", "true"]).await?;
    let get = kubectl_ms(&kubeconfig, &["get", "pod", "sink"]).await?;
    emit("exec_roundtrip_ms", exec, "ms", Some(get));

    kubelet.shutdown().await?;
    server.shutdown().await;
    Ok(())
}
