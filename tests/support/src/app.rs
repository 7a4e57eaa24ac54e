//! Apps on loopback for qproxy to front: hyper apps that record what they
//! see, and raw TCP apps for misbehaviour hyper would not produce.

use std::convert::Infallible;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::{TestBody, full, read_head, within};

/// How long [`App::varied`] takes to answer `/slow`: past the 250 ms
/// latency bucket of Knative's request metrics.
pub const SLOW: Duration = Duration::from_millis(300);

/// What an app saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Method.
    pub method: Method,
    /// Request target as received.
    pub uri: Uri,
    /// Protocol version.
    pub version: Version,
    /// Headers as received.
    pub headers: HeaderMap,
}

/// A hyper app (HTTP/1.1 and h2c) on loopback that records what it sees.
pub struct App {
    /// Where it listens.
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<Connections>,
}

/// Connections an app has accepted, and how many are still open.
#[derive(Default)]
struct Connections {
    /// (accepted, open)
    counts: Mutex<(usize, usize)>,
    changed: tokio::sync::Notify,
}

impl App {
    /// Starts an app answering every request with `handler`.
    pub async fn start<H, F>(handler: H) -> Self
    where
        H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Response<TestBody>> + Send + 'static,
    {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        Self::serve(listener, handler).await
    }

    /// Starts an app on `listener`, answering every request with `handler`.
    pub async fn serve<H, F>(listener: TcpListener, handler: H) -> Self
    where
        H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Response<TestBody>> + Send + 'static,
    {
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let connections = Arc::new(Connections::default());
        let conns = connections.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                {
                    let mut c = conns.counts.lock().unwrap();
                    c.0 += 1;
                    c.1 += 1;
                }
                let conns = conns.clone();
                let handler = handler.clone();
                let log = log.clone();
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    log.lock().unwrap().push(Seen {
                        method: req.method().clone(),
                        uri: req.uri().clone(),
                        version: req.version(),
                        headers: req.headers().clone(),
                    });
                    let fut = handler(req);
                    async move { Ok::<_, Infallible>(fut.await) }
                });
                tokio::spawn(async move {
                    let mut builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    // More than a client connection of qproxy's may carry
                    // (hyper's default is 200), so that the app is never
                    // what limits a test.
                    builder.http2().max_concurrent_streams(1000);
                    let _ = builder
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                    conns.counts.lock().unwrap().1 -= 1;
                    conns.changed.notify_waiters();
                });
            }
        });
        App {
            addr,
            seen,
            connections,
        }
    }

    /// How many connections the app has accepted so far.
    pub fn connections_accepted(&self) -> usize {
        self.connections.counts.lock().unwrap().0
    }

    /// Waits until exactly `n` of the app's connections are open.
    pub async fn wait_open_connections(&self, n: usize) {
        within(&format!("{n} open connections at the app"), async {
            loop {
                let changed = self.connections.changed.notified();
                if self.connections.counts.lock().unwrap().1 == n {
                    return;
                }
                changed.await;
            }
        })
        .await
    }

    /// An app that holds every request until the test releases it: each
    /// arrival sends the test a sender to release it with, and the app
    /// then answers `body`.
    pub async fn holding(
        body: &'static str,
    ) -> (
        Self,
        tokio::sync::mpsc::Receiver<tokio::sync::oneshot::Sender<()>>,
    ) {
        let (arrived_tx, arrived_rx) = tokio::sync::mpsc::channel(64);
        let app = App::start(move |_| {
            let arrived = arrived_tx.clone();
            async move {
                let (release_tx, release_rx) = tokio::sync::oneshot::channel();
                arrived.send(release_tx).await.unwrap();
                let _ = release_rx.await;
                Response::new(full(body))
            }
        })
        .await;
        (app, arrived_rx)
    }

    /// An app whose answer depends on the path: `/fail` is a `500`,
    /// `/slow` takes [`SLOW`], `/echo` sends the request body back, and
    /// everything else is `answer`.
    pub async fn varied() -> Self {
        App::start(|req| async move {
            let path = req.uri().path().to_owned();
            let body = req.into_body().collect().await.map(|b| b.to_bytes());
            let mut res = Response::new(full(match (&*path, body) {
                ("/echo", Ok(b)) => b,
                _ => Bytes::from_static(b"answer"),
            }));
            match &*path {
                "/fail" => *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR,
                "/slow" => tokio::time::sleep(SLOW).await,
                _ => {}
            }
            res
        })
        .await
    }

    /// An app answering `Hello World!` to everything.
    pub async fn hello() -> Self {
        App::start(|_| async { Response::new(full("Hello World!\n")) }).await
    }

    /// The requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The only request seen.
    pub fn only(&self) -> Seen {
        let seen = self.seen();
        assert_eq!(seen.len(), 1, "expected one request, saw {seen:#?}");
        seen.into_iter().next().unwrap()
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

/// An app speaking raw TCP, for misbehaviour hyper would not produce:
/// `handler` gets each accepted connection. Returns the port.
pub async fn raw_app<F, Fut>(handler: F) -> u16
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(handler(stream));
        }
    });
    port
}

/// Reads a request head and ignores it.
pub async fn read_request(stream: &mut TcpStream) {
    let _ = read_head(stream).await;
}

/// An app answering every request with `response`, written as given.
pub async fn canned_app(response: &'static [u8]) -> u16 {
    raw_app(move |mut s| async move {
        read_request(&mut s).await;
        let _ = s.write_all(response).await;
    })
    .await
}

/// A loopback port with nothing listening on it.
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    l.local_addr().unwrap().port()
}

/// A WebSocket app on loopback echoing every message until the client
/// closes. Returns its port.
pub async fn websocket_echo_app() -> u16 {
    raw_app(|stream| async move {
        let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
            return;
        };
        while let Some(Ok(msg)) = ws.next().await {
            if msg.is_close() || ws.send(msg).await.is_err() {
                break;
            }
        }
    })
    .await
}

/// A hyper app's answer to a WebSocket request: `101`, then an echo of
/// every message until the client closes, on whichever connection the
/// request came (new or reused); `400` without `Sec-WebSocket-Key`.
pub fn websocket_echo_upgrade(req: Request<Incoming>) -> Response<TestBody> {
    let Some(key) = req.headers().get("sec-websocket-key") else {
        let mut res = Response::new(crate::empty());
        *res.status_mut() = StatusCode::BAD_REQUEST;
        return res;
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        while let Some(Ok(msg)) = ws.next().await {
            if msg.is_close() || ws.send(msg).await.is_err() {
                break;
            }
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-accept", accept)
        .body(crate::empty())
        .unwrap()
}

/// An app that upgrades `/ws` to an echoing WebSocket and cuts every other
/// response short: its head promises 100 bytes, 5 come, then the
/// connection closes.
pub async fn upgrade_and_abort_app() -> u16 {
    raw_app(|mut stream| async move {
        let mut peek = [0u8; 8];
        let Ok(n) = stream.peek(&mut peek).await else {
            return;
        };
        if peek[..n].starts_with(b"GET /ws ") {
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                return;
            };
            while let Some(Ok(msg)) = ws.next().await {
                if msg.is_close() || ws.send(msg).await.is_err() {
                    break;
                }
            }
        } else {
            read_request(&mut stream).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
                .await;
        }
    })
    .await
}
