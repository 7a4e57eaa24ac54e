//! Classic Knative's request metrics on the user metrics port (9091),
//! compared with what Knative's Go queue-proxy (serving v0.42.2) serves for the same
//! traffic.

use std::net::SocketAddr;

use qproxy_test_support::*;

/// The lines that do not depend on how fast each proxy is: HELP and TYPE,
/// counts, every latency bucket's series without its count (which bucket
/// a request falls into depends on the machine's load), gauges.
fn stable_lines(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = without_additions(text)
        .lines()
        .filter(|l| !l.is_empty())
        .filter(|l| !l.contains("_sum{"))
        .map(|l| match l.rsplit_once(' ') {
            Some((series, _)) if l.contains("_bucket{") && !l.contains("le=\"+Inf\"") => {
                series.to_owned()
            }
            _ => l.to_owned(),
        })
        .collect();
    lines.sort();
    lines
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn the_exposition_matches_the_go_queue_proxy() {
    let app = App::varied().await;
    let env = with_vars(knative_env(app.port()), &[("CONTAINER_CONCURRENCY", "2")]);
    let go = GoQueueProxy::start(&env).await;
    play_metrics_mix(go.main).await;
    let last = format!(
        "{} 1",
        classic_series("revision_request_count", 200, Some("blue"), "")
    );
    let go_metrics = SocketAddr::from(([127, 0, 0, 1], 9091));
    let want = scrape_until(go_metrics, &last).await;
    drop(go);

    let qp = QProxy::start_env(&env);
    play_metrics_mix(qp.main).await;
    let got = scrape_until(qp.metrics.expect("the metrics port"), &last).await;
    assert_eq!(stable_lines(&got), stable_lines(&want));
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn upgrades_and_cut_responses_count_as_go_counts_them() {
    let port = upgrade_and_abort_app().await;
    let env = with_vars(knative_env(port), &[("CONTAINER_CONCURRENCY", "2")]);
    // The upgrade counts as 200, the cut response as 500, at both levels.
    let last = format!(
        "{} 1",
        classic_series("revision_request_count", 500, Some("DISABLED"), "")
    );
    let go = GoQueueProxy::start(&env).await;
    play_upgrade_and_abort(go.main).await;
    let want = scrape_until(SocketAddr::from(([127, 0, 0, 1], 9091)), &last).await;
    drop(go);

    let qp = QProxy::start_env(&env);
    play_upgrade_and_abort(qp.main).await;
    let got = scrape_until(qp.metrics.expect("the metrics port"), &last).await;
    // The depth the cut request takes depends on whether the tunnel's
    // slot was given back yet, in either proxy.
    let without_depth = |text: &str| {
        let mut lines = stable_lines(text);
        lines.retain(|l| !l.starts_with("revision_queue_depth{"));
        lines
    };
    assert_eq!(without_depth(&got), without_depth(&want));
    let upgrade = format!(
        "{} 1",
        classic_series("revision_app_request_count", 200, None, "")
    );
    assert!(got.lines().any(|l| l == upgrade), "no {upgrade} in {got}");
}
