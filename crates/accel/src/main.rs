//! `qproxy-accel`, the node agent: accelerates every qproxy under a cgroup.
//!
//! ```text
//! qproxy-accel --cgroup PATH --metrics-addr ADDR [--pin-dir DIR]
//!              [--namespace NS]... [--process-name NAME] [--scan-interval SECS]
//!              [--max-sockets N] [--allow-failed-check CHECK]...
//! qproxy-accel self-test [--cgroup PATH]
//! qproxy-accel detach [--pin-dir DIR]
//! ```
//!
//! See `docs/accel.md`.

use std::{
    collections::{BTreeMap, BTreeSet},
    convert::Infallible,
    io,
    net::{AddrParseError, SocketAddr},
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::{BuildError, PrometheusBuilder, PrometheusHandle};
use qproxy_accel::{Accel, accel, discover, selftest};
use tokio::signal::unix::SignalKind;
use tracing::{error, info, warn};

const USAGE: &str = "usage: qproxy-accel --cgroup PATH --metrics-addr ADDR [--pin-dir DIR] \
[--namespace NS]... [--process-name NAME] [--scan-interval SECS] [--max-sockets N] \
[--allow-failed-check CHECK]...
       qproxy-accel self-test [--cgroup PATH]
       qproxy-accel detach [--pin-dir DIR]";

const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/qproxy-accel";

struct Args {
    command: Command,
    cgroup: Option<PathBuf>,
    metrics_addr: Option<SocketAddr>,
    pin_dir: PathBuf,
    namespaces: BTreeSet<String>,
    process_name: String,
    scan_interval: Duration,
    allow_failed: BTreeSet<String>,
    max_sockets: u32,
}

enum Command {
    Run,
    SelfTest,
    Detach,
}

/// Why the arguments were refused, or that only the usage was asked for.
#[derive(Debug, thiserror::Error)]
enum ArgsError {
    /// `-h` or `--help`: the usage, and nothing else, was asked for.
    #[error("the usage was asked for")]
    Help,
    /// A flag came last, without its value.
    #[error("{flag} needs a value")]
    MissingValue {
        /// The flag.
        flag: &'static str,
    },
    /// `--metrics-addr`'s value is not an address and port.
    #[error("--metrics-addr {value:?} is not an address and port")]
    InvalidMetricsAddr {
        /// The value given.
        value: String,
        /// Why.
        #[source]
        source: AddrParseError,
    },
    /// `--scan-interval`'s value is not a number of seconds in range.
    #[error("--scan-interval {value:?} is not a number of seconds (0 to 3600)")]
    InvalidScanInterval {
        /// The value given.
        value: String,
    },
    /// `--max-sockets`'s value is not a positive number.
    #[error("--max-sockets {value:?} is not a positive number")]
    InvalidMaxSockets {
        /// The value given.
        value: String,
    },
    /// An argument that is no flag of the agent's.
    #[error("unknown argument {arg:?}")]
    Unknown {
        /// The argument.
        arg: String,
    },
    /// A flag the agent cannot run without is missing.
    #[error("{flag} is required")]
    Required {
        /// The flag.
        flag: &'static str,
    },
}

fn parse(argv: impl Iterator<Item = String>) -> Result<Args, ArgsError> {
    let mut args = Args {
        command: Command::Run,
        cgroup: None,
        metrics_addr: None,
        pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
        namespaces: BTreeSet::new(),
        process_name: "qproxy".to_owned(),
        scan_interval: Duration::from_secs(2),
        allow_failed: BTreeSet::new(),
        max_sockets: accel::DEFAULT_MAX_SOCKETS,
    };
    let mut argv = argv.peekable();
    // A command, if any, comes first.
    let command = match argv.peek().map(String::as_str) {
        Some("self-test") => Some(Command::SelfTest),
        Some("detach") => Some(Command::Detach),
        _ => None,
    };
    if let Some(command) = command {
        args.command = command;
        argv.next();
    }
    while let Some(arg) = argv.next() {
        let mut value = |flag: &'static str| argv.next().ok_or(ArgsError::MissingValue { flag });
        match arg.as_str() {
            "--cgroup" => args.cgroup = Some(PathBuf::from(value("--cgroup")?)),
            "--metrics-addr" => {
                let value = value("--metrics-addr")?;
                match value.parse() {
                    Ok(addr) => args.metrics_addr = Some(addr),
                    Err(source) => return Err(ArgsError::InvalidMetricsAddr { value, source }),
                }
            }
            "--pin-dir" => args.pin_dir = PathBuf::from(value("--pin-dir")?),
            "--namespace" => {
                args.namespaces.insert(value("--namespace")?);
            }
            "--process-name" => args.process_name = value("--process-name")?,
            "--scan-interval" => {
                let value = value("--scan-interval")?;
                let Some(secs) = value
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 3600.0)
                else {
                    return Err(ArgsError::InvalidScanInterval { value });
                };
                args.scan_interval = Duration::from_secs_f64(secs);
            }
            "--allow-failed-check" => {
                args.allow_failed.insert(value("--allow-failed-check")?);
            }
            "--max-sockets" => {
                let value = value("--max-sockets")?;
                let Some(n) = value.parse().ok().filter(|n| *n > 0) else {
                    return Err(ArgsError::InvalidMaxSockets { value });
                };
                args.max_sockets = n;
            }
            "-h" | "--help" => return Err(ArgsError::Help),
            _ => return Err(ArgsError::Unknown { arg }),
        }
    }
    if matches!(args.command, Command::Run) {
        if args.cgroup.is_none() {
            return Err(ArgsError::Required { flag: "--cgroup" });
        }
        if args.metrics_addr.is_none() {
            return Err(ArgsError::Required {
                flag: "--metrics-addr",
            });
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let mut argv = std::env::args().skip(1).peekable();
    if argv.peek().map(String::as_str) == Some(selftest::PEER_ARG) {
        let cgroup = argv.nth(1).map(PathBuf::from).unwrap_or_default();
        return match selftest::peer(&cgroup) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("qproxy-accel self-test child: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let args = match parse(argv) {
        Ok(args) => args,
        Err(ArgsError::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(why) => {
            eprintln!("qproxy-accel: {why}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    match args.command {
        Command::SelfTest => {
            let cgroup = args
                .cgroup
                .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"));
            if self_test(&cgroup, &args.allow_failed) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Detach => match accel::detach(&args.pin_dir) {
            Ok(true) => {
                info!(
                    "detached the sockops program pinned under {}",
                    args.pin_dir.display()
                );
                ExitCode::SUCCESS
            }
            Ok(false) => {
                info!("nothing attached under {}", args.pin_dir.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                error!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Run => {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    error!("starting the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    error!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Runs and logs the self-test; whether it passed, counting the checks in
/// `allowed` (an operator's `--allow-failed-check`) as passed.
fn self_test(cgroup: &Path, allowed: &BTreeSet<String>) -> bool {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            error!("self-test: cannot find this binary: {e}");
            return false;
        }
    };
    let parent = selftest::parent(cgroup);
    info!("self-test: in a cgroup under {}", parent.display());
    let report = selftest::run(&exe, &parent);
    for check in &report.checks {
        if check.ok {
            info!(check = %check.name, "self-test passed: {}", check.detail);
        } else if allowed.contains(&check.name) {
            warn!(
                check = %check.name,
                "self-test FAILED, allowed by --allow-failed-check: {}", check.detail
            );
        } else {
            error!(check = %check.name, "self-test FAILED: {}", check.detail);
        }
    }
    let passed = !report.checks.is_empty()
        && report
            .checks
            .iter()
            .all(|c| c.ok || allowed.contains(&c.name));
    metrics::gauge!("qproxy_accel_self_test_passed").set(if passed { 1.0 } else { 0.0 });
    for check in &report.checks {
        if !check.ok {
            metrics::gauge!("qproxy_accel_self_test_failed", "check" => check.name.clone())
                .set(1.0);
        }
    }
    passed
}

/// Why the agent stopped on its own.
#[derive(Debug, thiserror::Error)]
enum RunError {
    /// The agent was run without a cgroup or a metrics address.
    #[error("--cgroup and --metrics-addr are required")]
    Unconfigured,
    /// The metrics recorder could not be installed.
    #[error("metrics: {0}")]
    Metrics(#[source] BuildError),
    /// The metrics address could not be bound.
    #[error("--metrics-addr {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The metrics listener's address could not be read.
    #[error("{0}")]
    LocalAddr(#[source] io::Error),
    /// A signal's handler could not be installed.
    #[error("{source}")]
    Signal {
        /// Which signal: `SIGTERM` or `SIGINT`.
        signal: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The programs could not be loaded or attached.
    #[error("{0}")]
    Accel(#[from] accel::Error),
}

async fn run(args: Args) -> Result<(), RunError> {
    let (Some(cgroup), Some(metrics_addr)) = (args.cgroup.clone(), args.metrics_addr) else {
        return Err(RunError::Unconfigured);
    };
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(RunError::Metrics)?;
    describe();
    let ready = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind(metrics_addr)
        .await
        .map_err(|source| RunError::Bind {
            addr: metrics_addr,
            source,
        })?;
    let bound = listener.local_addr().map_err(RunError::LocalAddr)?;
    tokio::spawn(serve_metrics(listener, handle, ready.clone()));
    info!("metrics on http://{bound}/metrics");

    let signal_handler = |kind: SignalKind, signal: &'static str| {
        tokio::signal::unix::signal(kind).map_err(|source| RunError::Signal { signal, source })
    };
    let mut term = signal_handler(SignalKind::terminate(), "SIGTERM")?;
    let mut int = signal_handler(SignalKind::interrupt(), "SIGINT")?;

    metrics::gauge!("qproxy_accel_attached").set(0.0);
    let cgroup_for_test = cgroup.clone();
    let allowed = args.allow_failed.clone();
    let test = tokio::task::spawn_blocking(move || self_test(&cgroup_for_test, &allowed));
    let passed = tokio::select! {
        passed = test => passed.unwrap_or(false),
        // The self-test's child dies with the agent (PR_SET_PDEATHSIG).
        _ = term.recv() => return Ok(()),
        _ = int.recv() => return Ok(()),
    };
    if !passed {
        // An agent killed before it could detach left its program
        // attached: on a kernel that fails now, nothing may stay.
        match accel::detach(&args.pin_dir) {
            Ok(true) => warn!("detached the sockops program a previous agent left attached"),
            Ok(false) => {}
            Err(e) => error!("detaching what a previous agent left attached: {e}"),
        }
        warn!(
            "the kernel failed the self-test: nothing is attached, every connection stays on TCP; \
             the agent stays up to say so (not ready, qproxy_accel_attached 0)"
        );
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        return Ok(());
    }

    let mut accel = Accel::load(Some(&args.pin_dir), args.max_sockets)?;
    accel.attach(&cgroup)?;
    info!(
        "attached under {} (maps pinned in {})",
        cgroup.display(),
        args.pin_dir.join(accel::PIN_VERSION).display()
    );
    metrics::gauge!("qproxy_accel_attached").set(1.0);
    ready.store(true, Ordering::Release);

    // netns inode → (cookie, user port), for the qproxies found.
    let mut known: BTreeMap<u64, Allowed> = BTreeMap::new();
    // Processes already warned about, so that each is said once.
    let mut unreadable: BTreeSet<u32> = BTreeSet::new();
    // The first scan also forgets the pods gone while no agent ran.
    scan(&args, &cgroup, &mut accel, &mut known, &mut unreadable);
    forget_gone(&mut accel, &known);
    export(&mut accel);
    let mut tick = tokio::time::interval(args.scan_interval);
    // An interval's first tick is at once: that scan is done.
    tick.tick().await;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = tick.tick() => {
                scan(&args, &cgroup, &mut accel, &mut known, &mut unreadable);
                export(&mut accel);
            }
        }
    }
    ready.store(false, Ordering::Release);
    match accel::detach(&args.pin_dir) {
        Ok(_) => info!(
            "detached: new connections stay on TCP; connections already redirected keep \
             their path until they close (maps stay pinned in {})",
            args.pin_dir.display()
        ),
        Err(e) => error!("detaching: {e}"),
    }
    Ok(())
}

/// A network namespace allowed: its cookie, the port allowed in it, and the
/// qproxy it was allowed for.
struct Allowed {
    cookie: u64,
    user_port: u16,
    pid: u32,
}

/// Disallows the namespaces a previous agent allowed (the map is pinned)
/// whose qproxy is gone: found by no scan since this agent started.
fn forget_gone(accel: &mut Accel, known: &BTreeMap<u64, Allowed>) {
    let live: BTreeSet<u64> = known.values().map(|a| a.cookie).collect();
    match accel.allowed() {
        Ok(allowed) => {
            for cookie in allowed {
                if !live.contains(&cookie)
                    && let Err(e) = accel.disallow(cookie)
                {
                    warn!("disallowing a namespace left by a previous agent: {e}");
                }
            }
        }
        Err(e) => warn!("reading the namespaces a previous agent allowed: {e}"),
    }
}

/// Allows the network namespaces of the qproxies under the cgroup, and
/// disallows those of qproxies gone.
fn scan(
    args: &Args,
    cgroup: &Path,
    accel: &mut Accel,
    known: &mut BTreeMap<u64, Allowed>,
    unreadable: &mut BTreeSet<u32>,
) {
    let proc = Path::new("/proc");
    let pids = match discover::pids_under(cgroup) {
        Ok(pids) => pids,
        Err(e) => {
            warn!("reading the cgroup {}: {e}", cgroup.display());
            return;
        }
    };
    let mut seen = BTreeSet::new();
    unreadable.retain(|pid| pids.contains(pid));
    for pid in pids {
        let sidecar = match discover::sidecar(proc, pid, &args.process_name) {
            Ok(Some(sidecar)) => sidecar,
            Ok(None) => continue,
            Err(e) => {
                if unreadable.insert(pid) {
                    warn!(
                        pid,
                        "a {} process that cannot be read: {e}", args.process_name
                    );
                }
                continue;
            }
        };
        if !args.namespaces.is_empty()
            && !sidecar
                .namespace
                .as_ref()
                .is_some_and(|ns| args.namespaces.contains(ns))
        {
            continue;
        }
        seen.insert(sidecar.netns_inode);
        // The same qproxy with the same port: nothing to do. A namespace's
        // inode number can be reused by a later pod, so another process
        // means the cookie is looked up again.
        if let Some(a) = known.get(&sidecar.netns_inode)
            && a.pid == sidecar.pid
            && a.user_port == sidecar.user_port
        {
            continue;
        }
        match discover::netns_cookie(proc, pid) {
            Ok(cookie) => match accel.allow(cookie, sidecar.user_port) {
                Ok(()) => {
                    info!(
                        pid,
                        user_port = sidecar.user_port,
                        namespace = sidecar.namespace.as_deref().unwrap_or(""),
                        "accelerating"
                    );
                    let allowed = Allowed {
                        cookie,
                        user_port: sidecar.user_port,
                        pid: sidecar.pid,
                    };
                    if let Some(old) = known.insert(sidecar.netns_inode, allowed)
                        && old.cookie != cookie
                        && let Err(e) = accel.disallow(old.cookie)
                    {
                        warn!("disallowing a namespace gone: {e}");
                    }
                }
                Err(e) => warn!(pid, "allowing its network namespace: {e}"),
            },
            Err(e) => warn!(pid, "finding its network namespace's cookie: {e}"),
        }
    }
    known.retain(|inode, allowed| {
        if seen.contains(inode) {
            return true;
        }
        if let Err(e) = accel.disallow(allowed.cookie) {
            warn!("disallowing a namespace whose qproxy is gone: {e}");
        }
        false
    });
}

fn describe() {
    metrics::describe_counter!(
        "qproxy_accel_redirected_messages_total",
        "Messages handed straight to the peer socket, skipping loopback TCP."
    );
    metrics::describe_counter!(
        "qproxy_accel_redirected_bytes_total",
        "Bytes of those messages."
    );
    metrics::describe_counter!(
        "qproxy_accel_fallbacks_total",
        "Connections left on TCP: their peer was not in the map at their first message."
    );
    metrics::describe_counter!(
        "qproxy_accel_peer_gone_total",
        "Messages of redirected connections sent after the peer had closed."
    );
    metrics::describe_counter!(
        "qproxy_accel_insert_failures_total",
        "Sockets that qualified but could not join the map (full, or out of memory)."
    );
    metrics::describe_counter!(
        "qproxy_accel_inserted_total",
        "Sockets that joined the map, two per accelerated connection."
    );
    metrics::describe_gauge!("qproxy_accel_sockets", "Sockets in the map now.");
    metrics::describe_gauge!(
        "qproxy_accel_namespaces",
        "Network namespaces (pods) the programs accelerate now."
    );
    metrics::describe_gauge!(
        "qproxy_accel_attached",
        "1 when the programs are attached; 0 when the kernel failed the self-test."
    );
}

fn export(accel: &mut Accel) {
    match accel.counters() {
        Ok(c) => {
            metrics::counter!("qproxy_accel_redirected_messages_total")
                .absolute(c.redirected_messages);
            metrics::counter!("qproxy_accel_redirected_bytes_total").absolute(c.redirected_bytes);
            metrics::counter!("qproxy_accel_fallbacks_total").absolute(c.fallbacks);
            metrics::counter!("qproxy_accel_insert_failures_total").absolute(c.insert_failures);
            metrics::counter!("qproxy_accel_inserted_total").absolute(c.inserted);
            metrics::counter!("qproxy_accel_peer_gone_total").absolute(c.peer_gone);
        }
        Err(e) => warn!("reading the counters: {e}"),
    }
    match accel.sockets() {
        Ok(n) => metrics::gauge!("qproxy_accel_sockets").set(n as f64),
        Err(e) => warn!("counting the sockets: {e}"),
    }
    // From the map the programs read, not from what this agent found: a
    // namespace a previous agent allowed counts until it is forgotten.
    match accel.allowed() {
        Ok(allowed) => metrics::gauge!("qproxy_accel_namespaces").set(allowed.len() as f64),
        Err(e) => warn!("counting the allowed namespaces: {e}"),
    }
}

async fn serve_metrics(
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
    ready: Arc<AtomicBool>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let handle = handle.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let (status, body) = match req.uri().path() {
                    "/metrics" => (StatusCode::OK, handle.render()),
                    "/ready" if ready.load(Ordering::Acquire) => {
                        (StatusCode::OK, "ready\n".to_owned())
                    }
                    "/ready" => (StatusCode::SERVICE_UNAVAILABLE, "not attached\n".to_owned()),
                    _ => (StatusCode::NOT_FOUND, String::new()),
                };
                let mut response = Response::new(Full::new(Bytes::from(body)));
                *response.status_mut() = status;
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(argv: &[&str]) -> String {
        match parse(argv.iter().map(|a| (*a).to_owned())) {
            Ok(_) => panic!("{argv:?} parsed"),
            Err(e) => e.to_string(),
        }
    }

    /// main prints these after `qproxy-accel: `, as it always has.
    #[test]
    fn refusals_read_as_they_always_have() {
        assert_eq!(refused(&["--cgroup"]), "--cgroup needs a value");
        assert_eq!(
            refused(&["--metrics-addr", "nowhere"]),
            r#"--metrics-addr "nowhere" is not an address and port"#
        );
        assert_eq!(
            refused(&["--scan-interval", "0"]),
            r#"--scan-interval "0" is not a number of seconds (0 to 3600)"#
        );
        assert_eq!(
            refused(&["--max-sockets", "-1"]),
            r#"--max-sockets "-1" is not a positive number"#
        );
        assert_eq!(
            refused(&["--frobnicate"]),
            r#"unknown argument "--frobnicate""#
        );
        assert_eq!(refused(&[]), "--cgroup is required");
        assert_eq!(refused(&["--cgroup", "/c"]), "--metrics-addr is required");
        assert!(matches!(
            parse(["self-test", "--help"].into_iter().map(str::to_owned)),
            Err(ArgsError::Help)
        ));
        assert!(parse(["detach"].into_iter().map(str::to_owned)).is_ok());
    }

    #[test]
    fn run_errors_read_as_they_always_have() {
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let in_use = || io::Error::from(io::ErrorKind::AddrInUse);
        assert_eq!(
            RunError::Bind {
                addr,
                source: in_use()
            }
            .to_string(),
            format!("--metrics-addr 127.0.0.1:9: {}", in_use())
        );
        assert_eq!(
            RunError::Unconfigured.to_string(),
            "--cgroup and --metrics-addr are required"
        );
        assert_eq!(
            RunError::from(accel::Error::NoPrograms).to_string(),
            accel::Error::NoPrograms.to_string()
        );
    }
}
