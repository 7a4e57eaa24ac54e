//! The autoscaler's stats on 9090 through the real binary: what Knative's
//! autoscaler decodes, under a known load.

use http::{Request, StatusCode};
use prost::Message;
use qproxy_autoscaler_client::Stat;
use qproxy_test_support::*;

/// Scrapes the stats port as Knative's autoscaler does.
async fn scrape(qp: &QProxy) -> Stat {
    let req = Request::get("/metrics")
        .header("accept", "application/protobuf")
        .body(empty())
        .unwrap();
    let res = h1(qp.stats, req).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["content-type"], "application/protobuf");
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    Stat::decode(body).expect("a Stat")
}

/// Scrapes until a stat satisfies `pred` (a new one comes every second).
async fn wait_for_stat(qp: &QProxy, what: &str, pred: impl Fn(&Stat) -> bool) -> Stat {
    until(what, async || {
        let stat = scrape(qp).await;
        if pred(&stat) { Ok(stat) } else { Err(stat) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrency_and_the_proxied_part_under_a_known_load() {
    let (app, mut arrived) = App::holding("done").await;
    let qp = QProxy::start(app.port(), &[]);

    // The first scrape: only the pod's name, unless a report already came.
    let first = scrape(&qp).await;
    assert_eq!(first.pod_name, "hello-00001-deployment-6d8d4bd5b-x7k2p");
    if first.process_uptime == 0.0 {
        assert_eq!(
            first,
            Stat {
                pod_name: first.pod_name.clone(),
                ..Stat::default()
            }
        );
    }

    // Five requests held at the app, two of them through the activator,
    // and a kubelet probe, which does not count.
    let mut clients = Vec::new();
    for headers in [
        vec![],
        vec![],
        vec![],
        vec![("k-proxy-request", "activator")],
        vec![("k-proxy-request", "activator")],
        vec![("k-kubelet-probe", "queue")],
    ] {
        let addr = qp.main;
        clients.push(tokio::spawn(async move {
            text(h1(addr, get("/", &headers)).await).await
        }));
    }
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(
            within("a request at the app", arrived.recv())
                .await
                .unwrap(),
        );
    }

    // A whole period with them all in flight reads exactly 5 and 2.
    let stat = wait_for_stat(&qp, "a full period at 5", |s| {
        s.average_concurrent_requests == 5.0
    })
    .await;
    assert_eq!(stat.average_proxied_concurrent_requests, 2.0);
    assert_eq!(stat.pod_name, "hello-00001-deployment-6d8d4bd5b-x7k2p");
    assert!(stat.process_uptime > 0.0);
    assert_eq!(stat.timestamp, 0);

    // Protobuf too for a client asking for text, as Knative's queue-proxy
    // answers it.
    let req = Request::get("/metrics")
        .header("accept", "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
        .body(empty())
        .unwrap();
    let res = h1(qp.stats, req).await;
    assert_eq!(res.headers()["content-type"], "application/protobuf");

    // Once they finish, a period goes by with nothing in flight.
    for release in held {
        release.send(()).unwrap();
    }
    for client in clients {
        assert_eq!(within("response", client).await.unwrap(), "done");
    }
    wait_for_stat(&qp, "an idle period", |s| {
        s.process_uptime > stat.process_uptime
            && s.average_concurrent_requests == 0.0
            && s.request_count == 0.0
    })
    .await;

    // Only /metrics is served.
    let res = h1(qp.stats, get("/", &[])).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upgraded_connection_counts_until_it_closes() {
    let port = websocket_echo_app().await;
    let qp = QProxy::start(port, &[]);
    let ws = websocket(qp.main).await;
    let open = wait_for_stat(&qp, "a period with the tunnel open", |s| {
        s.average_concurrent_requests == 1.0
    })
    .await;
    drop(ws);
    wait_for_stat(&qp, "a period after it closed", |s| {
        s.average_concurrent_requests == 0.0 && s.process_uptime > open.process_uptime
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_the_client_abandons_counts_out() {
    let (app, mut arrived) = App::holding("done").await;
    let qp = QProxy::start(app.port(), &[]);
    let addr = qp.main;
    let client = tokio::spawn(async move { h1(addr, get("/", &[])).await });
    let _held = within("the request at the app", arrived.recv()).await;
    let busy = wait_for_stat(&qp, "a period with it in flight", |s| {
        s.average_concurrent_requests == 1.0
    })
    .await;
    // The client goes away while the app still holds the request.
    client.abort();
    wait_for_stat(&qp, "a period after it left", |s| {
        s.average_concurrent_requests == 0.0 && s.process_uptime > busy.process_uptime
    })
    .await;
}
