//! The user container's readiness probe, run by qproxy when a health check
//! asks, against real apps on loopback: HTTP (HTTP/1 and h2c), TCP and
//! gRPC probes, aggressive and periodic, single and multi-container.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use http::{Response, StatusCode, Version};
use qproxy_test_support::*;
use tokio::net::TcpListener;

/// qproxy in front of `app_port`, probing with `probe` (JSON).
fn with_probe(app_port: u16, probe: &str, extra: &[(&str, &str)]) -> QProxy {
    let mut overrides = vec![("SERVING_READINESS_PROBE", probe)];
    overrides.extend_from_slice(extra);
    QProxy::start(app_port, &overrides)
}

fn http_probe(port: u16, path: &str, period: u32) -> String {
    format!(
        r#"{{"httpGet":{{"path":"{path}","port":{port},"host":"127.0.0.1","scheme":"HTTP","httpHeaders":[{{"name":"X-Probe","value":"ready?"}}]}},"timeoutSeconds":1,"periodSeconds":{period},"successThreshold":1}}"#
    )
}

fn tcp_probe(port: u16, period: u32) -> String {
    format!(
        r#"{{"tcpSocket":{{"port":{port},"host":"127.0.0.1"}},"timeoutSeconds":1,"periodSeconds":{period}}}"#
    )
}

fn grpc_probe(port: u16, service: &str) -> String {
    format!(
        r#"{{"grpc":{{"port":{port},"service":"{service}"}},"timeoutSeconds":1,"periodSeconds":1}}"#
    )
}

/// An app answering `status` on `/status/<code>` and `200` elsewhere,
/// with a `Location` on `/redirect`.
async fn status_app() -> App {
    App::start(|req| async move {
        let path = req.uri().path().to_owned();
        let mut res = Response::new(full("probe"));
        if let Some(code) = path.strip_prefix("/status/") {
            *res.status_mut() = StatusCode::from_u16(code.parse().unwrap()).unwrap();
        } else if let Some(to) = path.strip_prefix("/redirect") {
            *res.status_mut() = StatusCode::FOUND;
            res.headers_mut()
                .insert("location", format!("/status{to}").parse().unwrap());
        }
        res
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http_probe_sends_what_the_kubelet_sends() {
    let app = status_app().await;
    let qp = with_probe(
        app.port(),
        &http_probe(app.port(), "/healthz?deep=1", 1),
        &[],
    );
    assert_eq!(kubelet_health(qp.main).await, (200, "queue".to_owned()));
    let seen = app.only();
    assert_eq!(seen.method, "GET");
    assert_eq!(seen.uri, "/healthz?deep=1");
    assert_eq!(seen.version, Version::HTTP_11);
    let header = |name: &str| {
        seen.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    assert_eq!(header("user-agent").as_deref(), Some("kube-probe//"));
    assert_eq!(header("x-probe").as_deref(), Some("ready?"));
    assert_eq!(header("host"), Some(format!("127.0.0.1:{}", app.port())));
    assert_eq!(header("connection").as_deref(), Some("close"));
    assert_eq!(header("accept-encoding").as_deref(), Some("gzip"));
}

#[tokio::test(flavor = "multi_thread")]
async fn http_statuses_2xx_and_3xx_pass_others_fail() {
    let app = status_app().await;
    for (path, want) in [
        ("/status/204", 200),
        ("/status/302", 200),
        ("/status/399", 200),
        ("/status/404", 503),
        ("/status/500", 503),
        ("/status/503", 503),
        // Redirects are followed, and the final answer decides.
        ("/redirect/200", 200),
        ("/redirect/500", 503),
    ] {
        let qp = with_probe(app.port(), &http_probe(app.port(), path, 1), &[]);
        assert_eq!(kubelet_health(qp.main).await.0, want, "{path}");
    }
    let redirected: Vec<_> = app
        .seen()
        .into_iter()
        .filter(|s| s.uri.path() == "/status/500" && s.headers.contains_key("referer"))
        .collect();
    assert_eq!(redirected.len(), 1, "the redirect was followed");
    assert_eq!(
        redirected[0].headers["x-probe"], "ready?",
        "with the probe's headers"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_aggressive_probe_waits_for_an_app_that_starts_late() {
    // The app's port accepts before the app is up, and drops what it
    // accepts: each of the probe's first tries fails. The app comes up
    // once three tries have come and gone, as a slow-starting app would.
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let qp = with_probe(port, &http_probe(port, "/", 0), &[]);
    let check = tokio::spawn(async move {
        let answer = kubelet_health(qp.main).await;
        (answer, Instant::now(), qp)
    });
    for n in 1..=3 {
        let (tried, _) = within(&format!("the probe's try {n}"), listener.accept())
            .await
            .unwrap();
        drop(tried);
    }
    assert!(!check.is_finished(), "answered while the app was down");
    let listening_since = Instant::now();
    let app = App::serve(listener, |_| async { Response::new(full("up")) }).await;
    let (answer, answered_at, _qp) = within("the health check", check).await.unwrap();
    assert_eq!(answer, (200, "queue".to_owned()));
    assert!(
        answered_at >= listening_since,
        "answered only once the app was up"
    );
    assert!(!app.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_aggressive_probe_gives_up_after_ten_seconds() {
    let port = closed_port();
    let qp = with_probe(port, &http_probe(port, "/", 0), &[]);
    let (status, body) = within("the health check's answer", kubelet_health(qp.main)).await;
    assert_eq!((status, body.as_str()), (503, ""));
    // It kept trying rather than failing on the first refused connection:
    // the error counts the tries that failed.
    let line = qp.wait_for_log("the probe failure", |l| {
        l["message"] == "readiness probe failed"
            && l["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("aggressive probe error (failed "))
    });
    let error = line["error"].as_str().unwrap();
    let failures: u32 = error
        .trim_start_matches("aggressive probe error (failed ")
        .split_once(' ')
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of failures in {error:?}"));
    assert!(failures > 1, "it gave up at the first failure: {error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn tcp_probes_pass_when_the_app_accepts() {
    let app = App::hello().await;
    let up = with_probe(app.port(), &tcp_probe(app.port(), 0), &[]);
    assert_eq!(kubelet_health(up.main).await.0, 200);
    let down_port = closed_port();
    let down = with_probe(down_port, &tcp_probe(down_port, 1), &[]);
    assert_eq!(kubelet_health(down.main).await.0, 503);
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_probes_ask_the_health_service() {
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("ready.svc", tonic_health::ServingStatus::Serving)
        .await;
    reporter
        .set_service_status("sick.svc", tonic_health::ServingStatus::NotServing)
        .await;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream_of(listener)),
    );
    for (service, want) in [
        ("", 200),
        ("ready.svc", 200),
        ("sick.svc", 503),
        ("unknown.svc", 503),
    ] {
        let qp = with_probe(port, &grpc_probe(port, service), &[]);
        assert_eq!(kubelet_health(qp.main).await.0, want, "service {service:?}");
    }
    // An HTTP app is no gRPC health server.
    let app = App::hello().await;
    let qp = with_probe(app.port(), &grpc_probe(app.port(), ""), &[]);
    assert_eq!(kubelet_health(qp.main).await.0, 503);
}

/// The accepted connections of `listener`, as tonic takes them.
fn tokio_stream_of(
    listener: TcpListener,
) -> impl futures_util::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(s, _)| s);
        Some((accepted, listener))
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn every_probe_of_a_multi_container_list_must_pass() {
    let app = status_app().await;
    let port = app.port();
    let list = |second: &str| format!("[{},{}]", tcp_probe(port, 1), http_probe(port, second, 1));
    let multi = [("ENABLE_MULTI_CONTAINER_PROBES", "true")];
    let all_up = with_probe(port, &list("/status/200"), &multi);
    assert_eq!(kubelet_health(all_up.main).await.0, 200);
    let one_down = with_probe(port, &list("/status/500"), &multi);
    assert_eq!(kubelet_health(one_down.main).await.0, 503);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_probe_that_does_not_parse_stops_the_start() {
    let mut env = knative_env(closed_port());
    env.retain(|(k, _)| k != "SERVING_READINESS_PROBE");
    env.push((
        "SERVING_READINESS_PROBE".to_owned(),
        r#"{"httpGet":{"port":"http"}}"#.to_owned(),
    ));
    let out = run_to_exit(&env);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("qproxy: SERVING_READINESS_PROBE="),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_health_checks_share_one_probe_run() {
    let probes = Arc::new(AtomicUsize::new(0));
    let count = probes.clone();
    let (tx, mut arrived) = tokio::sync::mpsc::channel(16);
    let app = App::start(move |_| {
        let tx = tx.clone();
        count.fetch_add(1, Ordering::SeqCst);
        async move {
            let (release, released) = tokio::sync::oneshot::channel::<()>();
            tx.send(release).await.unwrap();
            let _ = released.await;
            Response::new(full("ok"))
        }
    })
    .await;
    let qp = Arc::new(with_probe(
        app.port(),
        &http_probe(app.port(), "/", 1),
        &[("SERVING_LOGGING_LEVEL", "debug")],
    ));
    let check = || {
        let qp = qp.clone();
        tokio::spawn(async move { kubelet_health(qp.main).await })
    };
    let first = check();
    // The first check's probe is at the app, held there.
    let release = within("the probe", arrived.recv()).await.unwrap();
    let joined: Vec<_> = (0..5).map(|_| check()).collect();
    let qp_logs = qp.clone();
    tokio::task::spawn_blocking(move || {
        qp_logs.wait_for_logs("five checks joining the run", 5, |l| {
            l["message"] == "readiness check joins the probe run under way"
        })
    })
    .await
    .unwrap();
    release.send(()).unwrap();
    assert_eq!(first.await.unwrap().0, 200);
    for c in joined {
        assert_eq!(c.await.unwrap().0, 200);
    }
    assert_eq!(probes.load(Ordering::SeqCst), 1, "one probe for six checks");
    // A later check runs the probe again.
    let again = check();
    within("the second probe", arrived.recv())
        .await
        .unwrap()
        .send(())
        .unwrap();
    assert_eq!(again.await.unwrap().0, 200);
    assert_eq!(probes.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn h2c_detection_follows_each_generation() {
    let app = status_app().await;
    let detect = ("ENABLE_HTTP2_AUTO_DETECTION", "true");
    // Classic asks to upgrade over HTTP/1; the app does not switch and
    // answers 200, which passes at once.
    let classic = with_probe(app.port(), &http_probe(app.port(), "/up", 1), &[detect]);
    assert_eq!(kubelet_health(classic.main).await.0, 200);
    let seen = app.seen();
    let upgrade = seen.iter().find(|s| s.uri.path() == "/up").unwrap();
    assert_eq!(upgrade.method, "OPTIONS");
    assert_eq!(upgrade.headers["upgrade"], "h2c");
    assert!(
        !upgrade.headers.contains_key("x-probe"),
        "no custom headers"
    );

    // Current tries h2c first; the app speaks it, so the probe goes over h2c.
    let current = with_probe(
        app.port(),
        &http_probe(app.port(), "/h2", 1),
        &[detect, ("OBSERVABILITY_CONFIG", "{}")],
    );
    assert_eq!(kubelet_health(current.main).await.0, 200);
    let h2: Vec<_> = app
        .seen()
        .into_iter()
        .filter(|s| s.uri.path() == "/h2")
        .collect();
    assert_eq!(h2.len(), 2, "detection, then the probe: {h2:#?}");
    assert!(h2.iter().all(|s| s.version == Version::HTTP_2));
    assert!(h2[1].headers.contains_key("x-probe"));
}
