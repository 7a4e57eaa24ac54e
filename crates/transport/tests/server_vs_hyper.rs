//! qproxy's HTTP/1.1 server against hyper's: the same bytes sent to a
//! connection served each way must reach the service as the same requests
//! and come back as the same bytes (but for the `Date`).
//!
//! Served "each way" is as qproxy serves its main port: this crate's
//! [`serve`] until it hands the connection to hyper, and hyper from then on
//! with the bytes read so far; or hyper alone.

#![allow(clippy::unwrap_used)]

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::{
    HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, Version,
};
use http_body::{Body as _, Frame};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use qproxy_transport::server::MAX_BODY;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::service_fn;

use support::{Server, TestBody, spawn_connection};

type AnswerBody = BoxBody<Bytes, Infallible>;
type MakeResponse = fn() -> Response<AnswerBody>;

/// What the service saw of a request.
#[derive(Debug, PartialEq)]
struct Seen {
    method: Method,
    uri: Uri,
    version: Version,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// The body's length as the service was told it.
    length: Option<u64>,
    body: Bytes,
}

/// How the test service treats a request's body.
#[derive(Debug, Clone, Copy)]
enum Reading {
    /// Reads it whole, then answers.
    First,
    /// Reads it whole, then waits half a second (paused time) to answer.
    ThenWait,
    /// Waits half a second, then answers without reading it.
    Never,
}

/// Sends `sent` to a main-port connection served by qproxy's server
/// (`own`) or by hyper alone, whose service answers every request
/// with `answer`, treating bodies as `reading` says; closes the
/// client's end after it when `hang_up`.
/// Returns what came back until the connection closed or went quiet,
/// with each `Date` masked, the requests the service saw, and which
/// server gave it each.
async fn run_with(
    own: bool,
    sent: &[u8],
    answer: MakeResponse,
    hang_up: bool,
    reading: Reading,
) -> (String, Vec<Seen>, Vec<Server>) {
    let (mut client, server) = tokio::io::duplex(1 << 18);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let served = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let record_server = served.clone();
    let service = service_fn(move |req: Request<TestBody>| {
        let record = record.clone();
        record_server.lock().unwrap().push(req.body().server());
        async move {
            let (parts, body) = req.into_parts();
            let length = body.size_hint().exact();
            let body = match reading {
                Reading::Never => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Bytes::new()
                }
                Reading::First | Reading::ThenWait => body
                    .collect()
                    .await
                    .map(|c| c.to_bytes())
                    .unwrap_or_default(),
            };
            if let Reading::ThenWait = reading {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            record.lock().unwrap().push(Seen {
                method: parts.method,
                uri: parts.uri,
                version: parts.version,
                headers: parts
                    .headers
                    .iter()
                    .map(|(n, v)| (n.clone(), v.clone()))
                    .collect(),
                length,
                body,
            });
            Ok::<_, Infallible>(answer())
        }
    });
    spawn_connection(server, own, service);
    client.write_all(sent).await.unwrap();
    if hang_up {
        client.shutdown().await.unwrap();
    }
    let mut got = Vec::new();
    let mut buf = [0; 4096];
    // Time is paused: the timeout fires once nothing else can happen.
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(1), client.read(&mut buf)).await
        && n > 0
    {
        got.extend_from_slice(&buf[..n]);
    }
    let got = String::from_utf8_lossy(&got)
        .split("\r\n")
        .map(|line| {
            if line.starts_with("Date: ") {
                "Date: *"
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\r\n");
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let served = std::mem::take(&mut *served.lock().unwrap());
    (got, seen, served)
}

/// Runs `sent` both ways and checks that they agree; returns what
/// came back.
async fn same(sent: &[u8], answer: MakeResponse, hang_up: bool) -> String {
    same_with(sent, answer, hang_up, Reading::First).await
}

/// [`same`], the service treating bodies as `reading` says.
async fn same_with(sent: &[u8], answer: MakeResponse, hang_up: bool, reading: Reading) -> String {
    same_served(sent, answer, hang_up, reading).await.0
}

/// [`same_with`]; and which server gave the service each request when
/// this crate's server serves the connection first.
async fn same_served(
    sent: &[u8],
    answer: MakeResponse,
    hang_up: bool,
    reading: Reading,
) -> (String, Vec<Server>) {
    let (ours, ours_seen, ours_served) = run_with(true, sent, answer, hang_up, reading).await;
    let (hyper, hyper_seen, hyper_served) = run_with(false, sent, answer, hang_up, reading).await;
    assert!(
        hyper_served.iter().all(|s| *s == Server::Hyper),
        "hyper alone: {hyper_served:?}"
    );
    assert_eq!(
        ours,
        hyper,
        "answers to {:?}",
        String::from_utf8_lossy(sent)
    );
    assert_eq!(
        ours_seen,
        hyper_seen,
        "requests of {:?}",
        String::from_utf8_lossy(sent)
    );
    (ours, ours_served)
}

fn body(b: impl Into<Full<Bytes>>) -> AnswerBody {
    b.into().boxed()
}

/// A body of unknown length: these frames.
fn streamed(frames: Vec<Frame<Bytes>>) -> AnswerBody {
    StreamBody::new(futures_util::stream::iter(frames.into_iter().map(Ok))).boxed()
}

fn with(
    status: u16,
    headers: &[(&'static str, &'static str)],
    b: AnswerBody,
) -> Response<AnswerBody> {
    let mut res = Response::new(b);
    *res.status_mut() = StatusCode::from_u16(status).unwrap();
    for (name, value) in headers {
        res.headers_mut()
            .append(*name, HeaderValue::from_static(value));
    }
    res
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";

const ANSWERS: &[(&str, MakeResponse)] = &[
    ("empty", || Response::new(Empty::new().boxed())),
    ("sized", || {
        with(200, &[("content-type", "text/plain")], body("hello"))
    }),
    ("sized, with its length", || {
        with(200, &[("content-length", "5")], body("hello"))
    }),
    ("not found", || with(404, &[], body("nope"))),
    ("no content, with a length", || {
        with(204, &[("content-length", "0")], Empty::new().boxed())
    }),
    ("not modified, with a body", || with(304, &[], body("x"))),
    ("streamed", || {
        with(
            200,
            &[],
            streamed(vec![Frame::data("he".into()), Frame::data("llo".into())]),
        )
    }),
    ("streamed, with a length", || {
        with(
            200,
            &[("content-length", "5")],
            streamed(vec![Frame::data("hello".into())]),
        )
    }),
    ("streamed, longer than its length", || {
        with(
            200,
            &[("content-length", "3")],
            streamed(vec![Frame::data("hello".into())]),
        )
    }),
    ("streamed, short of its length", || {
        with(
            200,
            &[("content-length", "9")],
            streamed(vec![Frame::data("hello".into())]),
        )
    }),
    ("closing", || {
        with(200, &[("connection", "close")], body("bye"))
    }),
    ("coded", || {
        with(
            200,
            &[("transfer-encoding", "gzip")],
            streamed(vec![Frame::data("z".into())]),
        )
    }),
    ("trailers", || {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-t", HeaderValue::from_static("1"));
        with(
            200,
            &[("trailer", "x-t")],
            streamed(vec![Frame::data("a".into()), Frame::trailers(trailers)]),
        )
    }),
    ("a reason of its own", || {
        let mut res = with(200, &[], body("a"));
        res.extensions_mut()
            .insert(hyper::ext::ReasonPhrase::from_static(b"Fine"));
        res
    }),
    ("no standard reason", || with(299, &[], body("a"))),
    ("HTTP/1.0", || {
        let mut res = with(200, &[], body("a"));
        *res.version_mut() = Version::HTTP_10;
        res
    }),
    ("repeated fields", || {
        with(
            200,
            &[
                ("set-cookie", "a=1"),
                ("x-a", "1"),
                ("set-cookie", "b=2"),
                ("connection", "keep-alive"),
                ("connection", "x-a"),
            ],
            body("a"),
        )
    }),
    ("dated", || {
        with(200, &[("date", "Tue, 01 Jan 2030 00:00:00 GMT")], body("a"))
    }),
    ("informational", || with(100, &[], Empty::new().boxed())),
];

#[tokio::test(start_paused = true)]
async fn every_response_is_written_as_hyper_writes_it() {
    for (name, answer) in ANSWERS {
        for request in [
            GET,
            b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        ] {
            let got = same(request, *answer, false).await;
            // A body short of its length: hyper closes, writing nothing.
            let short = name.contains("short") && !request.starts_with(b"HEAD");
            assert_eq!(got.starts_with("HTTP/1."), !short, "{name}: {got:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn every_request_reaches_the_service_as_hyper_reads_it() {
    use Server::{Here, Hyper};
    // Each request, and which server gives the service each of its
    // requests when this crate's serves first, where that is the point.
    let requests: &[(&[u8], Option<&[Server]>)] = &[
        (b"GET /a?b=c HTTP/1.1\r\nHost: a\r\nX-M: 1\r\nX-M: 2\r\nAccept: */*\r\n\r\n", None),
        (b"GET http://example.com/x HTTP/1.1\r\nHost: a\r\n\r\n", None),
        (b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", None),
        (b"GET / HTTP/1.1\nHost: a\n\n", None),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX-A: \xe9t\xe9\r\nX-Empty:\r\n\r\n", None),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", None),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n", None),
        (b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, close\r\n\r\n", None),
        (b"GET / HTTP/1.0\r\n\r\n", None),
        (b"GET / HTTP/1.1\r\nHost: a\r\nBad Name: x\r\n\r\n", None),
        (b"GET / HTTP/1.1\r\nHost: a\r\nTE: trailers\r\n\r\n", None),
        (b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n", None),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", None),
        (b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", None),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", None),
        // Pipelined, a body that came whole among them: all served here.
        (b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\nPOST /3 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhiGET /4 HTTP/1.1\r\nHost: a\r\n\r\n", Some(&[Here, Here, Here, Here])),
        // Pipelined: served here, then by hyper from the chunked request
        // on, the one after it included.
        (b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nPOST /2 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\nGET /3 HTTP/1.1\r\nHost: a\r\n\r\n", Some(&[Here, Hyper, Hyper])),
        // A head split across the pipelined bytes.
        (b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHo", Some(&[Here])),
        // Bodies that came whole, served here, then what follows.
        (b"POST /e HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello", Some(&[Here])),
        (b"POST /1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhiPUT /2 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nyouGET /3 HTTP/1.1\r\nHost: a\r\n\r\n", Some(&[Here, Here, Here])),
        (b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nConnection: close\r\n\r\nxGET / HTTP/1.1\r\nHost: a\r\n\r\n", Some(&[Here])),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 00003\r\n\r\nabc", Some(&[Here])),
        // Bodies for hyper: still coming, a length said twice or not
        // in digits (which hyper refuses before any service sees them),
        // `Expect`, a length beside chunks.
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9\r\n\r\nhello", Some(&[Hyper])),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nhi", Some(&[Hyper])),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +2\r\n\r\nhi", Some(&[])),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2, 2\r\n\r\nhi", Some(&[])),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\nhi", Some(&[])),
        (b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi", Some(&[Hyper])),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", Some(&[Hyper])),
    ];
    for (request, servers) in requests {
        let (_, served) = same_served(request, ANSWERS[1].1, false, Reading::First).await;
        if let Some(servers) = servers {
            assert_eq!(
                served,
                *servers,
                "which served {:?}",
                String::from_utf8_lossy(request)
            );
        }
    }
}

/// Bodies larger than one read, and than the size served here, reach
/// the service as with hyper.
#[tokio::test(start_paused = true)]
async fn larger_bodies_reach_the_service_as_hyper_reads_them() {
    for size in [3_000, 5_000, MAX_BODY, MAX_BODY + 1] {
        let mut sent =
            format!("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {size}\r\n\r\n").into_bytes();
        sent.resize(sent.len() + size, b'b');
        sent.extend_from_slice(GET);
        same(&sent, ANSWERS[1].1, false).await;
    }
}

/// A body larger than one read, sent at once, is read whole and
/// served here; a larger one than [`MAX_BODY`] is streamed by hyper.
#[tokio::test]
async fn a_body_sent_at_once_is_read_whole() {
    for (size, whole) in [(20_000, true), (MAX_BODY, true), (MAX_BODY + 1, false)] {
        let (mut client, server) = tokio::io::duplex(4 * MAX_BODY);
        let service = service_fn(move |req: Request<TestBody>| async move {
            let served = matches!(req.body(), TestBody::Whole(_));
            let got = req.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(got.len(), size);
            assert_eq!(served, whole, "a body of {size} bytes served here");
            Ok::<_, Infallible>(with(200, &[], body("ok")))
        });
        let served = spawn_connection(server, true, service);
        let mut sent = format!(
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
        )
        .into_bytes();
        sent.resize(sent.len() + size, b'b');
        client.write_all(&sent).await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert!(
            got.ends_with(b"\r\n\r\nok"),
            "{}",
            String::from_utf8_lossy(&got)
        );
        served.await.unwrap();
    }
}

/// A client that hangs up after its body abandons its request once the body
/// has been read (or let go of), as with Go's server, whose watch for a
/// hang-up starts when a body is read to its end: not while the request
/// waits (as in the breaker's queue) with its body unread. (hyper's server
/// watches once it has read a body that fits one read itself, whoever reads
/// it.)
#[tokio::test(start_paused = true)]
async fn a_hang_up_after_a_body_counts_once_the_body_is_read() {
    let sent = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello";
    // The service ran to its end: the request was not abandoned while
    // its body waited unread (its answer then finds the client gone).
    let (_, seen, served) = run_with(true, sent, ANSWERS[1].1, true, Reading::Never).await;
    assert_eq!(seen.len(), 1);
    assert_eq!(served, [Server::Here]);
    let abandoned = same_with(sent, ANSWERS[1].1, true, Reading::ThenWait).await;
    assert_eq!(abandoned, "");
}

/// A body the service never reads leaves the connection open for the
/// next request, as Go's server leaves it (it reads up to 256 KiB of
/// an unread body to keep the connection); hyper's closes when one
/// more read does not finish the body.
#[tokio::test(start_paused = true)]
async fn a_body_left_unread_keeps_the_connection_as_go_does() {
    let mut sent =
        format!("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {MAX_BODY}\r\n\r\n").into_bytes();
    sent.resize(sent.len() + MAX_BODY, b'b');
    sent.extend_from_slice(GET);
    let (got, seen, served) = run_with(true, &sent, ANSWERS[1].1, false, Reading::Never).await;
    assert_eq!(got.matches("HTTP/1.1 200 OK").count(), 2, "{got:?}");
    assert_eq!(seen.len(), 2);
    assert_eq!(served, [Server::Here, Server::Here], "both served here");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_hangs_up_abandons_its_request_as_with_hyper() {
    let got = same(GET, ANSWERS[1].1, true).await;
    assert_eq!(got, "");
}

/// A service that reads the request's body and answers in the same
/// wake-up, with a body that sends a frame and then waits: a client
/// that hangs up then is noticed, and the body let go of.
#[tokio::test(start_paused = true)]
async fn a_hang_up_while_a_streamed_answer_waits_ends_it() {
    use futures_util::StreamExt;
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let (held, mut released) = tokio::sync::oneshot::channel::<()>();
    let held = Arc::new(Mutex::new(Some(held)));
    let service = service_fn(move |req: Request<TestBody>| {
        let held = held.lock().unwrap().take();
        async move {
            let _ = req.into_body().collect().await;
            let waits = futures_util::stream::poll_fn(move |_| {
                let _held = &held;
                Poll::<Option<Result<Frame<Bytes>, Infallible>>>::Pending
            });
            let frames = futures_util::stream::iter([Ok(Frame::data(Bytes::from("a")))]);
            Ok::<_, Infallible>(with(
                200,
                &[],
                BodyExt::boxed(StreamBody::new(frames.chain(waits))),
            ))
        }
    });
    spawn_connection(server, true, service);
    client
        .write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0; 1024];
    while !got.ends_with(b"\r\n1\r\na\r\n") {
        let n = client.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(released.try_recv().is_err(), "the body is still held");
    client.shutdown().await.unwrap();
    // Time is paused: the hour passes at once if nothing else can happen.
    let noticed = tokio::time::timeout(Duration::from_secs(3600), released).await;
    assert!(noticed.is_ok(), "the hang-up went unnoticed");
}

/// A body whose end comes in the same wake-up as the client's hang-up
/// (the client read the head and left; the app's last bytes were on their
/// way) was sent whole: it is read to its end, not let go of, as Go's
/// server takes the last bytes into its buffer before a write can fail.
/// Request metrics and logs count such an answer as its status, not as a
/// body cut off.
#[tokio::test(start_paused = true)]
async fn a_body_that_ends_as_the_client_hangs_up_is_read_to_its_end() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let (frames, waiting) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let waiting = Arc::new(Mutex::new(Some(waiting)));
    let ended = Arc::new(AtomicBool::new(false));
    let told = ended.clone();
    let service = service_fn(move |_req: Request<TestBody>| {
        let waiting = waiting.lock().unwrap().take();
        let told = told.clone();
        async move {
            let mut waiting = waiting.unwrap();
            let body = futures_util::stream::poll_fn(move |cx| {
                let polled = waiting.poll_recv(cx);
                if let Poll::Ready(None) = polled {
                    told.store(true, Ordering::SeqCst);
                }
                polled.map(|data| data.map(|d| Ok::<_, Infallible>(Frame::data(d))))
            });
            Ok::<_, Infallible>(with(200, &[], BodyExt::boxed(StreamBody::new(body))))
        }
    });
    spawn_connection(server, true, service);
    client.write_all(GET).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0; 1024];
    while !got.ends_with(b"\r\n\r\n") {
        let n = client.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    // Both before the connection's task runs again.
    client.shutdown().await.unwrap();
    frames.send(Bytes::from("hi")).unwrap();
    drop(frames);
    // Time is paused: the hour passes at once if nothing else can happen.
    let _ = tokio::time::timeout(Duration::from_secs(3600), client.read_to_end(&mut got)).await;
    assert!(
        ended.load(Ordering::SeqCst),
        "the body was let go of before its end"
    );
}

#[tokio::test(start_paused = true)]
async fn a_large_streamed_body_arrives_whole() {
    fn large() -> Response<AnswerBody> {
        let frames = (0..8u8)
            .map(|i| Frame::data(Bytes::from(vec![b'a' + i; 40_000])))
            .collect();
        with(200, &[], streamed(frames))
    }
    let got = same(GET, large, false).await;
    assert!(got.ends_with("\r\n0\r\n\r\n"));
}

/// Heads read one after another into the memory a connection keeps
/// (a head its own size, then smaller, larger, over the limit kept)
/// reach the service whole, whether it lets go of each request or
/// holds on to all of them.
#[tokio::test(start_paused = true)]
async fn heads_read_into_kept_memory_arrive_whole() {
    for hold in [false, true] {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let held = Arc::new(Mutex::new(Vec::new()));
        let (record, keep) = (seen.clone(), held.clone());
        let service = service_fn(move |req: Request<TestBody>| {
            let mut line = format!("{} {}", req.method(), req.uri());
            for (name, value) in req.headers() {
                line += &format!(" {name}={}", value.to_str().unwrap_or("?"));
            }
            record.lock().unwrap().push(line);
            if hold {
                keep.lock().unwrap().push(req);
            }
            async { Ok::<_, Infallible>(with(200, &[], body("ok"))) }
        });
        spawn_connection(server, true, service);
        let mut expected = Vec::new();
        for (i, pad) in [10, 300, 40, 1_500, 3_000, 20, 900].into_iter().enumerate() {
            let value = char::from(b'a' + i as u8).to_string().repeat(pad);
            client
                .write_all(
                    format!("GET /{i} HTTP/1.1\r\nHost: h{i}\r\nX-Pad: {value}\r\n\r\n").as_bytes(),
                )
                .await
                .unwrap();
            expected.push(format!("GET /{i} host=h{i} x-pad={value}"));
            // The whole response, before the next request.
            read_ok(&mut client).await;
        }
        assert_eq!(*seen.lock().unwrap(), expected, "holding requests: {hold}");
        for (req, line) in held.lock().unwrap().iter().zip(&expected) {
            assert!(line.starts_with(&format!("GET {}", req.uri())));
        }
    }
}

/// Reads from `client` until a response whose body is `ok` has come whole;
/// panics if the connection closes first.
async fn read_ok(client: &mut tokio::io::DuplexStream) {
    let mut got = Vec::new();
    let mut buf = [0; 1024];
    while !got.ends_with(b"\r\n\r\nok") {
        let n = client.read(&mut buf).await.unwrap();
        assert!(n > 0, "the connection closed");
        got.extend_from_slice(&buf[..n]);
    }
}

/// A connection's task holds little beyond the maker of its services
/// while it waits: this crate's server's state and hyper's are boxed once
/// needed, each with the service made for it. (Unoptimised, as tests build
/// it; with qproxy's stack, optimised, the whole is 760 bytes, the maker
/// 40, where a service is 672.)
#[test]
fn a_waiting_connection_holds_little_beyond_its_maker() {
    let service = service_fn(|_: Request<TestBody>| async move {
        Ok::<_, Infallible>(with(200, &[], body("ok")))
    });
    let room = support::connection_room(service);
    assert!(room <= 1024, "{room} bytes beyond the service");
}

/// A connection that waits long for its next request (or, on a crowded
/// port, at all) lets its room go and serves on when the request comes:
/// the head clock runs only from a head's first bytes (not while the
/// connection is idle, however long), and a head that stalls after an
/// idle wait is timed out as any other.
#[tokio::test(start_paused = true)]
async fn an_idle_connection_serves_on_and_times_its_next_head() {
    an_idle_connection_serves_on(false).await;
    an_idle_connection_serves_on(true).await;
}

async fn an_idle_connection_serves_on(crowded: bool) {
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let service = service_fn(move |req: Request<TestBody>| {
        record
            .lock()
            .unwrap()
            .push((req.uri().to_string(), req.body().server()));
        async { Ok::<_, Infallible>(with(200, &[], body("ok"))) }
    });
    support::spawn_on_port(server, true, crowded, service);
    let head = |i: u32| format!("GET /{i} HTTP/1.1\r\nHost: h\r\n\r\n");
    let served = async {
        client.write_all(head(1).as_bytes()).await.unwrap();
        read_ok(&mut client).await;
        // Idle past the head timeout (60 s): the next request is served,
        // and one sent right after its answer.
        tokio::time::sleep(Duration::from_secs(90)).await;
        client.write_all(head(2).as_bytes()).await.unwrap();
        read_ok(&mut client).await;
        client.write_all(head(22).as_bytes()).await.unwrap();
        read_ok(&mut client).await;
        // The next head's clock starts with its first bytes: 50 s idle,
        // then a head that takes 30 s to come whole is served.
        tokio::time::sleep(Duration::from_secs(50)).await;
        let third = head(3);
        let (start, rest) = third.split_at(10);
        client.write_all(start.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        client.write_all(rest.as_bytes()).await.unwrap();
        read_ok(&mut client).await;
        // One that stalls past the timeout after an idle wait is closed.
        tokio::time::sleep(Duration::from_secs(5)).await;
        client.write_all(b"GET /4 HTTP/1.1\r\nHo").await.unwrap();
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        rest
    };
    let rest = tokio::time::timeout(Duration::from_secs(600), served)
        .await
        .expect("the stalled head was not timed out");
    assert_eq!(rest, b"", "{}", String::from_utf8_lossy(&rest));
    let seen = seen.lock().unwrap().clone();
    let expected: Vec<(String, Server)> = ["/1", "/2", "/22", "/3"]
        .into_iter()
        .map(|uri| (uri.to_owned(), Server::Here))
        .collect();
    assert_eq!(seen, expected, "crowded: {crowded}");
}

/// One of the services a test made, counted in `live` until it drops (a
/// clone counts as another).
struct Live(Arc<AtomicUsize>);

impl Live {
    fn new(live: &Arc<AtomicUsize>) -> Self {
        live.fetch_add(1, Ordering::SeqCst);
        Self(live.clone())
    }
}

impl Clone for Live {
    fn clone(&self) -> Self {
        Self::new(&self.0)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An idle connection holds no service: the one its requests were served
/// with is dropped with its room, and one is made again for its next
/// request (on a crowded port as soon as it waits, on another after a
/// second or two).
#[tokio::test(start_paused = true)]
async fn an_idle_connection_holds_no_service() {
    for crowded in [false, true] {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let live = Arc::new(AtomicUsize::new(0));
        let counted = Live::new(&live);
        let at_call = Arc::new(Mutex::new(Vec::new()));
        let (record, seen) = (at_call.clone(), live.clone());
        let service = service_fn(move |_: Request<TestBody>| {
            let _counted = &counted;
            record.lock().unwrap().push(seen.load(Ordering::SeqCst));
            async { Ok::<_, Infallible>(with(200, &[], body("ok"))) }
        });
        // The maker's copy, which the connection keeps for its life.
        support::spawn_on_port(server, true, crowded, service);
        for i in 0..2 {
            let head = format!("GET /{i} HTTP/1.1\r\nHost: h\r\n\r\n");
            client.write_all(head.as_bytes()).await.unwrap();
            read_ok(&mut client).await;
            // Idle: only the maker's copy is left (time is paused, and
            // moves on only while every task waits).
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while live.load(Ordering::SeqCst) > 1 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "an idle connection still holds a service (crowded: {crowded})"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        // Each request met the maker's copy and the service made for it.
        assert_eq!(*at_call.lock().unwrap(), [2, 2], "crowded: {crowded}");
    }
}
