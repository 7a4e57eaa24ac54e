//! Request metrics as classic Knative (serving v0.42) serves them: the
//! Prometheus text on the user metrics port (9091) when
//! `SERVING_REQUEST_METRICS_BACKEND=prometheus`.
//!
//! | metric | type | labels besides the revision's |
//! |---|---|---|
//! | `revision_request_count` | counter | `response_code`, `response_code_class`, `route_tag` |
//! | `revision_request_latencies` | histogram (ms) | same |
//! | `revision_app_request_count` | counter | `response_code`, `response_code_class` |
//! | `revision_app_request_latencies` | histogram (ms) | same |
//! | `revision_queue_depth` | gauge | `response_code=""`, `response_code_class=""` |
//!
//! The revision's labels are `namespace_name`, `service_name` (`unknown`
//! when the revision has no Service), `configuration_name`,
//! `revision_name`, `pod_name` and `container_name` (`queue-proxy`). Names,
//! help texts, label sets and buckets are Knative's; latencies are whole
//! milliseconds, as Knative records them. A series appears once it has
//! something to show, as in Knative.
//!
//! The recorder is [`metrics_exporter_prometheus`]'s, used directly (no
//! global recorder). The label sets of the series in use are built once and
//! their handles cached, so that recording a request is two atomic
//! increments and a histogram sample.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Label, Level, Metadata, Recorder};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use qproxy_core::config::Revision;
use qproxy_core::facts::Facts;

/// Knative's latency buckets, in milliseconds.
pub const LATENCY_BUCKETS: [f64; 26] = [
    5.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 150.0, 200.0, 250.0, 300.0, 350.0, 400.0, 450.0,
    500.0, 600.0, 700.0, 800.0, 900.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0, 50000.0, 100000.0,
];

const REQUEST_COUNT: &str = "revision_request_count";
const REQUEST_LATENCIES: &str = "revision_request_latencies";
const APP_REQUEST_COUNT: &str = "revision_app_request_count";
const APP_REQUEST_LATENCIES: &str = "revision_app_request_latencies";
const QUEUE_DEPTH: &str = "revision_queue_depth";

/// Help texts, as Knative describes its views.
const HELP: [(&str, &str); 5] = [
    (
        REQUEST_COUNT,
        "The number of requests that are routed to queue-proxy",
    ),
    (REQUEST_LATENCIES, "The response time in millisecond"),
    (
        APP_REQUEST_COUNT,
        "The number of requests that are routed to user-container",
    ),
    (APP_REQUEST_LATENCIES, "The response time in millisecond"),
    (
        QUEUE_DEPTH,
        "The number of items queued at this queue proxy.",
    ),
];

/// How often histogram samples are folded into their buckets.
pub const UPKEEP_PERIOD: Duration = Duration::from_secs(1);

static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, None);

/// Where a request is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// As the request reaches the queue-proxy (`revision_request_*`).
    Revision,
    /// As the request goes to the user container (`revision_app_request_*`).
    App,
}

/// The request metrics of one revision's pod; cheap to clone.
#[derive(Clone)]
pub struct OpenCensusMetrics {
    inner: Arc<OpenCensusState>,
}

impl std::fmt::Debug for OpenCensusMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenCensusMetrics").finish_non_exhaustive()
    }
}

struct OpenCensusState {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// The revision's labels, sorted by name with the per-request ones.
    revision: Vec<Label>,
    /// Series by status code and route tag.
    requests: RwLock<HashMap<u16, ByTag>>,
    /// Series by status code.
    app: RwLock<HashMap<u16, Arc<SeriesPair>>>,
    queue_depth: OnceLock<Gauge>,
    /// The series of requests whose route tag Knative cannot use as a
    /// label, and of those past [`MAX_TAGGED_SERIES`].
    untagged: OnceLock<Arc<SeriesPair>>,
    /// The series of almost every request, kept aside so that finding it
    /// hashes nothing and takes no lock: `200` on the default route
    /// (`DISABLED`), and the app's `200`.
    revision_ok: OnceLock<Arc<SeriesPair>>,
    app_ok: OnceLock<Arc<SeriesPair>>,
}

/// SeriesPair of one status code, by route tag.
type ByTag = HashMap<Box<str>, Arc<SeriesPair>>;

/// The most series of requests by response code and route tag kept. The
/// route tag comes from a request header, so a client could otherwise
/// grow the exposition (and qproxy's memory) without bound; past this, a
/// request with a new code and tag is counted in the series with empty
/// labels, as one with an unusable tag is. (Classic Knative's OpenCensus
/// keeps every one; current Knative's SDK keeps 2,000 per instrument.)
const MAX_TAGGED_SERIES: usize = 2000;

/// One series pair: a count and a latency histogram.
#[derive(Debug)]
pub struct SeriesPair {
    count: Counter,
    latency: Histogram,
}

impl SeriesPair {
    /// Counts one request that took `latency`.
    pub fn record(&self, latency: Duration) {
        self.count.increment(1);
        // Whole milliseconds, as Knative records them.
        self.latency.record(latency.as_millis() as f64);
    }
}

impl OpenCensusMetrics {
    /// The metrics of `revision`'s pod.
    pub fn new(revision: &Revision) -> Self {
        let builder = PrometheusBuilder::new();
        let builder =
            [REQUEST_LATENCIES, APP_REQUEST_LATENCIES]
                .into_iter()
                .fold(builder, |b, name| {
                    b.set_buckets_for_metric(Matcher::Full(name.to_owned()), &LATENCY_BUCKETS)
                        .unwrap_or_else(|_| unreachable!("the buckets are not empty"))
                });
        let recorder = builder.build_recorder();
        for (name, help) in HELP {
            let key = KeyName::from_const_str(name);
            match name {
                REQUEST_COUNT | APP_REQUEST_COUNT => {
                    recorder.describe_counter(key, None, help.into())
                }
                QUEUE_DEPTH => recorder.describe_gauge(key, None, help.into()),
                _ => recorder.describe_histogram(key, None, help.into()),
            }
        }
        let service = if revision.service.is_empty() {
            "unknown".to_owned()
        } else {
            revision.service.clone()
        };
        let revision = vec![
            Label::new("configuration_name", revision.configuration.clone()),
            Label::new("container_name", "queue-proxy"),
            Label::new("namespace_name", revision.namespace.clone()),
            Label::new("pod_name", revision.pod.clone()),
            Label::new("revision_name", revision.name.clone()),
            Label::new("service_name", service),
        ];
        Self {
            inner: Arc::new(OpenCensusState {
                handle: recorder.handle(),
                recorder,
                revision,
                requests: RwLock::new(HashMap::new()),
                app: RwLock::new(HashMap::new()),
                queue_depth: OnceLock::new(),
                untagged: OnceLock::new(),
                revision_ok: OnceLock::new(),
                app_ok: OnceLock::new(),
            }),
        }
    }

    /// The series a request of `scope` answered with `status` (and routed
    /// by `route_tag`, for [`Scope::Revision`]) is counted in. Looking up a
    /// series in use takes a read lock and allocates nothing; the
    /// series of a `200` on the default route, or of the app's `200`, not
    /// even that.
    pub fn series(&self, scope: Scope, status: u16, route_tag: &str) -> Arc<SeriesPair> {
        let inner = &self.inner;
        let hot = match scope {
            _ if status != 200 => None,
            Scope::Revision if route_tag == DEFAULT_ROUTE_TAG => Some(&inner.revision_ok),
            Scope::Revision => None,
            Scope::App => Some(&inner.app_ok),
        };
        match hot {
            // The same series the maps hold (or, past the cap, the
            // untagged one): neither map ever forgets an entry.
            Some(hot) => hot
                .get_or_init(|| self.find_series(scope, status, route_tag))
                .clone(),
            None => self.find_series(scope, status, route_tag),
        }
    }

    /// [`Self::series`], looked up in (or added to) the maps.
    fn find_series(&self, scope: Scope, status: u16, route_tag: &str) -> Arc<SeriesPair> {
        let inner = &self.inner;
        match scope {
            Scope::Revision if !is_label_value(route_tag) => inner.untagged(),
            Scope::Revision => {
                let found = read(&inner.requests)
                    .get(&status)
                    .and_then(|by_tag| by_tag.get(route_tag))
                    .cloned();
                found.unwrap_or_else(|| {
                    let mut all = write(&inner.requests);
                    if let Some(series) = all.get(&status).and_then(|t| t.get(route_tag)) {
                        return series.clone();
                    }
                    if all.values().map(HashMap::len).sum::<usize>() >= MAX_TAGGED_SERIES {
                        return inner.untagged();
                    }
                    let series =
                        inner.register(REQUEST_COUNT, REQUEST_LATENCIES, status, Some(route_tag));
                    let series = Arc::new(series);
                    all.entry(status)
                        .or_default()
                        .insert(route_tag.into(), series.clone());
                    series
                })
            }
            Scope::App => {
                let found = read(&inner.app).get(&status).cloned();
                found.unwrap_or_else(|| {
                    let mut all = write(&inner.app);
                    all.entry(status)
                        .or_insert_with(|| {
                            let series = inner.register(
                                APP_REQUEST_COUNT,
                                APP_REQUEST_LATENCIES,
                                status,
                                None,
                            );
                            Arc::new(series)
                        })
                        .clone()
                })
            }
        }
    }

    /// Sets the queue depth: the requests inside the breaker.
    pub fn set_queue_depth(&self, depth: u32) {
        let inner = &self.inner;
        let gauge = inner.queue_depth.get_or_init(|| {
            let labels = inner.labels([
                ("response_code", String::new()),
                ("response_code_class", String::new()),
            ]);
            inner
                .recorder
                .register_gauge(&Key::from_parts(QUEUE_DEPTH, labels), &METADATA)
        });
        gauge.set(f64::from(depth));
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        self.inner.handle.render()
    }

    /// Folds recorded histogram samples into their buckets; run every
    /// [`UPKEEP_PERIOD`] so that samples do not pile up between scrapes.
    pub fn run_upkeep(&self) {
        self.inner.handle.run_upkeep();
    }
}

pub(super) fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

pub(super) fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

impl OpenCensusState {
    /// The series of requests counted without their response code and
    /// route tag.
    fn untagged(&self) -> Arc<SeriesPair> {
        self.untagged
            .get_or_init(|| {
                let labels = self.labels([
                    ("response_code", String::new()),
                    ("response_code_class", String::new()),
                    ("route_tag", String::new()),
                ]);
                Arc::new(self.series_of(REQUEST_COUNT, REQUEST_LATENCIES, labels))
            })
            .clone()
    }

    fn register(
        &self,
        count: &'static str,
        latency: &'static str,
        status: u16,
        route_tag: Option<&str>,
    ) -> SeriesPair {
        let mut extra = vec![
            ("response_code", status.to_string()),
            ("response_code_class", format!("{}xx", status / 100)),
        ];
        if let Some(tag) = route_tag {
            extra.push(("route_tag", tag.to_owned()));
        }
        self.series_of(count, latency, self.labels(extra))
    }

    fn series_of(
        &self,
        count: &'static str,
        latency: &'static str,
        labels: Vec<Label>,
    ) -> SeriesPair {
        SeriesPair {
            count: self
                .recorder
                .register_counter(&Key::from_parts(count, labels.clone()), &METADATA),
            latency: self
                .recorder
                .register_histogram(&Key::from_parts(latency, labels), &METADATA),
        }
    }

    /// The revision's labels and `extra`, sorted by name as Knative's
    /// exposition sorts them.
    fn labels(&self, extra: impl IntoIterator<Item = (&'static str, String)>) -> Vec<Label> {
        let mut labels = self.revision.clone();
        labels.extend(extra.into_iter().map(|(k, v)| Label::new(k, v)));
        labels.sort_by(|a, b| a.key().cmp(b.key()));
        labels
    }
}

/// Whether `value` can be a label value, as OpenCensus (under classic
/// Knative) decides: at most 255 printable ASCII characters. A request
/// whose route tag cannot is counted with its response code, class and
/// tag all empty, as Knative counts it; so a client cannot grow a series
/// without bound with one long header.
fn is_label_value(value: &str) -> bool {
    value.len() <= 255 && value.bytes().all(|b| (b' '..=b'~').contains(&b))
}

/// The route tag label of a request that names no route: what almost
/// every request is counted under.
const DEFAULT_ROUTE_TAG: &str = "DISABLED";

/// The route tag label of a request Knative measures, as Knative names it
/// (allocating only for a named tag), or `None` for a probe, which is not
/// measured. The fields are read only when the request names a route.
pub fn route_tag_unless_probe(
    facts: Facts,
    headers: &http::HeaderMap,
) -> Option<Cow<'static, str>> {
    use qproxy_core::headers::{KNATIVE_SERVING_DEFAULT_ROUTE, KNATIVE_SERVING_TAG, first_values};
    if facts.is_probe() {
        return None;
    }
    if !facts.names_route() {
        return Some(Cow::Borrowed(DEFAULT_ROUTE_TAG));
    }
    let [tag, default_route] = first_values(
        headers,
        [&KNATIVE_SERVING_TAG, &KNATIVE_SERVING_DEFAULT_ROUTE],
    )
    .map(|v| v.map_or(&b""[..], |v| v.as_bytes()));
    Some(match (tag.is_empty(), default_route) {
        (true, b"") => Cow::Borrowed(DEFAULT_ROUTE_TAG),
        (true, _) => Cow::Borrowed("DEFAULT"),
        (false, b"true") => Cow::Borrowed("UNDEFINED"),
        (false, _) => Cow::Owned(String::from_utf8_lossy(tag).into_owned()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use qproxy_core::headers::header_map;

    fn revision() -> Revision {
        Revision {
            namespace: "default".into(),
            service: String::new(),
            configuration: "hello".into(),
            name: "hello-00001".into(),
            pod: "pod1".into(),
            pod_ip: "127.0.0.1".into(),
        }
    }

    #[test]
    fn route_tags_follow_knative() {
        let tag = |pairs: &[(&str, &str)]| {
            let headers = header_map(pairs);
            route_tag_unless_probe(Facts::of(&headers), &headers)
                .expect("not a probe")
                .into_owned()
        };
        assert_eq!(tag(&[]), "DISABLED");
        assert_eq!(
            tag(&[("knative-serving-default-route", "false")]),
            "DEFAULT"
        );
        assert_eq!(tag(&[("knative-serving-tag", "blue")]), "blue");
        assert_eq!(
            tag(&[
                ("knative-serving-tag", "blue"),
                ("knative-serving-default-route", "true")
            ]),
            "UNDEFINED"
        );
    }

    #[test]
    fn probes_have_no_route_tag_as_is_probe_decides() {
        for pairs in [
            &[("user-agent", "kube-probe/1.30")][..],
            &[("k-kubelet-probe", "queue")],
            &[
                ("k-network-probe", "probe"),
                ("knative-serving-tag", "blue"),
            ],
            &[("k-network-probe", "")],
            &[("user-agent", "curl/8"), ("knative-serving-tag", "blue")],
        ] {
            let headers = header_map(pairs);
            let facts = Facts::of(&headers);
            assert_eq!(
                route_tag_unless_probe(facts, &headers).is_none(),
                facts.is_probe(),
                "{pairs:?}"
            );
        }
    }

    #[test]
    fn tags_past_the_limit_share_the_series_with_empty_labels() {
        let m = OpenCensusMetrics::new(&revision());
        let kept: Vec<_> = (0..MAX_TAGGED_SERIES)
            .map(|i| m.series(Scope::Revision, 200, &format!("t{i}")))
            .collect();
        let untagged = m.series(Scope::Revision, 200, &"x".repeat(256));
        let past = m.series(Scope::Revision, 404, "new");
        assert!(Arc::ptr_eq(&past, &untagged));
        let again = m.series(Scope::Revision, 200, "t7");
        assert!(Arc::ptr_eq(&again, &kept[7]), "a kept series stays");
        past.record(Duration::ZERO);
        let text = m.render();
        assert!(text.contains("response_code=\"\",response_code_class=\"\",revision_name=\"hello-00001\",route_tag=\"\",service_name=\"unknown\"} 1\n"), "{text}");
        assert!(!text.contains("route_tag=\"new\""), "{text}");
    }

    #[test]
    fn the_default_route_s_200_is_the_series_the_maps_hold() {
        let m = OpenCensusMetrics::new(&revision());
        for (scope, tag) in [(Scope::Revision, "DISABLED"), (Scope::App, "")] {
            let hot = m.series(scope, 200, tag);
            assert!(Arc::ptr_eq(&hot, &m.series(scope, 200, tag)));
            assert!(Arc::ptr_eq(&hot, &m.find_series(scope, 200, tag)));
        }
        // Past the cap, it is the untagged series, as the maps would give.
        let full = OpenCensusMetrics::new(&revision());
        for i in 0..MAX_TAGGED_SERIES {
            full.series(Scope::Revision, 200, &format!("t{i}"));
        }
        let untagged = full.series(Scope::Revision, 200, &"x".repeat(256));
        let hot = full.series(Scope::Revision, 200, "DISABLED");
        assert!(Arc::ptr_eq(&hot, &untagged));
    }

    #[test]
    fn unusable_route_tags_share_one_series_with_empty_labels() {
        let m = OpenCensusMetrics::new(&revision());
        let long = "x".repeat(256);
        let a = m.series(Scope::Revision, 200, &long);
        let b = m.series(Scope::Revision, 404, "caf\u{e9}");
        assert!(Arc::ptr_eq(&a, &b));
        a.record(Duration::ZERO);
        b.record(Duration::ZERO);
        let ok = m.series(Scope::Revision, 200, &"x".repeat(255));
        assert!(!Arc::ptr_eq(&a, &ok));
        let text = m.render();
        assert!(text.contains("response_code=\"\",response_code_class=\"\",revision_name=\"hello-00001\",route_tag=\"\",service_name=\"unknown\"} 2\n"), "{text}");
    }

    #[test]
    fn renders_knative_series() {
        let m = OpenCensusMetrics::new(&revision());
        assert_eq!(m.render().trim(), "", "nothing before the first request");
        m.series(Scope::Revision, 200, "DISABLED")
            .record(Duration::from_micros(7_900));
        m.series(Scope::Revision, 200, "DISABLED")
            .record(Duration::from_millis(150));
        m.series(Scope::App, 503, "").record(Duration::ZERO);
        m.set_queue_depth(3);
        let text = m.render();
        let labels = "configuration_name=\"hello\",container_name=\"queue-proxy\",namespace_name=\"default\",pod_name=\"pod1\"";
        assert!(text.contains("# HELP revision_request_count The number of requests that are routed to queue-proxy\n"), "{text}");
        assert!(
            text.contains("# TYPE revision_request_latencies histogram\n"),
            "{text}"
        );
        assert!(text.contains(&format!("revision_request_count{{{labels},response_code=\"200\",response_code_class=\"2xx\",revision_name=\"hello-00001\",route_tag=\"DISABLED\",service_name=\"unknown\"}} 2\n")), "{text}");
        // 7.9 ms counts as 7: bucket 10, not 5; 150 ms in bucket 150.
        let bucket = |le: &str| {
            format!(
                "revision_request_latencies_bucket{{{labels},response_code=\"200\",response_code_class=\"2xx\",revision_name=\"hello-00001\",route_tag=\"DISABLED\",service_name=\"unknown\",le=\"{le}\"}} "
            )
        };
        assert!(text.contains(&(bucket("5") + "0\n")), "{text}");
        assert!(text.contains(&(bucket("10") + "1\n")), "{text}");
        assert!(text.contains(&(bucket("100") + "1\n")), "{text}");
        assert!(text.contains(&(bucket("150") + "2\n")), "{text}");
        assert!(text.contains(&(bucket("+Inf") + "2\n")), "{text}");
        assert!(text.contains("revision_request_latencies_sum{"), "{text}");
        assert!(text.contains(&format!("revision_app_request_count{{{labels},response_code=\"503\",response_code_class=\"5xx\",revision_name=\"hello-00001\",service_name=\"unknown\"}} 1\n")), "{text}");
        assert!(text.contains(&format!("revision_queue_depth{{{labels},response_code=\"\",response_code_class=\"\",revision_name=\"hello-00001\",service_name=\"unknown\"}} 3\n")), "{text}");
    }
}
