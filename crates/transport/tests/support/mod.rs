//! A connection served as qproxy serves its main port's HTTP/1.1: this
//! crate's server first, hyper after a hand-off; or hyper alone.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use qproxy_transport::BoxError;
use qproxy_transport::limits::{MAX_HEADER_BYTES, MAX_HEADER_FIELDS};
use qproxy_transport::server::conn::{Protocols, serve_connection};
use qproxy_transport::server::{HeadClock, Lifecycle, MakeBody, WholeBody};
use tokio::io::DuplexStream;
use tower::Service;

/// The request body a test service is given: none or one read whole, by
/// this crate's server; or hyper's (empty or not), once the connection is
/// hyper's.
#[derive(Debug)]
pub(crate) enum TestBody {
    Empty,
    Whole(WholeBody),
    Streamed(Incoming),
}

/// Which server gave the service a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Server {
    /// This crate's.
    Here,
    /// hyper's.
    Hyper,
}

impl TestBody {
    /// Which server gave the service the request of this body.
    pub(crate) fn server(&self) -> Server {
        match self {
            TestBody::Empty | TestBody::Whole(_) => Server::Here,
            TestBody::Streamed(_) => Server::Hyper,
        }
    }
}

impl MakeBody for TestBody {
    fn empty(_: &http::HeaderMap) -> Self {
        TestBody::Empty
    }

    fn whole(body: WholeBody, _: &http::HeaderMap) -> Self {
        TestBody::Whole(body)
    }

    fn streamed(body: Incoming, _: &http::HeaderMap) -> Self {
        TestBody::Streamed(body)
    }
}

impl http_body::Body for TestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            TestBody::Empty => Poll::Ready(None),
            TestBody::Whole(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|never| match never {}),
            TestBody::Streamed(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            TestBody::Empty => true,
            TestBody::Whole(body) => body.is_end_stream(),
            TestBody::Streamed(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            TestBody::Empty => SizeHint::with_exact(0),
            TestBody::Whole(body) => body.size_hint(),
            TestBody::Streamed(body) => body.size_hint(),
        }
    }
}

/// A connection that is never asked to stop.
struct TestLifecycle;

impl Lifecycle for TestLifecycle {
    fn is_stopping(&self) -> bool {
        false
    }

    fn stopping(&self) -> impl Future<Output = ()> {
        std::future::pending()
    }
}

/// How many bytes the future of a connection served with `service`
/// takes (what every connection's task holds while it waits), beyond the
/// maker of its services (a clone of `service`).
pub(crate) fn connection_room<S, B>(service: S) -> usize
where
    S: Service<Request<TestBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let make = move || service.clone();
    let room = std::mem::size_of_val(&make);
    let (io, _client) = tokio::io::duplex(64);
    let protocols = std::sync::Arc::new(Protocols::new(
        true,
        hyper::server::conn::http1::Builder::new(),
        None,
    ));
    let clock = HeadClock::new(Duration::from_secs(60));
    let connection = serve_connection(io, clock, protocols, make, TestLifecycle);
    std::mem::size_of_val(&connection) - room
}

/// Serves `io` with `service` as qproxy serves its main port's HTTP/1.1
/// ([`serve_connection`]): this crate's server until it hands the
/// connection over, then hyper (when `own`); hyper alone otherwise.
pub(crate) fn spawn_connection<S, B>(
    io: DuplexStream,
    own: bool,
    service: S,
) -> tokio::task::JoinHandle<()>
where
    S: Service<Request<TestBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    spawn_on_port(io, own, false, service)
}

/// [`spawn_connection`], on a port that is crowded (`crowded`: a
/// connection lets its room go as soon as it waits) or not.
pub(crate) fn spawn_on_port<S, B>(
    io: DuplexStream,
    own: bool,
    crowded: bool,
    service: S,
) -> tokio::task::JoinHandle<()>
where
    S: Service<Request<TestBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .title_case_headers(true)
        .max_buf_size(MAX_HEADER_BYTES)
        .max_headers(MAX_HEADER_FIELDS);
    let mut protocols = Protocols::new(own, http1, None);
    if crowded {
        protocols = protocols.crowded_past(0);
    }
    let protocols = std::sync::Arc::new(protocols);
    tokio::spawn(async move {
        let clock = HeadClock::new(Duration::from_secs(60));
        serve_connection(io, clock, protocols, move || service.clone(), TestLifecycle).await;
    })
}
