//! The sidecar's servers: the main port and the small ones beside it, the
//! state behind them, and how they start and stop.
//!
//! A [`Server`] binds every port first, so that a port in use stops the
//! start before anything is served. [`Server::run`] then goes through
//! three steps, each a function of this module: it builds the shared state
//! from the configuration (`build`), spawns the servers and the background
//! loops (`spawn`), and, once told to stop, takes the drain's way out
//! (`RunningServers::shut_down`).

mod conn;
mod error;
mod graceful;
mod listener;
mod podinfo;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use graceful::GracefulShutdown;
use qproxy_autoscaler_client::{Clock, MonotonicClock, Reporter, RequestStats};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

pub use error::Error;
pub use listener::BindError;
use listener::CURRENT_METRICS_HEAD_TIMEOUT;
pub(crate) use listener::Listener;

use crate::admin::Admin;
use crate::config::{Config, Generation, LiveOptions, Opt, Options};
use crate::drain::{Drainer, Shutdown};
use crate::layers::concurrency;
use crate::profiling::{self, Profiling};
use crate::readiness::{HttpOptions, Readiness};
use crate::stack::{self, PortState};
use crate::stat_server::{self, REPORTING_PERIOD, StatsEndpoint};
use crate::tls::TlsPort;
use crate::tunnel_registry::Tunnels;
use conn::{main_builder, serve, small_server};
use podinfo::PodInfo;
use qproxy_observe::OwnMetrics;
use qproxy_observe::adaptive_limit::AdaptiveLimit;
use qproxy_observe::autoscaler_stats::view::AutoscalerView;
use qproxy_observe::queue_wait::QueueWait;
use qproxy_observe::startup::Startup;
use qproxy_observe::{ExportError, Observers};
use qproxy_transport::connector::Connector;

/// A queue-proxy whose ports are bound, ready to serve.
#[derive(Debug)]
pub struct Server {
    config: Arc<Config>,
    main: Listener,
    admin: Listener,
    stats: Listener,
    metrics: Option<Listener>,
    profiling: Option<Listener>,
    /// The TLS port, and its TLS, when the certificate is mounted.
    tls: Option<(Listener, TlsPort)>,
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
    /// TLS port, when the certificate and key are mounted.
    pub tls: Option<SocketAddr>,
}

impl Server {
    /// Binds every port the configuration asks for, and loads the TLS
    /// certificate when it is mounted. Must be called within a Tokio
    /// runtime.
    pub fn bind(config: Config) -> Result<Self, Error> {
        qproxy_core::crypto::install_default_provider();
        let open_files = listener::raise_open_files_limit();
        tracing::debug!(?open_files, "open files limit");
        let ports = config.ports;
        Ok(Self {
            main: Listener::bind("main", ports.main)?,
            admin: Listener::bind("admin", ports.admin)?,
            stats: Listener::bind("stats", ports.stats)?,
            metrics: if config.observability.prometheus_metrics() {
                let listener = Listener::bind("metrics", ports.metrics)?;
                Some(match config.observability.generation() {
                    Generation::Classic => listener,
                    Generation::Current => listener.with_head_timeout(CURRENT_METRICS_HEAD_TIMEOUT),
                })
            } else {
                None
            },
            profiling: if config.observability.profiling() {
                Some(Listener::bind("profile", ports.profiling)?)
            } else {
                None
            },
            tls: match TlsPort::from_config(&config)? {
                Some(tls) => Some((Listener::bind("tls", ports.tls)?, tls)),
                None => None,
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
            tls: self.tls.as_ref().map(|(l, _)| l.local_addr()),
        }
    }

    /// Serves until `shutdown` completes, then drains: health checks fail,
    /// requests are served until the quiet period passes without one, the
    /// listeners close, the requests in flight finish, and upgraded
    /// connections get a bounded grace period.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ExportError> {
        let parts = build(&self.config)?;
        let running = spawn(self, parts);
        shutdown.await;
        running.shut_down().await;
        Ok(())
    }
}

/// The main port without its listener, for the fuzz targets: serves any
/// byte stream handed to it as an accepted connection, through the whole
/// request stack, to the user container the configuration names.
#[cfg(feature = "fuzzing")]
#[derive(Debug)]
pub struct MainPort {
    shared: std::sync::Arc<PortState>,
    graceful: GracefulShutdown,
}

#[cfg(feature = "fuzzing")]
impl MainPort {
    /// The main port of `config`. Must be called within a Tokio runtime.
    pub fn new(config: &Config) -> Result<Self, ExportError> {
        qproxy_core::crypto::install_default_provider();
        Ok(Self {
            shared: std::sync::Arc::new(build(config)?.main),
            graceful: GracefulShutdown::new(),
        })
    }

    /// Serves `io`, a connection from `remote`, until it ends.
    pub async fn serve<IO>(&self, io: IO, remote: SocketAddr)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let conn = conn::Accepted { remote };
        let shared = self.shared.clone();
        conn::connection(
            io,
            qproxy_transport::server::HeadClock::new(listener::HEAD_TIMEOUT),
            std::sync::Arc::new(main_builder()),
            move || stack::main_service(&shared, remote),
            self.graceful.watcher(),
            conn,
        )
        .await;
    }
}

/// The state behind the servers, built from the configuration.
struct Parts {
    /// What every connection of the main port shares.
    main: PortState,
    /// The latest autoscaler `Stat`.
    reporter: Arc<Reporter>,
    /// The admin server's drain hook.
    admin: Admin,
    /// The way out.
    shutdown: Shutdown,
    /// The pod's annotations to follow, if mounted, and the options they
    /// gave at start.
    podinfo: Option<(PodInfo, Options)>,
}

/// Builds the state behind the servers from `config`.
fn build(config: &Config) -> Result<Parts, ExportError> {
    let clock = MonotonicClock::new();
    let drainer = Drainer::new(config.drain.quiet);
    let tunnels = Tunnels::default();
    let (terminate, terminating) = watch::channel(false);
    let generation = config.observability.generation();
    let podinfo = PodInfo::new(&config.podinfo_dir, config.options);
    let options = podinfo.start();
    let breaker = concurrency::breaker(
        config.container_concurrency,
        options.has(Opt::AdaptiveConcurrency),
    );
    let own_metrics = OwnMetrics {
        startup: Arc::new(Startup::begin()),
        queue_wait: breaker.as_ref().map(|_| Arc::new(QueueWait::default())),
        adaptive: AdaptiveLimit::of(breaker.as_ref()),
    };
    let main = PortState {
        upstream: Arc::new(Connector::new(
            config.ports.user,
            config.upstream_idle_connections(),
        )),
        breaker,
        timeouts: config.timeouts,
        generation,
        stats: Arc::new(RequestStats::new(clock.now())),
        clock,
        drainer: drainer.clone(),
        readiness: Readiness::new(
            config.readiness_probes.clone(),
            HttpOptions {
                auto_detect_http2: config.features.http2_auto_detection,
                generation,
            },
        ),
        tunnels: tunnels.clone(),
        observers: Observers::new(
            &config.observability,
            &config.revision,
            config.ports.user,
            &own_metrics,
        )?,
        own_metrics,
        options: LiveOptions::new(options),
    };
    let reporter = Arc::new(Reporter::new(
        config.revision.pod.clone(),
        clock.now(),
        REPORTING_PERIOD.as_secs_f64(),
    ));
    Ok(Parts {
        podinfo: podinfo.mounted().then_some((podinfo, options)),
        main,
        reporter,
        admin: Admin {
            drainer: drainer.clone(),
            terminating,
        },
        shutdown: Shutdown {
            drainer,
            terminate,
            tunnels,
            upgraded: config.drain.upgraded,
        },
    })
}

/// The servers and loops that run, and what stops them.
struct RunningServers {
    servers: JoinSet<()>,
    /// The stats reporting and the metrics upkeep, stopped with the servers.
    loops: Vec<JoinHandle<()>>,
    graceful: Arc<GracefulShutdown>,
    stop: watch::Sender<bool>,
    shutdown: Shutdown,
    observers: Observers,
}

/// Starts serving every port of `server`, and the background loops.
fn spawn(server: Server, parts: Parts) -> RunningServers {
    let Parts {
        main,
        reporter,
        admin,
        shutdown,
        podinfo,
    } = parts;
    let config = &server.config;
    tracing::info!(
        revision = %config.revision.name,
        user_port = config.ports.user,
        container_concurrency = config.container_concurrency,
        "Starting queue-proxy"
    );
    let graceful = Arc::new(GracefulShutdown::new());
    let (stop, stopped) = watch::channel(false);
    let observers = main.observers.clone();
    let own_metrics = main.own_metrics.clone();
    let mut loops = vec![tokio::spawn(stat_server::report_every_period(
        main.stats.clone(),
        main.clock,
        reporter.clone(),
    ))];
    loops.extend(observers.spawn_upkeep());
    if let Some((podinfo, started)) = podinfo {
        loops.push(tokio::spawn(podinfo.follow(main.options.clone(), started)));
    }

    // What a main-port connection holds between its requests: the maker of
    // its services, a pointer to the port's state and the client's
    // address (the service itself is a pointer for each layer's state).
    let services = {
        let main = Arc::new(main);
        move |conn: conn::Accepted| {
            let main = main.clone();
            move || stack::main_service(&main, conn.remote)
        }
    };
    let mut servers = JoinSet::new();
    let tls = server.tls.map(|(listener, tls)| {
        loops.push(tokio::spawn(tls.watch()));
        servers.spawn(serve(
            listener,
            main_builder(),
            Some(tls.acceptor.clone()),
            services.clone(),
            graceful.clone(),
            stopped.clone(),
        ));
        tls
    });
    servers.spawn(serve(
        server.main,
        main_builder(),
        None,
        services,
        graceful.clone(),
        stopped.clone(),
    ));
    let (g, s) = (&graceful, &stopped);
    // Classic Knative serves the admin port over TLS when it serves TLS.
    let admin_tls = tls.filter(|t| t.admin).map(|t| t.acceptor);
    servers.spawn(small_server(server.admin, admin, admin_tls, g, s));
    let stats = StatsEndpoint {
        reporter: reporter.clone(),
    };
    servers.spawn(small_server(server.stats, stats, None, g, s));
    if let Some(listener) = server.metrics {
        let view = AutoscalerView::new(reporter.clone(), &config.revision);
        let endpoint = observers.metrics_endpoint(view, own_metrics);
        servers.spawn(small_server(listener, endpoint, None, g, s));
    }
    if let Some(listener) = server.profiling {
        tracing::info!("Profiling enabled: true");
        profiling::prepare_temp_dir();
        servers.spawn(small_server(listener, Profiling::default(), None, g, s));
    }
    RunningServers {
        servers,
        loops,
        graceful,
        stop,
        shutdown,
        observers,
    }
}

impl RunningServers {
    /// Takes the drain's way out (see [`Shutdown`]), closing the servers
    /// when the drain is done, then sends what the exporters hold.
    async fn shut_down(self) {
        let RunningServers {
            mut servers,
            loops,
            graceful,
            stop,
            shutdown,
            observers,
        } = self;
        let close = async move {
            let _ = stop.send(true);
            while servers.join_next().await.is_some() {}
            for task in loops {
                task.abort();
            }
            // Every accept loop has returned and dropped its handle: what
            // is left is the connections, whose requests may finish.
            if let Some(graceful) = Arc::into_inner(graceful) {
                graceful.shutdown().await;
            }
        };
        shutdown.run(close).await;
        observers.flush().await;
        tracing::info!("Shutdown complete, exiting...");
    }
}
