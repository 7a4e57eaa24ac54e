//! The client role: qproxy's own HTTP/1.1 client to the user container,
//! for the requests that make most traffic: those that ask for no upgrade
//! and have no body, or one read whole already.
//!
//! hyper's client connection runs as a task of its own and takes each
//! request through a channel; its buffers stay with the connection while it
//! is idle. Here the request's own task writes the request head (and body)
//! in one write ([`encode`], [`exchange`]), reads the response head into a
//! buffer the size of what came, and the response body ([`ResponseBody`])
//! reads the rest from the socket itself. An idle connection
//! ([`ClientConn`]) keeps that buffer only when the response came in one
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
//! Requests whose body streams, upgrades and `CONNECT` go through hyper,
//! whose connections are kept apart from these.

mod body;
mod conn;

use std::future::poll_fn;
use std::io::{self, IoSlice};

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Version};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

pub use body::{AppAnswer, ResponseBody, ResponseBodyError, read_answer};
pub use conn::{ClientConn, ClientLink};

use crate::limits::{MAX_HEADER_FIELDS, MAX_RESPONSE_HEADER_BYTES};
use crate::wire::chunked::ChunkState;
use crate::wire::length::{InvalidLength, add_length};
use crate::wire::read::poll_read_into;
use crate::wire::title_case::header_line;
use crate::wire::token::{connection_has, ends_chunked};

/// Header lines parsed on the stack; a head with more is parsed again
/// with room for [`MAX_HEADER_FIELDS`].
pub(crate) const STACK_HEADERS: usize = 64;

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
}

/// Writes the head of `req` (an HTTP/1.1 request, its target in origin
/// form, `Host` set; its body, if any, whole, its length the
/// `Content-Length` it came with) as hyper writes it: header names in title
/// case, as Go's transport writes them, in the map's order.
pub fn encode<B>(req: &Request<B>, dst: &mut Vec<u8>) {
    dst.extend_from_slice(req.method().as_str().as_bytes());
    dst.push(b' ');
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    dst.extend_from_slice(target.as_bytes());
    dst.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in req.headers() {
        // A request without a body has no transfer coding (hyper drops it),
        // and one whose body is whole here came without one.
        if name == TRANSFER_ENCODING {
            continue;
        }
        header_line(dst, name, value);
    }
    dst.extend_from_slice(b"\r\n");
}

/// A response head read from the app, and how its body is framed.
#[derive(Debug)]
pub struct ResponseHead {
    /// The status the app answered with (never `1xx`: those are skipped).
    pub status: StatusCode,
    /// The version on its status line.
    pub version: Version,
    /// Its header fields.
    pub headers: HeaderMap,
    framing: Decoding,
    keep_alive: bool,
    /// The head came in one read, and so did what of the body came with
    /// it.
    one_read: bool,
}

/// How a response body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decoding {
    /// After this many more bytes.
    Length(u64),
    /// At its last chunk (and trailers).
    Chunked(ChunkState),
    /// When the app closes the connection.
    Eof,
}

/// Sends `head` (from [`encode`]) and `body` (whole, the length its head gives;
/// empty for none; let go of once written) on `conn`, in one write when the
/// socket takes them, and reads the response's head, its header map `headers`
/// (empty; taken for the head, left otherwise); what came after the head stays
/// in the connection's buffer, for the body. `method` frames the body.
///
/// Each read lands on the stack and is copied into the buffer, which so
/// grows only by what came.
pub async fn exchange(
    conn: &mut ClientConn,
    head: &[u8],
    body: Bytes,
    method: &Method,
    headers: &mut HeaderMap,
) -> Result<ResponseHead, ExchangeError> {
    write_all_both(&mut conn.tcp, head, &body).await?;
    // Written: its memory (the client's read buffer) goes now, not when
    // the app answers.
    drop(body);
    let mut reads = 0;
    loop {
        if !conn.buf.is_empty() {
            match parse(&mut conn.buf, method, headers)? {
                ResponseParse::Final(mut head) => {
                    head.one_read = reads == 1;
                    return Ok(head);
                }
                // Informational answers are skipped, as hyper skips them.
                ResponseParse::Informational => continue,
                ResponseParse::Partial => {}
            }
        }
        if conn.buf.len() >= MAX_RESPONSE_HEADER_BYTES {
            return Err(ExchangeError::Malformed("message head is too large"));
        }
        let link = &mut *conn.0;
        if poll_fn(|cx| poll_read_into(&mut link.tcp, &mut link.buf, cx)).await? == 0 {
            return Err(ExchangeError::Closed);
        }
        reads += 1;
    }
}

/// Writes `first`, then `second`, with vectored writes: no copy of either.
async fn write_all_both(
    tcp: &mut TcpStream,
    mut first: &[u8],
    mut second: &[u8],
) -> io::Result<()> {
    while !first.is_empty() || !second.is_empty() {
        let bufs = [IoSlice::new(first), IoSlice::new(second)];
        let n = tcp.write_vectored(&bufs).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
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
        keep_alive: keep_alive && status != StatusCode::SWITCHING_PROTOCOLS,
        one_read: false,
    }))
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
) -> Result<Decoding, ExchangeError> {
    if matches!(status.as_u16(), 101 | 204 | 304) || method == Method::HEAD {
        return Ok(Decoding::Length(0));
    }
    if let Some(chunked) = coded {
        if version == Version::HTTP_10 {
            return Err(ExchangeError::Malformed(
                "unexpected transfer-encoding parsed",
            ));
        }
        return Ok(if chunked {
            Decoding::Chunked(ChunkState::Size)
        } else {
            Decoding::Eof
        });
    }
    match length {
        Ok(Some(n)) => Ok(Decoding::Length(n)),
        Ok(None) => Ok(Decoding::Eof),
        Err(InvalidLength) => Err(ExchangeError::Malformed("invalid content-length parsed")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, path: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut req = Request::new(());
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
        encode(&req, &mut head);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /a?b=c HTTP/1.1\r\nHost: example.com\r\nX-Forwarded-For: 1.2.3.4\r\n\
             X-Forwarded-For: 5.6.7.8\r\nAccept: */*\r\n\r\n"
        );
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
            Ok((Decoding::Length(5), true))
        );
        assert_eq!(
            frame(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                &Method::HEAD
            ),
            Ok((Decoding::Length(0), true))
        );
        assert_eq!(
            frame(b"HTTP/1.1 204 No Content\r\n\r\n", &get),
            Ok((Decoding::Length(0), true))
        );
        assert_eq!(
            frame(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                &get
            ),
            Ok((Decoding::Chunked(ChunkState::Size), true))
        );
        assert_eq!(
            frame(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", &get),
            Ok((Decoding::Eof, true))
        );
        assert_eq!(
            frame(b"HTTP/1.1 200 OK\r\n\r\n", &get),
            Ok((Decoding::Eof, true))
        );
        assert_eq!(
            frame(
                b"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\nContent-Length: 3\r\n\r\n",
                &get
            ),
            Ok((Decoding::Length(3), true))
        );
        assert_eq!(
            frame(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", &get),
            Ok((Decoding::Length(1), false))
        );
        assert_eq!(
            frame(
                b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\n",
                &get
            ),
            Ok((Decoding::Length(1), true))
        );
        assert_eq!(
            frame(
                b"HTTP/1.1 200 OK\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n",
                &get
            ),
            Ok((Decoding::Eof, false))
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
