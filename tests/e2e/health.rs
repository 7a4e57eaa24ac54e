//! Health checks and network probes, answered field by field as Knative's
//! Go queue-proxy answers them, run side by side with the same
//! environment in front of the same app.

use std::net::SocketAddr;

use http::Response;
use qproxy_test_support::*;

/// Plays every case against both proxies and compares.
async fn compare_all(go: SocketAddr, qp: SocketAddr, when: &str) {
    for (name, headers) in HEALTH_CHECKS {
        let mut want = health_check(go, headers).await;
        let mut got = health_check(qp, headers).await;
        if name.ends_with("is proxied") {
            // Go's server sniffs a `Content-Type` for app responses that
            // have none; qproxy passes them on as they are (a known
            // difference, listed in docs/differences.md).
            want.content_type = None;
            got.content_type = None;
        }
        assert_eq!(got, want, "{name} ({when})");
    }
}

/// Waits until a kubelet health check on `addr` answers `503`.
async fn wait_draining(addr: SocketAddr) {
    until("health checks failing", async || {
        health_check(addr, &[KUBELET, QUEUE]).await.status == 503
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn health_checks_and_probes_answer_as_go_does_before_and_during_a_drain() {
    let app = App::hello().await;
    let mut env = knative_env(app.port());
    env.retain(|(k, _)| k != "QPROXY_DRAIN_QUIET_SECONDS");
    let go = GoQueueProxy::start(&env).await;
    let qp = QProxy::start_env(&env);

    compare_all(go.main, qp.main, "serving").await;
    let ready = health_check(qp.main, &[KUBELET, QUEUE]).await;
    assert_eq!((ready.status, ready.body.as_str()), (200, "queue"));
    let proxied = health_check(qp.main, &[("K-Kubelet-Probe", "1"), QUEUE]).await;
    assert_eq!(proxied.body, "Hello World!\n", "reaches the app");

    go.signal("TERM");
    qp.signal("TERM");
    wait_draining(go.main).await;
    wait_draining(qp.main).await;
    compare_all(go.main, qp.main, "draining").await;
    let draining = health_check(qp.main, &[ACTIVATOR, QUEUE]).await;
    assert_eq!(
        (draining.status, draining.body.as_str()),
        (503, "shutting down\n")
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn a_failing_readiness_probe_answers_as_go_does() {
    let app = App::start(|req| async move {
        let status = if req.uri().path() == "/ready" {
            200
        } else {
            500
        };
        let mut res = Response::new(full("probe answer"));
        *res.status_mut() = http::StatusCode::from_u16(status).unwrap();
        res
    })
    .await;
    for (path, want) in [("/ready", 200), ("/broken", 503)] {
        let mut env = knative_env(app.port());
        let probe = format!(
            r#"{{"httpGet":{{"path":"{path}","port":{},"host":"127.0.0.1","scheme":"HTTP"}},"timeoutSeconds":1,"periodSeconds":1,"successThreshold":1}}"#,
            app.port()
        );
        env.retain(|(k, _)| k != "SERVING_READINESS_PROBE");
        env.push(("SERVING_READINESS_PROBE".to_owned(), probe));
        let go = GoQueueProxy::start(&env).await;
        let qp = QProxy::start_env(&env);
        compare_all(go.main, qp.main, path).await;
        assert_eq!(health_check(qp.main, &[KUBELET, QUEUE]).await.status, want);
        let not_ready = health_check(qp.main, &[AUTOSCALER, QUEUE]).await;
        if want == 503 {
            assert_eq!(not_ready.body, "", "an empty 503");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn the_readiness_probe_request_is_the_one_go_sends() {
    let app = App::hello().await;
    let mut env = knative_env(app.port());
    let probe = format!(
        r#"{{"httpGet":{{"path":"/healthz?deep=1","port":{},"host":"127.0.0.1","scheme":"HTTP","httpHeaders":[{{"name":"X-Probe","value":"a b"}},{{"name":"X-Probe","value":"c"}}]}},"timeoutSeconds":1,"periodSeconds":0,"successThreshold":1}}"#,
        app.port()
    );
    env.retain(|(k, _)| k != "SERVING_READINESS_PROBE");
    env.push(("SERVING_READINESS_PROBE".to_owned(), probe));
    compare_probe_requests(&app, &env).await;
    // With HTTP/2 detection, the classic way: an upgrade request first.
    env.retain(|(k, _)| k != "ENABLE_HTTP2_AUTO_DETECTION");
    env.push(("ENABLE_HTTP2_AUTO_DETECTION".to_owned(), "true".to_owned()));
    compare_probe_requests(&app, &env).await;
}

async fn compare_probe_requests(app: &App, env: &[(String, String)]) {
    let mut seen = Vec::new();
    for oracle in [true, false] {
        let before = app.seen().len();
        let (go, qp);
        let main = if oracle {
            go = GoQueueProxy::start(env).await;
            go.main
        } else {
            qp = QProxy::start_env(env);
            qp.main
        };
        assert_eq!(health_check(main, &[KUBELET, QUEUE]).await.status, 200);
        let request = app.seen()[before..].to_vec();
        assert_eq!(request.len(), 1, "one probe request: {request:#?}");
        seen.push(request.into_iter().next().unwrap());
    }
    let (go, qp) = (&seen[0], &seen[1]);
    assert_eq!(
        (&qp.method, &qp.uri, qp.version),
        (&go.method, &go.uri, go.version)
    );
    let mut names: Vec<_> = go.headers.keys().collect();
    names.sort_by_key(|n| n.as_str());
    let mut qp_names: Vec<_> = qp.headers.keys().collect();
    qp_names.sort_by_key(|n| n.as_str());
    assert_eq!(qp_names, names, "the same header names");
    for name in names {
        let values = |h: &http::HeaderMap| h.get_all(name).iter().cloned().collect::<Vec<_>>();
        assert_eq!(values(&qp.headers), values(&go.headers), "{name}");
    }
}
