//! The hickory request handler: turns the current [`Zone`]'s [`Answer`]
//! into a DNS response. Wire format, UDP truncation and TCP framing are
//! hickory's.
//!
//! Invariants:
//! 1. Before the zone's first build (caches not synced) every query gets
//!    SERVFAIL, so resolvers retry instead of caching a wrong NXDOMAIN.
//! 2. Names outside the zone, and classes other than IN, get REFUSED:
//!    nothing is forwarded, no traffic leaves.
//! 3. In-zone answers are authoritative; NXDOMAIN and NODATA carry the
//!    zone's SOA in the authority section (negative caching, RFC 2308).
//! 4. Recursion is never offered (`RA` is clear).

use std::sync::Arc;

use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{Edns, Header, HeaderCounts, Metadata, OpCode, ResponseCode};
use hickory_server::proto::rr::{DNSClass, Record};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use tokio::sync::watch;

use super::records::{Answer, Zone};

/// Answers queries from the latest zone the feed published.
#[derive(Clone)]
pub(crate) struct DnsHandler {
    pub(crate) zone: watch::Receiver<Option<Arc<Zone>>>,
}

impl DnsHandler {
    fn current(&self) -> Option<Arc<Zone>> {
        self.zone.borrow().clone()
    }
}

#[async_trait::async_trait]
impl RequestHandler for DnsHandler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response: R,
    ) -> ResponseInfo {
        let edns = request.edns.as_ref().map(|req| {
            let mut e = Edns::new();
            e.set_max_payload(req.max_payload().max(512));
            e
        });
        let mut meta = Metadata::response_from_request(&request.metadata);
        let builder = MessageResponseBuilder::new(&request.queries, edns.as_ref());
        if request.metadata.op_code != OpCode::Query {
            meta.response_code = ResponseCode::NotImp;
            return send(&mut response, builder.build_no_records(meta)).await;
        }
        let query = match request.request_info() {
            Ok(info) => info.query,
            Err(_) => {
                meta.response_code = ResponseCode::FormErr;
                return send(&mut response, builder.build_no_records(meta)).await;
            }
        };
        let Some(zone) = self.current() else {
            meta.response_code = ResponseCode::ServFail;
            return send(&mut response, builder.build_no_records(meta)).await;
        };
        if query.query_class() != DNSClass::IN {
            meta.response_code = ResponseCode::Refused;
            return send(&mut response, builder.build_no_records(meta)).await;
        }
        let answer = zone.lookup(query.name(), query.query_type());
        let soa = [zone.soa().clone()];
        let none: [Record; 0] = [];
        match answer {
            Answer::Found {
                answers,
                additionals,
            } => {
                meta.authoritative = true;
                let msg = builder.build(
                    meta,
                    answers.iter(),
                    none.iter(),
                    none.iter(),
                    additionals.iter(),
                );
                send(&mut response, msg).await
            }
            Answer::NoData | Answer::NxDomain => {
                meta.authoritative = true;
                if answer == Answer::NxDomain {
                    meta.response_code = ResponseCode::NXDomain;
                }
                let msg = builder.build(meta, none.iter(), none.iter(), soa.iter(), none.iter());
                send(&mut response, msg).await
            }
            Answer::NotAuthoritative => {
                meta.response_code = ResponseCode::Refused;
                send(&mut response, builder.build_no_records(meta)).await
            }
        }
    }
}

async fn send<'a, R: ResponseHandler>(
    response: &mut R,
    msg: hickory_server::zone_handler::MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
    >,
) -> ResponseInfo {
    let meta = *msg.metadata();
    match response.send_response(msg).await {
        Ok(info) => info,
        Err(e) => {
            tracing::debug!(error = %e, "could not send a DNS response");
            let mut failed = meta;
            failed.response_code = ResponseCode::ServFail;
            ResponseInfo::from(Header {
                metadata: failed,
                counts: HeaderCounts::default(),
            })
        }
    }
}
