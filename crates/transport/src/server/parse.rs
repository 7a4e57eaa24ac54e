//! A request head read from a connection's buffer, and whether it is
//! served here or handed to hyper.

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, TE, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};

use super::{BodyRead, MakeBody, WholeBody};
use crate::limits::{MAX_HEADER_BYTES, STACK_HEADERS};
use crate::wire::length::digits;
use crate::wire::token::connection_has;

/// Longest head served here; a longer one goes to hyper, in front of
/// which those over Go's limit are refused. None served here is that long.
const MAX_HEAD: usize = 16 * 1024;
const _: () = assert!(MAX_HEAD < MAX_HEADER_BYTES);
/// Largest request body served here, read whole before the request is
/// served when it is all there already.
pub const MAX_BODY: usize = 64 * 1024;
/// hyper's longest request target: a longer one is hyper's `414`.
const MAX_URI_LEN: usize = (u16::MAX - 1) as usize;

/// What a connection's next bytes hold.
// The request is moved once, straight out; boxing it would cost an
// allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum RequestParse<RB> {
    /// A request served here, its head (and body) `len` bytes long.
    Request {
        req: Request<RB>,
        keep_alive: bool,
        len: usize,
        /// Tells when the stack has read the body, if it has one.
        body_read: Option<BodyRead>,
    },
    /// Not a whole head yet.
    Partial,
    /// A whole head whose body, small enough to be served here, has not
    /// all come yet: the request is `whole` bytes long.
    Short { whole: usize },
    /// A request, or bytes, for hyper.
    Hyper,
}

/// Reads the request head at the start of `raw` (and its body, when it is
/// served here) into a request whose header values share `raw`, its
/// header map `spare` (empty), taken.
pub(crate) fn parse<RB: MakeBody>(raw: &Bytes, spare: &mut HeaderMap) -> RequestParse<RB> {
    let mut lines = [httparse::EMPTY_HEADER; STACK_HEADERS];
    let mut parsed = httparse::Request::new(&mut lines);
    let mut len = match parsed.parse(raw) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if raw.len() < MAX_HEAD => return RequestParse::Partial,
        _ => return RequestParse::Hyper,
    };
    if len > MAX_HEAD || parsed.version != Some(1) {
        return RequestParse::Hyper;
    }
    let Some((method, uri)) = request_line(&parsed, raw) else {
        return RequestParse::Hyper;
    };
    let mut headers = std::mem::take(spare);
    headers.reserve(parsed.headers.len());
    let mut keep_alive = true;
    let mut length = None;
    let mut expect = false;
    for line in parsed.headers.iter() {
        let Ok(name) = HeaderName::from_bytes(line.name.as_bytes()) else {
            return RequestParse::Hyper;
        };
        let Ok(value) = HeaderValue::from_maybe_shared(raw.slice_ref(line.value)) else {
            return RequestParse::Hyper;
        };
        match name {
            // A length said once, in digits, is a body this module may take.
            CONTENT_LENGTH if length.is_none() => match digits(value.as_bytes()) {
                Some(n) => length = Some(n),
                None => return RequestParse::Hyper,
            },
            CONTENT_LENGTH | TRANSFER_ENCODING | UPGRADE | TE => return RequestParse::Hyper,
            CONNECTION if keep_alive => keep_alive = !connection_has(&value, "close"),
            EXPECT => expect = true,
            _ => {}
        }
        headers.append(name, value);
    }
    let mut body_read = None;
    let body = match length {
        None | Some(0) => RB::empty(&headers),
        // hyper answers `Expect: 100-continue` as the body is first read.
        Some(_) if expect => return RequestParse::Hyper,
        // A body small enough to be served here, whole.
        Some(n) if n <= MAX_BODY as u64 => {
            let end = len + n as usize;
            if raw.len() < end {
                // Parsed again once the body is here: the map is kept.
                headers.clear();
                *spare = headers;
                return RequestParse::Short { whole: end };
            }
            let (body, read) = WholeBody::new(raw.slice(len..end));
            len = end;
            body_read = Some(read);
            RB::whole(body, &headers)
        }
        // hyper streams a larger one to the app as it comes.
        Some(_) => return RequestParse::Hyper,
    };
    let mut req = Request::new(body);
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    RequestParse::Request {
        req,
        keep_alive,
        len,
        body_read,
    }
}

/// The method and target of the request line `parsed` read from `raw`,
/// its target sharing `raw`; `None` for a request that is hyper's: a
/// method that is not a token, a `CONNECT`, a target too long or not a
/// URI.
fn request_line(parsed: &httparse::Request<'_, '_>, raw: &Bytes) -> Option<(Method, Uri)> {
    let (Some(method), Some(path)) = (parsed.method, parsed.path) else {
        return None;
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return None;
    };
    if method == Method::CONNECT || path.len() > MAX_URI_LEN {
        return None;
    }
    let Ok(uri) = Uri::from_maybe_shared(raw.slice_ref(path.as_bytes())) else {
        return None;
    };
    Some((method, uri))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request body a service sees: none, or the whole one read here.
    #[derive(Debug)]
    enum TestBody {
        Empty,
        Whole(WholeBody),
    }

    impl MakeBody for TestBody {
        fn empty(_: &HeaderMap) -> Self {
            TestBody::Empty
        }

        fn whole(body: WholeBody, _: &HeaderMap) -> Self {
            TestBody::Whole(body)
        }

        fn streamed(_: hyper::body::Incoming, _: &HeaderMap) -> Self {
            // These tests read heads only: nothing here is hyper's.
            TestBody::Empty
        }
    }

    /// Which requests with a body are served here: those whose length is
    /// said once, in digits, no larger than [`MAX_BODY`], that do not wait
    /// on `Expect`; read on when the body has not all come yet.
    #[test]
    fn a_small_body_is_served_here() {
        let head = |extra: &str, length: usize| {
            format!("POST / HTTP/1.1\r\nHost: a\r\n{extra}Content-Length: {length}\r\n\r\n")
        };
        let parsed =
            |sent: Vec<u8>| match parse::<TestBody>(&Bytes::from(sent), &mut HeaderMap::new()) {
                RequestParse::Request { req, len, .. } => match req.into_body() {
                    TestBody::Whole(mut body) => format!("whole {} of {len}", body.take().len()),
                    TestBody::Empty => panic!("not a whole body"),
                },
                RequestParse::Short { whole } => format!("short of {whole}"),
                RequestParse::Partial => "partial".into(),
                RequestParse::Hyper => "hyper".into(),
            };
        let mut sent = head("", 5).into_bytes();
        let len = sent.len();
        sent.extend_from_slice(b"helloGET");
        assert_eq!(parsed(sent), format!("whole 5 of {}", len + 5));

        let mut largest = head("", MAX_BODY).into_bytes();
        let len = largest.len();
        largest.resize(len + MAX_BODY, b'x');
        assert_eq!(
            parsed(largest.clone()),
            format!("whole {MAX_BODY} of {}", len + MAX_BODY)
        );
        largest.truncate(len + 10);
        assert_eq!(parsed(largest), format!("short of {}", len + MAX_BODY));

        let mut over = head("", MAX_BODY + 1).into_bytes();
        over.resize(over.len() + MAX_BODY + 1, b'x');
        assert_eq!(parsed(over), "hyper");
        let expect = head("Expect: 100-continue\r\n", 5) + "hello";
        assert_eq!(parsed(expect.into_bytes()), "hyper");
        let twice = head("Content-Length: 5\r\n", 5) + "hello";
        assert_eq!(parsed(twice.into_bytes()), "hyper");
    }
}
