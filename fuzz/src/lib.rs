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

/// The runtime the whole-connection targets run in: one thread, time
/// paused (the clock moves only when every task waits, so that timeouts
/// fire without waiting). libFuzzer's `main` is not Rust's, which ignores
/// SIGPIPE as the qproxy binary does: it is ignored here, so that a write
/// to a socket the peer closed is an error, not the end of the process.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    // SAFETY: setting a signal's disposition to "ignore" before any other
    // thread of ours runs (the targets call this first, once).
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

/// The main ports the whole-connection targets drive, in front of the app
/// on `app`: classic Knative's with no limit, current Knative's with
/// `containerConcurrency` 1 (a fuzz input's selector bit picks one).
pub fn main_ports(app: SocketAddr) -> [qproxy::fuzz::MainPort; 2] {
    let port = |selector: u8, concurrency: &str| {
        let mut vars = knative_defaults(generation(selector), app.port());
        vars.set("CONTAINER_CONCURRENCY", concurrency);
        let config = qproxy::Config::from_vars(&vars).expect("Knative's defaults parse");
        qproxy::fuzz::MainPort::new(&config).expect("the main port builds")
    };
    [port(0, "0"), port(1, "1")]
}

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

/// What the recording app read of one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// The request target.
    pub target: String,
    /// The body, decoded from its framing.
    pub body: Vec<u8>,
    /// The trailer fields, `name: value` in lower case names.
    pub trailers: Vec<String>,
    /// Its framing ended it.
    pub complete: bool,
    /// What was not strict HTTP/1.1, if anything.
    pub violation: Option<&'static str>,
}

/// The requests the recording app has read, in order.
pub type SeenLog = std::sync::Arc<std::sync::Mutex<Vec<Seen>>>;

/// Starts an app on a loopback port of the current runtime that reads
/// requests as a strict HTTP/1.1 parser does (CRLF line ends, no folding,
/// one `Content-Length` or a `Transfer-Encoding` that is exactly
/// `chunked`, never both), records each one (complete only once its
/// framing ended it), answers each complete one `200 ok`, and keeps the
/// connection. Returns its address and what it read.
pub async fn recording_app() -> std::io::Result<(SocketAddr, SeenLog)> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let log = SeenLog::default();
    let seen = log.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(record_connection(stream, seen.clone()));
        }
    });
    Ok((addr, log))
}

async fn record_connection(stream: tokio::net::TcpStream, log: SeenLog) {
    use tokio::io::{AsyncWriteExt, BufReader};
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    loop {
        // Recorded once read, whole or not: a request still coming is not
        // complete.
        let mut this = Seen::default();
        let read_one = strict::read_request(&mut read, &mut this).await;
        let complete = this.complete;
        let started = !this.target.is_empty() || this.violation.is_some();
        if started && let Ok(mut seen) = log.lock() {
            seen.push(this);
        }
        if read_one.is_err() || !complete {
            return;
        }
        if write
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await
            .is_err()
        {
            return;
        }
    }
}

/// A strict HTTP/1.1 request reader, for the recording app.
pub mod strict {
    use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

    use super::Seen;

    /// Why a request was not read whole.
    #[derive(Debug)]
    pub enum Stop {
        /// The connection ended, or failed.
        Ended,
        /// The bytes are not strict HTTP/1.1.
        Violation(&'static str),
    }

    async fn line<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Vec<u8>, Stop> {
        let mut line = Vec::new();
        let n = (&mut *r)
            .take(64 * 1024)
            .read_until(b'\n', &mut line)
            .await
            .map_err(|_| Stop::Ended)?;
        if n == 0 || line.last() != Some(&b'\n') {
            return Err(if n >= 64 * 1024 {
                Stop::Violation("a line over 64 KiB")
            } else {
                Stop::Ended
            });
        }
        line.pop();
        if line.pop() != Some(b'\r') {
            return Err(Stop::Violation("a line ending in a bare LF"));
        }
        if line.contains(&b'\r') {
            return Err(Stop::Violation("a bare CR"));
        }
        Ok(line)
    }

    fn trim_ows(s: &[u8]) -> &[u8] {
        let ows = |c: &u8| *c == b' ' || *c == b'\t';
        let start = s.iter().position(|c| !ows(c)).unwrap_or(s.len());
        let end = s.iter().rposition(|c| !ows(c)).map_or(start, |e| e + 1);
        &s[start..end]
    }

    fn token(s: &[u8]) -> bool {
        !s.is_empty()
            && s.iter()
                .all(|&c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c))
    }

    async fn fields<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Vec<(String, Vec<u8>)>, Stop> {
        let mut out = Vec::new();
        loop {
            let l = line(r).await?;
            if l.is_empty() {
                return Ok(out);
            }
            if l[0] == b' ' || l[0] == b'\t' {
                return Err(Stop::Violation("an obs-folded line"));
            }
            let colon = l
                .iter()
                .position(|&c| c == b':')
                .ok_or(Stop::Violation("a field line without a colon"))?;
            if !token(&l[..colon]) {
                return Err(Stop::Violation("a field name that is not a token"));
            }
            // Only SP and HTAB are whitespace around a field value.
            let value = trim_ows(&l[colon + 1..]).to_vec();
            if value.iter().any(|&c| c < b' ' && c != b'\t' || c == 0x7f) {
                return Err(Stop::Violation("a control byte in a field value"));
            }
            out.push((
                String::from_utf8_lossy(&l[..colon]).to_ascii_lowercase(),
                value,
            ));
        }
    }

    /// Reads one request into `seen`.
    pub async fn read_request<R: AsyncBufRead + Unpin>(
        r: &mut R,
        seen: &mut Seen,
    ) -> Result<(), Stop> {
        let result = read(r, seen).await;
        if let Err(Stop::Violation(v)) = &result {
            seen.violation = Some(v);
        }
        result
    }

    async fn read<R: AsyncBufRead + Unpin>(r: &mut R, seen: &mut Seen) -> Result<(), Stop> {
        let l = line(r).await?;
        let parts: Vec<&[u8]> = l.split(|&c| c == b' ').collect();
        if parts.len() != 3 || !token(parts[0]) || parts[1].is_empty() || parts[2] != b"HTTP/1.1" {
            return Err(Stop::Violation(
                "a request line that is not METHOD target HTTP/1.1",
            ));
        }
        seen.target = String::from_utf8_lossy(parts[1]).into_owned();
        let fields = fields(r).await?;
        let lengths: Vec<&[u8]> = fields
            .iter()
            .filter(|(n, _)| n == "content-length")
            .map(|(_, v)| v.as_slice())
            .collect();
        let codings: Vec<&[u8]> = fields
            .iter()
            .filter(|(n, _)| n == "transfer-encoding")
            .map(|(_, v)| v.as_slice())
            .collect();
        match (lengths.as_slice(), codings.as_slice()) {
            ([], []) => {}
            ([], [b"chunked"]) => chunked(r, seen).await?,
            ([n], []) => {
                if n.is_empty() || n.len() > 18 || !n.iter().all(u8::is_ascii_digit) {
                    return Err(Stop::Violation("a Content-Length that is not digits"));
                }
                let n: u64 = String::from_utf8_lossy(n).parse().unwrap_or(0);
                body(r, n, seen).await?;
            }
            (_, []) => return Err(Stop::Violation("Content-Length twice")),
            ([], _) => return Err(Stop::Violation("a Transfer-Encoding other than chunked")),
            _ => return Err(Stop::Violation("Content-Length with Transfer-Encoding")),
        }
        seen.complete = true;
        Ok(())
    }

    /// Reads `n` more bytes of the body into `seen`, as they come.
    async fn body<R: AsyncBufRead + Unpin>(r: &mut R, n: u64, seen: &mut Seen) -> Result<(), Stop> {
        let got = (&mut *r)
            .take(n)
            .read_to_end(&mut seen.body)
            .await
            .map_err(|_| Stop::Ended)?;
        if (got as u64) < n {
            return Err(Stop::Ended);
        }
        Ok(())
    }

    async fn chunked<R: AsyncBufRead + Unpin>(r: &mut R, seen: &mut Seen) -> Result<(), Stop> {
        loop {
            let l = line(r).await?;
            let size = l.split(|&c| c == b';').next().unwrap_or_default();
            if size.is_empty() || size.len() > 15 || !size.iter().all(u8::is_ascii_hexdigit) {
                return Err(Stop::Violation("a chunk size that is not hexadecimal"));
            }
            let n = u64::from_str_radix(&String::from_utf8_lossy(size), 16).unwrap_or(0);
            if n == 0 {
                for (name, value) in fields(r).await? {
                    seen.trailers
                        .push(format!("{name}: {}", String::from_utf8_lossy(&value)));
                }
                return Ok(());
            }
            body(r, n, seen).await?;
            let mut end = [0u8; 2];
            r.read_exact(&mut end).await.map_err(|_| Stop::Ended)?;
            if &end != b"\r\n" {
                return Err(Stop::Violation("chunk data longer than its size"));
            }
        }
    }
}
