//! `httpGet` readiness probes.
//!
//! As the Go queue-proxy sends them: a `GET` of `scheme://host:port/path`
//! on a fresh connection (`Connection: close` on HTTP/1), with
//! `User-Agent: kube-probe//`, `Accept-Encoding: gzip` and the probe's
//! custom headers; redirects are followed (at most 10, Go's client rule);
//! the final status decides: 2xx and 3xx pass. Each request (with its
//! redirects) is bounded by the try's timeout, as each `http.Client.Do` is
//! in Go.
//!
//! With HTTP/2 auto-detection (`ENABLE_HTTP2_AUTO_DETECTION`) every try
//! first finds out whether the app speaks h2c, each generation its own way:
//! - classic (v0.42): an HTTP/1 `OPTIONS` asking to upgrade to h2c; a `101`
//!   means h2c, and the probe `GET` goes over h2c; a 2xx or 3xx passes
//!   at once;
//! - current: a `GET` over h2c; if that fails or is not ready, a `GET` over
//!   HTTP/1, which passes at once if ready; after a ready h2c answer the
//!   probe `GET` goes over h2c.
//!
//! The detection requests carry no custom headers, as in Knative.

use std::time::Duration;

use bytes::Bytes;
use http::header::{
    ACCEPT_ENCODING, CONNECTION, HOST, HeaderName, HeaderValue, LOCATION, REFERER, UPGRADE,
    USER_AGENT,
};
use http::{Method, Request, StatusCode, Version};
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use url::Url;

use super::attempt::{HttpOptions, PROBE_USER_AGENT, host_or_loopback};
use super::error::{HttpProbeError, MAX_REDIRECTS, ProbeError};
use crate::config::{Generation, HttpGetAction};

/// Which protocol a request goes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    Http1,
    H2c,
}

/// A request to send: what varies between the probe and the detection.
struct Exchange<'a> {
    proto: Proto,
    method: Method,
    /// Headers beyond the ones every probe request has.
    headers: &'a [(HeaderName, HeaderValue)],
    /// Bound on the request, redirects included.
    timeout: Duration,
}

/// Runs one try of `get`, each request bounded by `timeout`.
pub(super) async fn probe(
    get: &HttpGetAction,
    options: HttpOptions,
    timeout: Duration,
) -> Result<(), ProbeError> {
    let url = probe_url(get)?;
    let custom = custom_headers(get)?;
    let proto = if options.auto_detect_http2 {
        match options.generation {
            Generation::Classic => match detect_by_upgrade(&url, timeout).await {
                Ok(Some(proto)) => proto,
                Ok(None) => return Ok(()),
                Err(e) => return Err(HttpProbeError::Upgrade(Box::new(e)).into()),
            },
            Generation::Current => match detect_by_trying(&url, timeout).await {
                Ok(Some(proto)) => proto,
                Ok(None) => return Ok(()),
                Err(e) => return Err(HttpProbeError::Detection(Box::new(e)).into()),
            },
        }
    } else {
        Proto::Http1
    };
    let exchange = Exchange {
        proto,
        method: Method::GET,
        headers: &custom,
        timeout,
    };
    ready(send(&url, exchange).await?)
}

/// Classic detection. `Some(H2c)`: the app upgrades; `None`: it answered
/// ready over HTTP/1, which passes.
async fn detect_by_upgrade(url: &Url, timeout: Duration) -> Result<Option<Proto>, ProbeError> {
    let upgrade = [
        (
            CONNECTION,
            HeaderValue::from_static("Upgrade, HTTP2-Settings"),
        ),
        (UPGRADE, HeaderValue::from_static("h2c")),
        (
            HeaderName::from_static("http2-settings"),
            HeaderValue::from_static(""),
        ),
    ];
    let exchange = Exchange {
        proto: Proto::Http1,
        method: Method::OPTIONS,
        headers: &upgrade,
        timeout,
    };
    let status = send(url, exchange).await?;
    if status.code == StatusCode::SWITCHING_PROTOCOLS && status.upgrades_to_h2c {
        return Ok(Some(Proto::H2c));
    }
    ready(status).map(|()| None)
}

/// Current detection. `Some(H2c)`: the app answered ready over h2c;
/// `None`: it answered ready over HTTP/1, which passes.
async fn detect_by_trying(url: &Url, timeout: Duration) -> Result<Option<Proto>, ProbeError> {
    let h2c = Exchange {
        proto: Proto::H2c,
        method: Method::GET,
        headers: &[],
        timeout,
    };
    if let Ok(status) = send(url, h2c).await
        && is_ready(status.code)
    {
        return Ok(Some(Proto::H2c));
    }
    let http1 = Exchange {
        proto: Proto::Http1,
        method: Method::GET,
        headers: &[],
        timeout,
    };
    ready(send(url, http1).await?).map(|()| None)
}

/// What decides a probe: the final status.
#[derive(Debug, Clone, Copy)]
struct Status {
    code: StatusCode,
    /// A `101` with `Upgrade: h2c`.
    upgrades_to_h2c: bool,
}

fn is_ready(code: StatusCode) -> bool {
    (200..400).contains(&code.as_u16())
}

fn ready(status: Status) -> Result<(), ProbeError> {
    if is_ready(status.code) {
        Ok(())
    } else {
        Err(HttpProbeError::NotReady(status.code.as_u16()).into())
    }
}

/// `scheme://host:port/path`, with the path's leading `/` supplied.
fn probe_url(get: &HttpGetAction) -> Result<Url, HttpProbeError> {
    let scheme = match get.scheme.to_ascii_lowercase().as_str() {
        "" | "http" => "http",
        _ => return Err(HttpProbeError::Scheme(get.scheme.clone())),
    };
    let host = host_or_loopback(&get.host);
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let path = get.path.trim_start_matches('/');
    Ok(Url::parse(&format!(
        "{scheme}://{host}:{}/{path}",
        get.port.0
    ))?)
}

/// The probe's custom headers. `Host` and `User-Agent` are left out: Go's
/// client sends its own in their place.
fn custom_headers(get: &HttpGetAction) -> Result<Vec<(HeaderName, HeaderValue)>, HttpProbeError> {
    let mut headers = Vec::with_capacity(get.http_headers.len());
    for h in &get.http_headers {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| HttpProbeError::Header(h.name.clone()))?;
        if name == HOST || name == USER_AGENT {
            continue;
        }
        let value =
            HeaderValue::from_str(&h.value).map_err(|_| HttpProbeError::Header(h.name.clone()))?;
        headers.push((name, value));
    }
    Ok(headers)
}

/// Sends `exchange` to `url`, following redirects as Go's client does,
/// within the exchange's timeout.
async fn send(url: &Url, exchange: Exchange<'_>) -> Result<Status, ProbeError> {
    let timeout = exchange.timeout;
    tokio::time::timeout(timeout, follow(url, exchange))
        .await
        .unwrap_or(Err(ProbeError::Timeout(timeout)))
}

async fn follow(url: &Url, mut exchange: Exchange<'_>) -> Result<Status, ProbeError> {
    let mut url = url.clone();
    let mut referer = None;
    let mut redirects = 0;
    loop {
        let (status, location) = send_once(&url, &exchange, referer.as_ref()).await?;
        let redirect = matches!(status.code.as_u16(), 301 | 302 | 303 | 307 | 308);
        let Some(location) = location.filter(|_| redirect) else {
            return Ok(status);
        };
        if redirects == MAX_REDIRECTS {
            return Err(HttpProbeError::Redirects.into());
        }
        redirects += 1;
        let next = url
            .join(&location)
            .map_err(|source| HttpProbeError::Location { location, source })?;
        if matches!(status.code.as_u16(), 301..=303)
            && exchange.method != Method::GET
            && exchange.method != Method::HEAD
        {
            exchange.method = Method::GET;
        }
        let mut previous = url;
        previous.set_fragment(None);
        referer = HeaderValue::from_str(previous.as_str()).ok();
        url = next;
    }
}

/// One request on a fresh connection. Returns the status and the
/// `Location` header.
async fn send_once(
    url: &Url,
    exchange: &Exchange<'_>,
    referer: Option<&HeaderValue>,
) -> Result<(Status, Option<String>), ProbeError> {
    if url.scheme() != "http" {
        return Err(HttpProbeError::Scheme(url.scheme().to_owned()).into());
    }
    let host = url.host_str().unwrap_or("127.0.0.1");
    let port = url.port_or_known_default().unwrap_or(80);
    let authority = format!("{host}:{port}");
    let bare_host = host.trim_start_matches('[').trim_end_matches(']');
    let stream = tokio::net::TcpStream::connect((bare_host, port))
        .await
        .map_err(|source| ProbeError::Connect {
            addr: authority.clone(),
            source,
        })?;
    let _ = stream.set_nodelay(true);
    let io = TokioIo::new(stream);

    let req = probe_request(url, exchange, referer, &authority)?;
    let res = match exchange.proto {
        Proto::Http1 => {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(HttpProbeError::from)?;
            tokio::spawn(async move {
                let _ = conn.with_upgrades().await;
            });
            sender.send_request(req).await
        }
        Proto::H2c => {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                    .await
                    .map_err(HttpProbeError::from)?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            sender.send_request(req).await
        }
    }
    .map_err(HttpProbeError::from)?;
    let status = Status {
        code: res.status(),
        upgrades_to_h2c: res.headers().get(UPGRADE).is_some_and(|v| v == "h2c"),
    };
    let location = res
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned);
    // The body is not needed; dropping the response closes the connection.
    Ok((status, location))
}

/// The probe's request for `url` on `authority`: its target (absolute for
/// h2c), `Host`, Knative's prober's `User-Agent`, the probe's own headers,
/// `Referer` after a redirect, `Accept-Encoding: gzip` and, over
/// HTTP/1.1, `Connection: close`, as Go's transport and Knative's prober
/// send them.
fn probe_request(
    url: &Url,
    exchange: &Exchange<'_>,
    referer: Option<&HeaderValue>,
    authority: &str,
) -> Result<Request<Empty<Bytes>>, ProbeError> {
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_owned(),
    };
    let mut req = Request::builder().method(exchange.method.clone());
    req = match exchange.proto {
        Proto::Http1 => req.uri(path).version(Version::HTTP_11),
        Proto::H2c => req
            .uri(format!("http://{authority}{path}"))
            .version(Version::HTTP_2),
    };
    let mut req = req
        .body(Empty::<Bytes>::new())
        .map_err(|_| HttpProbeError::Header(url.to_string()))?;
    let headers = req.headers_mut();
    if exchange.proto == Proto::Http1 {
        let host = HeaderValue::from_str(authority)
            .map_err(|_| HttpProbeError::Header(authority.to_owned()))?;
        headers.insert(HOST, host);
    }
    headers.insert(USER_AGENT, HeaderValue::from_static(PROBE_USER_AGENT));
    for (name, value) in exchange.headers {
        headers.append(name.clone(), value.clone());
    }
    if let Some(referer) = referer {
        headers.insert(REFERER, referer.clone());
    }
    if exchange.method != Method::HEAD && !headers.contains_key(ACCEPT_ENCODING) {
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
    }
    if exchange.proto == Proto::Http1 && !headers.contains_key(CONNECTION) {
        // Knative's prober transport keeps no connection alive.
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HttpHeader, ProbePort};

    fn get(path: &str, headers: &[(&str, &str)]) -> HttpGetAction {
        HttpGetAction {
            path: path.to_owned(),
            port: ProbePort(8080),
            host: "127.0.0.1".to_owned(),
            scheme: "HTTP".to_owned(),
            http_headers: headers
                .iter()
                .map(|(n, v)| HttpHeader {
                    name: (*n).to_owned(),
                    value: (*v).to_owned(),
                })
                .collect(),
        }
    }

    #[test]
    fn builds_the_url_go_builds() {
        assert_eq!(
            probe_url(&get("/healthz?x=1", &[])).unwrap().as_str(),
            "http://127.0.0.1:8080/healthz?x=1"
        );
        assert_eq!(
            probe_url(&get("healthz", &[])).unwrap().as_str(),
            "http://127.0.0.1:8080/healthz"
        );
        assert_eq!(
            probe_url(&get("", &[])).unwrap().as_str(),
            "http://127.0.0.1:8080/"
        );
        let mut v6 = get("/", &[]);
        v6.host = "::1".to_owned();
        assert_eq!(probe_url(&v6).unwrap().as_str(), "http://[::1]:8080/");
        let mut empty = get("/", &[]);
        empty.host = String::new();
        empty.scheme = String::new();
        assert_eq!(
            probe_url(&empty).unwrap().as_str(),
            "http://127.0.0.1:8080/"
        );
    }

    /// An app on loopback that holds each request until the test lets it
    /// answer `200`: the sender of each request's release comes on the
    /// receiver as the request arrives.
    async fn held_app() -> (
        qproxy_test_support::App,
        tokio::sync::mpsc::UnboundedReceiver<tokio::sync::oneshot::Sender<()>>,
    ) {
        let (arrived, arrivals) = tokio::sync::mpsc::unbounded_channel();
        let app = qproxy_test_support::App::start(move |_| {
            let arrived = arrived.clone();
            async move {
                let (release, released) = tokio::sync::oneshot::channel();
                arrived.send(release).unwrap();
                let _ = released.await;
                http::Response::new(qproxy_test_support::full("ok"))
            }
        })
        .await;
        (app, arrivals)
    }

    /// Runs `test` with the paused clock moving only as the test moves it:
    /// a blocking task, held to the end, keeps the clock from advancing on
    /// its own while the runtime waits on the sockets.
    async fn on_the_test_s_clock<F: std::future::Future>(test: F) -> F::Output {
        let (hold, held) = std::sync::mpsc::channel::<()>();
        let holder = tokio::task::spawn_blocking(move || {
            let _ = held.recv();
        });
        let out = test.await;
        drop(hold);
        holder.await.unwrap();
        out
    }

    const TRY: Duration = Duration::from_millis(100);

    #[tokio::test(start_paused = true)]
    async fn each_request_of_a_try_has_the_whole_timeout() {
        let (app, mut arrivals) = held_app().await;
        let mut action = get("/", &[]);
        action.port = ProbePort(app.port());
        // Current detection over h2c, then the probe: each held 60 ms, 120
        // in all, past one 100 ms for both.
        let options = HttpOptions {
            auto_detect_http2: true,
            generation: Generation::Current,
        };
        let answered = on_the_test_s_clock(async {
            let driver = async {
                for _ in ["the detection", "the probe"] {
                    let release = arrivals.recv().await.unwrap();
                    tokio::time::advance(Duration::from_millis(60)).await;
                    release.send(()).unwrap();
                }
            };
            tokio::join!(probe(&action, options, TRY), driver).0
        })
        .await;
        assert!(answered.is_ok(), "{answered:?}");
        let seen = app.seen();
        assert_eq!(seen.len(), 2, "detection, then the probe: {seen:#?}");
        assert!(seen.iter().all(|s| s.version == Version::HTTP_2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_held_past_the_timeout_fails_the_try() {
        let (app, mut arrivals) = held_app().await;
        let mut action = get("/", &[]);
        action.port = ProbePort(app.port());
        let options = HttpOptions {
            auto_detect_http2: false,
            generation: Generation::Current,
        };
        let answered = on_the_test_s_clock(async {
            let driver = async {
                let release = arrivals.recv().await.unwrap();
                tokio::time::advance(TRY).await;
                let _ = release.send(());
            };
            tokio::join!(probe(&action, options, TRY), driver).0
        })
        .await;
        assert!(
            matches!(answered, Err(ProbeError::Timeout(t)) if t == TRY),
            "{answered:?}"
        );
    }

    #[test]
    fn custom_headers_leave_host_and_user_agent_to_the_client() {
        let h = custom_headers(&get(
            "/",
            &[("X-Probe", "1"), ("Host", "x"), ("user-agent", "me")],
        ))
        .unwrap();
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].0, "x-probe");
        assert!(custom_headers(&get("/", &[("bad name", "1")])).is_err());
        assert!(custom_headers(&get("/", &[("X", "a\nb")])).is_err());
    }
}
