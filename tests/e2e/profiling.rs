//! A CPU profile from the profiling port, read back with `go tool pprof`,
//! as an operator reads it.

use std::process::Command;

use http_body_util::BodyExt;
use qproxy_test_support::*;

#[tokio::test(flavor = "multi_thread")]
#[ignore = "reads the profile with `go tool pprof`: scripts/test runs it"]
async fn go_tool_pprof_reads_the_cpu_profile() {
    let app = App::hello().await;
    let (qp, profiling) = QProxy::start_profiling(app.port(), &[]);
    let main = qp.main;
    // Something to sample while the profile runs.
    let load = tokio::spawn(async move {
        for _ in 0..200 {
            text(h1(main, get("/", &[])).await).await;
        }
    });
    let res = h1(profiling, get("/debug/pprof/profile?seconds=1", &[])).await;
    assert_eq!(res.status(), 200);
    let gzipped = within("the profile", res.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    load.await.unwrap();

    let file = std::env::temp_dir().join(format!("qproxy-profile-{}.pb.gz", qp.pid()));
    std::fs::write(&file, &gzipped).unwrap();
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(&file)
        .output()
        .expect("go runs");
    let _ = std::fs::remove_file(&file);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go tool pprof: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.contains("PeriodType: cpu nanoseconds"), "{report}");
}
