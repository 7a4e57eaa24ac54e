//! qproxy: a drop-in replacement for Knative Serving's queue-proxy.
//!
//! Knative starts a queue-proxy next to every serverless app: every request
//! to the app crosses it. qproxy starts where the queue-proxy starts (same
//! environment, same ports) and answers the same way, at a fraction of the
//! cost.
//!
//! - [`config`]: the environment contract, parsed once into a [`Config`].
//! - [`server`]: dual-stack listeners; HTTP/1.1 and h2c on one port.
//! - [`stack`]: the request layers of the main port, in Knative's order.
//! - [`layers`]: one module per layer.
//! - [`proxy`]: the reverse proxy to the user container.
//! - [`readiness`]: the user container's readiness probe.
//! - [`drain`]: stopping without losing a request.
//! - [`admin`]: the admin, stats and metrics ports.
//! - [`profiling`]: CPU profiles, when profiling is on.
//! - [`observe`]: logs in Knative's zap JSON shape.
//! - [`demo`]: a hello app with qproxy in front, for a first look.

pub mod admin;
pub mod body;
pub mod config;
pub mod demo;
pub mod drain;
pub mod headers;
pub mod layers;
pub mod observe;
pub mod profiling;
pub mod proxy;
pub mod readiness;
pub mod server;
pub mod stack;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use autoscaler_client::{Clock, MonotonicClock, Reporter, RequestStats};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::{Layer, service_fn};

pub use config::{Config, ConfigError};
pub use server::BindError;

use crate::admin::{Admin, Endpoint, MetricsEndpoint};
use crate::config::{MetricsProtocol, Observability};
use crate::drain::Drainer;
use crate::layers::server_rules::ServerRulesLayer;
use crate::layers::timeout::go_duration;
use crate::layers::upgrade::Tunnels;
use crate::observe::UserMetrics;
use crate::observe::current_metrics::CurrentMetrics;
use crate::observe::request_log::RequestLog;
use crate::observe::request_metrics::{self, RequestMetrics};
use crate::observe::traces::Traces;
use crate::proxy::Upstream;
use crate::readiness::{HttpOptions, Readiness};
use crate::server::{Listener, admin_builder, main_builder, serve};
use crate::stack::Shared;

/// How often the autoscaler's `Stat` is renewed, as in Knative.
pub const REPORTING_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// Every [`REPORTING_PERIOD`], takes a report of `stats` and publishes it,
/// as Knative's queue-proxy does with a ticker.
async fn report_every_period(
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

/// A type-erased error, as hyper takes from bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why qproxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The environment was rejected.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A port could not be listened on.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// Traces could not be exported as configured.
    #[error(transparent)]
    Traces(#[from] observe::traces::TracesError),
    /// Request metrics could not be exported as configured.
    #[error(transparent)]
    Metrics(#[from] observe::current_metrics::ExportError),
    /// Anything else at start-up.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
}

/// A queue-proxy whose ports are bound, ready to serve.
#[derive(Debug)]
pub struct Server {
    config: Arc<Config>,
    main: Listener,
    admin: Listener,
    stats: Listener,
    metrics: Option<Listener>,
    profiling: Option<Listener>,
}

/// The addresses a [`Server`] listens on.
#[derive(Debug, Clone, Copy)]
pub struct Addrs {
    /// Main proxy port.
    pub main: SocketAddr,
    /// Admin port.
    pub admin: SocketAddr,
    /// Autoscaler stats port.
    pub stats: SocketAddr,
    /// User metrics port, when request metrics are served as Prometheus.
    pub metrics: Option<SocketAddr>,
    /// Profiling port, when profiling is on.
    pub profiling: Option<SocketAddr>,
}

impl Server {
    /// Binds every port the configuration asks for. Must be called within a
    /// Tokio runtime.
    pub fn bind(config: Config) -> Result<Self, Error> {
        let ports = config.ports;
        Ok(Self {
            main: Listener::bind("main", ports.main)?,
            admin: Listener::bind("admin", ports.admin)?,
            stats: Listener::bind("stats", ports.stats)?,
            metrics: if config.observability.prometheus_metrics() {
                Some(Listener::bind("metrics", ports.metrics)?)
            } else {
                None
            },
            profiling: if config.observability.profiling() {
                Some(Listener::bind("profile", ports.profiling)?)
            } else {
                None
            },
            config: Arc::new(config),
        })
    }

    /// Where the server listens.
    pub fn addrs(&self) -> Addrs {
        Addrs {
            main: self.main.local_addr(),
            admin: self.admin.local_addr(),
            stats: self.stats.local_addr(),
            metrics: self.metrics.as_ref().map(Listener::local_addr),
            profiling: self.profiling.as_ref().map(Listener::local_addr),
        }
    }

    /// Serves until `shutdown` completes, then drains: health checks fail,
    /// requests are served until the quiet period passes without one, the
    /// listeners close, the requests in flight finish, and upgraded
    /// connections get a bounded grace period.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        let config = self.config;
        let clock = MonotonicClock::new();
        let drainer = Drainer::new(config.drain.quiet);
        let tunnels = Tunnels::default();
        let (terminate, terminating) = watch::channel(false);
        let readiness = Readiness::new(
            config.readiness_probes.clone(),
            HttpOptions {
                auto_detect_http2: config.features.http2_auto_detection,
                generation: config.observability.generation(),
            },
        );
        let request_metrics = match &config.observability {
            o if o.classic_prometheus_metrics() => {
                Some(UserMetrics::Classic(RequestMetrics::new(&config.revision)))
            }
            Observability::Current(c) => match c.request_metrics.protocol {
                MetricsProtocol::Prometheus => Some(UserMetrics::Current(
                    CurrentMetrics::prometheus(&config.revision, config.ports.user),
                )),
                MetricsProtocol::Grpc | MetricsProtocol::HttpProtobuf => {
                    Some(UserMetrics::Current(CurrentMetrics::otlp(
                        &c.request_metrics,
                        &config.revision,
                        config.ports.user,
                    )?))
                }
                MetricsProtocol::None => None,
            },
            _ => None,
        };
        let log = config.observability.request_log();
        // The configuration checked the template; one that failed here
        // would only mean no request log.
        let request_log = match log.template() {
            Some(Ok(template)) => Some(Arc::new(RequestLog::new(
                template,
                &log.template,
                log.probes,
                config.observability.generation(),
                config.revision.clone(),
            ))),
            _ => None,
        };
        let traces = Traces::new(
            &config.observability,
            &config.revision,
            SocketAddr::from((Ipv4Addr::LOCALHOST, config.ports.user)),
        )?;
        let shared = Shared {
            upstream: Arc::new(Upstream::new(
                config.ports.user,
                config.upstream_idle_connections(),
            )),
            breaker: layers::concurrency::breaker(config.container_concurrency),
            timeouts: config.timeouts,
            generation: config.observability.generation(),
            stats: Arc::new(RequestStats::new(clock.now())),
            clock,
            drainer: drainer.clone(),
            readiness,
            tunnels: tunnels.clone(),
            request_metrics: request_metrics.clone(),
            request_log,
            traces: traces.clone(),
        };
        let admin = Admin {
            drainer: drainer.clone(),
            terminating,
        };
        let reporter = Arc::new(Reporter::new(
            config.revision.pod.clone(),
            clock.now(),
            REPORTING_PERIOD.as_secs_f64(),
        ));
        let stats_endpoint = admin::StatsEndpoint {
            reporter: reporter.clone(),
        };
        let graceful = Arc::new(GracefulShutdown::new());
        let (stop, stopped) = watch::channel(false);

        tracing::info!(
            revision = %config.revision.name,
            user_port = config.ports.user,
            container_concurrency = config.container_concurrency,
            "Starting queue-proxy"
        );
        let mut servers = JoinSet::new();
        let reporting = tokio::spawn(report_every_period(shared.stats.clone(), clock, reporter));
        let exported_metrics = request_metrics.clone();
        let upkeep = shared.request_metrics.clone().map(|m| {
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(request_metrics::UPKEEP_PERIOD);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    ticks.tick().await;
                    m.run_upkeep();
                }
            })
        });
        servers.spawn(serve(
            self.main,
            main_builder(),
            move |conn| stack::main_service(&shared, conn),
            graceful.clone(),
            stopped.clone(),
        ));
        let (g, s) = (&graceful, &stopped);
        servers.spawn(small_server(self.admin, admin, g, s));
        servers.spawn(small_server(self.stats, stats_endpoint, g, s));
        if let Some(listener) = self.metrics {
            let endpoint = MetricsEndpoint { request_metrics };
            servers.spawn(small_server(listener, endpoint, g, s));
        }
        if let Some(listener) = self.profiling {
            tracing::info!("Profiling enabled: true");
            profiling::prepare_temp_dir();
            let endpoint = profiling::Profiling::default();
            servers.spawn(small_server(listener, endpoint, g, s));
        }

        shutdown.await;
        tracing::info!("Received TERM signal, attempting to gracefully shutdown servers.");
        tracing::info!(
            "Sleeping {} to allow K8s propagation of non-ready state",
            go_duration(config.drain.quiet)
        );
        let _ = terminate.send(true);
        drainer.drain().await;
        let _ = stop.send(true);
        while servers.join_next().await.is_some() {}
        reporting.abort();
        if let Some(upkeep) = upkeep {
            upkeep.abort();
        }
        if let Some(graceful) = Arc::into_inner(graceful) {
            graceful.shutdown().await;
        }
        if tunnels.open() > 0 {
            tracing::info!(
                open = tunnels.open(),
                "Waiting for upgraded connections to close"
            );
        }
        if tokio::time::timeout(config.drain.upgraded, tunnels.all_closed())
            .await
            .is_err()
        {
            tracing::warn!(
                open = tunnels.open(),
                "Hijack connection drain failed: context deadline exceeded"
            );
        }
        // Sends what is buffered; blocking, so off the runtime's threads.
        let exports = tokio::task::spawn_blocking(move || {
            if let Some(traces) = traces {
                traces.shutdown();
            }
            if let Some(UserMetrics::Current(m)) = exported_metrics {
                m.shutdown();
            }
        });
        let _ = exports.await;
        tracing::info!("Shutdown complete, exiting...");
        Ok(())
    }
}

/// Serves one of the small servers (admin, stats, metrics, profiling) on
/// `listener`: every request answered by `endpoint`, behind Go's server
/// rules.
fn small_server<E: Endpoint>(
    listener: Listener,
    endpoint: E,
    graceful: &Arc<GracefulShutdown>,
    stopped: &watch::Receiver<bool>,
) -> impl Future<Output = ()> + Send + use<E> {
    serve(
        listener,
        admin_builder(),
        move |_| {
            let endpoint = endpoint.clone();
            ServerRulesLayer.layer(service_fn(move |req| {
                let answer = endpoint.clone().respond(req);
                async move { Ok::<_, std::convert::Infallible>(answer.await) }
            }))
        },
        graceful.clone(),
        stopped.clone(),
    )
}

/// Serves `config` until SIGTERM or SIGINT, then drains and returns.
pub async fn run(config: Config) -> Result<(), Error> {
    // Signals are watched before any port is served, so that a stop
    // request is never met by the default action (an abrupt exit).
    let shutdown = shutdown_signal()?;
    Server::bind(config)?.run(shutdown).await
}

/// Starts watching for SIGTERM (Kubernetes stopping the pod) and SIGINT
/// (Ctrl-C) at once; the returned future completes on the first of them.
/// A second signal, while the first one's drain runs, exits at once with
/// status 1, as Knative's signal handling does. Must be called within a
/// Tokio runtime.
pub fn shutdown_signal() -> Result<impl Future<Output = ()>, Error> {
    use tokio::signal::unix::{SignalKind, signal};

    let watch = |kind| {
        signal(kind).map_err(|source| Error::Io {
            context: "cannot watch signals",
            source,
        })
    };
    let mut term = watch(SignalKind::terminate())?;
    let mut int = watch(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::error!("Received a second signal, exiting at once");
            std::process::exit(1);
        });
    })
}
