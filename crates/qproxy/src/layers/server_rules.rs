//! What Go's `net/http` server does to HTTP/1 requests before any handler
//! runs, and so what every client of Knative's queue-proxy has always seen
//! (HTTP/2 requests go through Go's h2 server, which does none of this):
//!
//! - an HTTP/1.1 request without `Host` (CONNECT aside) is `400` with the
//!   reason `Bad Request: missing required Host header`, and the
//!   connection is closed;
//! - a single `Host` holding a byte Go does not accept in a host is `400`
//!   `Bad Request: malformed Host header`;
//! - `OPTIONS *` is answered by the server itself, `200` with an empty
//!   body, and never reaches the app;
//! - a request head longer than Go reads (1 MiB and 4 KiB, request line
//!   included) is `431` `Request Header Fields Too Large`, and the
//!   connection is closed, before any of the above: Go refuses it as it
//!   reads it. Only heads hyper reads can be that long, and
//!   `qproxy-transport`'s connection refuses them before this layer sees them
//!   ([`qproxy_transport::server::conn::serve_connection`]).

use std::convert::Infallible;
use std::task::{Context, Poll};

use http::header::HOST;
use http::{Method, Request, Response, StatusCode, Version};
use tower::{Layer, Service};

use super::answering::{Answering, FromReply};
use qproxy_core::body::ReplyBody;
use qproxy_core::reply::server_error;

/// Adds [`ServerRules`] to a stack.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ServerRulesLayer;

impl<S> Layer<S> for ServerRulesLayer {
    type Service = ServerRules<S>;

    fn layer(&self, inner: S) -> ServerRules<S> {
        ServerRules { inner }
    }
}

/// Answers the requests Go's server answers itself; passes the rest on.
#[derive(Debug, Clone)]
pub(crate) struct ServerRules<S> {
    inner: S,
}

impl<S, B, ResBody> Service<Request<B>> for ServerRules<S>
where
    S: Service<Request<B>, Response = Response<ResBody>, Error = Infallible>,
    ResBody: FromReply,
{
    type Response = Response<ResBody>;
    type Error = Infallible;
    type Future = Answering<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        match answer(&req) {
            Some(res) => Answering::now(res),
            None => Answering::inner(self.inner.call(req)),
        }
    }
}

/// The answer Go's server gives `req` by itself once it has read it
/// whole, if any.
pub(crate) fn answer<B>(req: &Request<B>) -> Option<Response<ReplyBody>> {
    if req.version() >= Version::HTTP_2 {
        return None;
    }
    if req.method() == Method::OPTIONS && req.uri() == "*" {
        return Some(Response::new(ReplyBody::empty()));
    }
    let mut hosts = req.headers().get_all(HOST).iter();
    match (hosts.next(), hosts.next()) {
        (None, _) if req.version() == Version::HTTP_11 && req.method() != Method::CONNECT => {
            Some(bad_request("missing required Host header"))
        }
        (Some(host), None) if !host.as_bytes().iter().all(|b| valid_host_byte(*b)) => {
            Some(bad_request("malformed Host header"))
        }
        _ => None,
    }
}

/// Go's `httpguts.ValidHostHeader` alphabet: letters, digits and the
/// punctuation of hosts, IPv6 literals, zones and ports.
fn valid_host_byte(b: u8) -> bool {
    HOST_BYTES[usize::from(b)]
}

/// [`valid_host_byte`] for every byte: a host is checked with every
/// request.
static HOST_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let punctuation = b"!$%&()*+,-.:;=[]'_~";
    let mut i = 0;
    while i < punctuation.len() {
        table[punctuation[i] as usize] = true;
        i += 1;
    }
    table
};

/// Go's reply to a request without a usable host.
fn bad_request(reason: &'static str) -> Response<ReplyBody> {
    server_error(StatusCode::BAD_REQUEST, &format!("Bad Request: {reason}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    use http::header::CONNECTION;
    use hyper::ext::ReasonPhrase;

    fn req(method: Method, uri: &str, version: Version, hosts: &[&str]) -> Request<()> {
        let mut b = Request::builder().method(method).uri(uri).version(version);
        for h in hosts {
            b = b.header(HOST, *h);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn options_star_is_answered_here() {
        let res = answer(&req(Method::OPTIONS, "*", Version::HTTP_11, &["h"])).unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(answer(&req(Method::OPTIONS, "/", Version::HTTP_11, &["h"])).is_none());
    }

    #[test]
    fn http11_needs_a_valid_host() {
        let res = answer(&req(Method::GET, "/", Version::HTTP_11, &[])).unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST);
        assert_eq!(res.headers()[CONNECTION], "close");
        assert_eq!(
            res.extensions().get::<ReasonPhrase>().unwrap().as_bytes(),
            b"Bad Request: missing required Host header"
        );
        let res = answer(&req(Method::GET, "/", Version::HTTP_11, &["a b"])).unwrap();
        assert_eq!(
            res.extensions().get::<ReasonPhrase>().unwrap().as_bytes(),
            b"Bad Request: malformed Host header"
        );
        for ok in ["h", "", "[::1]:80", "a.b-c_d~e:8080", "fe80::1%25eth0"] {
            assert!(
                answer(&req(Method::GET, "/", Version::HTTP_11, &[ok])).is_none(),
                "{ok}"
            );
        }
        // Several Host headers pass: the first one counts, as in Go.
        assert!(answer(&req(Method::GET, "/", Version::HTTP_11, &["a", "b c"])).is_none());
    }

    #[test]
    fn the_host_alphabet_is_go_s() {
        let go: Vec<u8> = (0..=255u8)
            .filter(|b| b.is_ascii_alphanumeric() || b"!$%&()*+,-.:;=[]'_~".contains(b))
            .collect();
        let here: Vec<u8> = (0..=255u8).filter(|b| valid_host_byte(*b)).collect();
        assert_eq!(here, go);
    }

    #[test]
    fn http10_and_connect_need_no_host_but_a_valid_one() {
        assert!(answer(&req(Method::GET, "/", Version::HTTP_10, &[])).is_none());
        assert!(answer(&req(Method::CONNECT, "h:443", Version::HTTP_11, &[])).is_none());
        assert!(answer(&req(Method::GET, "/", Version::HTTP_10, &["a b"])).is_some());
        assert!(answer(&req(Method::CONNECT, "h:443", Version::HTTP_11, &["a b"])).is_some());
    }

    #[test]
    fn http2_is_left_to_the_handlers() {
        assert!(answer(&req(Method::GET, "http://h/", Version::HTTP_2, &[])).is_none());
        assert!(answer(&req(Method::GET, "http://h/", Version::HTTP_2, &["a b"])).is_none());
        assert!(answer(&req(Method::OPTIONS, "*", Version::HTTP_2, &[])).is_none());
    }
}
