//! HTTP responses of the API server: the body type (a whole document or a
//! stream), JSON and Status-object responses, and streaming responses for
//! watches and proxied logs.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use serde_json::Value;
use tokio::sync::mpsc;

use super::status::ApiError;

/// The response body: a whole JSON document or a stream.
pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

pub(crate) fn full(code: u16, content_type: &str, body: Bytes) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(body).boxed_unsync())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed_unsync()))
}

pub(crate) fn json_response(code: u16, v: &Value) -> Response<Body> {
    full(
        code,
        "application/json",
        Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
    )
}

pub(crate) fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.to_status())
}

/// A streaming response fed by `rx`.
pub(crate) fn stream_response(rx: mpsc::Receiver<Bytes>, content_type: &str) -> Response<Body> {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(StreamBody::new(stream).boxed_unsync())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed_unsync()))
}
