//! The connector against scripted apps on loopback.

use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::client::ExchangeError;

/// What the tests send: no body, or one whole.
type NoBody = Empty<Bytes>;

/// `req` ready to send, with `payload`.
fn ready(req: Request<()>, payload: Payload<NoBody>) -> Http1Request<NoBody> {
    Http1Request::new(req.into_parts().0, payload)
}

/// Responses read one after another over one kept connection (into
/// the memory it keeps, when nothing holds it) stay whole: those
/// whose headers and bodies are held while the next is read, and
/// those let go. Sizes go up and down, and past one read.
#[tokio::test]
async fn responses_read_into_kept_memory_stay_whole() {
    let app = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let port = app.local_addr().unwrap().port();
    let sizes = [5, 300, 20, 3_000, 6_000, 10, 900, 1];
    tokio::spawn(async move {
        // One connection serves every request.
        let (mut tcp, _) = app.accept().await.unwrap();
        let mut got = Vec::new();
        for (i, size) in sizes.into_iter().enumerate() {
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let mut buf = [0; 1024];
                let n = tcp.read(&mut buf).await.unwrap();
                assert!(n > 0);
                got.extend_from_slice(&buf[..n]);
            }
            let end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            got.drain(..end);
            let body = char::from(b'a' + i as u8).to_string().repeat(size);
            let res = format!(
                "HTTP/1.1 200 OK\r\nX-N: {i}-{size}\r\nContent-Length: {size}\r\n\r\n{body}"
            );
            tcp.write_all(res.as_bytes()).await.unwrap();
        }
    });
    let connector = Connector::new(port, 4);
    let mut held = Vec::new();
    for (i, size) in sizes.into_iter().enumerate() {
        let req = Request::get("/")
            .header(http::header::HOST, "app")
            .body(())
            .unwrap();
        let answer = connector.send(ready(req, Payload::None)).await.unwrap();
        let Answer::<ResponseBody>::Response(res) = answer else {
            panic!("switched");
        };
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        let expected = char::from(b'a' + i as u8).to_string().repeat(size);
        assert_eq!(parts.headers["x-n"], format!("{i}-{size}").as_str());
        assert_eq!(body, expected.as_bytes());
        if i % 2 == 0 {
            held.push((parts.headers, body, i, size));
        }
    }
    for (headers, body, i, size) in held {
        assert_eq!(headers["x-n"], format!("{i}-{size}").as_str());
        assert_eq!(
            body,
            char::from(b'a' + i as u8)
                .to_string()
                .repeat(size)
                .as_bytes()
        );
    }
}

/// What a scripted app does with a request.
#[derive(Debug, Clone, Copy)]
enum Then {
    /// Answers `200` and keeps the connection.
    Answer,
    /// Answers `200`, announcing `Keep-Alive: timeout=2`.
    AnswerAnnouncing,
    /// Answers `200`, then closes the connection.
    AnswerAndClose,
    /// Closes the connection without answering.
    Close,
}

/// An app on loopback that reads each request whole (its
/// `Content-Length`) and does what `script` says for the `n`th request
/// on each connection (the last entry after that); the requests it
/// read, as (connection, request line), come from the receiver.
async fn scripted(
    script: Vec<Then>,
) -> (u16, tokio::sync::mpsc::UnboundedReceiver<(usize, String)>) {
    let app = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let port = app.local_addr().unwrap().port();
    let (seen, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        for conn in 0.. {
            let (mut tcp, _) = app.accept().await.unwrap();
            let (seen, script) = (seen.clone(), script.clone());
            tokio::spawn(async move {
                let mut got = Vec::new();
                for n in 0.. {
                    let end = loop {
                        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                            let length = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length: "))
                                .map_or(0, |n| n.parse::<usize>().unwrap());
                            if got.len() >= end + 4 + length {
                                break end + 4 + length;
                            }
                        }
                        let mut buf = [0; 4096];
                        match tcp.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    };
                    let line = String::from_utf8_lossy(&got[..end])
                        .lines()
                        .next()
                        .unwrap()
                        .to_owned();
                    got.drain(..end);
                    seen.send((conn, line)).unwrap();
                    let then = script[n.min(script.len() - 1)];
                    let answer: &[u8] = match then {
                        Then::Close => return,
                        Then::AnswerAnnouncing => b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=2\r\nContent-Length: 2\r\n\r\nok",
                        _ => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                    };
                    tcp.write_all(answer).await.unwrap();
                    if let Then::AnswerAndClose = then {
                        return;
                    }
                }
            });
        }
    });
    (port, rx)
}

fn get() -> Http1Request<NoBody> {
    let req = Request::get("/get")
        .header(http::header::HOST, "app")
        .body(())
        .unwrap();
    ready(req, Payload::None)
}

fn post() -> Http1Request<NoBody> {
    let req = Request::post("/post")
        .header(http::header::HOST, "app")
        .header(http::header::CONTENT_LENGTH, "4")
        .body(())
        .unwrap();
    ready(req, Payload::Whole(Bytes::from_static(b"data")))
}

/// Sends `req`, and reads the answer's body to its end (so that its
/// connection goes back to the pool): its status, `EOF` for an app that
/// closed the connection unanswered, or the error's text.
async fn status_of(connector: &Connector, req: Http1Request<NoBody>) -> String {
    match connector.send(req).await {
        Ok(Answer::<ResponseBody>::Response(res)) => {
            let status = res.status();
            res.into_body().collect().await.unwrap();
            status.as_str().to_owned()
        }
        Ok(Answer::Switched(_)) => "switched".to_owned(),
        Err(SendError::Exchange {
            source: ExchangeError::Closed,
            ..
        }) => "EOF".to_owned(),
        Err(err) => err.to_string(),
    }
}

fn drain(rx: &mut tokio::sync::mpsc::UnboundedReceiver<(usize, String)>) -> Vec<(usize, String)> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

/// A kept connection the app closed while it was idle is passed over
/// before anything is written to it: a request with a body goes on a
/// new connection, and reaches the app once.
#[tokio::test]
async fn a_connection_closed_while_idle_is_not_written_to() {
    let (port, mut seen) = scripted(vec![Then::AnswerAndClose]).await;
    let connector = Connector::new(port, 4);
    assert_eq!(status_of(&connector, get()).await, "200");
    // The app has closed its end once it has answered.
    assert_eq!(status_of(&connector, post()).await, "200");
    assert_eq!(
        drain(&mut seen),
        [
            (0, "GET /get HTTP/1.1".to_owned()),
            (1, "POST /post HTTP/1.1".to_owned())
        ]
    );
}

/// The app reads a request on a kept connection and closes it without
/// answering: a `GET` is sent again on a new connection, as Go sends
/// it; a `POST` with a body is not (the app has it), and fails with
/// Go's text.
#[tokio::test]
async fn only_a_replayable_request_is_sent_again_after_the_app_had_it() {
    let (port, mut seen) = scripted(vec![Then::Answer, Then::Close]).await;
    let connector = Connector::new(port, 4);
    assert_eq!(status_of(&connector, get()).await, "200");
    assert_eq!(status_of(&connector, get()).await, "200");
    assert_eq!(
        drain(&mut seen),
        [
            (0, "GET /get HTTP/1.1".to_owned()),
            (0, "GET /get HTTP/1.1".to_owned()),
            (1, "GET /get HTTP/1.1".to_owned()),
        ]
    );
    assert_eq!(status_of(&connector, post()).await, "EOF");
    assert_eq!(drain(&mut seen), [(1, "POST /post HTTP/1.1".to_owned())]);
}

/// A connection is not reused past the idle time its app announced
/// (`timeout=2`, kept 1.5 s): within it, it is.
#[tokio::test]
async fn a_connection_is_not_reused_past_the_idle_time_its_app_announced() {
    let (port, mut seen) = scripted(vec![Then::AnswerAnnouncing]).await;
    let connector = Connector::new(port, 4);
    assert_eq!(status_of(&connector, get()).await, "200");
    // Idle times around the limit are what is under test.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(status_of(&connector, get()).await, "200");
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(status_of(&connector, get()).await, "200");
    let conns: Vec<usize> = drain(&mut seen).into_iter().map(|(c, _)| c).collect();
    assert_eq!(conns, [0, 0, 1]);
}
