//! The binary as a process: its command line, the demo, and stopping.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use qproxy_test_support::*;
use tokio::sync::oneshot;

#[test]
fn version_and_usage() {
    let out = Command::new(qproxy_bin())
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("qproxy {}\n", env!("CARGO_PKG_VERSION"))
    );

    let out = Command::new(qproxy_bin()).arg("--bogus").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("usage: qproxy")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn demo_serves_hello_and_stops_on_ctrl_c() {
    let mut child = Command::new(qproxy_bin())
        .arg("demo")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (url_tx, url_rx) = oneshot::channel();
    std::thread::spawn(move || {
        let mut url_tx = Some(url_tx);
        for line in stdout.lines() {
            let Ok(line) = line else { break };
            if let Some(url) = line.trim().strip_prefix("proxy (QUEUE_SERVING_PORT)")
                && let Some(tx) = url_tx.take()
            {
                let _ = tx.send(url.trim().to_owned());
            }
        }
    });
    let url = within("the demo banner", url_rx).await.unwrap();
    let port: u16 = url
        .trim_start_matches("http://127.0.0.1:")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));

    let res = h1(addr, get("/", &[("host", "hello.default.example.com")])).await;
    assert_eq!(res.status(), 200);
    assert_eq!(text(res).await, "Hello World!\n");
    let res = h2(addr, get("http://hello.default.example.com/headers", &[])).await;
    let seen = text(res).await;
    assert!(seen.contains("x-forwarded-for: 127.0.0.1"), "{seen}");

    signal(child.id(), "INT");
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap());
    assert!(within("the demo to exit", status).await.unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_finishes_requests_in_flight_then_exits_0() {
    // The app holds the request until the test lets it go.
    let (app, mut arrived_rx) = App::holding("finished\n").await;
    let mut qp = QProxy::start(app.port(), &[]);

    let addr = qp.main;
    let in_flight = tokio::spawn(async move { text(h1(addr, get("/slow", &[])).await).await });
    let release = within("the request to reach the app", arrived_rx.recv())
        .await
        .unwrap();

    qp.signal("TERM");
    qp.wait_for_log("the stop", |l| {
        l["message"] == "Received TERM signal, attempting to gracefully shutdown servers."
    });
    assert!(qp.is_running(), "a request is still in flight");
    release.send(()).unwrap();
    assert_eq!(
        within("the held response", in_flight).await.unwrap(),
        "finished\n"
    );
    qp.wait_for_log("the exit", |l| {
        l["message"] == "Shutdown complete, exiting..."
    });
    assert_eq!(qp.wait_exit().code(), Some(0));
}

#[tokio::test(flavor = "multi_thread")]
async fn logs_go_where_the_zap_config_says() {
    let app = App::hello().await;
    // Knative's default: an empty config, so zap's production default, stderr.
    let mut qp = QProxy::start(app.port(), &[]);
    let logs = qp.stop_and_collect_logs();
    assert!(!logs.is_empty());
    assert!(logs.iter().all(|l| l["_stream"] == "stderr"), "{logs:#?}");

    // config-logging's documented zap-logger-config writes to stdout.
    let example = r#"{"level":"info","outputPaths":["stdout"],"errorOutputPaths":["stderr"],"encoding":"json","encoderConfig":{"timeKey":"timestamp","levelKey":"severity","nameKey":"logger","callerKey":"caller","messageKey":"message","levelEncoder":"","timeEncoder":"iso8601"}}"#;
    let mut qp = QProxy::start(app.port(), &[("SERVING_LOGGING_CONFIG", example)]);
    let logs = qp.stop_and_collect_logs();
    assert!(logs.iter().all(|l| l["_stream"] == "stdout"), "{logs:#?}");
    assert_eq!(logs[0]["severity"], "info");
}

/// Stops `qp` and returns the messages it logged as warnings.
fn warnings_logged(qp: &mut QProxy) -> Vec<String> {
    qp.stop_and_collect_logs()
        .iter()
        .filter(|l| l["severity"] == "WARNING")
        .map(|l| l["message"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn settings_not_honoured_are_logged_as_warnings() {
    let app = App::hello().await;
    // Current Knative's TLS settings, among classic's variables: the
    // metrics backend is classic's, and classic has no TLS settings, so
    // that one is not read, and not warned of.
    let mut qp = QProxy::start(
        app.port(),
        &[
            ("SERVING_REQUEST_METRICS_BACKEND", "stackdriver"),
            ("QUEUE_PROXY_TLS_MIN_VERSION", "1.0"),
        ],
    );
    let warnings = warnings_logged(&mut qp);
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(warnings[0].starts_with("SERVING_REQUEST_METRICS_BACKEND=\"stackdriver\""));

    // In current Knative, a bad TLS setting is warned of at start.
    let env = with_vars(
        current_knative_env(app.port()),
        &[("QUEUE_PROXY_TLS_MIN_VERSION", "1.0")],
    );
    let mut qp = QProxy::start_env(&env);
    let warnings = warnings_logged(&mut qp);
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(warnings[0].starts_with("QUEUE_PROXY_TLS_MIN_VERSION=\"1.0\" is invalid"));
}

#[test]
fn sigterm_right_after_start_is_a_clean_stop() {
    // The stop handler is in place before the first log line: a SIGTERM
    // from then on is a graceful stop, never the default kill.
    for _ in 0..20 {
        let mut qp = QProxy::spawn_env(&knative_env(closed_port()));
        qp.wait_for_log("the first line", |l| l["message"] == "Starting queue-proxy");
        qp.signal("TERM");
        assert_eq!(qp.wait_exit().code(), Some(0));
    }
}

/// The names of a process's threads.
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).unwrap())
        .map(|name| name.trim_end().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_thread_serves_unless_qproxy_workers_asks_for_a_pool() {
    let app = App::hello().await;
    // Tokio names the threads of its pool `tokio-rt-worker`.
    let workers = |qp: &QProxy| {
        thread_names(qp.pid())
            .iter()
            .filter(|n| *n == "tokio-rt-worker")
            .count()
    };
    for (setting, expected) in [(None, 0), (Some("3"), 3)] {
        let vars: Vec<(&str, &str)> = setting.map(|n| ("QPROXY_WORKERS", n)).into_iter().collect();
        let qp = QProxy::start(app.port(), &vars);
        let res = h1(qp.main, get("/", &[])).await;
        assert_eq!(text(res).await, "Hello World!\n");
        // A pool's threads start as the runtime is built, each in its own
        // time: the count is waited for, and then must not pass it.
        let what = format!("{expected} workers for QPROXY_WORKERS={setting:?}");
        until(&what, async || workers(&qp) >= expected).await;
        assert_eq!(workers(&qp), expected, "QPROXY_WORKERS={setting:?}");
    }
}
