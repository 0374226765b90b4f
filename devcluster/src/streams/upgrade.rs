//! HTTP/1.1 upgrade handshakes for the streaming subresources: which
//! protocol a request asks for (WebSocket with its subprotocols, or SPDY/3.1
//! with `X-Stream-Protocol-Version`), and the `101 Switching Protocols`
//! answer for the one chosen.

use http::{HeaderMap, StatusCode, header};

/// The SPDY upgrade token.
pub(crate) const SPDY: &str = "SPDY/3.1";
/// The header naming SPDY stream protocols (offered and chosen).
pub(crate) const STREAM_PROTOCOL: &str = "X-Stream-Protocol-Version";

/// What an upgrade request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// WebSocket, with the offered subprotocols in the client's order.
    WebSocket {
        /// `Sec-WebSocket-Key`.
        key: String,
        /// `Sec-WebSocket-Protocol` values.
        protocols: Vec<String>,
    },
    /// SPDY/3.1, with the offered stream protocols.
    Spdy {
        /// `X-Stream-Protocol-Version` values.
        protocols: Vec<String>,
    },
}

fn tokens(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The upgrade a request asks for, if any.
pub(crate) fn kind(headers: &HeaderMap) -> Option<Kind> {
    let upgrade = tokens(headers, header::UPGRADE.as_str());
    let connection = tokens(headers, header::CONNECTION.as_str());
    if !connection.iter().any(|c| c.eq_ignore_ascii_case("upgrade")) {
        return None;
    }
    if upgrade.iter().any(|u| u.eq_ignore_ascii_case("websocket")) {
        let key = headers
            .get(header::SEC_WEBSOCKET_KEY)
            .and_then(|v| v.to_str().ok())?
            .to_string();
        return Some(Kind::WebSocket {
            key,
            protocols: tokens(headers, header::SEC_WEBSOCKET_PROTOCOL.as_str()),
        });
    }
    if upgrade.iter().any(|u| u.eq_ignore_ascii_case(SPDY)) {
        return Some(Kind::Spdy {
            protocols: tokens(headers, STREAM_PROTOCOL),
        });
    }
    None
}

/// The first offered protocol that is supported.
pub(crate) fn choose<'a>(offered: &[String], supported: &[&'a str]) -> Option<&'a str> {
    offered
        .iter()
        .find_map(|o| supported.iter().find(|s| **s == o.as_str()).copied())
}

/// `101 Switching Protocols` for `kind` with the chosen `protocol`.
pub(crate) fn switching(kind: &Kind, protocol: &str) -> http::response::Builder {
    let b = http::Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade");
    match kind {
        Kind::WebSocket { key, .. } => b
            .header(header::UPGRADE, "websocket")
            .header(
                header::SEC_WEBSOCKET_ACCEPT,
                tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()),
            )
            .header(header::SEC_WEBSOCKET_PROTOCOL, protocol),
        Kind::Spdy { .. } => b
            .header(header::UPGRADE, SPDY)
            .header(STREAM_PROTOCOL, protocol),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn websocket_and_spdy_requests_are_told_apart() {
        let ws = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            (
                "sec-websocket-protocol",
                "v5.channel.k8s.io, v4.channel.k8s.io",
            ),
        ]);
        let k = kind(&ws).unwrap();
        let Kind::WebSocket { protocols, .. } = &k else {
            panic!("{k:?}")
        };
        assert_eq!(
            choose(protocols, &["v4.channel.k8s.io"]),
            Some("v4.channel.k8s.io")
        );
        let r = switching(&k, "v4.channel.k8s.io").body(()).unwrap();
        // RFC 6455's example key and answer.
        assert_eq!(
            r.headers()[header::SEC_WEBSOCKET_ACCEPT],
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        let spdy = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v4.channel.k8s.io"),
            ("x-stream-protocol-version", "v3.channel.k8s.io"),
        ]);
        assert_eq!(
            kind(&spdy),
            Some(Kind::Spdy {
                protocols: vec!["v4.channel.k8s.io".into(), "v3.channel.k8s.io".into()]
            })
        );
        assert_eq!(kind(&headers(&[("upgrade", "websocket")])), None);
    }
}
