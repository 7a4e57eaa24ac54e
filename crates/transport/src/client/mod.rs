//! The client role: qproxy's HTTP/1.1 client to the user container, for
//! every HTTP/1 request: without a body, with one read whole already, with
//! one streamed from the client, and upgrades and `CONNECT`.
//!
//! hyper's client connection runs as a task of its own and takes each
//! request through a channel; its buffers stay with the connection while it
//! is idle. Here the request's own task writes the request ([`Outgoing`],
//! [`exchange`]): a head and a whole body in one write, a streamed body as
//! it comes ([`upload`](Upload)); it reads the response head into a
//! buffer the size of what came, and the response body ([`ResponseBody`])
//! reads the rest from the socket itself. An idle connection
//! ([`Conn`]) keeps that buffer only when the response came in one
//! read (at most 4 KiB), and reads the next into it once nothing else holds
//! it. The request's header map becomes the response's, so a request costs no
//! header map. The rules are hyper's (and so what the app saw before): the
//! head's header names in title case, `100`-`199` answers but `101` skipped,
//! the body framed by the response's status, the request's method,
//! `Transfer-Encoding` and `Content-Length` (RFC 9112 §6.3), a connection
//! reused only when the response said nothing against it and was read whole
//! with nothing after it. A response head that is not HTTP fails with hyper's
//! words for it, which the proxy wraps in Go's transport's text.
//!
//! Beyond hyper and Go: a connection is not reused past the idle time the
//! app announced in `Keep-Alive: timeout=N` (less a margin,
//! [`keep_for`]), nor at all after `max=0`, so that it is not written to
//! just as the app closes it.
//!
//! A `101` (or a `2xx` to `CONNECT`) leaves the connection to the caller
//! ([`Conn::into_io`]), for the tunnel.

mod body;
mod conn;
mod upload;

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::task::{Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRAILER, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

pub use body::{AppAnswer, ResponseBody, ResponseBodyError, read_answer};
pub use conn::{Conn, Link};
pub use upload::{Upload, UploadError, Uploading};

use crate::BoxError;
use crate::pool::IDLE_TIMEOUT;

use crate::limits::{MAX_HEADER_FIELDS, MAX_RESPONSE_HEADER_BYTES, STACK_HEADERS};
use crate::wire::framing::Framing;
use crate::wire::length::{InvalidLength, add_length, content_length, digits};
use crate::wire::read::poll_read_into;
use crate::wire::title_case::header_line;
use crate::wire::token::{connection_has, ends_chunked};

/// Why no response head came back for a request.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The connection failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The app closed the connection before a whole response head.
    #[error("EOF")]
    Closed,
    /// The response head is not HTTP: hyper's words for what is wrong.
    #[error("malformed HTTP response: {0}")]
    Malformed(&'static str),
    /// The client's request body failed before the response head came.
    #[error(transparent)]
    Upload(UploadError),
}

/// What a request sends after its head.
#[derive(Debug)]
pub enum Payload<B> {
    /// Nothing.
    None,
    /// A body read whole already, its length the `Content-Length` the
    /// request came with.
    Whole(Bytes),
    /// A body streamed from the client.
    Stream(B),
}

/// A request for the app, written out ([`Outgoing::new`]) and sent with
/// [`exchange`]: on a connection that turns out to be closed before any of
/// it was written ([`Outgoing::is_unsent`]), it can be sent again as it is,
/// on another.
#[derive(Debug)]
pub struct Outgoing<B> {
    /// The head, as hyper writes it (empty when an upload holds it).
    head: Vec<u8>,
    /// A body read whole (empty for none), let go of once written.
    whole: Bytes,
    /// A body streamed from the client (boxed: the common request has
    /// none, and its future stays small).
    stream: Option<Box<Upload<B>>>,
    /// What frames the response.
    method: Method,
    /// Some of it has gone out on a connection.
    written: bool,
    /// Some of an answer came back.
    heard: bool,
    /// It has a body, whole or streamed.
    has_body: bool,
}

impl<B> Outgoing<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    /// The request `parts` (HTTP/1.1, its target in origin form, or in
    /// authority form for `CONNECT`, `Host` set) with `payload`, its head
    /// written as hyper writes it: header names in title case, as Go's
    /// transport writes them, in the map's order. A streamed body keeps
    /// the request's `Content-Length`, or goes in chunks
    /// (`Transfer-Encoding: chunked` last in the head), as Go's transport
    /// sends a body whose length it does not know.
    ///
    /// The method is taken from `parts` (left `GET`); the rest is left as
    /// it is, for the caller to reuse.
    pub fn new(parts: &mut http::request::Parts, payload: Payload<B>) -> Self {
        let mut head = Vec::with_capacity(256);
        encode(parts, &mut head);
        let method = std::mem::take(&mut parts.method);
        let whole = match payload {
            Payload::None => Bytes::new(),
            Payload::Whole(body) => body,
            Payload::Stream(body) => {
                let (framing, trailers) = match content_length(&parts.headers) {
                    Ok(Some(n)) => (Framing::Length(n), None),
                    _ => {
                        head.truncate(head.len() - 2);
                        head.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                        (Framing::Chunked(()), announced_trailers(&parts.headers))
                    }
                };
                let upload = Upload::new(Bytes::from(head), body, framing, trailers);
                return Outgoing {
                    head: Vec::new(),
                    whole: Bytes::new(),
                    stream: Some(Box::new(upload)),
                    method,
                    written: false,
                    heard: false,
                    has_body: true,
                };
            }
        };
        Outgoing {
            head,
            stream: None,
            method,
            written: false,
            heard: false,
            has_body: !whole.is_empty(),
            whole,
        }
    }
}

impl<B> Outgoing<B> {
    /// Nothing of it has been written and its body has not failed: it can
    /// be sent on another connection, whatever its method, its body
    /// untouched. A request whose body failed is never sent again, however
    /// little of it went out: the client did not send it whole.
    pub fn is_unsent(&self) -> bool {
        !self.written && !self.stream.as_ref().is_some_and(|u| u.has_failed())
    }

    /// Whether some of an answer came back on the last connection it was
    /// sent on.
    pub fn was_heard(&self) -> bool {
        self.heard
    }

    /// Makes a request without a body, written already, ready to be sent
    /// again; `false` (and nothing changed) for one with a body, which is
    /// never sent twice, as Go's transport never sends a client's body
    /// twice.
    pub fn rearm(&mut self) -> bool {
        if self.has_body {
            return false;
        }
        self.written = false;
        self.heard = false;
        true
    }
}

/// Writes the head of the request `parts`: header names in title case, in
/// the map's order; no `Transfer-Encoding` (a body that needs one says so
/// after).
fn encode(parts: &http::request::Parts, dst: &mut Vec<u8>) {
    dst.extend_from_slice(parts.method.as_str().as_bytes());
    dst.push(b' ');
    if parts.method == Method::CONNECT {
        let target = parts.uri.authority().map_or("", |a| a.as_str());
        dst.extend_from_slice(target.as_bytes());
    } else {
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        dst.extend_from_slice(target.as_bytes());
    }
    dst.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &parts.headers {
        // A request without a body has no transfer coding (hyper drops it),
        // one whose body is whole here came without one, and a streamed
        // one gets its own.
        if name == TRANSFER_ENCODING {
            continue;
        }
        header_line(dst, name, value);
    }
    dst.extend_from_slice(b"\r\n");
}

/// The trailer fields a request announced in `Trailer`, which hyper's
/// client sends (and no others).
fn announced_trailers(headers: &HeaderMap) -> Option<Vec<HeaderName>> {
    let mut names = Vec::new();
    for value in headers.get_all(TRAILER) {
        let Ok(text) = value.to_str() else { continue };
        names.extend(
            text.split(',')
                .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok()),
        );
    }
    (!names.is_empty()).then_some(names)
}

/// A response head read from the app, and how its body is framed.
#[derive(Debug)]
pub struct ResponseHead {
    /// The status the app answered with (never `1xx` but `101`: the others
    /// are skipped).
    pub status: StatusCode,
    /// The version on its status line.
    pub version: Version,
    /// Its header fields.
    pub headers: HeaderMap,
    /// How its body is framed.
    framing: Framing,
    keep_alive: bool,
    /// How long the connection may wait idle, in milliseconds, from the
    /// app's `Keep-Alive` (0: it said nothing).
    keep_ms: u32,
    /// The head came in one read, and so did what of the body came with
    /// it.
    one_read: bool,
}

/// Sends `out` on `conn` (a head and a whole body in one write when the
/// socket takes them; a streamed body as it comes, the head with its first
/// frame) and reads the response's head, its header map `headers` (empty;
/// taken for the head, left otherwise); what came after the head stays in
/// the connection's buffer, for the body.
///
/// A streamed body is written on while the head is awaited; what is left
/// when the head comes stays with the connection, and the response body
/// ([`ResponseBody`]) writes it on. If the app stops taking it
/// (closes, or resets), its response is still read; the connection is
/// then not reused.
///
/// Each read lands on the stack and is copied into the buffer, which so
/// grows only by what came.
pub async fn exchange<B>(
    conn: &mut Conn,
    out: &mut Outgoing<B>,
    headers: &mut HeaderMap,
) -> Result<ResponseHead, ExchangeError>
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + std::fmt::Debug + 'static,
    B::Error: Into<BoxError>,
{
    if out.stream.is_none() {
        write_all_both(&mut conn.tcp, &out.head, &out.whole, &mut out.written).await?;
        // Written: its memory (the client's read buffer) goes now, not
        // when the app answers.
        out.whole = Bytes::new();
    }
    let mut reads = 0;
    // Once a parse has come up short: how much of the buffer is known to
    // hold no end of a head. A head read whole is parsed at once, as before.
    let mut scanned: Option<usize> = None;
    let mut uploading = out.stream.is_some();
    let mut upload_broke = false;
    let link = &mut *conn.0;
    let mut head = poll_fn(|cx| {
        loop {
            if uploading && let Some(upload) = out.stream.as_mut() {
                match poll_upload(upload, &mut link.tcp, &mut out.written, cx) {
                    Uploaded::Done => uploading = false,
                    Uploaded::Broke => {
                        uploading = false;
                        upload_broke = true;
                    }
                    Uploaded::Failed(e) => return Poll::Ready(Err(e)),
                    Uploaded::Pending => {}
                }
            }
            if !link.buf.is_empty()
                && scanned
                    .as_mut()
                    .is_none_or(|from| head_may_end(&link.buf, from))
            {
                match parse(&mut link.buf, &out.method, headers)? {
                    ResponseParse::Final(mut head) => {
                        head.one_read = reads == 1;
                        return Poll::Ready(Ok(head));
                    }
                    // Informational answers are skipped, as hyper skips them.
                    ResponseParse::Informational => {
                        scanned = None;
                        continue;
                    }
                    ResponseParse::Partial => {
                        let mut from = 0;
                        head_may_end(&link.buf, &mut from);
                        scanned = Some(from);
                    }
                }
            }
            if link.buf.len() >= MAX_RESPONSE_HEADER_BYTES {
                return Poll::Ready(Err(ExchangeError::Malformed("message head is too large")));
            }
            if ready!(poll_read_into(&mut link.tcp, &mut link.buf, cx))? == 0 {
                return Poll::Ready(Err(ExchangeError::Closed));
            }
            out.heard = true;
            reads += 1;
        }
    })
    .await?;
    if uploading && let Some(upload) = out.stream.take() {
        link.upload = Some(upload);
    }
    if upload_broke {
        head.keep_alive = false;
    }
    link.keep_ms = head.keep_ms;
    Ok(head)
}

/// What [`poll_upload`] did.
enum Uploaded {
    /// The body is written whole.
    Done,
    /// The app stopped reading it, after some of it was written: its
    /// answer may still come.
    Broke,
    /// It failed: the exchange fails.
    Failed(ExchangeError),
    /// More is to come.
    Pending,
}

/// Writes what there is of a streamed body, while the answer is awaited:
/// out of line, as most requests stream nothing.
#[cold]
#[inline(never)]
fn poll_upload<B>(
    upload: &mut Upload<B>,
    tcp: &mut TcpStream,
    written: &mut bool,
    cx: &mut std::task::Context<'_>,
) -> Uploaded
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    match upload.poll_write(tcp, written, cx) {
        Poll::Ready(Ok(())) => Uploaded::Done,
        Poll::Ready(Err(UploadError::Io(e))) if !*written => Uploaded::Failed(ExchangeError::Io(e)),
        Poll::Ready(Err(UploadError::Io(_))) => Uploaded::Broke,
        Poll::Ready(Err(e)) => Uploaded::Failed(ExchangeError::Upload(e)),
        Poll::Pending => Uploaded::Pending,
    }
}

/// Writes `first`, then `second`, with vectored writes: no copy of either.
/// `written` is set once any byte has gone out.
async fn write_all_both(
    tcp: &mut TcpStream,
    mut first: &[u8],
    mut second: &[u8],
    written: &mut bool,
) -> io::Result<()> {
    while !first.is_empty() || !second.is_empty() {
        let bufs = [IoSlice::new(first), IoSlice::new(second)];
        let n = tcp.write_vectored(&bufs).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        *written = true;
        let from_first = n.min(first.len());
        first = &first[from_first..];
        second = &second[n - from_first..];
    }
    Ok(())
}

/// What [`parse`] found in the bytes read so far.
enum ResponseParse {
    /// The final response's head, taken from the buffer.
    Final(ResponseHead),
    /// A `1xx` head, taken from the buffer and dropped.
    Informational,
    /// Not a whole head yet.
    Partial,
}

/// hyper's words for what `httparse` refused.
fn parse_error(e: httparse::Error) -> ExchangeError {
    ExchangeError::Malformed(match e {
        httparse::Error::Status => "invalid HTTP status-code parsed",
        httparse::Error::TooManyHeaders => "message head is too large",
        httparse::Error::Version => "invalid HTTP version parsed",
        httparse::Error::HeaderName
        | httparse::Error::HeaderValue
        | httparse::Error::NewLine
        | httparse::Error::Token => "invalid HTTP header parsed",
    })
}

/// Whether `buf` may hold a whole head: a blank line (`\n\n` or
/// `\n\r\n`) at or after `*scanned`, which moves on past what holds none.
/// A head that comes in many reads is searched once, then parsed once,
/// instead of being parsed again from its start at every read (a head of a
/// megabyte would be parsed hundreds of times).
fn head_may_end(buf: &[u8], scanned: &mut usize) -> bool {
    let mut from = (*scanned).min(buf.len());
    while let Some(at) = buf[from..].iter().position(|&b| b == b'\n') {
        let line_end = from + at;
        match &buf[line_end + 1..] {
            [b'\n', ..] | [b'\r', b'\n', ..] => return true,
            // Too short to tell yet: looked at again after the next read.
            [] | [b'\r'] => {
                *scanned = line_end;
                return false;
            }
            _ => from = line_end + 1,
        }
    }
    *scanned = buf.len();
    false
}

/// Byte ranges of a header line's name and value within the head.
type Line = (usize, usize, usize, usize);

/// Parses a response head at the start of `buf`, taking it from `buf`
/// when whole; a final head's header map is `spare` (empty), taken.
fn parse(
    buf: &mut BytesMut,
    method: &Method,
    spare: &mut HeaderMap,
) -> Result<ResponseParse, ExchangeError> {
    let mut stack = [(0, 0, 0, 0); STACK_HEADERS];
    let mut heap = Vec::new();
    let (len, code, version, count) = match lines(buf, &mut stack) {
        Err(httparse::Error::TooManyHeaders) => {
            heap.resize(MAX_HEADER_FIELDS, (0, 0, 0, 0));
            lines(buf, &mut heap)
        }
        other => other,
    }
    .map_err(parse_error)?
    .map_or((0, 0, 0, 0), |h| h);
    if len == 0 {
        return Ok(ResponseParse::Partial);
    }
    let lines = if heap.is_empty() {
        &stack[..]
    } else {
        &heap[..]
    };
    let status = StatusCode::from_u16(code).map_err(|_| parse_error(httparse::Error::Status))?;
    let head = buf.split_to(len).freeze();
    if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
        return Ok(ResponseParse::Informational);
    }
    let version = if version == 1 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    let mut keep_alive = version == Version::HTTP_11;
    let mut headers = std::mem::take(spare);
    headers.reserve(count);
    let mut close = false;
    let mut announced = Announced::default();
    // What frames the body, noted on the way rather than looked up after.
    let mut coded: Option<bool> = None;
    let mut length = Ok(None);
    for &(n0, n1, v0, v1) in &lines[..count] {
        let invalid = || parse_error(httparse::Error::HeaderValue);
        let name = HeaderName::from_bytes(&head[n0..n1]).map_err(|_| invalid())?;
        let value = HeaderValue::from_maybe_shared(head.slice(v0..v1)).map_err(|_| invalid())?;
        match name {
            CONNECTION => {
                if close || connection_has(&value, "close") {
                    close = true;
                    keep_alive = false;
                } else if !keep_alive {
                    keep_alive = connection_has(&value, "keep-alive");
                }
            }
            TRANSFER_ENCODING => coded = Some(ends_chunked(&value)),
            CONTENT_LENGTH => {
                if let Ok(known) = &mut length {
                    length = add_length(known, &value).map(|()| *known);
                }
            }
            _ if name == KEEP_ALIVE => announced.note(&value),
            _ => {}
        }
        headers.append(name, value);
    }
    let framing = framing(status, method, version, coded, length)?;
    Ok(ResponseParse::Final(ResponseHead {
        status,
        version,
        headers,
        framing,
        // An upgraded connection is the upgrade's; this one is not reused.
        keep_alive: keep_alive && !announced.never && status != StatusCode::SWITCHING_PROTOCOLS,
        keep_ms: announced.keep_ms,
        one_read: false,
    }))
}

/// `Keep-Alive`, which `http` has no constant for: a custom name, so that
/// a standard one compares unequal at its first byte.
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// What the app announced in a response's `Keep-Alive` fields.
#[derive(Debug, Default)]
struct Announced {
    /// The shortest idle time announced, in milliseconds (0: none was).
    keep_ms: u32,
    /// The connection is not to be reused.
    never: bool,
}

impl Announced {
    /// Notes what the `Keep-Alive` field `value` says.
    fn note(&mut self, value: &HeaderValue) {
        match keep_alive_limit(value) {
            Some(KeepAlive::For(d)) => {
                let ms = u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1);
                self.keep_ms = if self.keep_ms == 0 {
                    ms
                } else {
                    self.keep_ms.min(ms)
                };
            }
            Some(KeepAlive::Never) => self.never = true,
            None => {}
        }
    }
}

/// What a `Keep-Alive` field says of the connection's reuse.
#[derive(Debug, PartialEq, Eq)]
enum KeepAlive {
    /// It may wait idle this long.
    For(Duration),
    /// It is not to be reused (`timeout=0` or `max=0`).
    Never,
}

/// Reads a `Keep-Alive` field (`timeout=5, max=100`, RFC 2068 §19.7.1.1):
/// its `timeout` in seconds, made [`keep_for`]; `max=0` (no more requests)
/// or `timeout=0` forbid reuse. Parameters it does not know, and values
/// that are not whole seconds, say nothing.
fn keep_alive_limit(value: &HeaderValue) -> Option<KeepAlive> {
    let mut said = None;
    for param in value.as_bytes().split(|&b| b == b',') {
        let param = param.trim_ascii();
        let Some(eq) = param.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (name, value) = (param[..eq].trim_ascii(), param[eq + 1..].trim_ascii());
        let value = value
            .strip_prefix(b"\"")
            .and_then(|v| v.strip_suffix(b"\""))
            .unwrap_or(value);
        let Some(n) = digits(value) else { continue };
        if name.eq_ignore_ascii_case(b"timeout") {
            if n == 0 {
                return Some(KeepAlive::Never);
            }
            said = Some(KeepAlive::For(keep_for(Duration::from_secs(
                n.min(u64::from(u32::MAX)),
            ))));
        } else if name.eq_ignore_ascii_case(b"max") && n == 0 {
            return Some(KeepAlive::Never);
        }
    }
    said
}

/// How long a connection whose app announced `timeout` may wait idle: a
/// quarter less, and at most a second less, so that a request never
/// crosses the app's close (its clock starts when it wrote the response,
/// a moment before qproxy read it); never longer than qproxy keeps any
/// ([`IDLE_TIMEOUT`]).
pub fn keep_for(timeout: Duration) -> Duration {
    let margin = (timeout / 4).min(Duration::from_secs(1));
    (timeout - margin).min(IDLE_TIMEOUT)
}

/// Runs `httparse` over `buf`, noting each header line's ranges in
/// `lines`: the head's length, status code, minor version and number of
/// header lines, or `None` while the head is partial.
fn lines(
    buf: &[u8],
    lines: &mut [Line],
) -> Result<Option<(usize, u16, u8, usize)>, httparse::Error> {
    if lines.len() <= STACK_HEADERS {
        let mut headers = [httparse::EMPTY_HEADER; STACK_HEADERS];
        run(buf, &mut headers[..lines.len()], lines)
    } else {
        run(buf, &mut vec![httparse::EMPTY_HEADER; lines.len()], lines)
    }
}

fn run<'b>(
    buf: &'b [u8],
    headers: &mut [httparse::Header<'b>],
    lines: &mut [Line],
) -> Result<Option<(usize, u16, u8, usize)>, httparse::Error> {
    let mut res = httparse::Response::new(headers);
    let len = match res.parse(buf)? {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => return Ok(None),
    };
    let base = buf.as_ptr() as usize;
    for (line, h) in lines.iter_mut().zip(res.headers.iter()) {
        let n0 = h.name.as_ptr() as usize - base;
        let v0 = h.value.as_ptr() as usize - base;
        *line = (n0, n0 + h.name.len(), v0, v0 + h.value.len());
    }
    Ok(Some((
        len,
        res.code.unwrap_or(0),
        res.version.unwrap_or(0),
        res.headers.len(),
    )))
}

/// How the body of a response is framed (RFC 9112 §6.3, as hyper reads
/// it), from its last `Transfer-Encoding` value (whether that ends in
/// `chunked`), if it has one, and its [`Content-Length`](crate::wire::length::content_length).
fn framing(
    status: StatusCode,
    method: &Method,
    version: Version,
    coded: Option<bool>,
    length: Result<Option<u64>, InvalidLength>,
) -> Result<Framing, ExchangeError> {
    if matches!(status.as_u16(), 101 | 204 | 304) || method == Method::HEAD {
        return Ok(Framing::Length(0));
    }
    if let Some(chunked) = coded {
        if version == Version::HTTP_10 {
            return Err(ExchangeError::Malformed(
                "unexpected transfer-encoding parsed",
            ));
        }
        return Ok(if chunked {
            Framing::Chunked(())
        } else {
            Framing::Close
        });
    }
    match length {
        Ok(Some(n)) => Ok(Framing::Length(n)),
        Ok(None) => Ok(Framing::Close),
        Err(InvalidLength) => Err(ExchangeError::Malformed("invalid content-length parsed")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, path: &str, headers: &[(&str, &str)]) -> http::Request<()> {
        let mut req = http::Request::new(());
        *req.method_mut() = method;
        *req.uri_mut() = path.parse().unwrap();
        for (k, v) in headers {
            req.headers_mut().append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        req
    }

    #[test]
    fn the_end_of_a_head_is_found_in_every_split_of_its_reads() {
        let heads: [&[u8]; 4] = [
            b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody",
            b"HTTP/1.1 200 OK\nA: b\n\nbody",
            b"HTTP/1.1 200 OK\r\nA: b\n\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\n",
        ];
        for whole in heads {
            // Where the head ends: the first byte after its blank line.
            let end = (1..=whole.len())
                .find(|&n| {
                    matches!(
                        httparse::Response::new(&mut [httparse::EMPTY_HEADER; 4])
                            .parse(&whole[..n]),
                        Ok(httparse::Status::Complete(_))
                    )
                })
                .unwrap();
            for first in 0..=whole.len() {
                for second in first..=whole.len() {
                    let mut scanned = 0;
                    let mut found = None;
                    for upto in [first, second, whole.len()] {
                        if found.is_none() && head_may_end(&whole[..upto], &mut scanned) {
                            found = Some(upto);
                        }
                    }
                    let found = found.unwrap();
                    assert!(
                        found >= end,
                        "{whole:?} split {first}/{second}: found at {found}, ends at {end}"
                    );
                    assert_eq!(
                        found,
                        [first, second, whole.len()]
                            .into_iter()
                            .find(|&u| u >= end)
                            .unwrap()
                    );
                }
            }
        }
        let mut scanned = 0;
        assert!(!head_may_end(b"HTTP/1.1 200 OK\r\nA: b\r\n", &mut scanned));
        assert!(scanned > 0);
        assert!(!head_may_end(b"", &mut scanned));
    }

    #[test]
    fn a_head_is_written_as_hyper_writes_it() {
        let req = request(
            Method::GET,
            "/a?b=c",
            &[
                ("host", "example.com"),
                ("x-forwarded-for", "1.2.3.4"),
                ("accept", "*/*"),
                ("x-forwarded-for", "5.6.7.8"),
                ("transfer-encoding", "chunked"),
            ],
        );
        let mut head = Vec::new();
        encode(&req.into_parts().0, &mut head);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /a?b=c HTTP/1.1\r\nHost: example.com\r\nX-Forwarded-For: 1.2.3.4\r\n\
             X-Forwarded-For: 5.6.7.8\r\nAccept: */*\r\n\r\n"
        );
    }

    /// The head of `req` with `payload`, as it goes out (held with the
    /// upload's first frame, for a streamed body).
    fn head_of(req: http::Request<()>, payload: Payload<http_body_util::Empty<Bytes>>) -> String {
        let out = Outgoing::new(&mut req.into_parts().0, payload);
        let head = match &out.stream {
            Some(upload) => upload.head().clone(),
            None => Bytes::from(out.head.clone()),
        };
        String::from_utf8(head.to_vec()).unwrap()
    }

    #[test]
    fn a_streamed_body_keeps_its_length_or_goes_in_chunks() {
        let stream = || Payload::Stream(http_body_util::Empty::new());
        let post = |headers: &[(&str, &str)]| request(Method::POST, "/", headers);
        assert_eq!(
            head_of(post(&[("host", "a"), ("content-length", "5")]), stream()),
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n"
        );
        assert_eq!(
            head_of(
                post(&[("host", "a"), ("transfer-encoding", "chunked")]),
                stream()
            ),
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        let connect = request(
            Method::CONNECT,
            "example.com:443",
            &[("host", "example.com:443")],
        );
        assert_eq!(
            head_of(connect, Payload::None),
            "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"
        );
    }

    #[test]
    fn keep_alive_timeouts_are_kept_less_a_margin() {
        let limit = |v: &'static str| keep_alive_limit(&HeaderValue::from_static(v));
        let secs = |s: f64| Some(KeepAlive::For(Duration::from_secs_f64(s)));
        assert_eq!(limit("timeout=5, max=1000"), secs(4.0));
        assert_eq!(limit("timeout=1"), secs(0.75));
        assert_eq!(limit(" Timeout = 2 "), secs(1.5));
        assert_eq!(limit("timeout=\"60\""), secs(59.0));
        assert_eq!(
            limit("timeout=3600"),
            secs(90.0),
            "never past the pool's own"
        );
        assert_eq!(limit("timeout=0"), Some(KeepAlive::Never));
        assert_eq!(limit("timeout=5, max=0"), Some(KeepAlive::Never));
        assert_eq!(limit("max=5"), None);
        assert_eq!(limit("timeout=1.5"), None);
        assert_eq!(limit("timeout"), None);
        let (head, _) = parsed(
            b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nKeep-Alive: timeout=2\r\n\r\n",
            &Method::HEAD,
        )
        .unwrap();
        assert_eq!(head.keep_ms, 1500, "the shortest");
        assert!(head.keep_alive);
        let (head, _) = parsed(
            b"HTTP/1.1 200 OK\r\nkeep-alive: max=0\r\n\r\n",
            &Method::HEAD,
        )
        .unwrap();
        assert!(!head.keep_alive);
    }

    fn parsed(bytes: &[u8], method: &Method) -> Result<(ResponseHead, BytesMut), String> {
        let mut buf = BytesMut::from(bytes);
        loop {
            match parse(&mut buf, method, &mut HeaderMap::new()).map_err(|e| e.to_string())? {
                ResponseParse::Final(head) => return Ok((head, buf)),
                ResponseParse::Informational => {}
                ResponseParse::Partial => return Err("partial".into()),
            }
        }
    }

    #[test]
    fn framing_follows_status_method_and_headers() {
        let get = Method::GET;
        let frame = |b: &[u8], m: &Method| parsed(b, m).map(|(h, _)| (h.framing, h.keep_alive));
        assert_eq!(
            frame(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", &get),
            Ok((Framing::Length(5), true))
        );
        assert_eq!(
            frame(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                &Method::HEAD
            ),
            Ok((Framing::Length(0), true))
        );
        assert_eq!(
            frame(b"HTTP/1.1 204 No Content\r\n\r\n", &get),
            Ok((Framing::Length(0), true))
        );
        assert_eq!(
            frame(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                &get
            ),
            Ok((Framing::Chunked(()), true))
        );
        assert_eq!(
            frame(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", &get),
            Ok((Framing::Close, true))
        );
        assert_eq!(
            frame(b"HTTP/1.1 200 OK\r\n\r\n", &get),
            Ok((Framing::Close, true))
        );
        assert_eq!(
            frame(
                b"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\nContent-Length: 3\r\n\r\n",
                &get
            ),
            Ok((Framing::Length(3), true))
        );
        assert_eq!(
            frame(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", &get),
            Ok((Framing::Length(1), false))
        );
        assert_eq!(
            frame(
                b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\n",
                &get
            ),
            Ok((Framing::Length(1), true))
        );
        assert_eq!(
            frame(
                b"HTTP/1.1 200 OK\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n",
                &get
            ),
            Ok((Framing::Close, false))
        );
    }

    #[test]
    fn informational_answers_are_skipped() {
        let (head, rest) = parsed(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n\
              HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
            &Method::GET,
        )
        .unwrap();
        assert_eq!(head.status, StatusCode::OK);
        assert!(!head.headers.contains_key("link"));
        assert_eq!(&rest[..], b"hi");
    }

    #[test]
    fn bad_heads_fail_with_hyper_s_words() {
        let get = Method::GET;
        let fail = |b: &[u8]| parsed(b, &get).unwrap_err();
        let prefix = "malformed HTTP response: ";
        for (bytes, what) in [
            (
                &b"HTTP/1.1 20 OK\r\n\r\n"[..],
                "invalid HTTP status-code parsed",
            ),
            (b"HTTP/1.1 099 X\r\n\r\n", "invalid HTTP status-code parsed"),
            (b"HTTP/2.0 200 OK\r\n\r\n", "invalid HTTP version parsed"),
            (
                b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
                "invalid HTTP header parsed",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                "invalid content-length parsed",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\n",
                "invalid content-length parsed",
            ),
            (
                b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                "unexpected transfer-encoding parsed",
            ),
        ] {
            assert_eq!(fail(bytes), format!("{prefix}{what}"), "{bytes:?}");
        }
        let many: String = (0..=MAX_HEADER_FIELDS)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        let head = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
        assert_eq!(
            fail(head.as_bytes()),
            format!("{prefix}message head is too large")
        );
        let some: String = (0..MAX_HEADER_FIELDS - 1)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        let head = format!("HTTP/1.1 200 OK\r\n{some}\r\n");
        assert_eq!(
            parsed(head.as_bytes(), &get).unwrap().0.headers.len(),
            MAX_HEADER_FIELDS - 1
        );
    }
}
