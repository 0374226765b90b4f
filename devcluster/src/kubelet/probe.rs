//! Readiness and liveness probes: `httpGet` (plain HTTP), `tcpSocket` and
//! `exec` (run inside the container's mount namespace), with Kubernetes'
//! defaults for delays, periods and thresholds.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::error::{KubeletError, Result};
use super::process::{self, Launch, Namespace, Output};

/// What a probe does.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// `GET path` on `addr`; 200-399 is success.
    Http {
        /// Where to connect.
        addr: SocketAddr,
        /// Request path.
        path: String,
        /// Extra headers.
        headers: Vec<(String, String)>,
    },
    /// Connect to `addr`.
    Tcp(SocketAddr),
    /// Run a command in the container; exit 0 is success.
    Exec(Launch),
    /// A probe that cannot run as written: it always fails with this
    /// message (naming the field), so the container is never ready on it.
    Invalid(String),
}

/// A probe with its timing.
#[derive(Debug, Clone)]
pub(crate) struct ProbeSpec {
    /// What to do.
    pub(crate) action: Action,
    /// Wait this long after the container started before the first probe.
    pub(crate) initial_delay: Duration,
    /// Time between probes.
    pub(crate) period: Duration,
    /// A probe taking longer fails.
    pub(crate) timeout: Duration,
    /// Consecutive successes to become ready.
    pub(crate) success_threshold: u32,
    /// Consecutive failures to become unready.
    pub(crate) failure_threshold: u32,
}

fn port_of(port: &IntOrString, container: &Container, field: &str) -> Result<u16> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).ok().filter(|p| *p > 0).ok_or_else(|| {
            KubeletError::PodSpec(format!("{field}: port {p} is out of range 1-65535"))
        }),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| {
                KubeletError::PodSpec(format!(
                    "{field}: no container port named {name:?} in ports"
                ))
            }),
    }
}

fn secs(v: Option<i32>, default: u64, min: u64) -> Duration {
    Duration::from_secs(v.map(|v| v.max(0) as u64).unwrap_or(default).max(min))
}

/// Like [`probe_spec`], but a probe that cannot run becomes one that always
/// fails with the reason (Kubernetes fails such probes at run time too).
pub(crate) fn probe_spec_or_invalid(
    probe: &Probe,
    container: &Container,
    field: &str,
    pod_ip: IpAddr,
    exec_base: &Launch,
) -> ProbeSpec {
    probe_spec(probe, container, field, pod_ip, exec_base).unwrap_or_else(|e| ProbeSpec {
        action: Action::Invalid(e.to_string()),
        initial_delay: secs(probe.initial_delay_seconds, 0, 0),
        period: secs(probe.period_seconds, 10, 1),
        timeout: secs(probe.timeout_seconds, 1, 1),
        success_threshold: 1,
        failure_threshold: probe.failure_threshold.unwrap_or(3).max(1) as u32,
    })
}

/// Builds a probe for `container` (at `field`) running on `pod_ip`.
/// `exec_base` carries the container's environment, working directory and
/// mounts for exec probes.
pub(crate) fn probe_spec(
    probe: &Probe,
    container: &Container,
    field: &str,
    pod_ip: IpAddr,
    exec_base: &Launch,
) -> Result<ProbeSpec> {
    let action = if let Some(h) = &probe.http_get {
        if h.scheme.as_deref().is_some_and(|s| s != "HTTP") {
            return Err(KubeletError::PodSpec(format!(
                "{field}.httpGet.scheme: only HTTP probes are supported by the process kubelet"
            )));
        }
        let host: IpAddr = match h.host.as_deref().filter(|h| !h.is_empty()) {
            Some(h) => h.parse().map_err(|_| {
                KubeletError::PodSpec(format!("{field}.httpGet.host: {h:?} must be an IP address"))
            })?,
            None => pod_ip,
        };
        let port = port_of(&h.port, container, &format!("{field}.httpGet.port"))?;
        let path = h
            .path
            .clone()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/".into());
        let headers = h
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        Action::Http {
            addr: SocketAddr::new(host, port),
            path,
            headers,
        }
    } else if let Some(t) = &probe.tcp_socket {
        let host: IpAddr = match t.host.as_deref().filter(|h| !h.is_empty()) {
            Some(h) => h.parse().map_err(|_| {
                KubeletError::PodSpec(format!(
                    "{field}.tcpSocket.host: {h:?} must be an IP address"
                ))
            })?,
            None => pod_ip,
        };
        Action::Tcp(SocketAddr::new(
            host,
            port_of(&t.port, container, &format!("{field}.tcpSocket.port"))?,
        ))
    } else if let Some(e) = &probe.exec {
        let command = e.command.clone().unwrap_or_default();
        let Some((program, args)) = command.split_first() else {
            return Err(KubeletError::PodSpec(format!(
                "{field}.exec.command: must not be empty"
            )));
        };
        let mut launch = exec_base.clone();
        launch.program = program.clone();
        launch.image_program = false;
        launch.args = args.to_vec();
        Action::Exec(launch)
    } else {
        return Err(KubeletError::PodSpec(format!(
            "{field}: set one of httpGet, tcpSocket or exec (grpc probes are not supported)"
        )));
    };
    Ok(ProbeSpec {
        action,
        initial_delay: secs(probe.initial_delay_seconds, 0, 0),
        period: secs(probe.period_seconds, 10, 1),
        timeout: secs(probe.timeout_seconds, 1, 1),
        success_threshold: probe.success_threshold.unwrap_or(1).max(1) as u32,
        failure_threshold: probe.failure_threshold.unwrap_or(3).max(1) as u32,
    })
}

async fn http_get(
    addr: SocketAddr,
    path: &str,
    headers: &[(String, String)],
) -> Result<(), String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("Get \"http://{addr}{path}\": {e}"))?;
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < 4096 {
        let n = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&buf);
    let code: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("malformed HTTP response from {addr}"))?;
    if (200..400).contains(&code) {
        Ok(())
    } else {
        Err(format!("HTTP probe failed with statuscode: {code}"))
    }
}

async fn exec(launch: &Launch, container_pid: i32, timeout: Duration) -> Result<(), String> {
    let mut child = process::spawn(launch, Output::Piped, Namespace::JoinOf(container_pid))
        .map_err(|e| format!("exec {}: {e}", launch.program))?;
    let pgid = child.id().map(|p| p as i32);
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let read = async move {
        let mut out = Vec::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.read_to_end(&mut out).await;
        }
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_end(&mut out).await;
        }
        out
    };
    let outcome = tokio::time::timeout(timeout, async { (read.await, child.wait().await) }).await;
    match outcome {
        Ok((_, Ok(status))) if status.success() => Ok(()),
        Ok((out, Ok(status))) => {
            let text = String::from_utf8_lossy(&out);
            let tail: String = text
                .chars()
                .rev()
                .take(256)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            Err(format!("command exited with {status}: {}", tail.trim()))
        }
        Ok((_, Err(e))) => Err(e.to_string()),
        Err(_) => {
            if let Some(pgid) = pgid {
                process::signal_group(pgid, libc::SIGKILL);
            }
            let _ = child.wait().await;
            Err(format!("command timed out after {timeout:?}"))
        }
    }
}

/// Runs `action` once; `Err` carries the failure message.
pub(crate) async fn run(
    action: &Action,
    timeout: Duration,
    container_pid: i32,
) -> Result<(), String> {
    match action {
        Action::Http {
            addr,
            path,
            headers,
        } => tokio::time::timeout(timeout, http_get(*addr, path, headers))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "Get \"http://{addr}{path}\": timeout after {timeout:?}"
                ))
            }),
        Action::Tcp(addr) => {
            match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(*addr)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("dial tcp {addr}: {e}")),
                Err(_) => Err(format!("dial tcp {addr}: timeout after {timeout:?}")),
            }
        }
        Action::Exec(launch) => exec(launch, container_pid, timeout).await,
        Action::Invalid(message) => Err(message.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Launch {
        Launch {
            program: String::new(),
            args: vec![],
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            working_dir: None,
            mounts: vec![],
            identity: None,
            image_program: false,
            pod_ns: None,
        }
    }

    #[tokio::test]
    async fn http_probe_reads_the_status_code() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            for code in [200, 503] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await.unwrap();
                let resp = format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n");
                s.write_all(resp.as_bytes()).await.unwrap();
            }
        });
        let action = Action::Http {
            addr,
            path: "/readyz".into(),
            headers: vec![],
        };
        assert_eq!(run(&action, Duration::from_secs(5), 0).await, Ok(()));
        let err = run(&action, Duration::from_secs(5), 0).await.unwrap_err();
        assert!(err.contains("503"), "{err}");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn tcp_probe_fails_on_a_closed_port() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert_eq!(
            run(&Action::Tcp(addr), Duration::from_secs(5), 0).await,
            Ok(())
        );
        drop(listener);
        assert!(
            run(&Action::Tcp(addr), Duration::from_secs(5), 0)
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn exec_probe_runs_in_the_target_namespace() {
        let me = std::process::id() as i32;
        let mut ok = base();
        ok.program = "true".into();
        assert_eq!(
            run(&Action::Exec(ok), Duration::from_secs(5), me).await,
            Ok(())
        );
        let mut bad = base();
        bad.program = "sh".into();
        bad.args = vec!["-c".into(), "echo nope >&2; exit 4".into()];
        let err = run(&Action::Exec(bad), Duration::from_secs(5), me)
            .await
            .unwrap_err();
        assert!(err.contains("nope"), "{err}");
    }

    #[tokio::test]
    async fn a_probe_that_cannot_run_always_fails_naming_the_field() {
        let c: Container =
            serde_saphyr::from_str("name: c\nreadinessProbe: {tcpSocket: {port: missing}}\n")
                .unwrap();
        let spec = probe_spec_or_invalid(
            c.readiness_probe.as_ref().unwrap(),
            &c,
            "spec.containers[0].readinessProbe",
            "127.0.0.5".parse().unwrap(),
            &base(),
        );
        let err = run(&spec.action, spec.timeout, 0).await.unwrap_err();
        assert!(
            err.contains("spec.containers[0].readinessProbe.tcpSocket.port"),
            "{err}"
        );
    }

    #[test]
    fn named_ports_and_defaults() {
        let c: Container = serde_saphyr::from_str(
            "name: c\nports: [{name: health, containerPort: 8081}]\nreadinessProbe: {httpGet: {port: health, path: /readyz}}\n",
        )
        .unwrap();
        let p = c.readiness_probe.clone().unwrap();
        let spec = probe_spec(
            &p,
            &c,
            "spec.containers[0].readinessProbe",
            "127.0.0.5".parse().unwrap(),
            &base(),
        )
        .unwrap();
        match spec.action {
            Action::Http { addr, path, .. } => {
                assert_eq!(addr, "127.0.0.5:8081".parse().unwrap());
                assert_eq!(path, "/readyz");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(spec.period, Duration::from_secs(10));
        assert_eq!(spec.failure_threshold, 3);
        let c: Container =
            serde_saphyr::from_str("name: c\nreadinessProbe: {httpGet: {port: nope}}\n").unwrap();
        let err = probe_spec(
            c.readiness_probe.as_ref().unwrap(),
            &c,
            "f",
            "127.0.0.5".parse().unwrap(),
            &base(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("f.httpGet.port"), "{err}");
    }
}
