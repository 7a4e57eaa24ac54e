//! Slow, silent and greedy clients: every port bounds what they can hold,
//! and running out of descriptors neither spins nor sticks.

use std::process::Command;
use std::time::Duration;

use qproxy_test_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Whether `held` is a close by the server, with no HTTP/1 answer. When
/// (a minute after accept) is for the paused clock of the server's own
/// tests; here, only that the close comes, and not before the port
/// answered a request sent after the connection opened.
fn closed_unanswered(held: Held, h2: bool) -> bool {
    matches!(held, Held::Closed { bytes, .. } if h2 || bytes == 0)
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_and_silent_heads_are_closed_a_minute_after_accept_on_every_port() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);
    let metrics = qp.metrics.unwrap();
    let give_up = HEAD_TIMEOUT + deadline();

    // A keep-alive connection that idles past the deadline stays usable.
    let mut idle = TcpStream::connect(qp.main).await.unwrap();
    let request = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    let mut body = [0u8; 13];
    idle.write_all(request).await.unwrap();
    assert!(
        read_head(&mut idle)
            .await
            .unwrap()
            .starts_with("HTTP/1.1 200")
    );
    idle.read_exact(&mut body).await.unwrap();

    let mut held = Vec::new();
    for (port, addr) in [
        ("main", qp.main),
        ("admin", qp.admin),
        ("stats", qp.stats),
        ("metrics", metrics),
    ] {
        for (how, first, line) in [
            ("a head a line a second", REQUEST_LINE, Some(HEADER_LINE)),
            ("nothing", &b""[..], None),
        ] {
            held.push(((port, how), tokio::spawn(hold(addr, first, line, give_up))));
        }
    }
    let h2c = hold(qp.main, H2_PREFACE, None, give_up);
    held.push((("main", "an h2c preface alone"), tokio::spawn(h2c)));

    // Each port answers on a connection opened after them: none of them
    // was closed at once.
    for (port, addr) in [
        ("main", qp.main),
        ("admin", qp.admin),
        ("stats", qp.stats),
        ("metrics", metrics),
    ] {
        let path = if port == "metrics" { "/metrics" } else { "/" };
        let _answered = h1(addr, get(path, &[])).await;
    }
    for ((port, how), task) in &held {
        assert!(!task.is_finished(), "{port} port, {how}: closed at once");
    }

    for ((port, how), task) in held {
        let got = task.await.unwrap();
        let h2 = how.contains("h2c");
        assert!(closed_unanswered(got, h2), "{port} port, {how}: {got:?}");
    }

    idle.write_all(request).await.unwrap();
    let head = read_head(&mut idle).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    idle.read_exact(&mut body).await.unwrap();
    assert_eq!(&body, b"Hello World!\n");
}

/// qproxy started through `prlimit`, with a limit of `soft` and `hard`
/// open files.
fn start_limited(user_port: u16, soft: u32, hard: u32) -> QProxy {
    let mut command = Command::new("prlimit");
    command
        .arg(format!("--nofile={soft}:{hard}"))
        .arg("--")
        .arg(qproxy_bin());
    QProxy::start_command(command, &knative_env(user_port))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_low_soft_limit_on_open_files_is_raised_as_go_raises_it() {
    let app = App::hello().await;
    let qp = start_limited(app.port(), 64, 4096);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", qp.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[3..5], ["4096", "4096"], "{line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn running_out_of_descriptors_backs_off_and_recovers() {
    let app = App::hello().await;
    let qp = start_limited(app.port(), 48, 48);
    let res = h1(qp.main, get("/", &[])).await;
    assert_eq!(res.status(), 200);

    // More connections than descriptors: the kernel completes them all,
    // qproxy can accept only some.
    let mut hogs = Vec::new();
    for _ in 0..80 {
        hogs.push(TcpStream::connect(qp.main).await.unwrap());
    }
    qp.wait_for_log("an accept failure", |l| {
        l["message"] == "accept failed" && l["error"].as_str().is_some_and(|e| e.contains("24"))
    });

    // It backs off, as Go's server does: the failures it logs wait longer
    // and longer, up to a second between tries. (What the backing off
    // saves in CPU is for the benchmarks to measure.)
    qp.wait_for_log("the backoff at its cap of a second", |l| {
        l["message"] == "accept failed" && l["delay"] == "1s"
    });

    drop(hogs);
    let res = until("service to resume", async || {
        let attempt = tokio::spawn(h1(qp.main, get("/", &[])));
        match tokio::time::timeout(Duration::from_secs(2), attempt).await {
            Ok(Ok(res)) => Some(res),
            _ => None,
        }
    })
    .await;
    assert_eq!(res.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn current_knative_s_metrics_port_gives_heads_five_seconds() {
    let app = App::hello().await;
    let env = with_vars(
        current_knative_env(app.port()),
        &[(
            "OBSERVABILITY_CONFIG",
            r#"{"requestMetrics":{"protocol":"prometheus"}}"#,
        )],
    );
    let qp = QProxy::start_env(&env);
    let metrics = qp.metrics.unwrap();
    // Both dribbled at once: the metrics port closes its head while the
    // main port, which keeps Knative's minute, still waits for its own.
    let main = tokio::spawn(hold(
        qp.main,
        REQUEST_LINE,
        Some(HEADER_LINE),
        HEAD_TIMEOUT + deadline(),
    ));
    let held = hold(metrics, REQUEST_LINE, Some(HEADER_LINE), HEAD_TIMEOUT).await;
    assert!(matches!(held, Held::Closed { bytes: 0, .. }), "{held:?}");
    assert!(!main.is_finished(), "the main port closed its head as soon");
}
