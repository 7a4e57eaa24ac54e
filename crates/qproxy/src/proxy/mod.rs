//! The reverse proxy to the user container: the innermost service of the
//! main port.
//!
//! It does what Knative's `NewHeaderPruningReverseProxy` (a Go
//! `httputil.ReverseProxy`) does to a request: removes the activator's
//! `Knative-Serving-Revision` and `Knative-Serving-Namespace`, keeps the
//! host, appends the client's address to `X-Forwarded-For`, drops hop-by-hop
//! headers ([`hop`]), and sends HTTP/1 as HTTP/1.1 and HTTP/2 as h2c
//! ([`upstream`]). An upgrade the app accepts with `101`, and a `CONNECT`
//! it accepts with a `2xx` (over HTTP/1.1 or HTTP/2), becomes a two-way
//! byte tunnel ([`tunnel_copy`]). A failure to reach the app is `502` with Go's
//! error text as the body, logged once.

pub(crate) mod body;
pub(crate) mod error;
pub(crate) mod h2c;
pub(crate) mod hop;
pub(crate) mod timing;
pub(crate) mod tunnel_copy;
pub(crate) mod upstream;

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
pub(crate) use error::UpstreamError;
use qproxy_core::body::{Content, ReplyBody, RequestBody};
use qproxy_core::headers::{KNATIVE_SERVING_NAMESPACE, KNATIVE_SERVING_REVISION, X_FORWARDED_FOR};
use qproxy_core::reply::http_error;
use qproxy_core::tunnel_registry::TunnelDeadline;
use qproxy_observe::startup::Startup;
use upstream::AppIo;
pub(crate) use upstream::{Answer, Http1Request, Upstream};

/// The reverse proxy for one client connection.
#[derive(Debug, Clone)]
pub(crate) struct Proxy {
    upstream: Arc<Upstream>,
    /// The client's IP, as appended to `X-Forwarded-For`.
    client_ip: HeaderValue,
    /// Told when the app answers, for its first answer.
    startup: Arc<Startup>,
}

impl Proxy {
    /// A proxy for requests arriving from `client`.
    pub(crate) fn new(upstream: Arc<Upstream>, client: IpAddr, startup: Arc<Startup>) -> Self {
        // An IP address is always a valid header value.
        let client_ip = HeaderValue::try_from(client.to_canonical().to_string())
            .unwrap_or_else(|_| HeaderValue::from_static(""));
        Self {
            upstream,
            client_ip,
            startup,
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
        if LiveOptions.has(Opt::ServerTiming) {
            return self.timed(req);
        }
        self.untimed(req)
    }
}

impl Proxy {
    /// The answer with `Server-Timing` ([`timing`]): a future of its own
    /// around the common one, which carries nothing for it.
    #[cold]
    #[inline(never)]
    fn timed(
        &mut self,
        req: Request<RequestBody>,
    ) -> <Self as Service<Request<RequestBody>>>::Future {
        let timing = Timing::start(&req);
        let answer = self.untimed(req);
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
    fn untimed(
        &mut self,
        mut req: Request<RequestBody>,
    ) -> <Self as Service<Request<RequestBody>>>::Future {
        // Only until the app's first answer to a request that is not a
        // probe: a load on every request after.
        let first = (self.startup.awaits_first_request() && !req.body().facts.is_probe())
            .then(|| self.startup.clone());
        let hop = self.prepare(&mut req);
        if req.version() == Version::HTTP_2 {
            let this = self.clone();
            return Box::pin(async move {
                let res = if req.method() == Method::CONNECT {
                    this.connect_h2(req).await
                } else {
                    this.forward_h2(req).await
                };
                Ok(answer(res, first))
            });
        }
        if req.method() == Method::CONNECT {
            let this = self.clone();
            return Box::pin(async move { Ok(answer(this.connect(req).await, first)) });
        }
        // Every other request, written out here, so that its future holds
        // only what it waits with.
        let sent = Upgrade::asked(&mut req, hop).and_then(|upgrade| {
            let req = self.http1_request(req)?;
            Ok((self.upstream.clone(), Http1Request::new(req), upgrade))
        });
        Box::pin(async move {
            let res = match sent {
                Ok((upstream, req, upgrade)) => match upstream.send(req).await {
                    Ok(Answer::Response(res)) => Ok(finish(res)),
                    Ok(Answer::Switched(switched)) => Upgrade::switched(upgrade, *switched),
                    Err(err) => Err(err),
                },
                Err(err) => Err(err),
            };
            Ok(answer(res, first))
        })
    }
}

/// An upgrade a client asked for (boxed: rare, and every request's future
/// carries room for it).
struct Upgrade {
    /// The protocol asked for.
    protocol: HeaderValue,
    /// The client's side of the tunnel, once the `101` is sent.
    client: OnUpgrade,
    deadline: Option<TunnelDeadline>,
}

impl Upgrade {
    /// The upgrade `req` asks for (`hop`, read as its hop-by-hop headers
    /// were removed), if any; a protocol that is not printable ASCII is
    /// refused, as Go refuses it.
    fn asked(
        req: &mut Request<RequestBody>,
        hop: hop::Hop,
    ) -> Result<Option<Box<Upgrade>>, UpstreamError> {
        let Some(protocol) = hop.upgrade else {
            return Ok(None);
        };
        if !is_printable(protocol.as_bytes()) {
            return Err(UpstreamError::InvalidClientUpgrade(
                protocol.as_bytes().to_vec(),
            ));
        }
        Ok(Some(Box::new(Upgrade {
            protocol,
            client: hyper::upgrade::on(&mut *req),
            deadline: req.extensions().get::<TunnelDeadline>().copied(),
        })))
    }

    /// The app switched protocols: a tunnel between the client and `app`,
    /// if the app switched to the protocol the client asked for; `502`
    /// otherwise, as Go's reverse proxy answers. The `101` goes to the
    /// client with its `Connection` and `Upgrade`.
    fn switched(
        asked: Option<Box<Upgrade>>,
        (res, app): (Response<()>, AppIo),
    ) -> Result<Response<ProxyBody>, UpstreamError> {
        let offered = hop::upgrade_type(res.headers()).map(HeaderValue::as_bytes);
        let asked = match (asked, offered) {
            (Some(asked), Some(offered))
                if asked.protocol.as_bytes().eq_ignore_ascii_case(offered) =>
            {
                asked
            }
            (asked, offered) => {
                let requested = asked.as_ref().map(|a| a.protocol.as_bytes());
                return Err(mismatch(requested, offered));
            }
        };
        let Upgrade {
            client, deadline, ..
        } = *asked;
        let mut res = res.map(|()| ProxyBody::from(ReplyBody::empty()));
        res.extensions_mut()
            .insert(tunnel_copy::spawn(client, app, deadline));
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

    /// An HTTP/2 request, over h2c.
    async fn forward_h2(
        &self,
        req: Request<RequestBody>,
    ) -> Result<Response<ProxyBody>, UpstreamError> {
        let req = self.h2_request(req)?;
        Ok(finish(self.upstream.send_h2c(req).await?))
    }

    /// A `CONNECT`, as Go's reverse proxy passes it: to the app with the
    /// client's target, on a connection of its own; a `2xx` answer makes
    /// the two connections one tunnel (the app's bytes after its head
    /// included), anything else is an ordinary response.
    async fn connect(
        &self,
        mut req: Request<RequestBody>,
    ) -> Result<Response<ProxyBody>, UpstreamError> {
        let client = hyper::upgrade::on(&mut req);
        let deadline = req.extensions().get::<TunnelDeadline>().copied();
        let (mut parts, body) = req.into_parts();
        if let Some(authority) = parts.uri.authority() {
            let host = HeaderValue::try_from(authority.as_str())
                .map_err(|_| UpstreamError::InvalidHost)?;
            parts.headers.insert(HOST, host);
        }
        parts.version = Version::HTTP_11;
        let req = Http1Request::new(Request::from_parts(parts, body));
        match self.upstream.send_connect(req).await? {
            Answer::Switched(switched) => {
                let (mut res, app) = *switched;
                pass_on(&mut res);
                // What follows the head is the tunnel's: no body framing.
                res.headers_mut().remove(CONTENT_LENGTH);
                res.headers_mut().remove(TRANSFER_ENCODING);
                let tunnel = tunnel_copy::spawn(client, app, deadline);
                res.extensions_mut().insert(tunnel);
                Ok(res.map(|()| ProxyBody::from(ReplyBody::empty())))
            }
            Answer::Response(res) => Ok(finish(res)),
        }
    }

    /// A `CONNECT` over HTTP/2, as Go's reverse proxy passes it: to the app
    /// over h2c, the client's stream and the app's answer streamed both
    /// ways. hyper's server hands the client's stream over once a `2xx`
    /// head is sent, so a `2xx` answer becomes a tunnel between the two
    /// streams (the app's body included, without its `Content-Length`,
    /// which a `2xx` to `CONNECT` may not carry); anything else is an
    /// ordinary response.
    async fn connect_h2(
        &self,
        mut req: Request<RequestBody>,
    ) -> Result<Response<ProxyBody>, UpstreamError> {
        let client = hyper::upgrade::on(&mut req);
        let deadline = req.extensions().get::<TunnelDeadline>().copied();
        // One message in flight: the client is read as fast as the app's
        // stream takes it.
        let (to_app, from_client) = mpsc::channel(1);
        let req = self.h2_request(
            req.map(|body| RequestBody::new(Content::Tunnel(from_client), body.facts)),
        )?;
        let mut res = self.upstream.send_h2c(req).await?;
        pass_on(&mut res);
        if res.status().is_success() {
            res.headers_mut().remove(CONTENT_LENGTH);
            let (parts, from_app) = res.into_parts();
            let tunnel = tunnel_copy::spawn_stream(client, from_app, to_app, deadline);
            let mut res = Response::from_parts(parts, ProxyBody::from(ReplyBody::empty()));
            res.extensions_mut().insert(tunnel);
            return Ok(res);
        }
        Ok(res)
    }

    /// An HTTP/1.1 request for `127.0.0.1:USER_PORT`, its target in origin
    /// form, keeping the client's host in `Host` (the app's address when
    /// the client sent none, as Go's transport writes it).
    fn http1_request(
        &self,
        req: Request<RequestBody>,
    ) -> Result<Request<RequestBody>, UpstreamError> {
        let (mut parts, body) = req.into_parts();
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
        parts.version = Version::HTTP_11;
        Ok(Request::from_parts(parts, body))
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
/// hop-by-hop headers removed, the standard reason phrase.
fn pass_on<B>(res: &mut Response<B>) {
    hop::prepare_response(res.headers_mut());
    // Go's server writes the standard reason phrase, whatever the app's.
    res.extensions_mut().remove::<hyper::ext::ReasonPhrase>();
}

/// The app's response, [passed on](pass_on), its connection handed back
/// at once when its body is already over.
fn finish(mut res: Response<ProxyBody>) -> Response<ProxyBody> {
    pass_on(&mut res);
    res
}

/// The `502` Knative answers when the app cannot be reached: Go's
/// `http.Error` with the error text.
fn error_response(err: &UpstreamError) -> Response<ProxyBody> {
    if err.is_client_gone() {
        tracing::debug!(error = %err, "request context canceled");
    } else {
        let sockstat = std::fs::read_to_string("/proc/net/sockstat").unwrap_or_default();
        tracing::error!(
            error = %err,
            "error reverse proxying request; sockstat: {sockstat}"
        );
    }
    http_error(StatusCode::BAD_GATEWAY, format!("{err}\n")).map(ProxyBody::from)
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
        let upstream = Arc::new(Upstream::new(8080, 1));
        let mapped: IpAddr = "::ffff:192.0.2.9".parse().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let startup = Arc::new(Startup::begin());
        let proxy = Proxy::new(upstream.clone(), mapped, startup.clone());
        assert_eq!(proxy.client_ip, "192.0.2.9");
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(Proxy::new(upstream, v6, startup).client_ip, "2001:db8::1");
    }
}
