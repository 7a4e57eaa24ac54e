//! What the layers need to know about a request, found in one pass over
//! its fields where the request comes in, and carried with it.
//!
//! A request's fields are read here and nowhere else to decide what it
//! is: whether it is a probe and of which kind, whether the activator
//! sent it, whether it names a route, carries `K-Original-Host`, the
//! forwarding fields, asks for an upgrade or has hop-by-hop fields. Each
//! layer then reads an answer instead of walking the fields again.
//!
//! [`Facts`] describe the head **as received**: a layer that edits a field
//! does not update them. That holds because no layer reads a fact that a
//! layer before it changes: the `Forwarded` shim adds `Forwarded`, the host
//! rewrite removes `K-Original-Host`, tracing adds its context, and none
//! adds or removes a hop-by-hop field or the activator's routing fields
//! before the proxy reads them.
//!
//! Where Knative reads a field with `Header.Get`, the first value is the
//! one that counts; so it is here.

use http::header::{HeaderName, HeaderValue, USER_AGENT};
use http::{HeaderMap, Request};

use crate::headers::{
    FORWARDED, HopFields, K_KUBELET_PROBE, K_NETWORK_PROBE, K_ORIGINAL_HOST, K_PROXY_REQUEST,
    KNATIVE_SERVING_DEFAULT_ROUTE, KNATIVE_SERVING_NAMESPACE, KNATIVE_SERVING_REVISION,
    KNATIVE_SERVING_TAG, X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO,
};

/// `User-Agent` prefix of kubelet probes.
pub const KUBE_PROBE_UA_PREFIX: &[u8] = b"kube-probe/";
/// `User-Agent` prefixes of health checks: the kubelet's, the activator's
/// and the autoscaler's.
const HEALTH_CHECK_UA_PREFIXES: [&[u8]; 3] = [
    KUBE_PROBE_UA_PREFIX,
    b"Knative-Activator-Probe",
    b"Knative-Autoscaling-Probe",
];
/// `K-Network-Probe` value of network probes.
const PROBE: &[u8] = b"probe";
/// `K-Proxy-Request` value of requests the activator proxied.
const ACTIVATOR: &[u8] = b"activator";

/// One bit per fact.
mod bit {
    /// The first `User-Agent` starts with `kube-probe/`.
    pub(super) const KUBE_PROBE_AGENT: u16 = 1 << 0;
    /// The first `User-Agent` is a health checker's.
    pub(super) const HEALTH_AGENT: u16 = 1 << 1;
    /// The first `K-Kubelet-Probe` is not empty.
    pub(super) const KUBELET_FIELD: u16 = 1 << 2;
    /// The first `K-Network-Probe` is not empty.
    pub(super) const NETWORK_FIELD: u16 = 1 << 3;
    /// The first `K-Network-Probe` is `probe`.
    pub(super) const NETWORK_PROBE: u16 = 1 << 4;
    /// The first `K-Proxy-Request` is `activator`.
    pub(super) const ACTIVATOR: u16 = 1 << 5;
    /// A `K-Original-Host` is there.
    pub(super) const ORIGINAL_HOST: u16 = 1 << 6;
    /// A `Knative-Serving-Tag` or `Knative-Serving-Default-Route` is there.
    pub(super) const ROUTE: u16 = 1 << 7;
    /// The first `Forwarded` is not empty.
    pub(super) const FORWARDED: u16 = 1 << 8;
    /// The first value of one of the `X-Forwarded-*` fields is not empty.
    pub(super) const X_FORWARDED: u16 = 1 << 9;
    /// `Knative-Serving-Revision` or `Knative-Serving-Namespace` is there.
    pub(super) const ACTIVATOR_ROUTING: u16 = 1 << 10;
}

/// What a request is, as the layers ask; see the [module docs](self).
///
/// Four bytes, copied with the request's body, so carrying it costs no
/// allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Facts {
    bits: u16,
    hop: HopFields,
}

/// How a request is a probe, as knative.dev/networking decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// Not a probe.
    No,
    /// A network probe: any non-empty `K-Network-Probe`.
    Network,
    /// A kubelet probe: a `kube-probe/` user agent or any non-empty
    /// `K-Kubelet-Probe`.
    Kubelet,
}

/// What a request is to the health layer, which answers health checks and
/// network probes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthKind {
    /// A health check, told by its user agent alone (the kubelet's, the
    /// activator's or the autoscaler's).
    HealthCheck,
    /// A network probe: `K-Network-Probe: probe`.
    NetworkProbe,
    /// Anything else, on its way to the app.
    Other,
}

impl Facts {
    /// The facts of a head with these fields, in one pass.
    pub fn of(headers: &HeaderMap) -> Self {
        let mut builder = FactsBuilder::default();
        for (name, value) in headers {
            builder.see(name, value);
        }
        builder.facts
    }

    fn has(self, bit: u16) -> bool {
        self.bits & bit != 0
    }

    /// Whether, and how, Knative counts the request as a probe (kept out
    /// of request metrics, stats and, unless asked, request logs).
    pub fn probe(self) -> ProbeKind {
        if self.has(bit::KUBE_PROBE_AGENT | bit::KUBELET_FIELD) {
            ProbeKind::Kubelet
        } else if self.has(bit::NETWORK_FIELD) {
            ProbeKind::Network
        } else {
            ProbeKind::No
        }
    }

    /// Whether the request is any probe.
    pub fn is_probe(self) -> bool {
        self.probe() != ProbeKind::No
    }

    /// Whether the request is a kubelet probe.
    pub fn is_kubelet_probe(self) -> bool {
        self.probe() == ProbeKind::Kubelet
    }

    /// What the request is to the health layer: Knative's drainer has a
    /// rule of its own, by user agent first.
    pub fn health(self) -> HealthKind {
        if self.has(bit::HEALTH_AGENT) {
            HealthKind::HealthCheck
        } else if self.has(bit::NETWORK_PROBE) {
            HealthKind::NetworkProbe
        } else {
            HealthKind::Other
        }
    }

    /// Whether the activator proxied the request (`K-Proxy-Request:
    /// activator`).
    pub fn activator_proxied(self) -> bool {
        self.has(bit::ACTIVATOR)
    }

    /// Whether the request carries `K-Original-Host`.
    pub fn has_original_host(self) -> bool {
        self.has(bit::ORIGINAL_HOST)
    }

    /// Whether the request names a route (`Knative-Serving-Tag` or
    /// `Knative-Serving-Default-Route`); when it does not, its route tag
    /// is the default one without a look at the fields.
    pub fn names_route(self) -> bool {
        self.has(bit::ROUTE)
    }

    /// Whether Knative's `Forwarded` shim has work to do: no `Forwarded`,
    /// and one of the `X-Forwarded-*` fields.
    pub fn wants_forwarded(self) -> bool {
        self.bits & (bit::FORWARDED | bit::X_FORWARDED) == bit::X_FORWARDED
    }

    /// Whether the request carries the activator's routing fields
    /// (`Knative-Serving-Revision`, `Knative-Serving-Namespace`).
    pub fn has_activator_routing(self) -> bool {
        self.has(bit::ACTIVATOR_ROUTING)
    }

    /// The hop-by-hop fields the request has.
    pub fn hop(self) -> HopFields {
        self.hop
    }

    /// Whether the request has an `Upgrade` field.
    pub fn has_upgrade(self) -> bool {
        self.hop.has_upgrade()
    }
}

/// Builds [`Facts`] from a head's fields, seen one at a time in order.
#[derive(Debug, Default)]
struct FactsBuilder {
    facts: Facts,
    /// The names whose first value has been seen, one bit each.
    seen: u16,
}

/// Names whose first value alone counts, one bit each in `seen`.
mod first {
    pub(super) const USER_AGENT: u16 = 1 << 0;
    pub(super) const KUBELET: u16 = 1 << 1;
    pub(super) const NETWORK: u16 = 1 << 2;
    pub(super) const PROXY_REQUEST: u16 = 1 << 3;
    pub(super) const FORWARDED: u16 = 1 << 4;
    pub(super) const X_FORWARDED_FOR: u16 = 1 << 5;
    pub(super) const X_FORWARDED_PROTO: u16 = 1 << 6;
    pub(super) const X_FORWARDED_HOST: u16 = 1 << 7;
}

impl FactsBuilder {
    /// Notes the field `name: value`.
    fn see(&mut self, name: &HeaderName, value: &HeaderValue) {
        if self.facts.hop.see(name) {
            return;
        }
        if name == USER_AGENT {
            if self.first(first::USER_AGENT) {
                let ua = value.as_bytes();
                if ua.starts_with(KUBE_PROBE_UA_PREFIX) {
                    self.facts.bits |= bit::KUBE_PROBE_AGENT | bit::HEALTH_AGENT;
                } else if HEALTH_CHECK_UA_PREFIXES.iter().any(|p| ua.starts_with(p)) {
                    self.facts.bits |= bit::HEALTH_AGENT;
                }
            }
        } else if name.as_str().len() > 8 {
            // Every other name asked about is longer than eight letters;
            // most fields a request carries (`Host`, `Accept`) are not.
            self.see_long(name, value);
        }
    }

    fn see_long(&mut self, name: &HeaderName, value: &HeaderValue) {
        let value = value.as_bytes();
        let non_empty = !value.is_empty();
        if name == K_KUBELET_PROBE {
            self.first_sets(first::KUBELET, non_empty, bit::KUBELET_FIELD);
        } else if name == K_NETWORK_PROBE {
            if self.first(first::NETWORK) {
                self.set(non_empty, bit::NETWORK_FIELD);
                self.set(value == PROBE, bit::NETWORK_PROBE);
            }
        } else if name == K_PROXY_REQUEST {
            self.first_sets(first::PROXY_REQUEST, value == ACTIVATOR, bit::ACTIVATOR);
        } else if name == K_ORIGINAL_HOST {
            self.facts.bits |= bit::ORIGINAL_HOST;
        } else if name == KNATIVE_SERVING_TAG || name == KNATIVE_SERVING_DEFAULT_ROUTE {
            self.facts.bits |= bit::ROUTE;
        } else if name == FORWARDED {
            self.first_sets(first::FORWARDED, non_empty, bit::FORWARDED);
        } else if name == X_FORWARDED_FOR {
            self.first_sets(first::X_FORWARDED_FOR, non_empty, bit::X_FORWARDED);
        } else if name == X_FORWARDED_PROTO {
            self.first_sets(first::X_FORWARDED_PROTO, non_empty, bit::X_FORWARDED);
        } else if name == X_FORWARDED_HOST {
            self.first_sets(first::X_FORWARDED_HOST, non_empty, bit::X_FORWARDED);
        } else if name == KNATIVE_SERVING_REVISION || name == KNATIVE_SERVING_NAMESPACE {
            self.facts.bits |= bit::ACTIVATOR_ROUTING;
        }
    }

    /// Whether this is the first value of the name `first`, noting it.
    fn first(&mut self, first: u16) -> bool {
        let is_first = self.seen & first == 0;
        self.seen |= first;
        is_first
    }

    fn set(&mut self, when: bool, bit: u16) {
        if when {
            self.facts.bits |= bit;
        }
    }

    fn first_sets(&mut self, first: u16, when: bool, bit: u16) {
        if self.first(first) {
            self.set(when, bit);
        }
    }
}

/// A request body that carries its request's [`Facts`].
pub trait HasFacts: Sized {
    /// The facts of `req`.
    fn facts(req: &Request<Self>) -> Facts;
}

/// Test requests with no body read their facts from their fields, by the
/// same rule.
#[cfg(any(test, feature = "test-util"))]
impl HasFacts for () {
    fn facts(req: &Request<()>) -> Facts {
        Facts::of(req.headers())
    }
}

#[cfg(any(test, feature = "test-util"))]
impl HasFacts for http_body_util::Empty<bytes::Bytes> {
    fn facts(req: &Request<Self>) -> Facts {
        Facts::of(req.headers())
    }
}

/// The facts of `req`, whatever its body.
pub fn facts<B: HasFacts>(req: &Request<B>) -> Facts {
    B::facts(req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::header_map;

    fn of(pairs: &[(&str, &str)]) -> Facts {
        Facts::of(&header_map(pairs))
    }

    #[test]
    fn probes_are_told_by_their_first_fields() {
        assert_eq!(
            of(&[("user-agent", "kube-probe/1")]).probe(),
            ProbeKind::Kubelet
        );
        assert_eq!(of(&[("k-kubelet-probe", "1")]).probe(), ProbeKind::Kubelet);
        assert_eq!(of(&[("k-kubelet-probe", "")]).probe(), ProbeKind::No);
        assert_eq!(of(&[("user-agent", "curl")]).probe(), ProbeKind::No);
        // The case of a user agent counts.
        assert_eq!(of(&[("user-agent", "Kube-Probe/1")]).probe(), ProbeKind::No);
        assert_eq!(
            of(&[("k-network-probe", "queue")]).probe(),
            ProbeKind::Network
        );
        assert_eq!(of(&[("host", "a")]).probe(), ProbeKind::No);
        // Only a name's first value counts, as Go's `Header.Get` reads it.
        assert_eq!(
            of(&[("user-agent", "curl"), ("user-agent", "kube-probe/1")]).probe(),
            ProbeKind::No
        );
        assert_eq!(
            of(&[("k-network-probe", ""), ("k-network-probe", "probe")]).probe(),
            ProbeKind::No
        );
        assert_eq!(
            of(&[("k-kubelet-probe", "1"), ("k-kubelet-probe", "")]).probe(),
            ProbeKind::Kubelet
        );
    }

    #[test]
    fn health_checks_are_told_by_user_agent_alone() {
        for ua in [
            "kube-probe/1.29",
            "Knative-Activator-Probe",
            "Knative-Autoscaling-Probe/1",
        ] {
            assert_eq!(of(&[("user-agent", ua)]).health(), HealthKind::HealthCheck);
        }
        for other in [
            of(&[("user-agent", "curl/8"), ("k-kubelet-probe", "1")]),
            of(&[("user-agent", "Kube-Probe/1.29")]),
            of(&[("k-network-probe", "queue")]),
            of(&[("k-network-probe", "Probe")]),
        ] {
            assert_eq!(other.health(), HealthKind::Other);
        }
        assert_eq!(
            of(&[("k-network-probe", "probe")]).health(),
            HealthKind::NetworkProbe
        );
        // A health check's user agent wins over a network probe header.
        assert_eq!(
            of(&[("user-agent", "kube-probe/1"), ("k-network-probe", "probe")]).health(),
            HealthKind::HealthCheck
        );
        // An activator health check is not a kubelet probe.
        assert!(!of(&[("user-agent", "Knative-Activator-Probe")]).is_probe());
    }

    #[test]
    fn the_other_facts() {
        let none = of(&[("host", "a"), ("accept", "*/*"), ("user-agent", "h2load")]);
        assert_eq!(none, Facts::default());
        assert!(of(&[("k-proxy-request", "activator")]).activator_proxied());
        assert!(!of(&[("k-proxy-request", "Activator")]).activator_proxied());
        assert!(
            !of(&[("k-proxy-request", "x"), ("k-proxy-request", "activator")]).activator_proxied()
        );
        // Present, even empty: the rewrite itself skips an empty one.
        assert!(of(&[("k-original-host", "")]).has_original_host());
        assert!(of(&[("knative-serving-tag", "")]).names_route());
        assert!(of(&[("knative-serving-default-route", "true")]).names_route());
        assert!(of(&[("knative-serving-namespace", "ns")]).has_activator_routing());
        assert!(of(&[("knative-serving-revision", "r")]).has_activator_routing());
        assert!(of(&[("x-forwarded-proto", "https")]).wants_forwarded());
        assert!(!of(&[("x-forwarded-for", "")]).wants_forwarded());
        assert!(!of(&[("forwarded", "for=a"), ("x-forwarded-for", "b")]).wants_forwarded());
        // An empty first `Forwarded` is no `Forwarded`, as Knative reads it.
        assert!(
            of(&[
                ("forwarded", ""),
                ("forwarded", "for=a"),
                ("x-forwarded-for", "b")
            ])
            .wants_forwarded()
        );
        assert!(of(&[("upgrade", "websocket")]).has_upgrade());
        assert!(of(&[("te", "trailers")]).hop() != HopFields::default());
    }
}
