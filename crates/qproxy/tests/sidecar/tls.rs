//! The TLS port (`QUEUE_SERVING_TLS_PORT`) with a certificate mounted as
//! Knative mounts it: HTTP/1.1 and HTTP/2 by ALPN and HTTP/2 without it
//! (as the activator speaks), gRPC, rotation through the kubelet's
//! symlink swap under load, a broken pair kept out, each generation's
//! versions and admin port, start-up errors naming the variable, and the
//! drain.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use http::Response;
use qproxy_test_support::tls::{KNATIVE_SERVER_NAME, SecretVolume, TestCa, tls_connect, tls_get};
use qproxy_test_support::*;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::version::{TLS12, TLS13};

const H2_H1: &[&[u8]] = &[b"h2", b"http/1.1"];

/// A file of a secret volume: its name and contents.
type File<'a> = (&'a str, &'a [u8]);

/// A CA, a volume with a pair it signed, and qproxy serving it in front of
/// `app` with `env` (a generation's environment).
struct Setup {
    ca: TestCa,
    volume: SecretVolume,
    qp: QProxy,
}

impl Setup {
    fn start(name: &str, env: Vec<(String, String)>, extra: &[(&str, &str)]) -> Self {
        let ca = TestCa::new(name);
        let (cert, key) = ca.knative_pair();
        let volume = SecretVolume::new(&ca.dir, &cert, &key);
        let dir = volume.dir.to_str().unwrap().to_owned();
        let mut vars = vec![("QPROXY_CERT_DIR", dir.as_str())];
        vars.extend_from_slice(extra);
        let qp = QProxy::start_env(&with_vars(env, &vars));
        assert!(qp.tls.is_some(), "the TLS port is served");
        Setup { ca, volume, qp }
    }

    fn tls(&self) -> SocketAddr {
        self.qp.tls.unwrap()
    }

    fn client(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        self.ca.client_config(alpn, &[&TLS13, &TLS12])
    }
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .as_ref()
        .to_vec()
}

#[tokio::test]
async fn http1_and_http2_over_tls_as_alpn_chooses_and_http2_without_alpn() {
    let app = App::hello().await;
    let s = Setup::start("protocols", knative_env(app.port()), &[]);

    let h2 = tls_get(s.tls(), s.client(H2_H1), "/a", false)
        .await
        .unwrap();
    assert_eq!(h2.alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(h2.status, 200);
    assert_eq!(h2.body, "Hello World!\n");
    assert_eq!(h2.version, Some(rustls::ProtocolVersion::TLSv1_3));

    let h1 = tls_get(s.tls(), s.client(&[b"http/1.1"]), "/b", false)
        .await
        .unwrap();
    assert_eq!(h1.alpn.as_deref(), Some(&b"http/1.1"[..]));
    assert_eq!(
        (h1.status.as_u16(), &h1.body[..]),
        (200, &b"Hello World!\n"[..])
    );

    // The activator offers no ALPN and speaks HTTP/2 at once when it
    // proxies HTTP/2; HTTP/1.1 without ALPN too.
    let activator = tls_get(s.tls(), s.client(&[]), "/c", true).await.unwrap();
    assert_eq!(activator.alpn, None);
    assert_eq!(activator.status, 200);
    let plain = tls_get(s.tls(), s.client(&[]), "/d", false).await.unwrap();
    assert_eq!(plain.status, 200);

    let paths: Vec<String> = app.seen().iter().map(|r| r.uri.path().to_owned()).collect();
    assert_eq!(paths, ["/a", "/b", "/c", "/d"]);
    for seen in app.seen() {
        // HTTP/2 goes on as h2c, the host in the authority.
        let host = match seen.headers.get("host") {
            Some(h) => h.to_str().unwrap().to_owned(),
            None => seen.uri.authority().unwrap().to_string(),
        };
        assert_eq!(host, KNATIVE_SERVER_NAME, "the app sees the host asked for");
    }
    // The main port stays plain.
    let plain = raw_exchange(s.qp.main, b"GET /e HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert!(plain.starts_with("HTTP/1.1 200 OK"), "{plain}");
}

#[tokio::test]
async fn a_connection_alpn_made_http2_speaks_nothing_else() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let app = App::hello().await;
    let s = Setup::start("h2-only", knative_env(app.port()), &[]);
    let mut tls = tls_connect(s.tls(), s.client(H2_H1), KNATIVE_SERVER_NAME)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    tls.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = within("the connection closed", tls.read_to_end(&mut got)).await;
    assert!(
        !got.starts_with(b"HTTP/1.1"),
        "answered HTTP/1.1: {:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(app.seen().is_empty(), "the app saw the request");
}

#[tokio::test]
async fn plain_http_on_the_tls_port_gets_go_s_400() {
    let app = App::hello().await;
    let s = Setup::start("plain", knative_env(app.port()), &[]);
    let got = raw_exchange(s.tls(), b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(
        got,
        "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_over_tls_end_to_end() {
    let port = crate::protocols::grpc_health_app().await;
    let s = Setup::start("grpc", knative_env(port), &[]);
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&s.ca.ca_pem))
        .domain_name(KNATIVE_SERVER_NAME);
    let channel = tonic::transport::Channel::from_shared(format!("https://{}", s.tls()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    crate::protocols::check_grpc_health(channel).await;
}

#[tokio::test]
async fn rotation_under_load_loses_nothing_and_new_handshakes_get_the_new_certificate() {
    let app = App::hello().await;
    let mut s = Setup::start("rotation", knative_env(app.port()), &[]);
    let first = tls_get(s.tls(), s.client(H2_H1), "/", false).await.unwrap();

    // Load: one long-lived HTTP/2 connection and new connections, back to
    // back, until stopped; every answer checked.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let kept = {
        let stream = tls_connect(s.tls(), s.client(&[b"h2"]), KNATIVE_SERVER_NAME)
            .await
            .unwrap();
        let (sender, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let req = http::Request::get(format!("https://{KNATIVE_SERVER_NAME}/kept"))
                    .body(empty())
                    .unwrap();
                match sender.clone().send_request(req).await {
                    Ok(r) if r.status() == 200 => ok.fetch_add(1, Ordering::SeqCst),
                    _ => failed.fetch_add(1, Ordering::SeqCst),
                };
            }
        })
    };
    let fresh = {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        let (addr, client) = (s.tls(), s.client(H2_H1));
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                match tls_get(addr, client.clone(), "/fresh", false).await {
                    Ok(a) if a.status == 200 => ok.fetch_add(1, Ordering::SeqCst),
                    _ => failed.fetch_add(1, Ordering::SeqCst),
                };
            }
        })
    };
    let answered = |what: &'static str, n| {
        let ok = ok.clone();
        async move {
            until(what, async || {
                let answered = ok.load(Ordering::SeqCst);
                if answered >= n { Ok(()) } else { Err(answered) }
            })
            .await
        }
    };
    answered("the load to run", 50).await;

    let (cert, key) = s.ca.knative_pair();
    s.volume
        .update(&[("tls.crt", cert.as_bytes()), ("tls.key", key.as_bytes())]);
    let new = der(&cert);
    assert_ne!(first.leaf, new);
    until("the new certificate served", async || {
        let answer = tls_get(s.tls(), s.client(H2_H1), "/", false).await.unwrap();
        assert!(
            answer.leaf == new || answer.leaf == first.leaf,
            "the old certificate until the new one"
        );
        answer.leaf == new
    })
    .await;
    let before = ok.load(Ordering::SeqCst);
    answered("the load to go on after the swap", before + 50).await;
    stop.store(true, Ordering::SeqCst);
    kept.await.unwrap();
    fresh.await.unwrap();
    assert_eq!(failed.load(Ordering::SeqCst), 0, "no request failed");
    s.qp.wait_for_log("the reload logged", |l| {
        l["message"] == "Certificate and/or key have changed on disk and were reloaded."
    });
}

#[tokio::test]
async fn a_pair_that_does_not_load_keeps_the_previous_one() {
    let app = App::hello().await;
    let mut s = Setup::start("broken", knative_env(app.port()), &[]);
    let first = tls_get(s.tls(), s.client(H2_H1), "/", false).await.unwrap();
    let (cert, key) = s.ca.knative_pair();
    let (_, other_key) = s.ca.knative_pair();

    let broken: [(&str, &[File]); 3] = [
        (
            "a key that is not PEM",
            &[("tls.crt", cert.as_bytes()), ("tls.key", b"not a key")],
        ),
        (
            "a key of another certificate",
            &[
                ("tls.crt", cert.as_bytes()),
                ("tls.key", other_key.as_bytes()),
            ],
        ),
        ("the key missing", &[("tls.crt", cert.as_bytes())]),
    ];
    for (n, (what, files)) in broken.iter().enumerate() {
        s.volume.update(files);
        s.qp.wait_for_logs(what, n + 1, |l| {
            l["severity"] == "ERROR"
                && l["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("cannot reload the TLS certificate"))
        });
        let answer = tls_get(s.tls(), s.client(H2_H1), "/", false).await.unwrap();
        assert_eq!(answer.status, 200, "{what}");
        assert_eq!(answer.leaf, first.leaf, "{what}: the previous pair is kept");
    }

    s.volume
        .update(&[("tls.crt", cert.as_bytes()), ("tls.key", key.as_bytes())]);
    let new = der(&cert);
    until("a good pair served once it comes", async || {
        tls_get(s.tls(), s.client(H2_H1), "/", false)
            .await
            .is_ok_and(|a| a.leaf == new)
    })
    .await;
}

#[tokio::test]
async fn tls_1_3_only_unless_current_knative_allows_1_2() {
    let app = App::hello().await;
    let only12 = |s: &Setup| s.ca.client_config(H2_H1, &[&TLS12]);

    for (generation, env) in [
        ("classic", knative_env(app.port())),
        ("current", current_knative_env(app.port())),
    ] {
        let s = Setup::start(&format!("versions-{generation}"), env, &[]);
        let refused = tls_get(s.tls(), only12(&s), "/", false).await;
        assert!(refused.is_err(), "{generation}: TLS 1.2 refused by default");
        let ok = tls_get(s.tls(), s.client(H2_H1), "/", false).await.unwrap();
        assert_eq!(ok.version, Some(rustls::ProtocolVersion::TLSv1_3));
    }

    let allow12 = [("QUEUE_PROXY_TLS_MIN_VERSION", "1.2")];
    let s = Setup::start("versions-12", current_knative_env(app.port()), &allow12);
    let answer = tls_get(s.tls(), only12(&s), "/", false).await.unwrap();
    assert_eq!(answer.version, Some(rustls::ProtocolVersion::TLSv1_2));
    assert_eq!(answer.status, 200);
    // Classic Knative has no such setting: TLS 1.3 only whatever is set.
    let s = Setup::start("versions-classic-12", knative_env(app.port()), &allow12);
    assert!(tls_get(s.tls(), only12(&s), "/", false).await.is_err());

    let max12 = [
        ("QUEUE_PROXY_TLS_MIN_VERSION", "1.2"),
        ("QUEUE_PROXY_TLS_MAX_VERSION", "1.2"),
    ];
    let s = Setup::start("versions-max-12", current_knative_env(app.port()), &max12);
    let answer = tls_get(s.tls(), s.client(H2_H1), "/", false).await.unwrap();
    assert_eq!(answer.version, Some(rustls::ProtocolVersion::TLSv1_2));
}

#[test]
fn settings_that_cannot_be_served_stop_the_start_naming_the_variable() {
    let ca = TestCa::new("settings");
    let (cert, key) = ca.knative_pair();
    let volume = SecretVolume::new(&ca.dir, &cert, &key);
    let dir = volume.dir.to_str().unwrap();
    let cases: [(&[(&str, &str)], &str); 5] = [
        (
            &[("QUEUE_PROXY_TLS_CIPHER_SUITES", "TLS_RSA_WITH_RC4_128_SHA")],
            "unknown cipher suite",
        ),
        (
            &[(
                "QUEUE_PROXY_TLS_CIPHER_SUITES",
                "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
            )],
            "is not offered by qproxy",
        ),
        (
            &[("QUEUE_PROXY_TLS_CURVE_PREFERENCES", "CurveP521")],
            "is not offered by qproxy",
        ),
        (
            &[("QUEUE_PROXY_TLS_MAX_VERSION", "2.0")],
            "must be 1.2 or 1.3",
        ),
        (
            &[
                ("QUEUE_PROXY_TLS_MIN_VERSION", "1.3"),
                ("QUEUE_PROXY_TLS_MAX_VERSION", "1.2"),
            ],
            "no version left",
        ),
    ];
    for (vars, reason) in cases {
        let (name, value) = vars[0];
        let env = with_vars(current_knative_env(8080), &[("QPROXY_CERT_DIR", dir)]);
        let env = with_vars(env, vars);
        let out = run_to_exit(&env);
        assert_eq!(out.status.code(), Some(1), "{name}={value}");
        // Logging is up by then: the error is logged as Knative logs a
        // failed start, naming the variable.
        let stderr = String::from_utf8(out.stderr).unwrap();
        let error = start_error(&stderr);
        assert!(
            error.starts_with(&format!("{name}=")) && error.contains(reason),
            "{name}={value}: {stderr}"
        );
    }

    // Without the certificate the settings do not matter, as in Knative.
    let env = with_vars(
        current_knative_env(8080),
        &[
            ("QPROXY_CERT_DIR", "/nonexistent"),
            ("QUEUE_PROXY_TLS_CURVE_PREFERENCES", "CurveP521"),
        ],
    );
    let qp = QProxy::start_env(&env);
    assert!(qp.tls.is_none());

    // A certificate that does not load stops the start too.
    let broken = ca.dir.join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("tls.crt"), &cert).unwrap();
    std::fs::write(broken.join("tls.key"), "no key here").unwrap();
    let env = with_vars(
        knative_env(8080),
        &[("QPROXY_CERT_DIR", broken.to_str().unwrap())],
    );
    let out = run_to_exit(&env);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        start_error(&stderr).contains("tls.key: no usable private key"),
        "{stderr}"
    );
}

/// The error of the one "Failed to bring up queue-proxy" line in `logs`.
fn start_error(logs: &str) -> String {
    let failed: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["message"] == "Failed to bring up queue-proxy, shutting down.")
        .collect();
    assert_eq!(failed.len(), 1, "one failed start logged: {logs}");
    failed[0]["error"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn the_admin_port_is_tls_in_classic_knative_and_plain_in_current() {
    let app = App::hello().await;
    let s = Setup::start("admin-classic", knative_env(app.port()), &[]);
    const HEAD: &[u8] = b"GET /nothing-here HTTP/1.1\r\nHost: a\r\n\r\n";
    let admin = tls_get(s.qp.admin, s.client(H2_H1), "/nothing-here", false).await;
    assert_eq!(
        admin.map(|a| a.status.as_u16()),
        Ok(404),
        "classic: the admin port speaks TLS"
    );
    let plain = raw_exchange(s.qp.admin, HEAD).await;
    assert!(
        !plain.starts_with("HTTP/1.1"),
        "classic: no plain HTTP on the admin port: {plain}"
    );

    let s = Setup::start("admin-current", current_knative_env(app.port()), &[]);
    let plain = raw_exchange(s.qp.admin, HEAD).await;
    assert!(
        plain.starts_with("HTTP/1.1 404"),
        "current: the admin port stays plain: {plain}"
    );
}

#[tokio::test]
async fn an_expired_certificate_is_served_with_a_warning() {
    let app = App::hello().await;
    let ca = TestCa::new("expired");
    let (cert, key) = ca.issue_expired(&[KNATIVE_SERVER_NAME]);
    let volume = SecretVolume::new(&ca.dir, &cert, &key);
    let env = with_vars(
        knative_env(app.port()),
        &[("QPROXY_CERT_DIR", volume.dir.to_str().unwrap())],
    );
    let qp = QProxy::start_env(&env);
    qp.wait_for_log("the warning", |l| {
        l["severity"] == "WARNING"
            && l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("the TLS certificate has expired"))
    });
    // A verifying client refuses it; the handshake got that far.
    let refused = tls_get(
        qp.tls.unwrap(),
        ca.client_config(H2_H1, &[&TLS13]),
        "/",
        false,
    )
    .await
    .unwrap_err();
    assert!(refused.contains("expired"), "{refused}");
}

#[tokio::test]
async fn the_tls_port_drains_like_the_main_port() {
    // `/slow` is held at the app until the test lets it go.
    let (arrived, mut slow_arrived) = tokio::sync::mpsc::unbounded_channel();
    let app = App::start(move |req| {
        let arrived = arrived.clone();
        async move {
            if req.uri().path() == "/slow" {
                let (release, released) = tokio::sync::oneshot::channel::<()>();
                arrived.send(release).unwrap();
                let _ = released.await;
            }
            Response::new(full("done"))
        }
    })
    .await;
    let mut s = Setup::start(
        "drain",
        knative_env(app.port()),
        &[("QPROXY_DRAIN_QUIET_SECONDS", "1")],
    );
    let slow = tokio::spawn({
        let (addr, client) = (s.tls(), s.client(H2_H1));
        async move { tls_get(addr, client, "/slow", false).await }
    });
    let release = within("the slow request at the app", slow_arrived.recv())
        .await
        .unwrap();
    s.qp.signal("TERM");
    // During the quiet period the TLS port still serves, and the slow
    // request, still in flight, is answered.
    let during = tls_get(s.tls(), s.client(H2_H1), "/", false).await.unwrap();
    assert_eq!(during.status, 200);
    release.send(()).unwrap();
    let slow = within("the slow answer", slow).await.unwrap().unwrap();
    assert_eq!((slow.status.as_u16(), &slow.body[..]), (200, &b"done"[..]));
    assert!(s.qp.wait_exit().success());
    assert!(tokio::net::TcpStream::connect(s.tls()).await.is_err());
}
