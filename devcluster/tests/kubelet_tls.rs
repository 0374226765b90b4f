//! The kubelet endpoint as a real kube-apiserver reaches it: HTTPS, a client
//! certificate signed by the configured client CA, authorized by a
//! `SubjectAccessReview` on `nodes/proxy`; logs and exec (WebSocket) over
//! it; refusals without a certificate (401), for a user without access
//! (403) and for a certificate of another CA (handshake refused).

mod kubelet_common;

use std::sync::Arc;

use futures::StreamExt as _;
use http_body_util::BodyExt as _;
use kubelet_common::{Cluster, phase};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = p.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(p, key),
    }
}

/// A client certificate and key signed by `ca` for `cn` in `orgs`.
fn client_cert(
    ca: &Ca,
    cn: &str,
    orgs: &[&str],
) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    for o in orgs {
        p.distinguished_name.push(DnType::OrganizationName, *o);
    }
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = p.signed_by(&key, &ca.issuer).unwrap();
    (
        CertificateDer::from(cert.der().to_vec()),
        PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
    )
}

/// kube-apiserver does not verify the kubelet's serving certificate unless
/// told to; neither does this client.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

async fn connect(
    addr: std::net::SocketAddr,
    cert: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)));
    let cfg = match cert {
        Some((c, k)) => builder.with_client_auth_cert(vec![c], k).unwrap(),
        None => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("node").unwrap().to_owned(), tcp)
        .await
}

/// `GET path` over a TLS connection: (status, body).
async fn get(
    addr: std::net::SocketAddr,
    cert: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
    path: &str,
) -> std::io::Result<(u16, String)> {
    let tls = connect(addr, cert).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    let resp = sender
        .send_request(
            http::Request::get(path)
                .header("host", "node")
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
        .await
        .map_err(std::io::Error::other)?;
    let code = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kube_apiserver_reaches_the_kubelet_with_its_client_certificate() {
    let authority = ca("test-cluster-ca");
    let ca_pem = authority.pem.clone();
    let cluster = Cluster::start_with(220, move |c| {
        c.client_ca = Some(ca_pem);
        // Only certificates: no token is accepted here.
        c.log_token = None;
    })
    .await;
    cluster
        .create_pod(
            r#"
metadata: {name: talker}
spec:
  containers:
  - name: main
    image: busybox
    command: [sh, -c, 'echo hello from the log; sleep 3600']
"#,
        )
        .await;
    cluster
        .wait_pod("talker", "Running", |p| phase(p) == "Running")
        .await;
    let node: k8s_openapi::api::core::v1::Node = kube::Api::all(cluster.client.clone())
        .get(&cluster.node)
        .await
        .unwrap();
    let status = node.status.unwrap();
    let ip = status
        .addresses
        .unwrap()
        .into_iter()
        .find(|a| a.type_ == "InternalIP")
        .unwrap()
        .address;
    let port = status
        .daemon_endpoints
        .unwrap()
        .kubelet_endpoint
        .unwrap()
        .port;
    let addr: std::net::SocketAddr = format!("{ip}:{port}").parse().unwrap();
    let apiserver = || {
        client_cert(
            &authority,
            "kube-apiserver-kubelet-client",
            &["system:masters"],
        )
    };

    let log = "/containerLogs/default/talker/main";
    let body = hostmesh_testkit::eventually_ok("the log over HTTPS", async || {
        match get(addr, Some(apiserver()), log).await {
            Ok((200, b)) if b.contains("hello from the log") => Ok(b),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(body.contains("hello from the log"));
    let (code, body) = get(addr, Some(client_cert(&authority, "nobody", &[])), log)
        .await
        .unwrap();
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("user=nobody"), "{body}");
    let (code, _) = get(addr, None, log).await.unwrap();
    assert_eq!(code, 401);
    let other = ca("another-ca");
    assert!(
        get(
            addr,
            Some(client_cert(
                &other,
                "kube-apiserver-kubelet-client",
                &["system:masters"]
            )),
            log
        )
        .await
        .is_err(),
        "a certificate of another CA is refused in the handshake"
    );

    // exec over WebSocket on the same connection kind.
    let tls = connect(addr, Some(apiserver())).await.unwrap();
    let mut req = "wss://node/exec/default/talker/main?command=echo&command=over-tls&output=1"
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        "v4.channel.k8s.io".parse().unwrap(),
    );
    let (mut ws, resp) = tokio_tungstenite::client_async(req, tls).await.unwrap();
    assert_eq!(
        resp.headers()["sec-websocket-protocol"],
        "v4.channel.k8s.io"
    );
    let (mut stdout, mut status) = (Vec::new(), None);
    while let Some(Ok(m)) = ws.next().await {
        if let Message::Binary(b) = m {
            match b.first() {
                Some(1) => stdout.extend_from_slice(&b[1..]),
                Some(3) => {
                    status = Some(serde_json::from_slice::<serde_json::Value>(&b[1..]).unwrap())
                }
                _ => {}
            }
        }
    }
    assert_eq!(String::from_utf8_lossy(&stdout), "over-tls\n");
    assert_eq!(status.unwrap()["status"], "Success");
    cluster.stop().await;
}
