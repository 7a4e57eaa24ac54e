//! The autoscaler's view of the pod: the `Stat` served on the stats port
//! (9090), and the loop that renews it every [`REPORTING_PERIOD`].
//!
//! The main port's [stats layer](qproxy_observe::autoscaler_stats::layer) records each
//! request's arrival and departure; once a period, as Knative's
//! queue-proxy does with a ticker, the time-weighted figures of the period
//! become the `Stat` the autoscaler scrapes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use qproxy_autoscaler_client::{Clock, MonotonicClock, Reporter, RequestStats};
use qproxy_core::body::RequestBody;

use qproxy_core::body::ReplyBody;
use qproxy_core::{Endpoint, metrics_route};

/// How often the autoscaler's `Stat` is renewed, as in Knative.
pub(crate) const REPORTING_PERIOD: Duration = Duration::from_secs(1);

/// Knative's `ProtobufMIMEType`.
const PROTOBUF: &str = "application/protobuf";

/// Every [`REPORTING_PERIOD`], takes a report of `stats` and publishes it
/// to `reporter`.
pub(crate) async fn report_every_period(
    stats: Arc<RequestStats>,
    clock: MonotonicClock,
    reporter: Arc<Reporter>,
) {
    let mut ticker = tokio::time::interval_at(
        tokio::time::Instant::now() + REPORTING_PERIOD,
        REPORTING_PERIOD,
    );
    // Like Go's ticker: ticks missed while late are dropped, and the
    // schedule is kept.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticker.tick().await;
        let now = clock.now();
        reporter.publish(&stats.report(now), now);
    }
}

/// What the stats server serves: the latest `Stat`.
#[derive(Debug, Clone)]
pub(crate) struct StatsEndpoint {
    /// The latest stat.
    pub(crate) reporter: Arc<Reporter>,
}

impl StatsEndpoint {
    /// Answers `req`: the latest `Stat` as protobuf, whatever the client
    /// accepts, as Knative's queue-proxy answers (its handler still reads
    /// "protobuf or prometheus, depending on the Accept header", but has
    /// served protobuf alone since the Prometheus reporter was removed).
    fn answer<B>(&self, req: &Request<B>) -> Response<ReplyBody> {
        metrics_route(req, PROTOBUF, || self.reporter.latest().protobuf.clone())
    }
}

impl Endpoint for StatsEndpoint {
    fn respond(
        self,
        req: Request<RequestBody>,
    ) -> impl Future<Output = Response<ReplyBody>> + Send {
        std::future::ready(self.answer(&req))
    }
}
