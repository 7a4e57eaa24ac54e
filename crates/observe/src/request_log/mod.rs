//! Request logs: one line per request on standard output, shaped by the
//! operator's Go template (`logging.request-log-template` in Knative's
//! `config-observability`).
//!
//! The template sees what Knative's `RequestLogHandler` gives it:
//!
//! - `.Request`: the request as it arrived (`Method`, `RequestURI`, `URL`
//!   with `Path`, `RawQuery`, ..., `Proto`, `ProtoMajor`, `ProtoMinor`,
//!   `Header` with Go's canonical keys, `ContentLength` (`-1` when unknown),
//!   `TransferEncoding`, `Close`, `Host`, `RemoteAddr`, and the methods
//!   `UserAgent` and `Referer`);
//! - `.Response`: `Code` (the status sent; `500` for a response cut off,
//!   `200` for an upgrade, as Go's handlers see them), `Size` (body bytes
//!   sent) and `Latency` (seconds until the response was done with);
//!   with qproxy's `request-log-queue-wait` option, `QueueWait` too
//!   (seconds the request waited for a slot in the breaker's queue: `0`
//!   when a slot was free, or with no limit);
//! - `.Revision`: `Name`, `Namespace`, `Service`, `Configuration`,
//!   `PodName`, `PodIP`;
//! - `.TraceID` (current Knative only): the trace ID of the incoming
//!   `traceparent` or `X-B3-TraceId`.
//!
//! A template that fails while it runs (a field that does not exist, say)
//! gives Knative's `Invalid request log template: ...` line instead,
//! followed, under classic Knative, by what the template wrote before it
//! failed, as Knative writes it.

pub mod layer;

use std::borrow::Cow;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Method, Request, Uri, Version};
use qproxy_go_template::{Object, Template, Value, canonical_header_key, float_v};
use qproxy_transport::wire::token::connection_has;

use crate::semconv;
use qproxy_core::config::{Generation, Revision};

/// The request log of the main port.
#[derive(Debug)]
pub struct RequestLog {
    template: Template,
    /// Whether the template reads request headers beyond the user agent
    /// and referer; if not, they are not copied.
    needs_headers: bool,
    probes: bool,
    generation: Generation,
    revision: Revision,
}

impl RequestLog {
    /// A log rendering `template` (parsed from `src`).
    pub fn new(
        template: Template,
        src: &str,
        probes: bool,
        generation: Generation,
        revision: Revision,
    ) -> Self {
        Self {
            template,
            needs_headers: src.contains("Header"),
            probes,
            generation,
            revision,
        }
    }

    /// Whether requests Knative counts as probes are logged.
    pub fn logs_probes(&self) -> bool {
        self.probes
    }

    /// What a request's line needs from the request, taken as it arrives.
    pub fn arrived<B: http_body::Body>(&self, req: &Request<B>, remote: SocketAddr) -> Arrived {
        let headers = req.headers();
        let first = |name: http::header::HeaderName| {
            headers
                .get(name)
                .map(|v| v.as_bytes().to_vec())
                .unwrap_or_default()
        };
        Arrived {
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            content_length: req
                .body()
                .size_hint()
                .exact()
                .and_then(|n| i64::try_from(n).ok())
                .unwrap_or(-1),
            remote,
            user_agent: first(http::header::USER_AGENT),
            referer: first(http::header::REFERER),
            trace_id: match self.generation {
                Generation::Current => Some(trace_id(headers)),
                Generation::Classic => None,
            },
            headers: self.needs_headers.then(|| headers.clone()),
            chunked: headers
                .get_all(http::header::TRANSFER_ENCODING)
                .iter()
                .any(|v| v.as_bytes().eq_ignore_ascii_case(b"chunked")),
            close: closes(req.version(), headers),
            host: host(req),
        }
    }

    /// Renders and writes the line of a request that got `status`, sent
    /// `size` body bytes and took `latency`, having waited `queue_wait`
    /// for a slot if its template may read that.
    pub fn write(
        &self,
        arrived: &Arrived,
        status: u16,
        size: u64,
        latency: Duration,
        queue_wait: Option<Duration>,
    ) {
        let line = self.render(arrived, status, size, latency, queue_wait);
        // A closed output is no reason to stop serving.
        let _ = std::io::stdout().lock().write_all(&line);
    }

    /// The bytes [`RequestLog::write`] writes.
    pub fn render(
        &self,
        arrived: &Arrived,
        status: u16,
        size: u64,
        latency: Duration,
        queue_wait: Option<Duration>,
    ) -> Vec<u8> {
        let input = Input {
            request: RequestView {
                arrived,
                url: UrlView { arrived },
            },
            response: ResponseView {
                code: status,
                size,
                latency: latency.as_secs_f64(),
                queue_wait: queue_wait.map(|w| w.as_secs_f64()),
            },
            revision: RevisionView(&self.revision),
        };
        let mut line = Vec::with_capacity(256);
        if self
            .template
            .execute(&mut line, Value::Object(&input))
            .is_err()
        {
            let partial = std::mem::take(&mut line);
            line.extend_from_slice(
                format!(
                    "Invalid request log template: method: {}, response code: {}, latency: {}, url: {}\n",
                    arrived.method,
                    status,
                    float_v(latency.as_secs_f64()),
                    url_string(arrived),
                )
                .as_bytes(),
            );
            if self.generation == Generation::Classic {
                line.extend_from_slice(&partial);
            }
        }
        line
    }
}

/// Go's `Request.Close` on the server side: HTTP/1.0 without keep-alive,
/// or `Connection: close`.
fn closes(version: Version, headers: &HeaderMap) -> bool {
    let has = |token: &str| {
        headers
            .get_all(http::header::CONNECTION)
            .iter()
            .any(|v| connection_has(v, token))
    };
    match version {
        Version::HTTP_10 => !has("keep-alive"),
        Version::HTTP_11 => has("close"),
        _ => false,
    }
}

/// Knative's `ExtractTraceID`: from `traceparent`, else `X-B3-TraceId`.
fn trace_id(headers: &HeaderMap) -> Vec<u8> {
    if let Some(tp) = headers.get("traceparent").filter(|v| !v.is_empty()) {
        let mut parts = tp.as_bytes().splitn(3, |b| *b == b'-');
        if let (Some(_), Some(id)) = (parts.next(), parts.next()) {
            return id.to_vec();
        }
    }
    headers
        .get("x-b3-traceid")
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default()
}

/// What a request's log line needs, taken as it arrived.
#[derive(Debug)]
pub struct Arrived {
    method: Method,
    uri: Uri,
    version: Version,
    content_length: i64,
    remote: SocketAddr,
    user_agent: Vec<u8>,
    referer: Vec<u8>,
    trace_id: Option<Vec<u8>>,
    headers: Option<HeaderMap>,
    chunked: bool,
    close: bool,
    host: Vec<u8>,
}

/// Go's `Request.Host`: the authority of an absolute target or of an
/// HTTP/2 request, else the `Host` header.
fn host<B>(req: &Request<B>) -> Vec<u8> {
    let uri = req.uri();
    match uri.authority() {
        Some(auth) if req.version() == Version::HTTP_2 || uri.scheme().is_some() => {
            auth.as_str().as_bytes().to_vec()
        }
        _ => req
            .headers()
            .get(http::header::HOST)
            .map(|v| v.as_bytes().to_vec())
            .unwrap_or_default(),
    }
}

/// Go's `Request.RequestURI`, which is also what `URL.String()` gives for
/// a server request.
fn url_string(arrived: &Arrived) -> Cow<'_, str> {
    semconv::request_target(&arrived.uri, arrived.version)
}

fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

fn proto(version: Version) -> (&'static str, i64, i64) {
    match version {
        Version::HTTP_09 => ("HTTP/0.9", 0, 9),
        Version::HTTP_10 => ("HTTP/1.0", 1, 0),
        Version::HTTP_2 => ("HTTP/2.0", 2, 0),
        Version::HTTP_3 => ("HTTP/3.0", 3, 0),
        _ => ("HTTP/1.1", 1, 1),
    }
}

struct Input<'a> {
    request: RequestView<'a>,
    response: ResponseView,
    revision: RevisionView<'a>,
}

impl Object for Input<'_> {
    fn type_name(&self) -> &'static str {
        "*http.RequestLogTemplateInput"
    }

    fn field(&self, name: &str) -> Option<Value<'_>> {
        Some(match name {
            "Request" => Value::Object(&self.request),
            "Response" => Value::Object(&self.response),
            "Revision" => Value::Object(&self.revision),
            "TraceID" => Value::bytes(self.request.arrived.trace_id.as_deref()?),
            _ => return None,
        })
    }

    fn write_v(&self, out: &mut Vec<u8>, pointer: bool) {
        if pointer {
            out.push(b'&');
        }
        out.push(b'{');
        self.request.write_v(out, true);
        out.push(b' ');
        self.response.write_v(out, true);
        out.push(b' ');
        self.revision.write_v(out, true);
        if let Some(id) = &self.request.arrived.trace_id {
            out.push(b' ');
            out.extend_from_slice(id);
        }
        out.push(b'}');
    }
}

struct RequestView<'a> {
    arrived: &'a Arrived,
    url: UrlView<'a>,
}

impl RequestView<'_> {
    /// `Header`: Go's canonical keys, `Host` and `Transfer-Encoding` left
    /// out as Go's server leaves them out.
    fn header(&self) -> Value<'_> {
        let mut entries: Vec<(Cow<'_, [u8]>, Value<'_>)> = Vec::new();
        let Some(headers) = &self.arrived.headers else {
            return Value::Map {
                entries,
                header: true,
            };
        };
        for (name, value) in headers {
            if name == http::header::HOST || name == http::header::TRANSFER_ENCODING {
                continue;
            }
            let key = canonical_header_key(name.as_str().as_bytes());
            let value = Value::bytes(value.as_bytes());
            match entries.iter_mut().find(|(k, _)| *k == key) {
                Some((_, Value::List(values))) => values.push(value),
                _ => entries.push((key, Value::List(vec![value]))),
            }
        }
        Value::Map {
            entries,
            header: true,
        }
    }
}

impl Object for RequestView<'_> {
    fn type_name(&self) -> &'static str {
        "*http.Request"
    }

    fn field(&self, name: &str) -> Option<Value<'_>> {
        let a = self.arrived;
        let (proto, major, minor) = proto(a.version);
        Some(match name {
            "Method" => Value::str(a.method.as_str()),
            "RequestURI" => Value::Str(match url_string(a) {
                Cow::Borrowed(s) => Cow::Borrowed(s.as_bytes()),
                Cow::Owned(s) => Cow::Owned(s.into_bytes()),
            }),
            "URL" => Value::Object(&self.url),
            "Proto" => Value::str(proto),
            "ProtoMajor" => Value::Int(major),
            "ProtoMinor" => Value::Int(minor),
            "Header" => self.header(),
            "ContentLength" => Value::Int(a.content_length),
            "TransferEncoding" => Value::List(if a.chunked {
                vec![Value::str("chunked")]
            } else {
                Vec::new()
            }),
            "Close" => Value::Bool(a.close),
            "Host" => Value::bytes(&a.host),
            "RemoteAddr" => Value::string(a.remote.to_string()),
            "UserAgent" => Value::bytes(&a.user_agent),
            "Referer" => Value::bytes(&a.referer),
            _ => return None,
        })
    }

    fn write_v(&self, out: &mut Vec<u8>, pointer: bool) {
        // Go prints every field of http.Request, pointers as addresses;
        // the parts that mean something are given.
        let a = self.arrived;
        if pointer {
            out.push(b'&');
        }
        out.extend_from_slice(
            format!("{{{} {} {}}}", a.method, url_string(a), proto(a.version).0).as_bytes(),
        );
    }
}

struct UrlView<'a> {
    arrived: &'a Arrived,
}

impl Object for UrlView<'_> {
    fn type_name(&self) -> &'static str {
        "*url.URL"
    }

    fn field(&self, name: &str) -> Option<Value<'_>> {
        let a = self.arrived;
        let absolute = a.uri.scheme().is_some() && a.version != Version::HTTP_2;
        Some(match name {
            "Scheme" if absolute => Value::str(a.uri.scheme_str().unwrap_or("")),
            "Host" if absolute => Value::str(a.uri.authority().map_or("", |h| h.as_str())),
            "Scheme" | "Host" | "Opaque" | "Fragment" | "RawPath" | "RawFragment" => Value::str(""),
            "Path" => Value::Str(Cow::Owned(percent_decode(a.uri.path()))),
            "RawQuery" => Value::str(a.uri.query().unwrap_or("")),
            "ForceQuery" | "OmitHost" => Value::Bool(false),
            "String" | "RequestURI" => Value::string(url_string(a).into_owned()),
            "EscapedPath" => Value::str(a.uri.path()),
            _ => return None,
        })
    }

    fn write_v(&self, out: &mut Vec<u8>, _pointer: bool) {
        // *url.URL has a String method: printed as the URL either way.
        out.extend_from_slice(url_string(self.arrived).as_bytes());
    }
}

struct ResponseView {
    code: u16,
    size: u64,
    latency: f64,
    /// With the `request-log-queue-wait` option only: without it, as in
    /// Knative, the field does not exist.
    queue_wait: Option<f64>,
}

impl Object for ResponseView {
    fn type_name(&self) -> &'static str {
        "*http.RequestLogResponse"
    }

    fn field(&self, name: &str) -> Option<Value<'_>> {
        Some(match name {
            "Code" => Value::Int(i64::from(self.code)),
            "Size" => Value::Int(i64::try_from(self.size).unwrap_or(i64::MAX)),
            "Latency" => Value::Float(self.latency),
            "QueueWait" => Value::Float(self.queue_wait?),
            _ => return None,
        })
    }

    fn write_v(&self, out: &mut Vec<u8>, pointer: bool) {
        if pointer {
            out.push(b'&');
        }
        let wait = self
            .queue_wait
            .map(|w| format!(" {}", float_v(w)))
            .unwrap_or_default();
        out.extend_from_slice(
            format!(
                "{{{} {} {}{wait}}}",
                self.code,
                self.size,
                float_v(self.latency)
            )
            .as_bytes(),
        );
    }
}

struct RevisionView<'a>(&'a Revision);

impl Object for RevisionView<'_> {
    fn type_name(&self) -> &'static str {
        "*http.RequestLogRevision"
    }

    fn field(&self, name: &str) -> Option<Value<'_>> {
        let r = self.0;
        Some(Value::str(match name {
            "Name" => &r.name,
            "Namespace" => &r.namespace,
            "Service" => &r.service,
            "Configuration" => &r.configuration,
            "PodName" => &r.pod,
            "PodIP" => &r.pod_ip,
            _ => return None,
        }))
    }

    fn write_v(&self, out: &mut Vec<u8>, pointer: bool) {
        let r = self.0;
        if pointer {
            out.push(b'&');
        }
        out.extend_from_slice(
            format!(
                "{{{} {} {} {} {} {}}}",
                r.name, r.namespace, r.service, r.configuration, r.pod, r.pod_ip
            )
            .as_bytes(),
        );
    }
}

/// Shared by every connection.
pub type SharedRequestLog = Arc<RequestLog>;
