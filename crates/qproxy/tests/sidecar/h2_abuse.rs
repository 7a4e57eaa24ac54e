//! HTTP/2 abuse on the main port: what a client can make the sidecar
//! hold or do with frames a well-behaved client never sends, and that a
//! well-behaved client doing many of the same things is not mistaken for
//! one that abuses.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::Request;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use qproxy_test_support::h2frames::*;
use qproxy_test_support::*;
use tokio::net::TcpStream;

/// Knative's (Go's) limit of concurrent streams per connection.
const MAX_CONCURRENT_STREAMS: u32 = 250;

/// What qproxy's resident memory may grow by under one abusive connection.
const BOUNDED_GROWTH_KIB: u64 = 16 * 1024;

/// A fresh request on a fresh connection is answered 200.
async fn still_serves(qp: &QProxy) {
    let res = h2(qp.main, get("/", &[])).await;
    assert_eq!(res.status(), 200, "another client is served");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_cancelling_hundreds_of_streams_it_started_is_not_cut_off() {
    let (app, mut arrived) = App::holding("held").await;
    let qp = QProxy::start(app.port(), &[]);
    let stream = TcpStream::connect(qp.main).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);

    // Each request reaches the app, then the client gives up on it (its
    // response future dropped: RST_STREAM CANCEL), one after another.
    for i in 0..300 {
        sender.ready().await.unwrap();
        let pending = tokio::spawn(sender.send_request(get("/", &[])));
        let release = within(&format!("request {i} at the app"), arrived.recv())
            .await
            .unwrap();
        pending.abort();
        let _ = pending.await;
        drop(release);
    }

    // The connection still carries requests.
    sender.ready().await.unwrap();
    let last = tokio::spawn(sender.send_request(get("/", &[])));
    let release = within("the last request at the app", arrived.recv())
        .await
        .unwrap();
    release.send(()).unwrap();
    let res = within("the last response", last).await.unwrap().unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(text(res).await, "held");
    assert!(!conn.is_finished(), "the connection was closed");
    assert_eq!(app.seen().len(), 301);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_251st_concurrent_stream_is_refused_and_the_connection_kept() {
    let (app, mut arrived) = App::holding("held").await;
    let qp = QProxy::start(app.port(), &[]);
    let mut conn = RawH2::connect(qp.main, &[]).await;
    let streams: Vec<u32> = (0..=MAX_CONCURRENT_STREAMS).map(|i| 2 * i + 1).collect();
    for &id in &streams {
        conn.request(id, "GET", "/", true).await;
    }
    let last = *streams.last().unwrap();
    let refused = conn
        .until("the 251st stream refused", |f| f.kind == RST_STREAM)
        .await;
    assert_eq!(refused.stream, last);
    assert_eq!(refused.error_code(), Some(REFUSED_STREAM));

    // The 250 others reached the app and are answered once released.
    let mut releases = Vec::new();
    for i in 0..MAX_CONCURRENT_STREAMS {
        releases.push(
            within(&format!("stream {i} at the app"), arrived.recv())
                .await
                .unwrap(),
        );
    }
    for release in releases {
        release.send(()).unwrap();
    }
    let mut answered = 0;
    while answered < MAX_CONCURRENT_STREAMS {
        let f = conn
            .until("the held streams answered", |f| {
                f.kind == HEADERS || f.kind == GOAWAY
            })
            .await;
        assert_ne!(f.kind, GOAWAY, "the connection was closed: {f:?}");
        assert!(f.is_200_on(f.stream), "{f:?}");
        answered += 1;
    }

    // And the connection takes new streams.
    conn.request(last + 2, "GET", "/", true).await;
    within("the next stream at the app", arrived.recv())
        .await
        .unwrap()
        .send(())
        .unwrap();
    conn.until("the next stream answered", |f| f.is_200_on(last + 2))
        .await;
    assert_eq!(app.seen().len(), MAX_CONCURRENT_STREAMS as usize + 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_continuation_flood_ends_the_connection_with_memory_bounded() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);
    let before = rss_kib(qp.pid());
    let mut conn = RawH2::connect(qp.main, &[]).await;

    // A request head that never ends: CONTINUATION after CONTINUATION of
    // header fields, up to 64 MiB, or until the server stops it.
    conn.send(&frame(HEADERS, 0, 1, &request_block("GET", "/")))
        .await
        .unwrap();
    let fields: Vec<u8> = (0..128)
        .flat_map(|i| literal_field(&format!("x-{i}"), 100))
        .collect();
    let continuation = frame(CONTINUATION, 0, 1, &fields);
    let mut sent = 0;
    while sent < 64 << 20 && !conn.saw_close() {
        if conn.send(&continuation).await.is_err() {
            break;
        }
        sent += continuation.len();
    }
    let frames = conn.closed("the connection closed").await;
    assert!(
        frames.iter().all(|f| f.kind != HEADERS),
        "the endless head got an answer: {frames:?}"
    );
    // Go's server says PROTOCOL_ERROR; both end the connection.
    assert!(
        frames
            .iter()
            .any(|f| f.kind == GOAWAY && f.error_code() == Some(ENHANCE_YOUR_CALM)),
        "{frames:?}"
    );
    let grown = rss_kib(qp.pid()).saturating_sub(before);
    eprintln!("CONTINUATION: {sent} bytes sent, {grown} KiB grown, {frames:?}");
    assert!(
        grown < BOUNDED_GROWTH_KIB,
        "{grown} KiB more after {sent} bytes"
    );
    still_serves(&qp).await;
}

/// Writes `frame` over and over on `conn` for up to `budget`, or until
/// the connection fails; how many were sent (a write the server does not
/// read blocks until the budget is spent).
async fn flood(conn: &mut RawH2, frame: &[u8], budget: Duration) -> usize {
    let batch: Vec<u8> = frame.repeat(1000);
    let mut sent = 0;
    let _ = tokio::time::timeout(budget, async {
        while conn.send(&batch).await.is_ok() {
            sent += 1000;
        }
    })
    .await;
    sent
}

#[tokio::test(flavor = "multi_thread")]
async fn settings_and_ping_floods_hold_memory_bounded_and_others_are_served() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);
    let before = rss_kib(qp.pid());
    // Each of these asks the server for an answer (an ACK, a PONG) that a
    // flooding client never reads.
    for (what, f) in [
        (
            "SETTINGS",
            frame(
                SETTINGS,
                0,
                0,
                &[0, INITIAL_WINDOW_SIZE as u8, 0, 0, 0xff, 0xff],
            ),
        ),
        ("PING", frame(PING, 0, 0, b"12345678")),
    ] {
        let mut conn = RawH2::connect(qp.main, &[]).await;
        conn.stop_reading();
        let sent = flood(&mut conn, &f, Duration::from_secs(5)).await;
        let grown = rss_kib(qp.pid()).saturating_sub(before);
        eprintln!("{what}: {sent} frames sent, {grown} KiB grown");
        assert!(
            grown < BOUNDED_GROWTH_KIB,
            "{what}: {grown} KiB more after {sent} frames"
        );
        still_serves(&qp).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_window_update_past_the_largest_window_is_a_flow_control_error() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);
    let mut conn = RawH2::connect(qp.main, &[]).await;
    // The connection's window is 65,535 already: this takes it past 2^31-1.
    conn.send(&frame(WINDOW_UPDATE, 0, 0, &0x7fff_ffffu32.to_be_bytes()))
        .await
        .unwrap();
    let goaway = conn.until("a GOAWAY", |f| f.kind == GOAWAY).await;
    assert_eq!(goaway.error_code(), Some(FLOW_CONTROL_ERROR));
    conn.closed("the connection closed").await;
    still_serves(&qp).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_reads_nothing_holds_no_more_than_windows_of_a_large_response() {
    // The app would send 256 MiB; it counts what it got to send.
    let produced = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = produced.clone();
    let app = App::start(move |_| {
        let counter = counter.clone();
        async move {
            let chunks = futures_util::stream::iter(0..4096).map(move |_| {
                counter.fetch_add(64 << 10, std::sync::atomic::Ordering::Relaxed);
                Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(Bytes::from(
                    vec![b'x'; 64 << 10],
                )))
            });
            let body = http_body_util::StreamBody::new(chunks);
            http::Response::new(body.map_err(|e| match e {}).boxed())
        }
    })
    .await;
    let qp = QProxy::start(app.port(), &[]);
    let before = rss_kib(qp.pid());
    // A window of zero: the server may send no DATA at all.
    let mut conn = RawH2::connect(qp.main, &[(INITIAL_WINDOW_SIZE, 0)]).await;
    conn.request(1, "GET", "/", true).await;
    conn.until("the response head", |f| f.is_200_on(1)).await;
    // The app is held back once the buffers between it and the client are
    // full: what it produced stops growing.
    let mut last = 0;
    let mut steady = 0;
    until("the app held back", async || {
        let now = produced.load(std::sync::atomic::Ordering::Relaxed);
        steady = if now == last { steady + 1 } else { 0 };
        last = now;
        if steady >= 25 { Ok(()) } else { Err(now) }
    })
    .await;
    assert!(
        last < 32 << 20,
        "{last} bytes left the app for a client that reads nothing"
    );
    let grown = rss_kib(qp.pid()).saturating_sub(before);
    eprintln!("zero window: the app sent {last} bytes, {grown} KiB grown");
    assert!(
        grown < BOUNDED_GROWTH_KIB,
        "{grown} KiB more with {last} bytes sent by the app"
    );
    still_serves(&qp).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_whose_body_never_comes_ends_at_the_revision_timeout() {
    let app = App::varied().await;
    let qp = QProxy::start(app.port(), &[("REVISION_TIMEOUT_SECONDS", "1")]);
    let stream = TcpStream::connect(qp.main).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    // A body whose sender is kept and never sends.
    let (_keep, body) = futures_channel_body();
    let req = Request::post("http://a/echo").body(body).unwrap();
    let res = within("the response", sender.send_request(req))
        .await
        .unwrap();
    assert_eq!(res.status(), 504);
}

/// A request body that sends nothing until the returned sender is used or
/// dropped.
fn futures_channel_body() -> (
    tokio::sync::mpsc::Sender<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>,
    TestBody,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    (tx, body.map_err(|e| match e {}).boxed())
}
