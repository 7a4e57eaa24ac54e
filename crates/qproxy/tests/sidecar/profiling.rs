//! CPU profiles on the profiling port: what is served, one at a time, and
//! without a writable temporary directory. (`tests/e2e` reads one back with
//! `go tool pprof`.)

use std::io::Read;

use qproxy_test_support::*;

#[tokio::test(flavor = "multi_thread")]
async fn serves_a_gzipped_cpu_profile_one_at_a_time() {
    let app = App::hello().await;
    let (qp, profiling) =
        QProxy::start_profiling(app.port(), &[("SERVING_LOGGING_LEVEL", "debug")]);
    qp.wait_for_log("the switch", |l| l["message"] == "Profiling enabled: true");

    let profile =
        tokio::spawn(
            async move { h1(profiling, get("/debug/pprof/profile?seconds=2", &[])).await },
        );
    let started = |l: &serde_json::Value| l["message"] == "CPU profile started";
    tokio::task::block_in_place(|| qp.wait_for_log("the profile's start", started));
    // Something to sample while the profile runs.
    let main = qp.main;
    let load = tokio::spawn(async move {
        for _ in 0..200 {
            text(h1(main, get("/", &[])).await).await;
        }
    });
    // A second profile meanwhile is refused, as Go refuses it.
    let busy = h1(profiling, get("/debug/pprof/profile?seconds=1", &[])).await;
    assert_eq!(busy.status(), 500);
    assert_eq!(busy.headers()["x-go-pprof"], "1");
    assert_eq!(busy.headers()["content-type"], "text/plain; charset=utf-8");
    assert_eq!(
        text(busy).await,
        "Could not enable CPU profiling: cpu profiling already in use\n"
    );
    load.await.unwrap();

    let res = within("the profile", profile).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/octet-stream");
    assert_eq!(
        res.headers()["content-disposition"],
        "attachment; filename=\"profile\""
    );
    let gzipped = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gzipped[..])
        .read_to_end(&mut raw)
        .expect("a gzip body");
    assert!(!raw.is_empty());

    let other = h1(profiling, get("/debug/pprof/heap", &[])).await;
    assert_eq!(other.status(), 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn no_profiling_port_unless_asked() {
    let app = App::hello().await;
    let mut qp = QProxy::start(app.port(), &[("QPROXY_PROFILING_PORT", "0")]);
    let logs = qp.stop_and_collect_logs();
    assert!(
        !logs.iter().any(|l| l["server"] == "profile"),
        "a profiling server started"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn profiles_work_without_a_writable_temporary_directory() {
    // As under Knative's read-only root filesystem: the usual temporary
    // directory cannot be written.
    let app = App::hello().await;
    let (_qp, profiling) = QProxy::start_profiling(app.port(), &[("TMPDIR", "/nonexistent/tmp")]);
    let res = h1(profiling, get("/debug/pprof/profile?seconds=1", &[])).await;
    assert_eq!(res.status(), 200, "{}", text(res).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_profile_whose_client_left_frees_the_profiler() {
    let app = App::hello().await;
    let (qp, profiling) =
        QProxy::start_profiling(app.port(), &[("SERVING_LOGGING_LEVEL", "debug")]);
    // A client asks for a long profile, then hangs up.
    let mut client = tokio::net::TcpStream::connect(profiling).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut client,
        b"GET /debug/pprof/profile?seconds=600 HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await
    .unwrap();
    let started = |l: &serde_json::Value| l["message"] == "CPU profile started";
    tokio::task::block_in_place(|| qp.wait_for_log("the profile's start", started));
    drop(client);
    // The next profile runs.
    until("the profiler free again", async || {
        let res = h1(profiling, get("/debug/pprof/profile?seconds=1", &[])).await;
        res.status() == 200
    })
    .await;
}
