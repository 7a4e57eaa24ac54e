//! What the fuzz targets share: turning fuzz input into environments and
//! header maps, and the stub app the `connection` target proxies to.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::OnceLock;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use qproxy::config::{Generation, Vars, knative_defaults};
use tokio::net::TcpListener;

/// The generation a fuzz input's first byte picks (its lowest bit).
pub fn generation(selector: u8) -> Generation {
    if selector & 1 == 0 {
        Generation::Classic
    } else {
        Generation::Current
    }
}

/// Knative's default environment for `generation` with the app on 8080.
pub fn defaults(generation: Generation) -> Vars {
    static DEFAULTS: OnceLock<[Vars; 2]> = OnceLock::new();
    let [classic, current] = DEFAULTS.get_or_init(|| {
        [
            knative_defaults(Generation::Classic, 8080),
            knative_defaults(Generation::Current, 8080),
        ]
    });
    match generation {
        Generation::Classic => classic.clone(),
        Generation::Current => current.clone(),
    }
}

/// Applies `text`'s lines to `vars`: `NAME=VALUE` sets a variable, a line
/// without `=` removes the variable it names.
pub fn apply_lines(vars: &mut Vars, text: &str) {
    for line in text.split('\n') {
        match line.split_once('=') {
            Some((name, value)) => vars.set(name, value),
            None => vars.remove(line),
        }
    }
}

/// The header fields of `text`'s lines (`name: value`), leaving out the
/// lines that are no valid field.
pub fn header_fields(text: &[u8]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for line in text.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii_start());
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    }
    headers
}

/// Starts the stub app on a loopback port of the current runtime and
/// returns its address. By path:
///
/// - `/status/NNN`: that status, empty body;
/// - `/drop`: the connection closed without an answer;
/// - `/hop`: a response carrying hop-by-hop headers;
/// - anything else: the request body echoed back, streamed.
pub async fn stub_app() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(answer);
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

type StubBody = BoxBody<Bytes, hyper::Error>;

async fn answer(req: Request<Incoming>) -> Result<Response<StubBody>, std::io::Error> {
    let path = req.uri().path().to_owned();
    let empty = || {
        Full::new(Bytes::new())
            .map_err(|e: Infallible| match e {})
            .boxed()
    };
    if let Some(code) = path.strip_prefix("/status/") {
        let status = code
            .parse::<u16>()
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
            .unwrap_or(StatusCode::OK);
        let mut res = Response::new(empty());
        *res.status_mut() = status;
        return Ok(res);
    }
    match path.as_str() {
        "/drop" => Err(std::io::Error::other("dropped on purpose")),
        "/hop" => Ok(Response::builder()
            .header("connection", "x-private, keep-alive")
            .header("x-private", "1")
            .header("keep-alive", "timeout=5")
            .header("proxy-authenticate", "Basic")
            .body(empty())
            .unwrap_or_else(|_| Response::new(empty()))),
        _ => Ok(Response::new(req.into_body().boxed())),
    }
}
