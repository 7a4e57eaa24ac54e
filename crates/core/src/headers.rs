//! Header names Knative gives meaning to, as constants so the hot path never
//! parses a name.

use http::header::{self, CONNECTION, HeaderName, TE, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderValue};

/// Original `Host`, set by the activator to dodge host-based routing; the
/// queue-proxy turns it back into `Host`.
pub const K_ORIGINAL_HOST: HeaderName = HeaderName::from_static("k-original-host");
/// Revision name, added by the activator for its own routing; never reaches the app.
pub const KNATIVE_SERVING_REVISION: HeaderName =
    HeaderName::from_static("knative-serving-revision");
/// Revision namespace, added by the activator; never reaches the app.
pub const KNATIVE_SERVING_NAMESPACE: HeaderName =
    HeaderName::from_static("knative-serving-namespace");
/// Marks a request the activator proxied (`activator`).
pub const K_PROXY_REQUEST: HeaderName = HeaderName::from_static("k-proxy-request");
/// Network probes (`probe`) and queue health checks (`queue`).
pub const K_NETWORK_PROBE: HeaderName = HeaderName::from_static("k-network-probe");
/// Hash echoed back to a network probe.
pub const K_NETWORK_HASH: HeaderName = HeaderName::from_static("k-network-hash");
/// Marks kubelet probes rewritten by a mesh.
pub const K_KUBELET_PROBE: HeaderName = HeaderName::from_static("k-kubelet-probe");
/// Route tag chosen by the ingress.
pub const KNATIVE_SERVING_TAG: HeaderName = HeaderName::from_static("knative-serving-tag");
/// Whether the ingress used the default route.
pub const KNATIVE_SERVING_DEFAULT_ROUTE: HeaderName =
    HeaderName::from_static("knative-serving-default-route");

/// RFC 7239 `Forwarded`.
pub const FORWARDED: HeaderName = HeaderName::from_static("forwarded");
/// De-facto `X-Forwarded-For`.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// De-facto `X-Forwarded-Proto`.
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// De-facto `X-Forwarded-Host`.
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Non-standard hop-by-hop header some clients (curl) still send.
pub const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
/// Hop-by-hop `Keep-Alive`.
pub const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// Fields that are always hop-by-hop, besides those named in `Connection`
/// (at most eight: [`HopFields`] has a bit for each). `Connection` is the
/// first.
pub const HOP_HEADERS: [HeaderName; 8] = [
    CONNECTION,
    PROXY_CONNECTION,
    KEEP_ALIVE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    TE,
    TRANSFER_ENCODING,
    UPGRADE,
];

/// Which of [`HOP_HEADERS`] a message has, one bit each: most messages
/// have none (a gRPC request has `TE` alone).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HopFields(u8);

impl HopFields {
    /// The hop-by-hop fields of `headers`, in one pass over their names.
    pub fn of(headers: &HeaderMap) -> Self {
        let mut present = HopFields::default();
        for name in headers.keys() {
            present.see(name);
        }
        present
    }

    /// Notes `name` if it is one of [`HOP_HEADERS`]; whether it is.
    pub fn see(&mut self, name: &HeaderName) -> bool {
        match HOP_HEADERS.iter().position(|hop| hop == name) {
            Some(i) => {
                self.0 |= 1 << i;
                true
            }
            None => false,
        }
    }

    /// Whether there are none.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether the `i`th of [`HOP_HEADERS`] is there.
    pub fn has(self, i: usize) -> bool {
        self.0 & (1 << i) != 0
    }

    /// Whether `Upgrade` is there.
    pub fn has_upgrade(self) -> bool {
        self.has(HOP_HEADERS.len() - 1)
    }
}

/// The first value of each of `names` in `headers`, as
/// [`HeaderMap::get`] gives it, found in one pass over the fields.
///
/// A request carries a handful of fields, and most of the names the layers
/// ask about are Knative's own, which most requests do not carry: comparing
/// each field's name with a few wanted ones costs less than hashing every
/// wanted name to look it up, with one field as with a dozen.
pub fn first_values<'a, const N: usize>(
    headers: &'a HeaderMap,
    names: [&HeaderName; N],
) -> [Option<&'a HeaderValue>; N] {
    let mut found = [None; N];
    // Each name's first value comes first: `iter` yields a field's values
    // in order, one field after another. Names are compared as names, not
    // as text: a standard name (`Host`) and one of Knative's are told
    // apart by their kind alone, and a standard one is never spelt out.
    for (name, value) in headers {
        for (wanted, slot) in names.iter().zip(found.iter_mut()) {
            if slot.is_none() && name == *wanted {
                *slot = Some(value);
            }
        }
    }
    found
}

/// A header map from name/value pairs, for tests (and, with the
/// `test-util` feature, the tests of the crates above).
#[cfg(any(test, feature = "test-util"))]
pub fn header_map(pairs: &[(&str, &str)]) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).expect("a header name"),
            http::HeaderValue::from_str(v).expect("a header value"),
        );
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::USER_AGENT;

    #[test]
    fn first_values_are_what_get_gives() {
        let headers = header_map(&[
            ("x-forwarded-for", "a"),
            ("host", "h"),
            ("K-Network-Probe", "probe"),
            ("x-forwarded-for", "b"),
            ("user-agent", "kube-probe/1.30"),
            ("k-network-probe", "queue"),
        ]);
        let names = [
            &X_FORWARDED_FOR,
            &K_NETWORK_PROBE,
            &USER_AGENT,
            &K_ORIGINAL_HOST,
            &http::header::HOST,
        ];
        let found = first_values(&headers, names);
        for (name, value) in names.iter().zip(found) {
            assert_eq!(value, headers.get(*name), "{name}");
        }
        assert_eq!(found[0].map(HeaderValue::as_bytes), Some(&b"a"[..]));
        assert_eq!(found[3], None);
        assert_eq!(first_values(&HeaderMap::new(), [&USER_AGENT]), [None]);
    }
}
