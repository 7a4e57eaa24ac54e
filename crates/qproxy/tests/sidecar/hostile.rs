//! Slow, silent and greedy clients: every port bounds what they can hold,
//! and running out of descriptors neither spins nor sticks.

use std::process::Command;
use std::time::Duration;

use qproxy_test_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Whether `held` is a close at the head deadline (not before it, and not
/// long after), with no HTTP/1 answer.
fn closed_at_deadline(held: Held, h2: bool) -> bool {
    matches!(held, Held::Closed { after, bytes }
        if after >= HEAD_TIMEOUT - Duration::from_millis(500)
            && after < HEAD_TIMEOUT + Duration::from_secs(10)
            && (h2 || bytes == 0))
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_and_silent_heads_are_closed_a_minute_after_accept_on_every_port() {
    let app = App::hello().await;
    let qp = QProxy::start(app.port(), &[]);
    let metrics = qp.metrics.unwrap();
    let give_up = HEAD_TIMEOUT * 2;

    // A keep-alive connection that idles past the deadline stays usable.
    let mut idle = TcpStream::connect(qp.main).await.unwrap();
    let request = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    let mut body = [0u8; 13];
    idle.write_all(request).await.unwrap();
    assert!(
        read_head(&mut idle)
            .await
            .unwrap()
            .starts_with("HTTP/1.1 200")
    );
    idle.read_exact(&mut body).await.unwrap();

    let mut held = Vec::new();
    for (port, addr) in [
        ("main", qp.main),
        ("admin", qp.admin),
        ("stats", qp.stats),
        ("metrics", metrics),
    ] {
        for (how, first, line) in [
            ("a head a line a second", REQUEST_LINE, Some(HEADER_LINE)),
            ("nothing", &b""[..], None),
        ] {
            held.push(((port, how), tokio::spawn(hold(addr, first, line, give_up))));
        }
    }
    let h2c = hold(qp.main, H2_PREFACE, None, give_up);
    held.push((("main", "an h2c preface alone"), tokio::spawn(h2c)));
    for ((port, how), task) in held {
        let got = task.await.unwrap();
        let h2 = how.contains("h2c");
        assert!(closed_at_deadline(got, h2), "{port} port, {how}: {got:?}");
    }

    idle.write_all(request).await.unwrap();
    let head = read_head(&mut idle).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    idle.read_exact(&mut body).await.unwrap();
    assert_eq!(&body, b"Hello World!\n");
}

/// qproxy started through `prlimit`, with a limit of `soft` and `hard`
/// open files.
fn start_limited(user_port: u16, soft: u32, hard: u32) -> QProxy {
    let mut command = Command::new("prlimit");
    command
        .arg(format!("--nofile={soft}:{hard}"))
        .arg("--")
        .arg(qproxy_bin());
    QProxy::start_command(command, &knative_env(user_port))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_low_soft_limit_on_open_files_is_raised_as_go_raises_it() {
    let app = App::hello().await;
    let qp = start_limited(app.port(), 64, 4096);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", qp.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[3..5], ["4096", "4096"], "{line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn running_out_of_descriptors_backs_off_and_recovers() {
    let app = App::hello().await;
    let qp = start_limited(app.port(), 48, 48);
    let res = h1(qp.main, get("/", &[])).await;
    assert_eq!(res.status(), 200);

    // More connections than descriptors: the kernel completes them all,
    // qproxy can accept only some.
    let mut hogs = Vec::new();
    for _ in 0..80 {
        hogs.push(TcpStream::connect(qp.main).await.unwrap());
    }
    qp.wait_for_log("an accept failure", |l| {
        l["message"] == "accept failed" && l["error"].as_str().is_some_and(|e| e.contains("24"))
    });

    // Backing off, it burns next to nothing while out of descriptors; a
    // loop retrying at once would burn the whole window.
    let window = Duration::from_secs(2);
    let before = cpu_time(qp.pid());
    tokio::time::sleep(window).await;
    let burnt = cpu_time(qp.pid()) - before;
    assert!(burnt < window / 4, "{burnt:?} of CPU in {window:?}");

    drop(hogs);
    let res = within("service to resume", async {
        loop {
            if let Ok(Ok(res)) = tokio::time::timeout(
                Duration::from_secs(2),
                tokio::spawn(h1(qp.main, get("/", &[]))),
            )
            .await
            {
                return res;
            }
        }
    })
    .await;
    assert_eq!(res.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn current_knative_s_metrics_port_gives_heads_five_seconds() {
    let app = App::hello().await;
    let env = with_vars(
        current_knative_env(app.port()),
        &[(
            "OBSERVABILITY_CONFIG",
            r#"{"requestMetrics":{"protocol":"prometheus"}}"#,
        )],
    );
    let qp = QProxy::start_env(&env);
    let metrics = qp.metrics.unwrap();
    let held = hold(metrics, REQUEST_LINE, Some(HEADER_LINE), HEAD_TIMEOUT).await;
    assert!(
        matches!(held, Held::Closed { after, bytes: 0 }
            if after >= Duration::from_millis(4500) && after < Duration::from_secs(15)),
        "{held:?}"
    );
    // The main port keeps Knative's minute.
    let main = hold(
        qp.main,
        REQUEST_LINE,
        Some(HEADER_LINE),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(main, Held::Open);
}
