//! HTTP/1.1, h2c, upgrades, streaming, 100-continue and trailers through the
//! real binary.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode, Version};
use http_body::Frame;
use http_body_util::BodyExt;
use qproxy_test_support::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

#[tokio::test(flavor = "multi_thread")]
async fn h1_and_h2c_share_the_main_port() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);

    let res = h1(qp.main, get("/h1", &[("host", "hello.example.com")])).await;
    assert_eq!(res.version(), Version::HTTP_11);
    assert_eq!(text(res).await, "Hello World!\n");

    let res = h2(qp.main, get("http://hello.example.com/h2", &[])).await;
    assert_eq!(res.version(), Version::HTTP_2);
    assert_eq!(res.status(), 200);
    assert_eq!(text(res).await, "Hello World!\n");

    let seen = app.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].version, Version::HTTP_11);
    // HTTP/2 goes upstream as h2c, keeping the client's authority.
    assert_eq!(seen[1].version, Version::HTTP_2);
    assert_eq!(
        seen[1].uri.authority().map(|a| a.as_str()),
        Some("hello.example.com")
    );
    assert_eq!(seen[1].headers["x-forwarded-for"], "127.0.0.1");
}

#[tokio::test(flavor = "multi_thread")]
async fn websocket_echo_through_the_tunnel() {
    let port = websocket_echo_app().await;
    let qp = QProxy::start(port, &[]);

    let mut ws = websocket(qp.main).await;
    for i in 0..5 {
        let msg = format!("hello {i}");
        ws.send(Message::text(msg.clone())).await.unwrap();
        let echoed = within("echo", ws.next()).await.unwrap().unwrap();
        assert_eq!(echoed, Message::text(msg));
    }
    let big = vec![7u8; 256 * 1024];
    ws.send(Message::binary(big.clone())).await.unwrap();
    let echoed = within("binary echo", ws.next()).await.unwrap().unwrap();
    assert_eq!(echoed.into_data(), big);
    ws.close(None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn tunnel_half_close_lets_the_app_finish() {
    // An app speaking a made-up upgraded protocol: it reads until the
    // client stops sending, then answers and closes.
    let port = raw_app(|mut s| async move {
        read_request(&mut s).await;
        s.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: shout\r\n\r\n",
        )
        .await
        .unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        s.write_all(&got.to_ascii_uppercase()).await.unwrap();
    })
    .await;
    let qp = QProxy::start(port, &[]);

    let mut client = shout(qp.main).await;
    client.write_all(b"hello there").await.unwrap();
    client.shutdown().await.unwrap();
    let mut answer = Vec::new();
    within("the app's answer", client.read_to_end(&mut answer))
        .await
        .unwrap();
    assert_eq!(answer, b"HELLO THERE");
}

/// An app that upgrades to `shout` and echoes every byte until the client
/// stops sending, then closes.
async fn echoing_app() -> u16 {
    raw_app(|mut s| async move {
        read_request(&mut s).await;
        s.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: shout\r\n\r\n",
        )
        .await
        .unwrap();
        let (mut read, mut write) = s.split();
        tokio::io::copy(&mut read, &mut write).await.unwrap();
    })
    .await
}

/// A tunnel between two plain TCP connections is spliced, socket to
/// socket, both ways: qproxy's own count of what crossed it says every
/// byte but what came with the heads was spliced, and every byte came
/// back in order. With the `no-splice` option none is.
#[tokio::test(flavor = "multi_thread")]
async fn a_tunnel_on_plain_tcp_is_spliced_both_ways() {
    const SENT: usize = 4 << 20;
    let port = echoing_app().await;
    for (option, spliced) in [("off", SENT), ("on", 0)] {
        let qp = QProxy::start(
            port,
            &[
                ("SERVING_LOGGING_LEVEL", "debug"),
                ("QPROXY_OPTION_NO_SPLICE", option),
            ],
        );
        let client = shout(qp.main).await;
        let (mut read, mut write) = client.into_split();
        let data: Vec<u8> = (0..SENT).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            write.write_all(&sent).await.unwrap();
            write.shutdown().await.unwrap();
        });
        let mut back = Vec::new();
        within("the echo", read.read_to_end(&mut back))
            .await
            .unwrap();
        writer.await.unwrap();
        assert!(back == data, "{} bytes back of {SENT}", back.len());
        let line = qp.wait_for_log("the tunnel's end", |l| {
            l["message"] == "upgraded connection closed"
        });
        assert_eq!(line["up"], SENT, "no-splice {option}: {line}");
        assert_eq!(line["down"], SENT, "no-splice {option}: {line}");
        assert_eq!(line["up_spliced"], spliced, "no-splice {option}: {line}");
        assert_eq!(line["down_spliced"], spliced, "no-splice {option}: {line}");
    }
}

/// Bytes no two runs of which line up with a pipe's size.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4093) as u8).collect()
}

/// The head of a chunked answer.
const CHUNKED_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";

/// An app serving, on each kept-alive connection, `/length` (256 KiB with
/// its `Content-Length`, written 64 KiB at a time), `/long` (4 MiB
/// likewise), `/chunked` (two chunks of 100 KiB and one of 10 bytes),
/// `/short` (4 MiB announced, 1 MiB
/// sent, then the connection closed), `/chunked-short` (a chunk of 1 MiB
/// announced, half of it sent, then the connection closed) and
/// `/chunked-broken` (a chunk of 1 MiB, then no chunk's end: the
/// connection left open).
async fn large_bodies_app() -> u16 {
    raw_app(|mut s| async move {
        while let Some(head) = read_head(&mut s).await {
            let body = pattern(4 << 20);
            if head.starts_with("GET /length ") || head.starts_with("GET /long ") {
                let len = if head.starts_with("GET /long ") {
                    body.len()
                } else {
                    256 << 10
                };
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n");
                s.write_all(head.as_bytes()).await.unwrap();
                for piece in body[..len].chunks(64 << 10) {
                    s.write_all(piece).await.unwrap();
                }
            } else if head.starts_with("GET /chunked ") {
                s.write_all(CHUNKED_HEAD).await.unwrap();
                for chunk in body[..(200 << 10) + 10].chunks(100 << 10) {
                    s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                        .await
                        .unwrap();
                    s.write_all(chunk).await.unwrap();
                    s.write_all(b"\r\n").await.unwrap();
                }
                s.write_all(b"0\r\n\r\n").await.unwrap();
            } else if head.starts_with("GET /chunked-short ") {
                s.write_all(CHUNKED_HEAD).await.unwrap();
                s.write_all(b"100000\r\n").await.unwrap();
                s.write_all(&body[..1 << 19]).await.unwrap();
                return;
            } else if head.starts_with("GET /chunked-broken ") {
                // A chunk's data, then what is not its end; the connection
                // stays open.
                s.write_all(CHUNKED_HEAD).await.unwrap();
                s.write_all(b"100000\r\n").await.unwrap();
                s.write_all(&body[..1 << 20]).await.unwrap();
                s.write_all(b"XX0\r\n\r\n").await.unwrap();
                let _ = read_head(&mut s).await;
                return;
            } else {
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                s.write_all(head.as_bytes()).await.unwrap();
                s.write_all(&body[..1 << 20]).await.unwrap();
                return;
            }
        }
    })
    .await
}

/// The response to `GET path` on the client connection `sender`, once it
/// is ready for another request.
async fn get_on(
    sender: &mut hyper::client::conn::http1::SendRequest<TestBody>,
    path: &str,
) -> Response<hyper::body::Incoming> {
    let req = Request::get(path)
        .header("host", "hello.example.com")
        .body(empty())
        .unwrap();
    within("the connection kept", sender.ready()).await.unwrap();
    within("the response", sender.send_request(req))
        .await
        .unwrap()
}

/// A large body between two plain TCP connections is spliced from the
/// app's socket into the client's, a length-framed one and a chunked one's
/// large chunks alike, on one client connection and one pooled app
/// connection: every byte comes whole and in order, qproxy's count says
/// all but what came with the head (or with a chunk's framing) was
/// spliced, a body longer than splicing pays for is copied whole, and a
/// body the app cuts short is cut short for the client. With the
/// `no-splice` option none is.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_body_on_plain_tcp_is_spliced_whole_and_in_order() {
    let port = large_bodies_app().await;
    let body = pattern(4 << 20);
    for option in ["off", "on"] {
        let qp = QProxy::start(
            port,
            &[
                ("SERVING_LOGGING_LEVEL", "debug"),
                ("QPROXY_OPTION_NO_SPLICE", option),
            ],
        );
        let stream = TcpStream::connect(qp.main).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let mut lines = 0;
        for (path, whole) in [
            ("/length", &body[..256 << 10]),
            ("/chunked", &body[..(200 << 10) + 10]),
            ("/long", &body[..]),
            ("/length", &body[..256 << 10]),
        ] {
            let res = get_on(&mut sender, path).await;
            assert_eq!(res.status(), 200);
            let got = within("the body", res.into_body().collect())
                .await
                .unwrap()
                .to_bytes();
            assert!(
                got == whole,
                "{path}: {} bytes of {}",
                got.len(),
                whole.len()
            );
            if path == "/long" {
                // Not lent a pipe: no count is logged for it.
                continue;
            }
            lines += 1;
            let line = qp.wait_for_logs("the body's count", lines, |l| {
                l["message"] == "response body written, lent a pipe"
            });
            let spliced = line["spliced"].as_u64().unwrap() as usize;
            if option == "on" {
                assert_eq!(spliced, 0, "{path}: {line}");
            } else {
                // What came with the head and with a chunked body's first
                // size line, and a few bytes of each later chunk read with
                // its framing, are read.
                let read = whole.len() - spliced;
                assert!(spliced <= whole.len() && read <= 16 << 10, "{path}: {line}");
            }
        }
        // A body the app cuts short, or whose chunk does not end, is cut
        // short for the client, on a client connection of its own each.
        for path in ["/short", "/chunked-short", "/chunked-broken"] {
            let res = get_on(&mut sender, path).await;
            let got = within("the body", res.into_body().collect()).await;
            assert!(got.is_err(), "{path}: a body cut short is cut short");
            let stream = TcpStream::connect(qp.main).await.unwrap();
            let (next, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            sender = next;
        }
    }
}

/// A client that leaves an upgraded connection ends its request, as
/// current Knative's queue-proxy ends the whole tunnel then: an app that
/// never closes its side of the tunnel does not keep the request's slot
/// (`containerConcurrency: 1`), and the next request is served.
#[tokio::test(flavor = "multi_thread")]
async fn a_tunnel_the_client_left_holds_no_slot_while_the_app_keeps_it() {
    let port = raw_app(|mut s| async move {
        read_request(&mut s).await;
        if s.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: shout\r\n\r\n",
        )
        .await
        .is_err()
        {
            return;
        }
        // Reads what comes, and never closes its side, even at the end.
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink).await;
        std::future::pending::<()>().await;
    })
    .await;
    let qp = QProxy::start(port, &[("CONTAINER_CONCURRENCY", "1")]);
    let client = shout(qp.main).await;
    drop(client);
    // The slot is free: an upgrade again gets its own 101.
    shout(qp.main).await;
}

/// A connection to `main` upgraded to the made-up protocol `shout`: the
/// request sent, the `101` read.
async fn shout(main: std::net::SocketAddr) -> TcpStream {
    let mut client = TcpStream::connect(main).await.unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: shout\r\n\r\n")
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        within("the 101", client.read_exact(&mut byte))
            .await
            .unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101 Switching Protocols\r\n"));
    client
}

#[tokio::test(flavor = "multi_thread")]
async fn upgrade_to_another_protocol_than_asked_is_502() {
    let port = canned_app(
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
    )
    .await;
    let qp = QProxy::start(port, &[]);
    let res = h1(
        qp.main,
        get("/", &[("connection", "upgrade"), ("upgrade", "websocket")]),
    )
    .await;
    assert_eq!(res.status(), 502);
    assert_eq!(
        text(res).await,
        "backend tried to switch protocol \"h2c\" when \"websocket\" was requested\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn h2c_upgrade_is_declined_and_served_over_http1() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);
    // What `curl --http2 http://...` sends.
    let res = h1(
        qp.main,
        get(
            "/",
            &[
                ("connection", "Upgrade, HTTP2-Settings"),
                ("upgrade", "h2c"),
                ("http2-settings", "AAMAAABkAARAAAAAAAIAAAAA"),
            ],
        ),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.version(), Version::HTTP_11);
    let seen = app.only();
    for gone in ["upgrade", "connection", "http2-settings"] {
        assert!(seen.headers.get(gone).is_none(), "{gone} reached the app");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn upgrade_to_an_unprintable_protocol_is_502() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);
    let mut client = TcpStream::connect(qp.main).await.unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: caf\xe9\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    let mut reader = BufReader::new(client);
    within("the 502", reader.read_line(&mut answer))
        .await
        .unwrap();
    assert_eq!(answer, "HTTP/1.1 502 Bad Gateway\r\n");
    let mut rest = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        if line == "\r\n" {
            break;
        }
        rest.push(line);
    }
    let expected = "client tried to switch to invalid protocol \"caf\\xe9\"\n";
    assert!(
        rest.contains(&format!("Content-Length: {}\r\n", expected.len())),
        "{rest:?}"
    );
    let mut body = vec![0; expected.len()];
    within("the body", reader.read_exact(&mut body))
        .await
        .unwrap();
    assert_eq!(String::from_utf8(body).unwrap(), expected);
    assert!(app.seen().is_empty(), "never reaches the app");
}

/// A body whose chunks the test feeds one by one.
struct Chunks(mpsc::Receiver<Bytes>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|c| c.map(|c| Ok(Frame::data(c))))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn server_sent_events_are_not_held_back() {
    // The app sends the first event, then waits for the test to have read it
    // before it sends the second: buffering anywhere would deadlock.
    let (release_tx, release_rx) = mpsc::channel::<()>(1);
    let release_rx = Arc::new(tokio::sync::Mutex::new(release_rx));
    let app = App::start(move |_| {
        let release = release_rx.clone();
        async move {
            let (tx, rx) = mpsc::channel(1);
            tokio::spawn(async move {
                tx.send(Bytes::from_static(b"data: one\n\n")).await.unwrap();
                release.lock().await.recv().await;
                tx.send(Bytes::from_static(b"data: two\n\n")).await.unwrap();
            });
            let mut res = Response::new(Chunks(rx).boxed());
            res.headers_mut()
                .insert("content-type", "text/event-stream".parse().unwrap());
            res
        }
    })
    .await;
    let qp = QProxy::start(app.port(), &[]);

    for version in [Version::HTTP_11, Version::HTTP_2] {
        let req = get("http://hello.example.com/events", &[]);
        let res = if version == Version::HTTP_2 {
            h2(qp.main, req).await
        } else {
            h1(qp.main, req).await
        };
        assert_eq!(res.headers()["content-type"], "text/event-stream");
        let mut body = res.into_body();
        let first = within("first event", body.frame()).await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "data: one\n\n");
        release_tx.send(()).await.unwrap();
        let second = within("second event", body.frame()).await.unwrap().unwrap();
        assert_eq!(second.into_data().unwrap(), "data: two\n\n");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn expect_100_continue() {
    // An app that never sends an interim response of its own: it reads the
    // head, then the five-byte body, then answers with it.
    let port = raw_app(|mut s| async move {
        let Some(head) = read_head(&mut s).await else {
            return;
        };
        let mut body = [0u8; 5];
        s.read_exact(&mut body).await.unwrap();
        let expect = head.to_ascii_lowercase().contains("expect: 100-continue");
        let reply =
            format!("HTTP/1.1 200 OK\r\nX-Saw-Expect: {expect}\r\nContent-Length: 5\r\n\r\n");
        s.write_all(reply.as_bytes()).await.unwrap();
        s.write_all(&body).await.unwrap();
    })
    .await;
    let qp = QProxy::start(port, &[]);

    let stream = TcpStream::connect(qp.main).await.unwrap();
    let (rx, mut tx) = stream.into_split();
    let mut rx = BufReader::new(rx);
    tx.write_all(
        b"POST /upload HTTP/1.1\r\nHost: hello\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    // The body is sent only after the interim response, as a careful client
    // does: qproxy gives it once the upload toward the app begins.
    let mut status = String::new();
    within("100 Continue", rx.read_line(&mut status))
        .await
        .unwrap();
    assert_eq!(status, "HTTP/1.1 100 Continue\r\n");
    let mut blank = String::new();
    rx.read_line(&mut blank).await.unwrap();
    assert_eq!(blank, "\r\n");
    tx.write_all(b"hello").await.unwrap();
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        within("the final response", rx.read_line(&mut line))
            .await
            .unwrap();
        if line == "\r\n" {
            break;
        }
        head.push(line);
    }
    assert_eq!(head[0], "HTTP/1.1 200 OK\r\n");
    assert!(
        head.contains(&"X-Saw-Expect: true\r\n".to_owned()),
        "{head:?}"
    );
    let mut body = [0u8; 5];
    within("echoed body", rx.read_exact(&mut body))
        .await
        .unwrap();
    assert_eq!(&body, b"hello");
}

/// A body of one data chunk and then trailers.
struct WithTrailers(Option<Frame<Bytes>>, Option<http::HeaderMap>);

impl http_body::Body for WithTrailers {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(data) = self.0.take() {
            return Poll::Ready(Some(Ok(data)));
        }
        Poll::Ready(self.1.take().map(|t| Ok(Frame::trailers(t))))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn trailers_pass() {
    let app = App::start(|_| async {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-checksum", "abc123".parse().unwrap());
        Response::builder()
            .header("trailer", "x-checksum")
            .body(
                WithTrailers(
                    Some(Frame::data(Bytes::from_static(b"payload"))),
                    Some(trailers),
                )
                .boxed(),
            )
            .unwrap()
    })
    .await;
    let qp = QProxy::start(app.port(), &[]);

    // HTTP/2 (gRPC's case), and HTTP/1.1 to a client that offers trailers.
    for (version, req) in [
        (Version::HTTP_2, get("http://hello.example.com/", &[])),
        (Version::HTTP_11, get("/", &[("te", "trailers")])),
    ] {
        let res = if version == Version::HTTP_2 {
            h2(qp.main, req).await
        } else {
            h1(qp.main, req).await
        };
        let collected = within("the body", res.into_body().collect()).await.unwrap();
        let trailers = collected.trailers().cloned();
        assert_eq!(collected.to_bytes(), "payload", "{version:?}");
        assert_eq!(
            trailers.as_ref().and_then(|t| t.get("x-checksum")).unwrap(),
            "abc123",
            "{version:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_with_trailers_over_h2c() {
    let port = grpc_health_app().await;
    let qp = QProxy::start(port, &[]);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", qp.main))
        .unwrap()
        .connect()
        .await
        .unwrap();
    check_grpc_health(channel).await;
}

/// A gRPC app on loopback serving the standard health service, where
/// `hello.Greeter` is serving; its port.
pub(crate) async fn grpc_health_app() -> u16 {
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("hello.Greeter", tonic_health::ServingStatus::Serving)
        .await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream_of(listener)),
    );
    port
}

/// Asks the app of [`grpc_health_app`] through `channel`: a unary call
/// answered with a message and trailers, and one answered with an error
/// status (tonic sends it as a trailers-only response); trailers proper
/// are checked in `trailers_pass`.
pub(crate) async fn check_grpc_health(channel: tonic::transport::Channel) {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let mut client = HealthClient::new(channel);
    let res = within(
        "gRPC Check",
        client.check(HealthCheckRequest {
            service: "hello.Greeter".into(),
        }),
    )
    .await
    .unwrap();
    assert_eq!(res.into_inner().status(), ServingStatus::Serving);

    let err = within(
        "gRPC Check of an unknown service",
        client.check(HealthCheckRequest {
            service: "no.such.Service".into(),
        }),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
}

/// Accepted connections of `listener` as the stream tonic serves from.
fn tokio_stream_of(
    listener: TcpListener,
) -> impl futures_util::Stream<Item = std::io::Result<TcpStream>> {
    futures_util::stream::unfold(listener, |l| async move {
        let accepted = l.accept().await.map(|(s, _)| s);
        Some((accepted, l))
    })
}

const GIB: u64 = 1 << 30;
/// Bytes per frame of a [`Pattern`] body: a multiple of 251, about 256 KiB.
const CHUNK: usize = 251 * 1044;

/// A body of `len` bytes made on the fly, byte `i` being `i % 251` (so
/// that a byte out of place shows), in frames of [`CHUNK`].
struct Pattern {
    left: u64,
    chunk: Bytes,
}

impl Pattern {
    fn new(len: u64) -> Self {
        let chunk: Vec<u8> = (0..CHUNK).map(|i| (i % 251) as u8).collect();
        Self {
            left: len,
            chunk: Bytes::from(chunk),
        }
    }
}

impl http_body::Body for Pattern {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(CHUNK as u64);
        self.left -= n;
        Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..n as usize)))))
    }
}

async fn count_bytes(body: hyper::body::Incoming) -> u64 {
    let mut body = body;
    let mut total = 0;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            total += data.len() as u64;
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread")]
async fn one_gibibyte_each_way_with_flat_memory() {
    let received = Arc::new(AtomicU64::new(0));
    let counter = received.clone();
    let app = App::start(move |req: Request<hyper::body::Incoming>| {
        let counter = counter.clone();
        async move {
            if req.uri().path() == "/download" {
                Response::new(Pattern::new(GIB).boxed())
            } else {
                let n = count_bytes(req.into_body()).await;
                counter.store(n, Ordering::SeqCst);
                Response::new(full(n.to_string()))
            }
        }
    })
    .await;
    let qp = QProxy::start(app.port(), &[]);

    // A gibibyte takes a while in a debug build: a longer deadline here.
    let slow = deadline() * 6;
    let upload = Request::post("/upload")
        .header("host", "hello.example.com")
        .body(Pattern::new(GIB).boxed())
        .unwrap();
    let stream = TcpStream::connect(qp.main).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let res = tokio::time::timeout(slow, sender.send_request(upload))
        .await
        .expect("upload finished")
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(text(res).await, GIB.to_string());
    assert_eq!(received.load(Ordering::SeqCst), GIB);

    let res = h1(qp.main, get("/download", &[])).await;
    assert_eq!(res.status(), 200);
    let (done_tx, done_rx) = oneshot::channel();
    tokio::spawn(async move {
        let _ = done_tx.send(count_bytes(res.into_body()).await);
    });
    let downloaded = tokio::time::timeout(slow, done_rx)
        .await
        .expect("download finished")
        .unwrap();
    assert_eq!(downloaded, GIB);

    let peak_mib = qp.peak_rss_kib() / 1024;
    assert!(peak_mib < 64, "qproxy peaked at {peak_mib} MiB");
}

#[tokio::test(flavor = "multi_thread")]
async fn http1_upstream_connections_are_kept_alive() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);
    for _ in 0..5 {
        let res = h1(qp.main, get("/", &[])).await;
        assert_eq!(text(res).await, "Hello World!\n");
    }
    assert_eq!(app.seen().len(), 5);
    assert_eq!(
        app.connections_accepted(),
        1,
        "one pooled connection serves all"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_app_connection_is_reused_after_every_kind_of_answer() {
    // An answer with no body (to HEAD, and a 204), one with a length, and
    // one in chunks (no length known): each read whole, each client on a
    // connection of its own, one connection to the app for them all.
    let app = App::start(|req| async move {
        match req.uri().path() {
            "/none" => {
                let mut res = Response::new(empty());
                *res.status_mut() = StatusCode::NO_CONTENT;
                res
            }
            "/chunks" => Response::new(Pattern::new(3 * CHUNK as u64).boxed()),
            _ => Response::new(full("Hello World!\n")),
        }
    })
    .await;
    let qp = QProxy::start(app.port(), &[]);
    let head = Request::head("/").body(empty()).unwrap();
    let res = h1(qp.main, head).await;
    assert_eq!(res.status(), 200);
    assert_eq!(text(res).await, "");
    let res = h1(qp.main, get("/none", &[])).await;
    assert_eq!(res.status(), 204);
    let res = h1(qp.main, get("/chunks", &[])).await;
    assert!(res.headers().contains_key("transfer-encoding"));
    assert_eq!(count_bytes(res.into_body()).await, 3 * CHUNK as u64);
    let res = h1(qp.main, get("/", &[])).await;
    assert_eq!(text(res).await, "Hello World!\n");
    assert_eq!(app.seen().len(), 4);
    assert_eq!(app.connections_accepted(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_pool_keeps_container_concurrency_connections() {
    // The app holds requests until told, so that five connections open.
    // Kubelet probes take no breaker slot, so five can be inside at once.
    let (app, mut arrived_rx) = App::holding("done").await;
    let qp = QProxy::start(app.port(), &[("CONTAINER_CONCURRENCY", "2")]);

    let requests: Vec<_> = (0..5)
        .map(|_| {
            let addr = qp.main;
            let probe = get("/", &[("k-kubelet-probe", "queue")]);
            tokio::spawn(async move { text(h1(addr, probe).await).await })
        })
        .collect();
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(
            within("a request at the app", arrived_rx.recv())
                .await
                .unwrap(),
        );
    }
    app.wait_open_connections(5).await;
    for release in held {
        release.send(()).unwrap();
    }
    for r in requests {
        assert_eq!(within("a response", r).await.unwrap(), "done");
    }
    // Two stay idle for reuse; the rest are closed.
    app.wait_open_connections(2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_reaches_the_app_with_its_target_and_a_2xx_becomes_a_tunnel() {
    let (heads, mut seen) = mpsc::unbounded_channel();
    let port = raw_app(move |mut s| {
        let heads = heads.clone();
        async move {
            let Some(head) = read_head(&mut s).await else {
                return;
            };
            let _ = heads.send(head);
            // A greeting after the head, then an echo: both the tunnel's.
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nhello\n")
                .await;
            let mut buf = [0u8; 64];
            while let Ok(n @ 1..) = s.read(&mut buf).await {
                let _ = s.write_all(&buf[..n]).await;
            }
        }
    })
    .await;
    let qp = QProxy::start(port, &[]);

    // A CONNECT is a CONNECT, whatever else it asks for.
    let heads: [&[u8]; 2] = [
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\
          Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    ];
    for sent in heads {
        let mut client = TcpStream::connect(qp.main).await.unwrap();
        client.write_all(sent).await.unwrap();
        let head = within("the 200", read_head(&mut client)).await.unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        // RFC 9110 forbids body framing on a 2xx to CONNECT.
        assert!(
            !head.to_ascii_lowercase().contains("content-length"),
            "{head}"
        );

        let app_head = within("the app's request", seen.recv()).await.unwrap();
        assert!(
            app_head.starts_with("CONNECT example.com:443 HTTP/1.1\r\n"),
            "{app_head}"
        );
        assert!(app_head.contains("Host: example.com:443\r\n"), "{app_head}");

        let mut greeting = [0u8; 6];
        within("the greeting", client.read_exact(&mut greeting))
            .await
            .unwrap();
        assert_eq!(&greeting, b"hello\n");
        client.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        within("the echo", client.read_exact(&mut echo))
            .await
            .unwrap();
        assert_eq!(&echo, b"ping");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_framing_of_an_app_answer_reaches_the_client_whole() {
    // Answers written byte by byte as an app may write them, on keep-alive
    // connections: one is reused until an answer says it may not be (bytes
    // after the body; `Connection: close`, whose body lasts until the close).
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    let port = raw_app(move |mut s| {
        count.fetch_add(1, Ordering::SeqCst);
        async move {
            while let Some(head) = read_head(&mut s).await {
                let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
                let answer: &[u8] = match path.as_str() {
                    "/chunks" => {
                        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n\
                          3;ext=1\r\nhel\r\n2\r\nlo\r\n0\r\nX-Sum: 5\r\n\r\n"
                    }
                    "/early" => {
                        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n\
                          HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
                    }
                    "/extra" => b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloXX",
                    "/close" => b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello",
                    "/short" => b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello",
                    _ => b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
                };
                if s.write_all(answer).await.is_err()
                    || matches!(path.as_str(), "/close" | "/short")
                {
                    return;
                }
            }
        }
    })
    .await;
    let qp = QProxy::start(port, &[]);

    for (path, connections) in [
        ("/length", 1),
        ("/chunks", 1),
        ("/early", 1),
        ("/extra", 1),
        ("/length", 2),
        ("/close", 2),
        ("/length", 3),
    ] {
        let res = h1(qp.main, get(path, &[("te", "trailers")])).await;
        assert_eq!(res.status(), 200, "{path}");
        assert!(
            !res.headers().contains_key("link"),
            "{path}: a 1xx head leaked"
        );
        let collected = within("the body", res.into_body().collect()).await.unwrap();
        let trailers = collected.trailers().cloned();
        assert_eq!(collected.to_bytes(), "hello", "{path}");
        if path == "/chunks" {
            assert_eq!(trailers.unwrap()["x-sum"], "5");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), connections, "after {path}");
    }

    // A body cut short: the client's connection is cut too, before a
    // whole answer.
    let mut client = TcpStream::connect(qp.main).await.unwrap();
    client
        .write_all(b"GET /short HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    within("the close", client.read_to_end(&mut got))
        .await
        .unwrap();
    let body = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(0, |end| got.len() - end - 4);
    assert!(body < 10, "{:?}", String::from_utf8_lossy(&got));
}

/// Reads `body` to its end, checking it is [`Pattern`]'s bytes; its length.
async fn read_pattern(body: hyper::body::Incoming) -> u64 {
    let mut body = body;
    let mut at = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            for (k, b) in data.iter().enumerate() {
                let i = at + k as u64;
                assert_eq!(u64::from(*b), i % 251, "byte {i}");
            }
            at += data.len() as u64;
        }
    }
    at
}

/// Over h2c the app answers before the request's body has ended, and
/// echoes it: the body goes on to the app after the answer came, and
/// both ways pass far more than HTTP/2's flow-control windows let through
/// at once, byte for byte.
#[tokio::test(flavor = "multi_thread")]
async fn h2c_bodies_stream_both_ways_past_the_windows() {
    let app = App::start(|req: Request<hyper::body::Incoming>| async move {
        Response::new(req.into_body().map_err(Into::into).boxed())
    })
    .await;
    let qp = QProxy::start(app.port(), &[]);
    const LEN: u64 = 48 << 20;
    let req = Request::post("http://hello.example.com/echo")
        .body(Pattern::new(LEN).boxed())
        .unwrap();
    let res = h2(qp.main, req).await;
    assert_eq!(res.status(), 200);
    assert_eq!(within("the echo", read_pattern(res.into_body())).await, LEN);
}

/// An h2c request whose body is still coming when the revision timeout
/// answers it: the app's stream is reset (as Go's transport cancels it),
/// not left open waiting for the rest.
#[tokio::test(flavor = "multi_thread")]
async fn an_h2c_request_the_timeout_answers_is_reset_at_the_app() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let app = App::start(move |req: Request<hyper::body::Incoming>| {
        let tx = tx.clone();
        async move {
            let mut body = req.into_body();
            let outcome = loop {
                match body.frame().await {
                    Some(Ok(_)) => continue,
                    Some(Err(_)) => break "reset",
                    None => break "ended",
                }
            };
            let _ = tx.send(outcome);
            Response::new(full("late"))
        }
    })
    .await;
    let qp = QProxy::start(app.port(), &[("REVISION_TIMEOUT_SECONDS", "1")]);
    // One frame, and then nothing more for as long as the test runs.
    let (more, chunks) = mpsc::channel(1);
    more.send(Bytes::from_static(b"first")).await.unwrap();
    let req = Request::post("http://hello.example.com/upload")
        .body(Chunks(chunks).boxed())
        .unwrap();
    let res = h2(qp.main, req).await;
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(within("the app's stream", rx.recv()).await, Some("reset"));
    drop(more);
}

/// A `CONNECT` over HTTP/2 that the app accepts with a `2xx` is a tunnel
/// between the client's stream and the app's, as Go's proxy streams both:
/// bytes go both ways while it is open, and each side's end of stream
/// reaches the other, the rest of the app's answer still coming after the
/// client has ended its side.
#[tokio::test(flavor = "multi_thread")]
async fn an_h2c_connect_the_app_accepts_is_a_tunnel() {
    let app = App::start(|mut req: Request<hyper::body::Incoming>| async move {
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            let Ok(tunnel) = upgrade.await else {
                return;
            };
            // An echo in capitals, to the client's end.
            let mut io = hyper_util::rt::TokioIo::new(tunnel);
            let mut buf = [0u8; 1024];
            loop {
                let n = io.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                buf[..n].make_ascii_uppercase();
                if io.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            let _ = io.shutdown().await;
        });
        Response::new(empty())
    })
    .await;
    let qp = QProxy::start(app.port(), &[]);

    let mut io = h2_connect(qp.main).await;
    io.write_all(b"hello").await.unwrap();
    let mut echoed = [0u8; 5];
    within("the echo", io.read_exact(&mut echoed))
        .await
        .unwrap();
    assert_eq!(&echoed, b"HELLO");
    io.write_all(b" again").await.unwrap();
    io.shutdown().await.unwrap();
    let mut rest = Vec::new();
    within("the app's end", io.read_to_end(&mut rest))
        .await
        .unwrap();
    assert_eq!(rest, b" AGAIN");
    let seen = app.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, http::Method::CONNECT);
    assert_eq!(seen[0].version, Version::HTTP_2);
}

/// An HTTP/2 `CONNECT` tunnel in which nothing moves is closed at the
/// request's timeout, as an upgraded connection is, and gives back what
/// it held: with `containerConcurrency` 1, the next request is served.
#[tokio::test(flavor = "multi_thread")]
async fn a_quiet_h2c_connect_tunnel_ends_at_the_timeout() {
    let app = App::start(|mut req: Request<hyper::body::Incoming>| async move {
        if req.method() == http::Method::CONNECT {
            let upgrade = hyper::upgrade::on(&mut req);
            // The far end holds its side open and says nothing.
            tokio::spawn(async move {
                if let Ok(tunnel) = upgrade.await {
                    let mut io = hyper_util::rt::TokioIo::new(tunnel);
                    let mut sink = Vec::new();
                    let _ = io.read_to_end(&mut sink).await;
                }
            });
        }
        Response::new(empty())
    })
    .await;
    let qp = QProxy::start(
        app.port(),
        &[
            ("REVISION_TIMEOUT_SECONDS", "1"),
            ("CONTAINER_CONCURRENCY", "1"),
        ],
    );

    let mut io = h2_connect(qp.main).await;
    let mut rest = Vec::new();
    // Ended by qproxy: a clean end or a reset, either way no more bytes.
    let _ = within("the tunnel's end", io.read_to_end(&mut rest)).await;
    assert!(rest.is_empty());
    let res = h1(qp.main, get("/", &[])).await;
    assert_eq!(res.status(), StatusCode::OK);
}

/// Opens an HTTP/2 `CONNECT` tunnel through qproxy at `main`, which must
/// answer `200`.
async fn h2_connect(
    main: std::net::SocketAddr,
) -> hyper_util::rt::TokioIo<hyper::upgrade::Upgraded> {
    let req = Request::connect("example.com:443").body(empty()).unwrap();
    let mut res = h2(main, req).await;
    assert_eq!(res.status(), StatusCode::OK);
    let tunnel = within("the client's tunnel", hyper::upgrade::on(&mut res))
        .await
        .unwrap();
    hyper_util::rt::TokioIo::new(tunnel)
}
