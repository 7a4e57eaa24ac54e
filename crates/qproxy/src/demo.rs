//! `qproxy demo`: a hello app and qproxy in front of it, configured with the
//! environment a default Knative install gives a revision.
//!
//! The app answers on a free loopback port:
//! - `/` with `Hello World!` (Knative's helloworld sample),
//! - `/headers` with the request line and headers it received, to show what
//!   qproxy changes,
//! - `/echo` with the request body, streamed back,
//! - `/sse` with a few server-sent events, one every half second.
//!
//! qproxy takes Knative's ports (8012, 8022, 9090, 9091) where they are
//! free and any free port otherwise.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdListener};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body as _;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::config::{Config, Generation, knative_defaults};
use crate::{Error, Server, shutdown_signal};

type AppBody = BoxBody<Bytes, hyper::Error>;

/// Runs the demo until SIGINT or SIGTERM.
pub async fn run() -> Result<(), Error> {
    let app = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .map_err(|source| Error::Io {
            context: "cannot start the demo app",
            source,
        })?;
    let app_addr = app.local_addr().map_err(|source| Error::Io {
        context: "cannot start the demo app",
        source,
    })?;
    tokio::spawn(serve_app(app));

    let mut vars = knative_defaults(Generation::Classic, app_addr.port());
    // Nothing routes to the demo but its user: Ctrl-C needs no quiet period.
    vars.set("QPROXY_DRAIN_QUIET_SECONDS", "0");
    const PORTS: [(&str, u16); 4] = [
        ("QUEUE_SERVING_PORT", 8012),
        ("QPROXY_ADMIN_PORT", 8022),
        ("QPROXY_STATS_PORT", 9090),
        ("QPROXY_METRICS_PORT", 9091),
    ];
    for (var, port) in PORTS {
        if !port_free(port) {
            vars.set(var, "0");
        }
    }
    let config = Config::from_vars(&vars)?;
    crate::init_logging(&config);
    let shutdown = shutdown_signal()?;
    // A port found free may be taken before it is bound: then every port
    // is any free one.
    let server = match Server::bind(config) {
        Ok(server) => server,
        Err(_) => {
            for (var, _) in PORTS {
                vars.set(var, "0");
            }
            Server::bind(Config::from_vars(&vars)?)?
        }
    };
    println!("{}", banner(app_addr, &server));
    server.run(shutdown).await?;
    Ok(())
}

fn port_free(port: u16) -> bool {
    StdListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok()
}

fn banner(app: SocketAddr, server: &Server) -> String {
    let addrs = server.addrs();
    let main = format!("http://127.0.0.1:{}", addrs.main.port());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "qproxy demo: a hello app on {app}, qproxy in front of it.\n"
    );
    let _ = writeln!(out, "  proxy (QUEUE_SERVING_PORT)  {main}/");
    let _ = writeln!(
        out,
        "  admin                       http://127.0.0.1:{}/",
        addrs.admin.port()
    );
    let _ = writeln!(
        out,
        "  autoscaler stats            http://127.0.0.1:{}/metrics",
        addrs.stats.port()
    );
    if let Some(m) = addrs.metrics {
        let _ = writeln!(
            out,
            "  request metrics             http://127.0.0.1:{}/metrics",
            m.port()
        );
    }
    let _ = writeln!(out, "\nTry:");
    let _ = writeln!(out, "  curl {main}/");
    let _ = writeln!(out, "  curl --http2-prior-knowledge {main}/");
    let _ = writeln!(
        out,
        "  curl -H 'X-Forwarded-For: 203.0.113.7' -H 'K-Original-Host: hello.default.example.com' {main}/headers"
    );
    let _ = writeln!(out, "  curl -d 'ping' {main}/echo");
    let _ = writeln!(out, "  curl -N {main}/sse");
    let _ = writeln!(
        out,
        "\nqproxy's logs follow, in Knative's JSON format. Ctrl-C stops."
    );
    out
}

async fn serve_app(listener: TcpListener) {
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let conn = builder
            .serve_connection(TokioIo::new(stream), hyper::service::service_fn(app))
            .into_owned();
        tokio::spawn(conn);
    }
}

/// The hello app, answering `HEAD` as it answers `GET` but with no body:
/// hyper's HTTP/2 server would send the body, which an HTTP/2 client (and
/// qproxy, proxying an h2c request) takes for a protocol error.
async fn app(req: Request<Incoming>) -> Result<Response<AppBody>, Infallible> {
    let head = req.method() == http::Method::HEAD;
    let res = answer(req).await?;
    if !head {
        return Ok(res);
    }
    let (mut parts, body) = res.into_parts();
    if let Some(len) = body.size_hint().exact() {
        parts
            .headers
            .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
    }
    let empty = Full::new(Bytes::new()).map_err(|e| match e {}).boxed();
    Ok(Response::from_parts(parts, empty))
}

async fn answer(req: Request<Incoming>) -> Result<Response<AppBody>, Infallible> {
    let full = |s: String| Full::new(Bytes::from(s)).map_err(|e| match e {}).boxed();
    Ok(match req.uri().path() {
        "/headers" => {
            let mut text = format!("{} {} {:?}\n", req.method(), req.uri(), req.version());
            for (name, value) in req.headers() {
                let _ = writeln!(
                    text,
                    "{name}: {}",
                    String::from_utf8_lossy(value.as_bytes())
                );
            }
            Response::new(full(text))
        }
        "/echo" => Response::new(req.into_body().boxed()),
        "/sse" => {
            let mut res = Response::new(ticks(5, Duration::from_millis(500)).boxed());
            res.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/event-stream"),
            );
            res
        }
        _ => Response::new(full("Hello World!\n".to_owned())),
    })
}

/// `n` server-sent events, `every` apart, written as the clock ticks.
fn ticks(n: u32, every: Duration) -> ChannelBody {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        for i in 1..=n {
            if tx
                .send(Bytes::from(format!("data: tick {i}\n\n")))
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(every).await;
        }
    });
    ChannelBody(rx)
}

/// A body whose chunks arrive over a channel, each sent as soon as it comes.
struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}
