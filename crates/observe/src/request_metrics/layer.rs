//! Request metrics, measured where Knative's handlers measure them: as a
//! request reaches the queue-proxy (outside the timeouts, so a timed-out
//! request counts as its `504`), and as it goes to the user container
//! (inside the breaker; the queue depth is taken as it enters).
//!
//! A request is measured from when it reaches the layer until its response
//! body has been sent (or the client went away); an upgraded connection,
//! until it closes. The status counted is the response's, with Go's
//! server's quirks: one that ends without a response from the layers below
//! (cancelled by the client or a timeout) counts as a `502`, as Knative's
//! proxy error handler answers it; a response whose body was cut off (the
//! app failed, the client left) counts as a `500`, as Knative's handlers
//! record the proxy's aborted handler (current Knative's HTTP instruments
//! as its Go handlers do: the server's not at all, the client's with the
//! app's status, [`crate::request_metrics::otel`]); an upgrade counts as a `200`, since
//! Go's proxy writes the `101` past the handlers. Probes are not measured
//! (but the queue depth is taken as they pass, as Knative takes it), but
//! for one case: current Knative's HTTP client measures every request it
//! sends the app, a probe passed on (`K-Kubelet-Probe`) too, without a
//! route tag. Without request metrics, the layer passes everything through
//! untouched.
//!
//! The same two places feed classic Knative's series
//! ([`crate::request_metrics::opencensus`]) or current Knative's instruments
//! ([`crate::request_metrics::otel`]): the server's and the client's
//! HTTP instruments, and the invocation duration.

use std::borrow::Cow;

use http::Request;
use qproxy_breaker::Breaker;
use tower::Layer;

use crate::UserMetrics;
use crate::observing::{Observe, Observing};
use crate::outcome::{Ended, Observed, Record};
use crate::request_metrics::opencensus::{OpenCensusMetrics, Scope, route_tag_unless_probe};
use crate::request_metrics::otel::{HttpAttributes, OtelMetrics};
use qproxy_core::facts::{HasFacts, facts};

/// Measures requests where it sits in the stack; see the [module
/// docs](self).
#[derive(Debug, Clone)]
pub struct MetricsLayer {
    metrics: Option<UserMetrics>,
    scope: Scope,
    breaker: Option<Breaker>,
}

impl MetricsLayer {
    /// Measures requests as they reach the queue-proxy.
    pub fn revision(metrics: Option<UserMetrics>) -> Self {
        Self {
            metrics,
            scope: Scope::Revision,
            breaker: None,
        }
    }

    /// Measures requests as they go to the user container, and the depth
    /// of `breaker`'s queue.
    pub fn app(metrics: Option<UserMetrics>, breaker: Option<Breaker>) -> Self {
        Self {
            metrics,
            scope: Scope::App,
            breaker,
        }
    }
}

impl<S> Layer<S> for MetricsLayer {
    type Service = Observing<MetricsLayer, S>;

    fn layer(&self, inner: S) -> Self::Service {
        Observing::new(self.clone(), inner)
    }
}

impl Observe for MetricsLayer {
    type Guard = Observed<Measuring>;

    fn enter<B: http_body::Body + HasFacts>(
        &self,
        req: &mut Request<B>,
    ) -> Option<Observed<Measuring>> {
        if let (Some(metrics), Some(breaker)) = (&self.metrics, &self.breaker) {
            // Taken for every request, probes too, as Knative takes it.
            metrics.set_queue_depth(breaker.in_flight());
        }
        // Probes are not measured, but for current Knative's HTTP client
        // (see `HttpAttributes`), which measures those the proxy passes on.
        let facts = facts(req);
        let series = match &self.metrics {
            Some(UserMetrics::Classic(m)) => {
                let tag = match self.scope {
                    Scope::Revision => route_tag_unless_probe(facts, req.headers()),
                    Scope::App => (!facts.is_probe()).then_some(Cow::Borrowed("")),
                };
                tag.map(|tag| MetricsTarget::Classic(m.clone(), tag))
            }
            Some(UserMetrics::Current(m)) => {
                (self.scope == Scope::App || !facts.is_probe()).then(|| {
                    MetricsTarget::Current(m.clone(), Box::new(HttpAttributes::of(req, facts)))
                })
            }
            None => None,
        };
        series.map(|series| {
            Observed::new(
                req.method(),
                Measuring {
                    series,
                    scope: self.scope,
                },
            )
        })
    }
}

/// Where a request is recorded once it is over: its series, and which
/// of the two places measured it.
#[derive(Debug)]
pub struct Measuring {
    series: MetricsTarget,
    scope: Scope,
}

/// Where a request is recorded, and what chooses its series beyond its
/// status.
#[derive(Debug)]
enum MetricsTarget {
    /// Classic Knative's, by route tag (empty for the app's series).
    Classic(OpenCensusMetrics, Cow<'static, str>),
    /// Current Knative's, by the request's HTTP attributes.
    Current(OtelMetrics, Box<HttpAttributes>),
}

impl Record for Measuring {
    fn record(&mut self, ended: Ended) {
        // A body cut off counts as Go's aborted handler: 500.
        let status = ended.status.unwrap_or(500);
        match &self.series {
            MetricsTarget::Classic(m, tag) => {
                m.series(self.scope, status, tag).record(ended.elapsed)
            }
            MetricsTarget::Current(m, attributes) => match self.scope {
                // Current Knative's HTTP server instruments record a
                // request once its handler returns: never one whose body
                // Go's proxy aborted.
                Scope::Revision => {
                    if let Some(status) = ended.status {
                        m.record_server(attributes, status, ended.size, ended.elapsed);
                    }
                }
                // Its HTTP client's, once the app's head is in: with that
                // head's status, however its body then ends.
                Scope::App => m.record_app(attributes, status, ended.answered, ended.elapsed),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::Future;
    use std::task::{Context, Waker};

    use bytes::Bytes;
    use http::Response;
    use http_body::Frame;
    use http_body_util::{BodyExt, Empty, StreamBody};
    use tower::{ServiceExt, service_fn};

    use super::*;
    use qproxy_core::config::Revision;

    type TwoFrames = StreamBody<
        futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>,
    >;

    /// The app: two frames.
    async fn answer(_req: Request<Empty<Bytes>>) -> Result<Response<TwoFrames>, Infallible> {
        let frames = vec![
            Ok(Frame::data(Bytes::from_static(b"a"))),
            Ok(Frame::data(Bytes::from_static(b"b"))),
        ];
        Ok(Response::new(StreamBody::new(futures_util::stream::iter(
            frames,
        ))))
    }

    /// The revision the tests measure.
    fn revision() -> Revision {
        Revision {
            namespace: "default".into(),
            service: "hello".into(),
            configuration: "hello".into(),
            name: "hello-00001".into(),
            pod: "pod1".into(),
            pod_ip: "127.0.0.1".into(),
        }
    }

    /// Classic Knative's request metrics of a revision.
    fn classic() -> OpenCensusMetrics {
        OpenCensusMetrics::new(&revision())
    }

    /// The requests counted with each status, as Prometheus reads them.
    fn counted(m: &OpenCensusMetrics) -> Vec<(String, u64)> {
        m.render()
            .lines()
            .filter(|l| l.starts_with("revision_request_count{"))
            .map(|l| {
                let code = l.split("response_code=\"").nth(1).unwrap_or("");
                let code = code.split('"').next().unwrap_or("").to_owned();
                let n = l.rsplit(' ').next().unwrap().parse().unwrap();
                (code, n)
            })
            .collect()
    }

    fn request() -> Request<Empty<Bytes>> {
        Request::new(Empty::new())
    }

    #[tokio::test]
    async fn a_request_is_counted_once_when_its_body_ends() {
        let m = classic();
        let layer = MetricsLayer::revision(Some(UserMetrics::Classic(m.clone())));
        let res = layer
            .layer(service_fn(answer))
            .oneshot(request())
            .await
            .unwrap();
        assert!(counted(&m).is_empty(), "not before the body is sent");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "ab");
        assert_eq!(counted(&m), [("200".to_owned(), 1)]);
    }

    #[tokio::test]
    async fn a_body_dropped_early_is_counted_once_as_go_s_aborted_handler() {
        let m = classic();
        let layer = MetricsLayer::revision(Some(UserMetrics::Classic(m.clone())));
        let mut body = layer
            .layer(service_fn(answer))
            .oneshot(request())
            .await
            .unwrap()
            .into_body();
        body.frame().await.unwrap().unwrap();
        drop(body);
        assert_eq!(counted(&m), [("500".to_owned(), 1)]);
    }

    /// Current Knative counts a body cut off as its Go handlers do: the
    /// invocation as a `500`, the request to the app with the app's status,
    /// the request to the queue-proxy not at all.
    #[tokio::test]
    async fn a_body_cut_off_is_counted_in_current_knative_as_its_handlers_count_it() {
        let m = OtelMetrics::prometheus(&revision(), &Default::default(), 8080);
        let metrics = Some(UserMetrics::Current(m.clone()));
        let stack = MetricsLayer::revision(metrics.clone())
            .layer(MetricsLayer::app(metrics, None).layer(service_fn(answer)));
        let mut body = stack.oneshot(request()).await.unwrap().into_body();
        body.frame().await.unwrap().unwrap();
        drop(body);
        let text = m.render();
        let counts = |family: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.starts_with(&format!("{family}_count{{")))
                .map(|l| {
                    let code = l.split("status_code=\"").nth(1).unwrap_or("");
                    code.split('"').next().unwrap_or("").to_owned()
                })
                .collect()
        };
        assert_eq!(counts("kn_serving_invocation_duration_seconds"), ["500"]);
        assert_eq!(counts("http_client_request_duration_seconds"), ["200"]);
        assert!(
            counts("http_server_request_duration_seconds").is_empty(),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_request_dropped_before_its_answer_is_counted_once_as_a_502() {
        let m = classic();
        let layer = MetricsLayer::revision(Some(UserMetrics::Classic(m.clone())));
        let never = service_fn(|_req: Request<Empty<Bytes>>| {
            std::future::pending::<Result<Response<TwoFrames>, Infallible>>()
        });
        let mut call = Box::pin(layer.layer(never).oneshot(request()));
        assert!(
            call.as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_pending()
        );
        drop(call);
        assert_eq!(counted(&m), [("502".to_owned(), 1)]);
    }

    #[tokio::test]
    async fn a_kubelet_probe_is_not_counted() {
        let m = classic();
        let layer = MetricsLayer::revision(Some(UserMetrics::Classic(m.clone())));
        let probe = Request::builder()
            .header("K-Kubelet-Probe", "queue")
            .body(Empty::new())
            .unwrap();
        let res = layer
            .layer(service_fn(answer))
            .oneshot(probe)
            .await
            .unwrap();
        res.into_body().collect().await.unwrap();
        assert!(counted(&m).is_empty(), "{:?}", counted(&m));
    }
}
