//! The reverse proxy to the user container: the innermost service of the
//! main port.
//!
//! It does what Knative's `NewHeaderPruningReverseProxy` (a Go
//! `httputil.ReverseProxy`) does to a request: removes the activator's
//! `Knative-Serving-Revision` and `Knative-Serving-Namespace`, keeps the
//! host, appends the client's address to `X-Forwarded-For`, drops hop-by-hop
//! headers ([`hop`]), and sends HTTP/1 as HTTP/1.1 and HTTP/2 as h2c
//! through the transport's [`Connector`], which dials the app, keeps its
//! connections and sends again by Go's rules. An upgrade the app accepts with `101`, and a `CONNECT`
//! it accepts with a `2xx` (over HTTP/1.1 or HTTP/2), becomes a two-way
//! byte tunnel ([`tunnel_copy`]). A failure to reach the app is `502` with Go's
//! error text as the body, logged once.

pub(crate) mod body;
pub(crate) mod error;
pub(crate) mod hop;
pub(crate) mod timing;
pub(crate) mod tunnel_copy;

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, BytesMut};
use http::header::{CONTENT_LENGTH, HOST, HeaderValue, TRANSFER_ENCODING};
use http::uri::{Authority, PathAndQuery, Scheme, Uri};
use http::{Method, Request, Response, StatusCode, Version};
use hyper::upgrade::OnUpgrade;
use tokio::sync::mpsc;
use tower::Service;

use crate::config::{LiveOptions, Opt};
use crate::proxy::body::ProxyBody;
use crate::proxy::timing::Timing;
use crate::tunnel_registry::TunnelDeadline;
pub(crate) use error::UpstreamError;
use qproxy_core::body::{Content, ReplyBody, RequestBody};
use qproxy_core::headers::{KNATIVE_SERVING_NAMESPACE, KNATIVE_SERVING_REVISION, X_FORWARDED_FOR};
use qproxy_core::reply::http_error;
use qproxy_observe::startup::Startup;
use qproxy_transport::client::Payload;
use qproxy_transport::connector::{Answer, Connector, Http1Request};
use tunnel_copy::AppSide;

/// The reverse proxy for one client connection.
#[derive(Debug, Clone)]
pub(crate) struct Proxy {
    upstream: Arc<Connector>,
    /// The client's IP, as appended to `X-Forwarded-For`.
    client_ip: HeaderValue,
    /// Told when the app answers, for its first answer.
    startup: Arc<Startup>,
    /// qproxy's options: whether `Server-Timing` is on, and whether
    /// bytes may be spliced.
    options: LiveOptions,
}

impl Proxy {
    /// A proxy for requests arriving from `client`.
    pub(crate) fn new(
        upstream: Arc<Connector>,
        client: IpAddr,
        startup: Arc<Startup>,
        options: LiveOptions,
    ) -> Self {
        // An IP address is always a valid header value.
        let client_ip = HeaderValue::try_from(client.to_canonical().to_string())
            .unwrap_or_else(|_| HeaderValue::from_static(""));
        Self {
            upstream,
            client_ip,
            startup,
            options,
        }
    }
}

impl Service<Request<RequestBody>> for Proxy {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<RequestBody>) -> Self::Future {
        if self.options.has(Opt::ServerTiming) {
            return self.answer_with_timing(req);
        }
        self.answer(req)
    }
}

impl Proxy {
    /// The answer with `Server-Timing` ([`timing`]): a future of its own
    /// around the common one, which carries nothing for it.
    #[cold]
    #[inline(never)]
    fn answer_with_timing(
        &mut self,
        req: Request<RequestBody>,
    ) -> <Self as Service<Request<RequestBody>>>::Future {
        let timing = Timing::start(&req);
        let answer = self.answer(req);
        Box::pin(async move {
            let mut res = answer.await?;
            timing.add_to(res.headers_mut());
            if timing::is_grpc(res.headers()) {
                let body = std::mem::replace(res.body_mut(), ReplyBody::empty().into());
                *res.body_mut() = body.timed(timing);
            }
            Ok(res)
        })
    }

    /// The answer.
    #[inline(never)]
    fn answer(
        &mut self,
        mut req: Request<RequestBody>,
    ) -> <Self as Service<Request<RequestBody>>>::Future {
        // Only until the app's first answer to a request that is not a
        // probe: a load on every request after.
        let first = (self.startup.awaits_first_request() && !req.body().facts.is_probe())
            .then(|| self.startup.clone());
        let hop = self.prepare(&mut req);
        let tunnel = Tunnel::asked(&mut req, hop, &self.options);
        if req.version() == Version::HTTP_2 {
            let this = self.clone();
            return Box::pin(async move {
                let res = match tunnel {
                    Ok(tunnel) => this.forward_h2(req, tunnel).await,
                    Err(err) => Err(err),
                };
                Ok(answer(res, first))
            });
        }
        // Every HTTP/1 request, `CONNECT` and upgrades included, written
        // out here, so that its future holds only what it waits with.
        let sent = tunnel.and_then(|tunnel| {
            let req = self.http1_request(req)?;
            let req = req.spliced(!self.options.has(Opt::NoSplice));
            Ok((self.upstream.clone(), req, tunnel))
        });
        Box::pin(async move {
            let res = match sent {
                Ok((upstream, req, tunnel)) => match upstream.send(req).await {
                    Ok(Answer::Response(res)) => Ok(finish(res)),
                    Ok(Answer::Switched(switched)) => {
                        let (head, app) = *switched;
                        Tunnel::open(tunnel, head, AppSide::Connection(app))
                    }
                    Err(err) => Err(err.into()),
                },
                Err(err) => Err(err),
            };
            Ok(answer(res, first))
        })
    }
}

/// A request that may become a two-way byte tunnel: an upgrade, or a
/// `CONNECT` (boxed: rare, and every request's future carries room for
/// it).
struct Tunnel {
    asked: Asked,
    /// The client's side of the tunnel, once the `101` (or `2xx`) is sent.
    client: OnUpgrade,
    deadline: Option<TunnelDeadline>,
    /// Its bytes may be spliced (the `no-splice` option is off).
    splice: bool,
}

/// What a client asked for that opens a tunnel.
enum Asked {
    /// An HTTP/1.1 upgrade to this protocol.
    Upgrade(HeaderValue),
    /// A `CONNECT`, over HTTP/1.1 or HTTP/2.
    Connect,
}

impl Tunnel {
    /// The tunnel `req` asks for: a `CONNECT`, or (over HTTP/1.1) the
    /// upgrade `hop` read as its hop-by-hop headers were removed; a
    /// protocol that is not printable ASCII is refused, as Go refuses it.
    /// Whether its bytes may be spliced is read from `options` then.
    fn asked(
        req: &mut Request<RequestBody>,
        hop: hop::Hop,
        options: &LiveOptions,
    ) -> Result<Option<Box<Tunnel>>, UpstreamError> {
        let asked = match hop.upgrade {
            _ if req.method() == Method::CONNECT => Asked::Connect,
            Some(protocol) if req.version() != Version::HTTP_2 => {
                if !is_printable(protocol.as_bytes()) {
                    return Err(UpstreamError::InvalidClientUpgrade(
                        protocol.as_bytes().to_vec(),
                    ));
                }
                Asked::Upgrade(protocol)
            }
            _ => return Ok(None),
        };
        Ok(Some(Box::new(Tunnel {
            asked,
            client: hyper::upgrade::on(&mut *req),
            deadline: req.extensions().get::<TunnelDeadline>().copied(),
            splice: !options.has(Opt::NoSplice),
        })))
    }

    /// The app accepted a tunnel with `head` (a `101`, or a `2xx` to
    /// `CONNECT`): the tunnel between the client and `app` runs, and the
    /// head goes to the client. An upgrade to another protocol than the
    /// client asked for (or one nobody asked for) is `502`, as Go's
    /// reverse proxy answers; a `101` keeps its `Connection` and
    /// `Upgrade`, a `CONNECT`'s answer is passed on without hop-by-hop
    /// headers or body framing.
    fn open(
        tunnel: Option<Box<Tunnel>>,
        mut head: Response<()>,
        app: AppSide,
    ) -> Result<Response<ProxyBody>, UpstreamError> {
        let offered = || hop::upgrade_type(head.headers()).map(HeaderValue::as_bytes);
        let Some(tunnel) = tunnel else {
            return Err(mismatch(None, offered()));
        };
        match &tunnel.asked {
            Asked::Upgrade(protocol) => {
                if !offered().is_some_and(|o| protocol.as_bytes().eq_ignore_ascii_case(o)) {
                    return Err(mismatch(Some(protocol.as_bytes()), offered()));
                }
            }
            Asked::Connect => {
                pass_on(&mut head);
                // What follows the head is the tunnel's: no body framing.
                head.headers_mut().remove(CONTENT_LENGTH);
                head.headers_mut().remove(TRANSFER_ENCODING);
            }
        }
        let Tunnel {
            client,
            deadline,
            splice,
            ..
        } = *tunnel;
        let mut res = head.map(|()| ProxyBody::from(ReplyBody::empty()));
        res.extensions_mut()
            .insert(tunnel_copy::spawn(client, app, deadline, splice));
        Ok(res)
    }
}

impl Proxy {
    /// What Go's reverse proxy does to every request's headers: the
    /// activator's removed, the hop-by-hop ones removed, the client
    /// appended to `X-Forwarded-For`. Returns the upgrade asked for.
    fn prepare(&self, req: &mut Request<RequestBody>) -> hop::Hop {
        let facts = req.body().facts;
        let headers = req.headers_mut();
        if facts.has_activator_routing() {
            headers.remove(KNATIVE_SERVING_REVISION);
            headers.remove(KNATIVE_SERVING_NAMESPACE);
        }
        let hop = hop::prepare_request_with(headers, facts.hop());
        append_forwarded_for(headers, &self.client_ip);
        hop
    }

    /// An HTTP/2 request, over h2c. A `CONNECT` is passed on as Go's
    /// reverse proxy passes it: the client's stream and the app's answer
    /// streamed both ways. hyper's server hands the client's stream over
    /// once a `2xx` head is sent, so a `2xx` answer becomes a tunnel
    /// between the two streams (the app's body included, without its
    /// `Content-Length`, which a `2xx` to `CONNECT` may not carry);
    /// anything else is an ordinary response.
    async fn forward_h2(
        &self,
        req: Request<RequestBody>,
        tunnel: Option<Box<Tunnel>>,
    ) -> Result<Response<ProxyBody>, UpstreamError> {
        let Some(tunnel) = tunnel else {
            let req = self.h2_request(req)?;
            let res = self.upstream.send_h2c(req).await?;
            return Ok(finish(res.map(ProxyBody::H2c)));
        };
        // One message in flight: the client is read as fast as the app's
        // stream takes it.
        let (to_app, from_client) = mpsc::channel(1);
        let req = self.h2_request(
            req.map(|body| RequestBody::new(Content::Tunnel(from_client), body.facts)),
        )?;
        let res = self.upstream.send_h2c(req).await?;
        if !res.status().is_success() {
            return Ok(finish(res.map(ProxyBody::H2c)));
        }
        let (parts, from_app) = res.into_parts();
        let head = Response::from_parts(parts, ());
        Tunnel::open(
            Some(tunnel),
            head,
            AppSide::Stream {
                from_app: ProxyBody::H2c(from_app),
                to_app,
            },
        )
    }

    /// An HTTP/1.1 request for `127.0.0.1:USER_PORT`, its target in origin
    /// form, keeping the client's host in `Host` (the app's address when
    /// the client sent none, as Go's transport writes it), made ready to
    /// send. A `CONNECT` keeps the client's target, which is its `Host`
    /// too.
    fn http1_request(
        &self,
        req: Request<RequestBody>,
    ) -> Result<Http1Request<RequestBody>, UpstreamError> {
        let (mut parts, body) = req.into_parts();
        parts.version = Version::HTTP_11;
        if parts.method == Method::CONNECT {
            if let Some(authority) = parts.uri.authority() {
                let host = HeaderValue::try_from(authority.as_str())
                    .map_err(|_| UpstreamError::InvalidHost)?;
                parts.headers.insert(HOST, host);
            }
            return Ok(Http1Request::new(parts, payload(body)));
        }
        let uri = std::mem::take(&mut parts.uri).into_parts();
        // The host of an absolute-form request line wins over `Host`, as in Go.
        if let Some(authority) = uri.authority {
            let host = HeaderValue::try_from(authority.as_str())
                .map_err(|_| UpstreamError::InvalidHost)?;
            parts.headers.insert(HOST, host);
        } else if !parts.headers.contains_key(HOST) {
            let app = HeaderValue::try_from(self.upstream.authority().as_str())
                .map_err(|_| UpstreamError::InvalidHost)?;
            parts.headers.insert(HOST, app);
        }
        parts.uri = match uri.path_and_query {
            Some(path) if path.as_str() != "/" => Uri::from(path),
            _ => Uri::from_static("/"),
        };
        Ok(Http1Request::new(parts, payload(body)))
    }

    /// An HTTP/2 request whose `:authority` is the client's host.
    fn h2_request(&self, req: Request<RequestBody>) -> Result<Request<RequestBody>, UpstreamError> {
        let (mut parts, body) = req.into_parts();
        let mut uri = std::mem::take(&mut parts.uri).into_parts();
        let host = parts.headers.remove(HOST);
        if uri.authority.is_none() {
            uri.authority = Some(match host {
                Some(h) => {
                    Authority::try_from(h.as_bytes()).map_err(|_| UpstreamError::InvalidHost)?
                }
                None => self.upstream.authority().clone(),
            });
        }
        parts.uri = http_uri(uri)?;
        Ok(Request::from_parts(parts, body))
    }
}

/// What an HTTP/1.1 request sends after its head: nothing, a body the
/// client sent whole (written from where it is, after the head and in the
/// same write, as hyper's client writes a body it has whole), or the
/// client's body as it streams.
fn payload(body: RequestBody) -> Payload<RequestBody> {
    match body.content {
        Content::Empty => Payload::None,
        Content::Full(mut whole) => Payload::Whole(whole.take()),
        content => Payload::Stream(RequestBody::new(content, body.facts)),
    }
}

/// An `http://` URI from `parts` (whose authority is set), with `/` as
/// the path when there is none.
fn http_uri(mut parts: http::uri::Parts) -> Result<Uri, UpstreamError> {
    parts.scheme = Some(Scheme::HTTP);
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(PathAndQuery::from_static("/"));
    }
    Uri::from_parts(parts).map_err(|e| UpstreamError::Other(e.to_string()))
}

/// Appends the client to `X-Forwarded-For`, folding earlier values into one
/// comma-separated header as Go does.
fn append_forwarded_for(headers: &mut http::HeaderMap, client_ip: &HeaderValue) {
    let mut prior = headers.get_all(X_FORWARDED_FOR).iter().peekable();
    if prior.peek().is_none() {
        headers.insert(X_FORWARDED_FOR, client_ip.clone());
        return;
    }
    let mut joined = BytesMut::with_capacity(64);
    for v in prior {
        joined.put_slice(v.as_bytes());
        joined.put_slice(b", ");
    }
    joined.put_slice(client_ip.as_bytes());
    if let Ok(value) = HeaderValue::from_maybe_shared(joined.freeze()) {
        headers.insert(X_FORWARDED_FOR, value);
    }
}

fn is_printable(s: &[u8]) -> bool {
    s.iter().all(|b| (b' '..=b'~').contains(b))
}

fn mismatch(requested: Option<&[u8]>, offered: Option<&[u8]>) -> UpstreamError {
    UpstreamError::UpgradeMismatch {
        requested: requested.unwrap_or_default().to_vec(),
        offered: offered.unwrap_or_default().to_vec(),
    }
}

/// The proxy's answer: the app's response, or the error's; `first`, when
/// given, is told of the app's answer (see [`Startup`]).
fn answer(
    res: Result<Response<ProxyBody>, UpstreamError>,
    first: Option<Arc<Startup>>,
) -> Response<ProxyBody> {
    match res {
        Ok(res) => {
            if let Some(startup) = first {
                startup.request_answered();
            }
            res
        }
        Err(err) => error_response(&err),
    }
}

/// The app's response head, as Go's reverse proxy passes it on:
/// hop-by-hop headers removed, the standard reason phrase, the proxy's own
/// protocol version (an app's `HTTP/1.0` answer goes to an HTTP/1.1 client
/// as `HTTP/1.1`, its connection kept alive, as Go's server writes it; an
/// HTTP/1.0 client still gets `HTTP/1.0`).
fn pass_on<B>(res: &mut Response<B>) {
    hop::prepare_response(res.headers_mut());
    if res.version() == Version::HTTP_10 {
        *res.version_mut() = Version::HTTP_11;
    }
    // Go's server writes the standard reason phrase, whatever the app's.
    res.extensions_mut().remove::<hyper::ext::ReasonPhrase>();
}

/// The app's response, [passed on](pass_on).
fn finish(mut res: Response<ProxyBody>) -> Response<ProxyBody> {
    pass_on(&mut res);
    res
}

/// The `502` Knative answers when the app cannot be reached: Go's
/// `http.Error` with the error text. When the client's own body broke
/// (its framing, or the client went away mid-body), the connection cannot
/// serve another request (where the next one would start is unknown): the
/// answer says `Connection: close`, as Go's server says it, and the
/// connection closes after it.
fn error_response(err: &UpstreamError) -> Response<ProxyBody> {
    let mut res = http_error(StatusCode::BAD_GATEWAY, format!("{err}\n")).map(ProxyBody::from);
    if err.is_client_gone() {
        tracing::debug!(error = %err, "request context canceled");
        res.headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    } else {
        let sockstat = std::fs::read_to_string("/proc/net/sockstat").unwrap_or_default();
        tracing::error!(
            error = %err,
            "error reverse proxying request; sockstat: {sockstat}"
        );
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_for_is_appended_and_folded() {
        let ip = HeaderValue::from_static("10.1.2.3");
        let mut h = http::HeaderMap::new();
        append_forwarded_for(&mut h, &ip);
        assert_eq!(h[X_FORWARDED_FOR], "10.1.2.3");

        let mut h = http::HeaderMap::new();
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("1.1.1.1"));
        h.append(
            X_FORWARDED_FOR,
            HeaderValue::from_static("2.2.2.2, 3.3.3.3"),
        );
        append_forwarded_for(&mut h, &ip);
        assert_eq!(
            h.get_all(X_FORWARDED_FOR).iter().collect::<Vec<_>>(),
            ["1.1.1.1, 2.2.2.2, 3.3.3.3, 10.1.2.3"]
        );

        let mut h = http::HeaderMap::new();
        h.append(X_FORWARDED_FOR, HeaderValue::from_static(""));
        append_forwarded_for(&mut h, &ip);
        assert_eq!(h[X_FORWARDED_FOR], ", 10.1.2.3");
    }

    #[test]
    fn client_ip_is_canonical() {
        let upstream = Arc::new(Connector::new(8080, 1));
        let mapped: IpAddr = "::ffff:192.0.2.9".parse().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let startup = Arc::new(Startup::begin());
        let proxy = Proxy::new(
            upstream.clone(),
            mapped,
            startup.clone(),
            LiveOptions::default(),
        );
        assert_eq!(proxy.client_ip, "192.0.2.9");
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(
            Proxy::new(upstream, v6, startup, LiveOptions::default()).client_ip,
            "2001:db8::1"
        );
    }
}
