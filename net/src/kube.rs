//! Kubernetes clients whose connections resolve the API server's name with
//! [`Resolver`] instead of `getaddrinfo` (kube's default connector runs
//! hyper-util's `GaiResolver`, the C library's resolver on a blocking thread).
//!
//! [`kube_client_builder`] builds the same stack as
//! `kube::client::ClientBuilder::try_from(Config)`: an HTTP connector (here
//! with [`HyperResolver`]), TLS from the config (rustls, `tls-server-name`
//! honoured), the config's connect/read/write timeouts, the base URI, kube's
//! retry policy for server errors, authentication (tokens, refreshing token
//! files, exec plugins) and extra headers. It leaves out kube's `debug`-level
//! HTTP tracing spans. A config with a proxy URL goes to kube's own builder
//! unchanged (the proxy resolves the API server's name).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::TokioExecutor;
use kube::client::{Body, ClientBuilder, ConfigExt as _, DynBody};
use tower::util::BoxService;
use tower::{BoxError, ServiceBuilder, ServiceExt as _};

use crate::resolve::{ResolveError, Resolver};

/// The service a [`kube_client_builder`] wraps: kube's own default stack
/// type, so layers written for `ClientBuilder::try_from` fit unchanged.
pub type ClientService = BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;

/// [`Resolver`] as hyper-util's resolver (a `Service<Name>`); the connector
/// puts the URI's port on the addresses.
#[derive(Debug, Clone, Default)]
pub struct HyperResolver(pub Resolver);

impl tower::Service<Name> for HyperResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = ResolveError;
    type Future =
        Pin<Box<dyn Future<Output = Result<std::vec::IntoIter<SocketAddr>, ResolveError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ResolveError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let resolver = self.0.clone();
        Box::pin(async move {
            let ips = resolver.lookup_ip(name.as_str()).await?;
            Ok(ips
                .into_iter()
                .map(|ip| SocketAddr::new(ip, 0))
                .collect::<Vec<_>>()
                .into_iter())
        })
    }
}

/// A client for `config` that resolves names with [`Resolver::system`].
pub fn kube_client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    Ok(kube_client_builder(config, Resolver::system())?.build())
}

/// kube's default client stack for `config`, resolving with `resolver`; add
/// layers with `with_layer`, then `build`.
pub fn kube_client_builder(
    config: kube::Config,
    resolver: Resolver,
) -> Result<ClientBuilder<ClientService>, kube::Error> {
    if config.proxy_url.is_some() {
        return ClientBuilder::try_from(config);
    }
    let mut http = HttpConnector::new_with_resolver(HyperResolver(resolver));
    http.enforce_http(false);
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let client: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector);

    let retry = config
        .default_retry
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(client)
        .map_response(|res| {
            res.map(|body| {
                Box::new(http_body_util::BodyExt::map_err(body, BoxError::from)) as Box<DynBody>
            })
        })
        .boxed();
    Ok(ClientBuilder::new(service, config.default_namespace))
}
