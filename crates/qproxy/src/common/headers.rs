//! Header names Knative gives meaning to, as constants so the hot path never
//! parses a name.

use http::header::HeaderName;

/// Original `Host`, set by the activator to dodge host-based routing; the
/// queue-proxy turns it back into `Host`.
pub(crate) const K_ORIGINAL_HOST: HeaderName = HeaderName::from_static("k-original-host");
/// Revision name, added by the activator for its own routing; never reaches the app.
pub(crate) const KNATIVE_SERVING_REVISION: HeaderName =
    HeaderName::from_static("knative-serving-revision");
/// Revision namespace, added by the activator; never reaches the app.
pub(crate) const KNATIVE_SERVING_NAMESPACE: HeaderName =
    HeaderName::from_static("knative-serving-namespace");
/// Marks a request the activator proxied (`activator`).
pub(crate) const K_PROXY_REQUEST: HeaderName = HeaderName::from_static("k-proxy-request");
/// Network probes (`probe`) and queue health checks (`queue`).
pub(crate) const K_NETWORK_PROBE: HeaderName = HeaderName::from_static("k-network-probe");
/// Hash echoed back to a network probe.
pub(crate) const K_NETWORK_HASH: HeaderName = HeaderName::from_static("k-network-hash");
/// Marks kubelet probes rewritten by a mesh.
pub(crate) const K_KUBELET_PROBE: HeaderName = HeaderName::from_static("k-kubelet-probe");
/// Route tag chosen by the ingress.
pub(crate) const KNATIVE_SERVING_TAG: HeaderName = HeaderName::from_static("knative-serving-tag");
/// Whether the ingress used the default route.
pub(crate) const KNATIVE_SERVING_DEFAULT_ROUTE: HeaderName =
    HeaderName::from_static("knative-serving-default-route");

/// RFC 7239 `Forwarded`.
pub(crate) const FORWARDED: HeaderName = HeaderName::from_static("forwarded");
/// De-facto `X-Forwarded-For`.
pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// De-facto `X-Forwarded-Proto`.
pub(crate) const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// De-facto `X-Forwarded-Host`.
pub(crate) const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Non-standard hop-by-hop header some clients (curl) still send.
pub(crate) const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
/// Hop-by-hop `Keep-Alive`.
pub(crate) const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// `User-Agent` prefix of kubelet probes.
pub(crate) const KUBE_PROBE_UA_PREFIX: &[u8] = b"kube-probe/";

/// Whether a request is a kubelet probe, as knative.dev/networking decides:
/// a `kube-probe/` user agent or any non-empty `K-Kubelet-Probe`.
pub(crate) fn is_kubelet_probe(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::USER_AGENT)
        .is_some_and(|ua| ua.as_bytes().starts_with(KUBE_PROBE_UA_PREFIX))
        || headers.get(K_KUBELET_PROBE).is_some_and(|v| !v.is_empty())
}

/// Whether Knative counts a request as a probe (kept out of request
/// metrics and, unless asked, request logs): a kubelet probe or any
/// `K-Network-Probe`.
pub(crate) fn is_probe(headers: &http::HeaderMap) -> bool {
    is_kubelet_probe(headers) || headers.get(K_NETWORK_PROBE).is_some_and(|v| !v.is_empty())
}

/// A header map from name/value pairs, for tests.
#[cfg(test)]
pub(crate) fn header_map(pairs: &[(&str, &str)]) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).expect("a header name"),
            http::HeaderValue::from_str(v).expect("a header value"),
        );
    }
    h
}
