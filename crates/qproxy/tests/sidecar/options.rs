//! qproxy's options through the real binary, in both generations: read
//! from the pod's annotations as the kubelet mounts them (and followed as
//! the kubelet updates them), with defaults from the image's environment;
//! and what each option changes: the request log's `.Response.QueueWait`,
//! upgraded connections past the timeouts, the adaptive limit,
//! `Server-Timing`.

use std::path::Path;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use http::Response;
use hyper::body::Incoming;
use qproxy::config::Generation;
use qproxy_test_support::*;
use tokio_tungstenite::tungstenite::Message;

const BOTH: [Generation; 2] = [Generation::Classic, Generation::Current];

/// A Downward API volume of the pod's annotations, laid out and updated
/// as the kubelet does: the visible `annotations` is a link through
/// `..data`, which an update points at a fresh directory by a rename.
struct PodInfo {
    dir: tempfile::TempDir,
    version: usize,
}

impl PodInfo {
    /// A volume holding `annotations`, one `key="value"` line each.
    fn new(annotations: &str) -> Self {
        let mut podinfo = PodInfo {
            dir: tempfile::tempdir().unwrap(),
            version: 0,
        };
        podinfo.update(annotations);
        std::os::unix::fs::symlink("..data/annotations", podinfo.path().join("annotations"))
            .unwrap();
        podinfo
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Replaces the annotations as the kubelet does.
    fn update(&mut self, annotations: &str) {
        self.version += 1;
        let data = format!("..2026_11_28_00_00_00.{}", self.version);
        std::fs::create_dir(self.path().join(&data)).unwrap();
        std::fs::write(self.path().join(&data).join("annotations"), annotations).unwrap();
        let tmp = self.path().join("..data_tmp");
        std::os::unix::fs::symlink(&data, &tmp).unwrap();
        std::fs::rename(&tmp, self.path().join("..data")).unwrap();
    }

    fn var(&self) -> (&'static str, String) {
        ("QPROXY_PODINFO_DIR", self.path().display().to_string())
    }
}

/// The template of these tests: the queue's wait, which exists only with
/// the `request-log-queue-wait` option.
const WAIT_TEMPLATE: &str = "RL {{.Response.QueueWait}}";
const WAIT_ON: &str = "autoscaling.knative.dev/target=\"1\"\n\
    features.knative.dev/queueproxy-podinfo=\"enabled\"\n\
    qpoption.knative.dev/qproxy-request-log-queue-wait=\"on\"";
const WAIT_OFF: &str = "qpoption.knative.dev/qproxy-request-log-queue-wait=\"off\"";
/// The start of the line Knative writes when a template fails: what a
/// template reading the wait gives without the option.
const INVALID: &str = "Invalid request log template: method: GET, response code: 200";

/// The environment of `generation` in front of `port`, logging requests
/// with `template`, the pod's annotations in `podinfo`, and `extra` set.
fn env(
    generation: Generation,
    port: u16,
    template: &str,
    podinfo: &PodInfo,
    extra: &[(&str, &str)],
) -> Vec<(String, String)> {
    let (name, dir) = podinfo.var();
    let env = with_vars(
        request_log_env(generation, port, template, false),
        &[(name, &dir)],
    );
    with_vars(env, extra)
}

/// Sends one request, and returns its log line: `RL <wait>`, or
/// Knative's line for a failed template.
async fn logged(qp: &QProxy, nth: usize) -> String {
    text(h1(qp.main, get("/", &[])).await).await;
    until(&format!("request log line {nth}"), async || {
        let lines: Vec<String> = qp
            .raw_lines()
            .into_iter()
            .filter(|l| l.starts_with("RL ") || l.starts_with("Invalid request log template"))
            .collect();
        lines.get(nth).cloned().ok_or(lines)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_annotation_turns_an_option_on_and_its_update_off_again() {
    for generation in BOTH {
        let app = App::hello().await;
        let mut podinfo = PodInfo::new(WAIT_ON);
        let qp = QProxy::start_env(&env(generation, app.port(), WAIT_TEMPLATE, &podinfo, &[]));
        qp.wait_for_log("the options logged", |l| {
            l["message"] == "qproxy options on" && l["options"] == "request-log-queue-wait"
        });
        assert_eq!(logged(&qp, 0).await, "RL 0", "{generation:?}");

        podinfo.update(WAIT_OFF);
        qp.wait_for_log("the change logged", |l| {
            l["message"] == "qproxy options changed" && l["options"] == "none"
        });
        let line = logged(&qp, 1).await;
        assert!(line.starts_with(INVALID), "{generation:?}: {line}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_image_s_default_is_overridden_by_an_annotation() {
    let app = App::hello().await;
    let default_on = [("QPROXY_OPTION_REQUEST_LOG_QUEUE_WAIT", "on")];
    // No annotations mounted: the default holds.
    let none = tempfile::tempdir().unwrap();
    let env_none = with_vars(
        request_log_env(Generation::Classic, app.port(), WAIT_TEMPLATE, false),
        &[
            ("QPROXY_PODINFO_DIR", none.path().to_str().unwrap()),
            default_on[0],
        ],
    );
    let qp = QProxy::start_env(&env_none);
    assert_eq!(logged(&qp, 0).await, "RL 0");
    drop(qp);
    // An annotation turns it off for this revision.
    let podinfo = PodInfo::new(WAIT_OFF);
    let qp = QProxy::start_env(&env(
        Generation::Classic,
        app.port(),
        WAIT_TEMPLATE,
        &podinfo,
        &default_on,
    ));
    let line = logged(&qp, 0).await;
    assert!(line.starts_with(INVALID), "{line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_annotation_is_one_warning_and_the_default() {
    let app = App::hello().await;
    let podinfo = PodInfo::new(
        "qpoption.knative.dev/qproxy-request-log-queue-wait=\"sometimes\"\n\
         qpoption.knative.dev/qproxy-go-faster=\"on\"",
    );
    let qp = QProxy::start_env(&env(
        Generation::Current,
        app.port(),
        WAIT_TEMPLATE,
        &podinfo,
        &[],
    ));
    for (what, text) in [
        (
            "the bad value",
            "qproxy-request-log-queue-wait=\"sometimes\"",
        ),
        (
            "the unknown option",
            "qproxy-go-faster names no qproxy option",
        ),
    ] {
        let line = qp.wait_for_log(what, |l| {
            l["message"].as_str().is_some_and(|m| m.contains(text))
        });
        assert_eq!(line["severity"], "WARNING", "{line}");
    }
    let line = logged(&qp, 0).await;
    assert!(line.starts_with(INVALID), "{line}");
}

#[test]
fn a_bad_default_stops_the_start_with_one_line_naming_it() {
    let env = with_vars(
        knative_env(8080),
        &[("QPROXY_OPTION_UPGRADES_OUTLIVE_TIMEOUTS", "maybe")],
    );
    let out = run_to_exit(&env);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("QPROXY_OPTION_UPGRADES_OUTLIVE_TIMEOUTS=\"maybe\" is invalid"),
        "{stderr}"
    );
}

/// How long [`one_held_one_queued`] holds the first request at the least:
/// the app's time, so that the waits measured have something to show.
const HELD: Duration = Duration::from_millis(100);

/// Two requests through a revision with `containerConcurrency: 1`, in
/// front of an app that holds each request: one request held, a second
/// queued behind it, both let go. The two responses, first then queued,
/// and how long the test saw the second queued while the first was held:
/// the first's time at the app and the second's wait in the queue each
/// contain that span, whatever the machine's pace, so each is at least
/// as long.
async fn one_held_one_queued(
    qp: &QProxy,
    arrived: &mut tokio::sync::mpsc::Receiver<tokio::sync::oneshot::Sender<()>>,
) -> (Response<Incoming>, Response<Incoming>, Duration) {
    let main = qp.main;
    let first = tokio::spawn(async move { h1(main, get("/first", &[])).await });
    let release_first = within("the first request", arrived.recv()).await.unwrap();
    let queued = tokio::spawn(async move { h1(main, get("/queued", &[])).await });
    qp.wait_for_log("the second request queued", |l| {
        l["message"] == "request queued for a slot"
    });
    let queued_since = Instant::now();
    tokio::time::sleep(HELD).await;
    let held = queued_since.elapsed();
    release_first.send(()).unwrap();
    let first = within("the first answer", first).await.unwrap();
    let release_queued = within("the queued request", arrived.recv()).await.unwrap();
    release_queued.send(()).unwrap();
    let queued = within("the queued answer", queued).await.unwrap();
    (first, queued, held)
}

/// `held` in milliseconds, less the microsecond the answers round to.
fn held_ms(held: Duration) -> f64 {
    held.as_secs_f64() * 1e3 - 1e-3
}

#[tokio::test(flavor = "multi_thread")]
async fn the_request_log_reads_the_queue_wait_with_its_option() {
    let template = "RL {{.Request.URL.Path}} {{.Response.QueueWait}}";
    for generation in BOTH {
        let (app, mut arrived) = App::holding("held").await;
        let podinfo = PodInfo::new("qpoption.knative.dev/qproxy-request-log-queue-wait=\"on\"");
        let (name, dir) = podinfo.var();
        let env = with_vars(
            request_log_env(generation, app.port(), template, false),
            &[
                (name, &dir),
                ("CONTAINER_CONCURRENCY", "1"),
                ("SERVING_LOGGING_LEVEL", "debug"),
            ],
        );
        let qp = QProxy::start_env(&env);
        let (first, queued, held) = one_held_one_queued(&qp, &mut arrived).await;
        text(first).await;
        text(queued).await;
        let lines = wait_lines_with("both lines", 2, "RL ", || qp.raw_lines()).await;
        let wait = |path: &str| -> f64 {
            let line = lines
                .iter()
                .find(|l| l.starts_with(&format!("RL {path} ")))
                .unwrap_or_else(|| panic!("{path}: {lines:?}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        assert_eq!(wait("/first"), 0.0, "{generation:?}: {lines:?}");
        assert!(
            wait("/queued") * 1e3 >= held_ms(held),
            "{generation:?}: queued for {held:?} at least: {lines:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn without_its_option_the_queue_wait_is_not_there_as_in_knative() {
    let app = App::hello().await;
    let template = "RL {{.Response.QueueWait}}";
    let qp = QProxy::start_env(&request_log_env(
        Generation::Classic,
        app.port(),
        template,
        false,
    ));
    text(h1(qp.main, get("/", &[])).await).await;
    let lines = wait_lines_with("the error line", 1, "Invalid request log template", || {
        qp.raw_lines()
    })
    .await;
    assert!(
        lines[0].starts_with("Invalid request log template: method: GET, response code: 200"),
        "{lines:?}"
    );
}

/// Sends and reads back pings on `ws` until `long` has passed since
/// `since`: the tunnel stays open and working all that time.
async fn echoes_until(
    ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    since: Instant,
    long: Duration,
) {
    let mut n = 0;
    while since.elapsed() < long {
        n += 1;
        let ping = format!("ping {n}");
        ws.send(Message::text(ping.clone())).await.unwrap();
        let echoed = within("the echo", ws.next()).await.unwrap().unwrap();
        assert_eq!(echoed, Message::text(ping));
        // Pace the pings; the assertion is that each one comes back.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_websocket_outlives_every_timeout_with_its_option_until_the_drain() {
    for generation in BOTH {
        let port = websocket_echo_app().await;
        let podinfo = PodInfo::new("qpoption.knative.dev/qproxy-upgrades-outlive-timeouts=\"on\"");
        let (name, dir) = podinfo.var();
        let env = with_vars(
            knative_env_of(generation, port),
            &[
                (name, dir.as_str()),
                ("REVISION_TIMEOUT_SECONDS", "1"),
                ("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "1"),
                ("REVISION_IDLE_TIMEOUT_SECONDS", "1"),
                ("QPROXY_DRAIN_UPGRADED_SECONDS", "1"),
            ],
        );
        let mut qp = QProxy::start_env(&env);
        let opened = Instant::now();
        let mut ws = websocket(qp.main).await;
        // Three times the longest timeout, talking all along.
        echoes_until(&mut ws, opened, Duration::from_secs(3)).await;
        // Idle past every timeout too (time that has to pass, not a wait
        // for anything): still open.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        ws.send(Message::text("still here")).await.unwrap();
        let echoed = within("the echo", ws.next()).await.unwrap().unwrap();
        assert_eq!(echoed, Message::text("still here"), "{generation:?}");
        // The drain ends it, within its grace period.
        qp.signal("TERM");
        let end = within("the drain closes it", async {
            loop {
                match ws.next().await {
                    Some(Ok(Message::Text(_) | Message::Binary(_))) => continue,
                    other => return other,
                }
            }
        })
        .await;
        assert!(!matches!(end, Some(Ok(Message::Text(_)))), "{end:?}");
        assert!(qp.wait_exit().success(), "{generation:?}");
    }
}

const ADAPTIVE_ON: &str = "features.knative.dev/queueproxy-podinfo=\"enabled\"\n\
    qpextension.knative.dev/qproxy-adaptive-concurrency=\"on\"";
/// The adaptive limit on the user metrics port, with the revision's labels.
fn adaptive_limit(limit: u32) -> String {
    format!(
        "qproxy_adaptive_concurrency_limit{{{REVISION_LABELS},revision_name=\"hello-00001\",\
         service_name=\"hello\"}} {limit}"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn adaptive_concurrency_limits_a_revision_without_one_to_the_probe_s_three_at_first() {
    for generation in BOTH {
        let (app, mut arrived) = App::holding("held").await;
        let podinfo = PodInfo::new(ADAPTIVE_ON);
        let (name, dir) = podinfo.var();
        // Current Knative serves 9091 when its request metrics are
        // Prometheus'.
        let metrics = match generation {
            Generation::Classic => None,
            Generation::Current => Some(r#"{"requestMetrics":{"protocol":"prometheus"}}"#),
        };
        let mut env = with_vars(
            knative_env_of(generation, app.port()),
            &[(name, &dir), ("SERVING_LOGGING_LEVEL", "debug")],
        );
        if let Some(config) = metrics {
            env = with_vars(env, &[("OBSERVABILITY_CONFIG", config)]);
        }
        let qp = QProxy::start_env(&env);
        qp.wait_for_log("the adaptive limit", |l| {
            l["message"]
                == "the concurrency limit follows the app's latency \
                    (qproxy option adaptive-concurrency)"
                && l["probe_limit"] == 3
        });
        let main = qp.main;
        let clients: Vec<_> = (0..5)
            .map(|_| tokio::spawn(async move { text(h1(main, get("/", &[])).await).await }))
            .collect();
        // Three reach the app; the other two wait in qproxy's queue.
        let mut releases = Vec::new();
        for _ in 0..3 {
            releases.push(
                within("a request at the app", arrived.recv())
                    .await
                    .unwrap(),
            );
        }
        qp.wait_for_log("two queued", |l| {
            l["message"] == "request queued for a slot" && l["waiting"] == 2
        });
        let port = qp.metrics.expect("the metrics port");
        scrape_until(port, &adaptive_limit(3)).await;
        // Each one answered lets one more in.
        for _ in 0..2 {
            releases.remove(0).send(()).unwrap();
            releases.push(within("a queued request", arrived.recv()).await.unwrap());
        }
        for release in releases {
            release.send(()).unwrap();
        }
        for client in clients {
            assert_eq!(within("an answer", client).await.unwrap(), "held");
        }
        assert_eq!(app.seen().len(), 5, "{generation:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn adaptive_concurrency_is_read_at_start_and_leaves_a_set_container_concurrency_alone() {
    // Turned on after the start: logged, not applied.
    let app = App::hello().await;
    let mut podinfo = PodInfo::new(WAIT_ON);
    let (name, dir) = podinfo.var();
    let qp = QProxy::start_env(&with_vars(knative_env(app.port()), &[(name, &dir)]));
    qp.wait_for_log("the options logged", |l| {
        l["message"] == "qproxy options on" && l["options"] == "request-log-queue-wait"
    });
    podinfo.update(ADAPTIVE_ON);
    qp.wait_for_log("read at start only", |l| {
        l["message"]
            == "qproxy option adaptive-concurrency is read at start only: \
                it changes with the revision's next pod"
    });
    text(h1(qp.main, get("/", &[])).await).await;
    let metrics = scrape(qp.metrics.expect("the metrics port")).await;
    assert!(!metrics.contains("qproxy_adaptive"), "{metrics}");

    // With containerConcurrency set, the option is one warning and
    // Knative's breaker.
    let podinfo = PodInfo::new(ADAPTIVE_ON);
    let (name, dir) = podinfo.var();
    let qp = QProxy::start_env(&with_vars(
        knative_env(app.port()),
        &[(name, &dir), ("CONTAINER_CONCURRENCY", "2")],
    ));
    qp.wait_for_log("the warning", |l| {
        l["severity"] == "WARNING"
            && l["message"]
                == "qproxy option adaptive-concurrency is ignored: the revision sets \
                    containerConcurrency"
            && l["container_concurrency"] == 2
    });
    qp.wait_for_log("Knative's breaker", |l| {
        l["message"]
            == "Queue container is starting with BreakerParams = queue.BreakerParams{QueueDepth:20, \
                MaxConcurrency:2, InitialCapacity:2}"
    });
    text(h1(qp.main, get("/", &[])).await).await;
    let metrics = scrape(qp.metrics.expect("the metrics port")).await;
    assert!(!metrics.contains("qproxy_adaptive"), "{metrics}");
}

const TIMING_ON: &str = "features.knative.dev/queueproxy-podinfo=\"enabled\"\n\
    qpoption.knative.dev/qproxy-server-timing=\"on\"";

/// The `Server-Timing` fields of a head or trailers.
fn server_timing(headers: &http::HeaderMap) -> Vec<String> {
    headers
        .get_all("server-timing")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

/// The two durations of qproxy's `Server-Timing` field, in milliseconds.
fn durations(field: &str) -> (f64, f64) {
    let (queue, app) = field.split_once(", ").unwrap();
    let ms = |part: &str, name: &str| -> f64 {
        part.strip_prefix(name)
            .and_then(|d| d.strip_prefix(";dur="))
            .unwrap_or_else(|| panic!("{name} in {field}"))
            .parse()
            .unwrap()
    };
    (ms(queue, "qproxy-queue"), ms(app, "app"))
}

#[tokio::test(flavor = "multi_thread")]
async fn server_timing_tells_the_wait_in_the_queue_from_the_app_s_time() {
    for generation in BOTH {
        let (app, mut arrived) = App::holding("held").await;
        let podinfo = PodInfo::new(TIMING_ON);
        let (name, dir) = podinfo.var();
        let limited = [
            ("CONTAINER_CONCURRENCY", "1"),
            ("SERVING_LOGGING_LEVEL", "debug"),
        ];
        let qp = QProxy::start_env(&with_vars(
            with_vars(knative_env_of(generation, app.port()), &limited),
            &[(name, &dir)],
        ));
        let (first, queued, held) = one_held_one_queued(&qp, &mut arrived).await;
        let (first_queue, first_app) = durations(&server_timing(first.headers())[0]);
        let (queued_queue, queued_app) = durations(&server_timing(queued.headers())[0]);
        assert_eq!(first_queue, 0.0, "{generation:?}: a slot was free");
        assert!(
            first_app >= held_ms(held),
            "{generation:?}: held {held:?} at least, {first_app} ms said"
        );
        assert!(
            queued_queue >= held_ms(held),
            "{generation:?}: queued behind the first for {held:?} at least, {queued_queue} ms said"
        );
        assert!(queued_app >= 0.0);
        assert_eq!(text(queued).await, "held");

        // Without the option, nothing: the drop-in's answers.
        let (app, mut arrived) = App::holding("held").await;
        let qp = QProxy::start_env(&with_vars(knative_env_of(generation, app.port()), &limited));
        let (first, queued, _) = one_held_one_queued(&qp, &mut arrived).await;
        assert!(server_timing(first.headers()).is_empty());
        assert!(server_timing(queued.headers()).is_empty());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grpc_call_gets_server_timing_in_its_trailers_too() {
    let app = App::start(|_req| async {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let frames = futures_util::stream::iter([
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(hyper::body::Frame::data(
                bytes::Bytes::from_static(b"\0\0\0\0\0"),
            )),
            Ok(hyper::body::Frame::trailers(trailers)),
        ]);
        Response::builder()
            .header("content-type", "application/grpc")
            .body(http_body_util::BodyExt::boxed(
                http_body_util::StreamBody::new(frames),
            ))
            .unwrap()
    })
    .await;
    for generation in BOTH {
        let podinfo = PodInfo::new(TIMING_ON);
        let (name, dir) = podinfo.var();
        let qp = QProxy::start_env(&with_vars(
            knative_env_of(generation, app.port()),
            &[(name, &dir)],
        ));
        let req = http::Request::post("http://hello.example.com/grpc.health.v1.Health/Check")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(full(&b"\0\0\0\0\0"[..]))
            .unwrap();
        let res = h2(qp.main, req).await;
        assert_eq!(server_timing(res.headers()).len(), 1, "{generation:?}");
        let body = within(
            "the call",
            http_body_util::BodyExt::collect(res.into_body()),
        )
        .await
        .unwrap();
        let trailers = body.trailers().expect("the app's trailers");
        assert_eq!(trailers["grpc-status"], "0");
        let fields = server_timing(trailers);
        assert_eq!(fields.len(), 1, "{generation:?}: {fields:?}");
        assert_eq!(durations(&fields[0]).0, 0.0, "no limit, no wait");
    }
}
