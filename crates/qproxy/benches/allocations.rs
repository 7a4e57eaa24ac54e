//! Heap allocations per proxied request.
//!
//! qproxy serves in this process on a thread of its own, one thread as in a
//! pod, and only that thread's allocations are counted (an allocation group
//! of `tracking-allocator`); the app and the client run on other threads.
//! Each case sends plain HTTP/1.1 `GET`s (or `POST`s of a 1 KiB body, as events
//! come) over one kept-alive connection, warms up, then divides the allocations
//! of the measured requests by their number. The periodic work of the sidecar
//! (the stats report, once a second) is counted too, spread over the requests.
//!
//!     cargo bench -p qproxy --bench allocations
//!
//! Prints one line per case; `benches/harness.py` records them in
//! `benches/RESULTS.md`. Without `--bench` (as `cargo test --benches` runs
//! it), sends few requests and only checks that the counting works.

#![allow(missing_docs, clippy::unwrap_used)]

use std::alloc::System;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use qproxy::Config;
use qproxy::config::{Generation, knative_defaults};
use qproxy_test_support::app::App;
use qproxy_test_support::full;
use tracking_allocator::{
    AllocationGroupId, AllocationGroupToken, AllocationRegistry, AllocationTracker, Allocator,
};

#[global_allocator]
static ALLOCATOR: Allocator<System> = Allocator::system();

/// One case: its name, whether its requests carry a body, and qproxy's
/// environment beyond Knative's defaults.
struct Case {
    name: &'static str,
    body: bool,
    vars: &'static [(&'static str, &'static str)],
}

/// The cases, each counted in a group of its own.
const CASES: [Case; 3] = [
    Case {
        name: "plain HTTP/1.1 GET, Knative's defaults",
        body: false,
        vars: &[],
    },
    Case {
        name: "plain HTTP/1.1 GET, request metrics off",
        body: false,
        vars: &[("SERVING_REQUEST_METRICS_BACKEND", "")],
    },
    Case {
        name: "HTTP/1.1 POST of 1 KiB, Knative's defaults",
        body: true,
        vars: &[],
    },
];

static GROUPS: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];
static COUNTS: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

/// Counts allocations made while one of [`GROUPS`] is entered.
struct Counter;

impl AllocationTracker for Counter {
    fn allocated(&self, _: usize, _: usize, _: usize, group: AllocationGroupId) {
        let id = group.as_usize().get();
        for (g, count) in GROUPS.iter().zip(&COUNTS) {
            if g.load(Ordering::Relaxed) == id {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn deallocated(
        &self,
        _: usize,
        _: usize,
        _: usize,
        _: AllocationGroupId,
        _: AllocationGroupId,
    ) {
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    l.local_addr().unwrap().port()
}

/// Starts qproxy on a thread of its own whose allocations count in group
/// `case`; returns its main port.
fn start_qproxy(case: usize, app_port: u16, vars: &[(&str, &str)]) -> u16 {
    let port = free_port();
    let mut env = knative_defaults(Generation::Classic, app_port);
    for (name, value) in [
        ("QUEUE_SERVING_PORT", port.to_string().as_str()),
        ("QUEUE_SERVING_TLS_PORT", "0"),
        ("QPROXY_ADMIN_PORT", "0"),
        ("QPROXY_STATS_PORT", "0"),
        ("QPROXY_METRICS_PORT", "0"),
    ]
    .into_iter()
    .chain(vars.iter().copied())
    {
        env.set(name, value);
    }
    let config = Config::from_vars(&env).unwrap();
    std::thread::spawn(move || {
        let mut token = AllocationGroupToken::register().unwrap();
        GROUPS[case].store(token.id().as_usize().get(), Ordering::Relaxed);
        let _counted = token.enter();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(qproxy::run(config)).unwrap();
    });
    port
}

/// Sends `n` GETs (or, with `body`, POSTs of 1 KiB) over one connection;
/// every answer must be the app's.
async fn requests(addr: SocketAddr, n: u64, body: bool) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    for _ in 0..n {
        send.ready().await.unwrap();
        let req = http::Request::builder()
            .method(if body { "POST" } else { "GET" })
            .uri("/")
            .header("host", "hello.default.svc.cluster.local")
            .body(if body {
                Full::new(Bytes::from_static(&[b'x'; 1024]))
            } else {
                Full::default()
            })
            .unwrap();
        let res = send.send_request(req).await.unwrap();
        assert_eq!(res.status(), 200);
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"Hello World!\n");
    }
}

async fn serving(addr: SocketAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "qproxy did not start"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn main() {
    let test = !std::env::args().any(|a| a == "--bench");
    let (warm, measured) = if test { (10, 100) } else { (2_000, 20_000) };
    AllocationRegistry::set_global_tracker(Counter).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // The app reads each body whole, as an event sink does.
        let app = App::start(|req| async {
            let _ = req.into_body().collect().await;
            hyper::Response::new(full("Hello World!\n"))
        })
        .await;
        AllocationRegistry::enable_tracking();
        for (case, Case { name, body, vars }) in CASES.iter().enumerate() {
            let addr =
                SocketAddr::from((Ipv4Addr::LOCALHOST, start_qproxy(case, app.port(), vars)));
            serving(addr).await;
            requests(addr, warm, *body).await;
            let before = COUNTS[case].load(Ordering::Relaxed);
            requests(addr, measured, *body).await;
            let counted = COUNTS[case].load(Ordering::Relaxed) - before;
            assert!(counted > 0, "{name}: no allocation counted");
            println!(
                "allocations per request: {:.1}  ({name}; {measured} requests)",
                counted as f64 / measured as f64
            );
        }
    });
    // qproxy's threads serve until the process ends.
    std::process::exit(0);
}
