//! Traces, made where Knative's handlers make them: the server span where
//! its tracing middleware sits (inside the drainer), the proxy and wait
//! spans where its proxy handler takes the stats and the breaker slot, and
//! the client span as the request leaves for the app, whose context goes
//! into the request's headers. See [`crate::traces`].
//!
//! Each span lasts until its response body is done with. Without tracing,
//! the layers pass everything through untouched.

use std::net::SocketAddr;

use http::{Request, StatusCode};
use opentelemetry::Context;
use opentelemetry::trace::TraceContextExt;
use tower::Layer;

use crate::observing::{Observe, Observing};
use crate::traces::{Sizes, Traces};
use qproxy_core::body::Settle;
use qproxy_core::config::Generation;
use qproxy_core::facts::{HasFacts, facts};

/// Where in the stack a [`TraceLayer`] sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Position {
    /// Knative's tracing middleware: the server span.
    Server(SocketAddr),
    /// Knative's proxy handler: the proxy span, and the wait span when
    /// there is a breaker.
    Proxy { breaker: bool },
    /// Past the breaker: the wait ends, the client span starts.
    Client,
}

/// Traces requests where it sits in the stack; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct TraceLayer {
    traces: Option<Traces>,
    position: Position,
}

impl TraceLayer {
    /// The server span of each request from `remote`.
    pub fn server(traces: Option<Traces>, remote: SocketAddr) -> Self {
        Self {
            traces,
            position: Position::Server(remote),
        }
    }

    /// The proxy span, and with a `breaker` the wait span.
    pub fn proxy(traces: Option<Traces>, breaker: bool) -> Self {
        Self {
            traces,
            position: Position::Proxy { breaker },
        }
    }

    /// The client span, whose context goes to the app.
    pub fn client(traces: Option<Traces>) -> Self {
        Self {
            traces,
            position: Position::Client,
        }
    }
}

impl<S> Layer<S> for TraceLayer {
    type Service = Observing<TraceLayer, S>;

    fn layer(&self, inner: S) -> Self::Service {
        Observing::new(self.clone(), inner)
    }
}

impl Observe for TraceLayer {
    type Guard = Box<Spanned>;

    fn enter<B: http_body::Body + HasFacts>(&self, req: &mut Request<B>) -> Option<Box<Spanned>> {
        let traces = self.traces.as_ref()?;
        start(traces, self.position, req).map(Box::new)
    }
}

/// The context of a request's server span, for the spans below it.
#[derive(Debug, Clone)]
struct ServerSpan(Context);

/// The contexts of a request's proxy span and wait span.
#[derive(Debug, Clone)]
struct ProxySpans {
    proxy: Context,
    wait: Option<Context>,
}

/// Starts this position's span for `req`; what ends it.
fn start<B: http_body::Body + HasFacts>(
    traces: &Traces,
    position: Position,
    req: &mut Request<B>,
) -> Option<Spanned> {
    match position {
        Position::Server(remote) => {
            // Current Knative's handler skips every probe.
            if traces.generation() == Generation::Current && facts(req).is_probe() {
                return None;
            }
            let parent = traces.extract(req.headers());
            let span = traces.server_span(req, &parent, remote);
            let cx = parent.with_span(span);
            req.extensions_mut().insert(ServerSpan(cx.clone()));
            let read = req.body().size_hint().exact().unwrap_or(0);
            let sizes = Sizes { read, written: 0 };
            Some(Spanned::http(traces, cx, Some(sizes)))
        }
        Position::Proxy { breaker } => {
            let ServerSpan(server) = req.extensions().get::<ServerSpan>()?.clone();
            // Kubelet probes get no proxy span.
            if facts(req).is_kubelet_probe() {
                return None;
            }
            let proxy = server.with_span(traces.internal_span(false, &server));
            let wait = breaker.then(|| proxy.with_span(traces.internal_span(true, &proxy)));
            req.extensions_mut().insert(ProxySpans {
                proxy: proxy.clone(),
                wait,
            });
            Some(Spanned {
                traces: traces.clone(),
                cx: proxy,
                kind: SpanEnd::Internal,
                status: None,
            })
        }
        Position::Client => {
            let Some(ProxySpans { proxy, wait }) = req.extensions_mut().remove::<ProxySpans>()
            else {
                // Current Knative's HTTP client traces every request it
                // sends, a probe passed on to the app too: with no server
                // span to follow, as the root of a trace of its own.
                if traces.generation() == Generation::Current && facts(req).is_probe() {
                    let root = Context::new();
                    let span = traces.client_span(req, &root);
                    return Some(Spanned::http(traces, root.with_span(span), None));
                }
                return None;
            };
            // The slot is taken: the wait is over.
            if let Some(wait) = &wait {
                wait.span().end();
            }
            // Current Knative sends the request in the wait span's context.
            let parent = match (traces.generation(), wait) {
                (Generation::Current, Some(wait)) => wait,
                _ => proxy,
            };
            let span = traces.client_span(req, &parent);
            Some(Spanned::http(traces, parent.with_span(span), None))
        }
    }
}

/// How a span ends.
#[derive(Debug, Clone, Copy)]
enum SpanEnd {
    /// With the response's status; and for a server span (not the client
    /// span to the app), the body sizes.
    Http { sizes: Option<Sizes> },
    /// Plainly.
    Internal,
}

/// A span, ended when its request is done with.
#[derive(Debug)]
pub struct Spanned {
    traces: Traces,
    cx: Context,
    kind: SpanEnd,
    status: Option<StatusCode>,
}

impl Spanned {
    fn http(traces: &Traces, cx: Context, sizes: Option<Sizes>) -> Self {
        Self {
            traces: traces.clone(),
            cx,
            kind: SpanEnd::Http { sizes },
            status: None,
        }
    }
}

impl Settle for Spanned {
    fn answered(&mut self, status: StatusCode) {
        self.status = Some(status);
    }

    fn data(&mut self, len: usize) {
        if let SpanEnd::Http { sizes: Some(sizes) } = &mut self.kind {
            sizes.written += len as u64;
        }
    }
}

impl Drop for Spanned {
    fn drop(&mut self) {
        match self.kind {
            SpanEnd::Http { sizes } => self.traces.end_http(&self.cx, self.status, sizes),
            SpanEnd::Internal => self.cx.span().end(),
        }
    }
}
