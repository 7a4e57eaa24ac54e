//! Health checks and network probes are answered by qproxy itself: they
//! never reach the app nor count for the autoscaler. (How each is answered
//! is compared with Knative's Go queue-proxy in `tests/e2e`.)

use std::net::SocketAddr;

use qproxy_test_support::*;

#[tokio::test(flavor = "multi_thread")]
async fn health_checks_never_reach_the_app_or_the_stats() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);
    // Health checks keep coming while the autoscaler's stats are reported
    // twice: every report in between counts no request.
    until("two stats reports", async || {
        for (_, headers) in HEALTH_CHECKS
            .iter()
            .filter(|(name, _)| !name.ends_with("is proxied"))
        {
            health_check(qp.main, headers).await;
        }
        let stats = stat_gauges(qp.stats).await;
        assert_eq!(stats.requests_per_second, 0.0, "a health check was counted");
        stats.uptime >= 2.0
    })
    .await;
    assert!(app.seen().is_empty(), "the app saw {:#?}", app.seen());
}

struct Gauges {
    requests_per_second: f64,
    uptime: f64,
}

/// The latest `Stat`.
async fn stat_gauges(stats: SocketAddr) -> Gauges {
    use http_body_util::BodyExt;
    use prost::Message;
    let res = h1(stats, get("/metrics", &[])).await;
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let stat = qproxy_autoscaler_client::Stat::decode(body).expect("a Stat");
    Gauges {
        requests_per_second: stat.request_count,
        uptime: stat.process_uptime,
    }
}
