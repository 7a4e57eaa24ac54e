//! qproxy's HTTP/1.1 client against hyper's: the same request, sent each
//! way to an app on loopback, must reach the app as the same bytes (but
//! where hyper and Go part, and qproxy follows Go: a `GET` whose body
//! streams goes in chunks, as Go's transport sends it, where hyper would
//! drop it).

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request};
use http_body::Frame;
use http_body_util::StreamBody;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use qproxy_transport::client::{self, Outgoing, Payload, exchange};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type TestBody = BoxBody<Bytes, Infallible>;

/// A body of `frames`, streamed one at a time, then `trailers`.
fn streamed(frames: &[&'static str], trailers: Option<(&'static str, &'static str)>) -> TestBody {
    let mut all: Vec<Result<Frame<Bytes>, Infallible>> = frames
        .iter()
        .map(|f| Ok(Frame::data(Bytes::from_static(f.as_bytes()))))
        .collect();
    if let Some((name, value)) = trailers {
        let mut map = HeaderMap::new();
        map.insert(name, HeaderValue::from_static(value));
        all.push(Ok(Frame::trailers(map)));
    }
    StreamBody::new(futures_util::stream::iter(all)).boxed()
}

/// What an app that answers `204` and closes read of one request: until
/// the request's end (its `Content-Length`, or the last chunk and the
/// blank line after it).
async fn received<F, Fut>(send: F) -> String
where
    F: FnOnce(SocketAddr) -> Fut,
    Fut: Future<Output = ()>,
{
    let app = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = app.local_addr().unwrap();
    let read = tokio::spawn(async move {
        let (mut tcp, _) = app.accept().await.unwrap();
        let mut got = Vec::new();
        loop {
            let text = String::from_utf8_lossy(&got).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let head = text[..end].to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .map(|n| n.parse::<usize>().unwrap());
                let done = match length {
                    Some(n) => got.len() >= end + 4 + n,
                    None if head.contains("transfer-encoding: chunked") => {
                        text[end + 4..].starts_with("0\r\n") && text.ends_with("\r\n\r\n")
                            || text[end + 4..].contains("\r\n0\r\n") && text.ends_with("\r\n\r\n")
                    }
                    None => true,
                };
                if done {
                    break;
                }
            }
            let mut buf = [0; 4096];
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "the request ended early: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        tcp.write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        String::from_utf8(got).unwrap()
    });
    send(addr).await;
    read.await.unwrap()
}

/// `req` sent by qproxy's client.
async fn ours(req: Request<TestBody>, whole: bool) -> String {
    received(|addr| async move {
        let (mut parts, body) = req.into_parts();
        let payload = if whole {
            Payload::Whole(body.collect().await.unwrap().to_bytes())
        } else {
            Payload::Stream(body)
        };
        let mut out = Outgoing::new(&mut parts, payload);
        let tcp = TcpStream::connect(addr).await.unwrap();
        let local = tcp.local_addr().unwrap();
        let mut conn = client::Conn::new(tcp, local);
        let head = exchange(&mut conn, &mut out, &mut HeaderMap::new())
            .await
            .unwrap();
        assert_eq!(head.status, 204);
    })
    .await
}

/// `req` sent by hyper's client, as qproxy configured it (header names in
/// title case).
async fn hypers(req: Request<TestBody>) -> String {
    received(|addr| async move {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
            .title_case_headers(true)
            .handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        let res = sender.send_request(req).await.unwrap();
        assert_eq!(res.status(), 204);
    })
    .await
}

fn request(
    method: Method,
    headers: &[(&'static str, &'static str)],
    body: TestBody,
) -> Request<TestBody> {
    let mut req = Request::new(body);
    *req.method_mut() = method;
    *req.uri_mut() = "/up?x=1".parse().unwrap();
    req.headers_mut()
        .insert("host", HeaderValue::from_static("app"));
    for (name, value) in headers {
        req.headers_mut()
            .append(*name, HeaderValue::from_static(value));
    }
    req
}

#[tokio::test]
async fn a_whole_body_goes_out_as_hyper_writes_it() {
    let make = || {
        request(
            Method::PUT,
            &[("content-length", "11"), ("ce-type", "dev.knative.example")],
            Full::new(Bytes::from_static(b"{\"a\":\"b c\"}")).boxed(),
        )
    };
    assert_eq!(ours(make(), true).await, hypers(make()).await);
}

#[tokio::test]
async fn a_streamed_body_with_a_length_goes_out_as_hyper_writes_it() {
    let make = || {
        request(
            Method::POST,
            &[("content-length", "10")],
            streamed(&["hello", "world"], None),
        )
    };
    let ours = ours(make(), false).await;
    assert_eq!(ours, hypers(make()).await);
    assert!(ours.ends_with("\r\n\r\nhelloworld"), "{ours:?}");
}

#[tokio::test]
async fn a_streamed_body_without_a_length_goes_in_chunks_as_hyper_writes_it() {
    let make = || request(Method::POST, &[], streamed(&["hello", " world!"], None));
    let ours = ours(make(), false).await;
    assert_eq!(ours, hypers(make()).await);
    assert!(
        ours.ends_with("Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7\r\n world!\r\n0\r\n\r\n"),
        "{ours:?}"
    );
}

/// Trailers go in the last chunk when the request announced them in
/// `Trailer`, and only those it announced; an empty body is one last
/// chunk.
#[tokio::test]
async fn trailers_go_as_hyper_sends_them() {
    for (announced, body) in [
        (Some("x-sum"), &["abc"][..]),
        (Some("x-other"), &["abc"][..]),
        (None, &["abc"][..]),
        (Some("x-sum"), &[][..]),
    ] {
        let make = || {
            let headers: &[(&'static str, &'static str)] = match announced {
                Some(name) => &[("trailer", name)][..],
                None => &[],
            };
            // `headers` borrows `announced`'s static name.
            let headers: Vec<_> = headers.to_vec();
            request(
                Method::POST,
                &headers,
                streamed(body, Some(("x-sum", "42"))),
            )
        };
        let ours = ours(make(), false).await;
        assert_eq!(ours, hypers(make()).await, "{announced:?} {body:?}");
        assert_eq!(
            ours.contains("X-Sum: 42"),
            announced == Some("x-sum"),
            "{ours:?}"
        );
    }
}

/// A chunk's size goes in lower case, as Go's transport writes it; hyper
/// writes it in upper case.
#[tokio::test]
async fn a_chunk_s_size_is_written_in_lower_case_as_go_writes_it() {
    let make = || request(Method::POST, &[], streamed(&["hello world!"], None));
    let ours = ours(make(), false).await;
    assert!(
        ours.ends_with("Transfer-Encoding: chunked\r\n\r\nc\r\nhello world!\r\n0\r\n\r\n"),
        "{ours:?}"
    );
    assert_eq!(ours.replace("\r\nc\r\n", "\r\nC\r\n"), hypers(make()).await);
}

/// hyper drops the streamed body of a `GET` it has no length for; Go's
/// transport, and so qproxy, sends it in chunks.
#[tokio::test]
async fn a_get_whose_body_streams_goes_in_chunks_as_go_sends_it() {
    let ours = ours(request(Method::GET, &[], streamed(&["q"], None)), false).await;
    assert!(
        ours.ends_with("Transfer-Encoding: chunked\r\n\r\n1\r\nq\r\n0\r\n\r\n"),
        "{ours:?}"
    );
}
