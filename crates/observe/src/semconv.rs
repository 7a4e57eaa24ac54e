//! What request metrics, traces and request logs read off a request the
//! way Knative's Go code reads it: the method as OpenTelemetry's semantic
//! conventions name it, the protocol version, the host and port, and the
//! request target.

use std::borrow::Cow;
use std::fmt;

use http::{HeaderMap, Method, Request, Uri, Version};

use qproxy_core::headers::{KNATIVE_SERVING_DEFAULT_ROUTE, KNATIVE_SERVING_TAG};

/// The instrumentation scope of current Knative's HTTP spans and
/// instruments: Go's otelhttp, which Knative's queue-proxy wraps its
/// server and its client in.
pub const OTELHTTP_SCOPE: &str = "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp";
/// The version of otelhttp current Knative's queue-proxy (serving v0.50)
/// is built with.
pub const OTELHTTP_VERSION: &str = "0.69.0";
/// The instrumentation scope of Knative's own spans and instruments.
pub const QUEUE_SCOPE: &str = "knative.dev/serving/pkg/queue";

/// Current Knative's route tag (`kn.route.tag`): the `Knative-Serving-Tag`,
/// or `kn:default`, `kn:undefined`, `kn:disabled`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteTag {
    /// A named tag.
    Tag(String),
    /// One of Knative's own values.
    Known(&'static str),
}

impl RouteTag {
    /// The route tag of a request that names no route.
    pub const DISABLED: RouteTag = RouteTag::Known("kn:disabled");

    /// The route tag of a request with `headers`.
    pub fn of(headers: &HeaderMap) -> Self {
        let get = |name| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
        };
        match (
            get(&KNATIVE_SERVING_TAG),
            get(&KNATIVE_SERVING_DEFAULT_ROUTE),
        ) {
            ("", "") => RouteTag::DISABLED,
            ("", _) => RouteTag::Known("kn:default"),
            (_, "true") => RouteTag::Known("kn:undefined"),
            (tag, _) => RouteTag::Tag(tag.to_owned()),
        }
    }
}

impl fmt::Display for RouteTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteTag::Tag(tag) => f.write_str(tag),
            RouteTag::Known(known) => f.write_str(known),
        }
    }
}

/// `http.request.method`: one of the methods HTTP defines, else `_OTHER`.
pub fn method(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "_OTHER",
    }
}

/// A server span's name: the method, or `HTTP` for one HTTP does not
/// define.
pub fn span_name(m: &Method) -> &'static str {
    match method(m) {
        "_OTHER" => "HTTP",
        known => known,
    }
}

/// `network.protocol.version`.
pub fn protocol_version(version: Version) -> &'static str {
    match version {
        Version::HTTP_10 => "1.0",
        Version::HTTP_2 => "2",
        _ => "1.1",
    }
}

/// The host the client addressed: the target's authority, else `Host`.
pub fn host<B>(req: &Request<B>) -> &str {
    req.uri()
        .authority()
        .map(|a| a.as_str())
        .or_else(|| {
            req.headers()
                .get(http::header::HOST)
                .and_then(|v| v.to_str().ok())
        })
        .unwrap_or("")
}

/// `host` split into its address (without an IPv6 literal's brackets) and
/// its port, if it has a numeric one.
pub fn split_host(host: &str) -> (&str, Option<&str>) {
    match host.rsplit_once(':') {
        Some((h, p))
            if !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && (!h.contains(':') || (h.starts_with('[') && h.ends_with(']'))) =>
        {
            (h.trim_start_matches('[').trim_end_matches(']'), Some(p))
        }
        _ => (host, None),
    }
}

/// Go's `Request.RequestURI`: the target as received; in HTTP/2, `:path`.
pub fn request_target(uri: &Uri, version: Version) -> Cow<'_, str> {
    if version == Version::HTTP_2 || uri.scheme().is_none() {
        match uri.path_and_query() {
            Some(pq) => Cow::Borrowed(pq.as_str()),
            None => Cow::Owned(uri.to_string()),
        }
    } else {
        Cow::Owned(uri.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_split_as_go_splits_them() {
        assert_eq!(
            split_host("example.com:8080"),
            ("example.com", Some("8080"))
        );
        assert_eq!(split_host("example.com"), ("example.com", None));
        assert_eq!(split_host("[::1]:80"), ("::1", Some("80")));
        assert_eq!(split_host("::1"), ("::1", None));
        assert_eq!(split_host("host:"), ("host:", None));
    }

    #[test]
    fn methods_http_does_not_define_are_other() {
        let purge = Method::from_bytes(b"PURGE").unwrap();
        assert_eq!(method(&purge), "_OTHER");
        assert_eq!(span_name(&purge), "HTTP");
        assert_eq!(span_name(&Method::GET), "GET");
    }
}
