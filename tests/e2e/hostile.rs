//! Hostile and broken clients, and a broken app, played against qproxy and
//! Knative's Go queue-proxy side by side: qproxy must do at least as well
//! on every count, and close slow heads exactly when Go does.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use qproxy_test_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// Both proxies in front of one app, with classic Knative's environment.
struct Pair {
    app: App,
    go: GoQueueProxy,
    qp: QProxy,
}

impl Pair {
    async fn start() -> Self {
        let app = App::hello().await;
        let env = knative_env(app.port());
        let go = GoQueueProxy::start(&env).await;
        let qp = QProxy::start_env(&env);
        Pair { app, go, qp }
    }

    /// Each proxy: name, main port, pid.
    fn each(&self) -> [(&'static str, SocketAddr, u32); 2] {
        [
            ("go", self.go.main, self.go.pid()),
            ("qproxy", self.qp.main, self.qp.pid()),
        ]
    }
}

/// Says how `n` connections that each sent a request head a line a second
/// ended, and the proxy's resident memory (KiB) while they were held.
async fn dribble_many(addr: SocketAddr, pid: u32, n: usize) -> (Vec<Held>, u64) {
    let mut tasks = JoinSet::new();
    for _ in 0..n {
        tasks.spawn(hold(
            addr,
            REQUEST_LINE,
            Some(HEADER_LINE),
            HEAD_TIMEOUT * 2,
        ));
    }
    // Once every connection is open, each holds its head: the memory
    // that costs.
    let open = eventually(HEAD_TIMEOUT / 2, || open_fds(pid) >= n).await;
    assert!(open, "{n} connections were not all accepted");
    let rss = rss_kib(pid);
    (tasks.join_all().await, rss)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn slow_heads_are_closed_as_go_closes_them_in_less_memory() {
    raise_open_files();
    let pair = Pair::start().await;
    let mut results = Vec::new();
    let play = |(name, addr, pid): (&'static str, SocketAddr, u32)| async move {
        let (dribbled, rss) = dribble_many(addr, pid, 2000).await;
        (name, dribbled, rss)
    };
    let [go, qp] = pair.each();
    let (go, qp) = tokio::join!(play(go), play(qp));
    for (name, held, rss) in [go, qp] {
        // Each connection ends as Go's own ends: closed without a byte of
        // answer. (When: a minute after it was opened, on the paused clock
        // of the server's own tests; a wall clock here would measure the
        // machine.)
        assert!(
            held.iter()
                .all(|h| matches!(h, Held::Closed { bytes: 0, .. })),
            "{name}: {:?}",
            held.iter()
                .find(|h| !matches!(h, Held::Closed { bytes: 0, .. }))
        );
        results.push((name, rss));
    }
    eprintln!("resident memory (KiB) holding 2,000 slow heads: {results:?}");
    let [(_, go), (_, qp)] = [results[0], results[1]];
    assert!(qp <= go, "qproxy {qp} KiB, Go {go} KiB");
    for (name, addr, _) in pair.each() {
        let res = h1(addr, get("/", &[])).await;
        assert_eq!(res.status(), 200, "{name} serves after");
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn ten_thousand_idle_connections_cost_less_than_go() {
    raise_open_files();
    let pair = Pair::start().await;
    let mut per_conn = Vec::new();
    for (name, addr, pid) in pair.each() {
        let before = rss_kib(pid);
        let mut conns = Vec::new();
        for _ in 0..10_000 {
            conns.push(TcpStream::connect(addr).await.unwrap());
        }
        let accepted = eventually(deadline(), || open_fds(pid) >= 10_000).await;
        assert!(accepted, "{name} did not accept 10,000 connections");
        let grown = rss_kib(pid).saturating_sub(before);
        per_conn.push((name, grown * 1024 / 10_000));
        drop(conns);
    }
    eprintln!("bytes per idle connection: {per_conn:?}");
    let [(_, go), (_, qp)] = [per_conn[0], per_conn[1]];
    assert!(qp <= go, "qproxy {qp} B per connection, Go {go} B");
}

/// A request head, chosen and then damaged by `rng`.
fn mangled_head(rng: &mut u64) -> Vec<u8> {
    let mut next = || {
        // xorshift64*: reproducible, and enough to scramble bytes.
        *rng ^= *rng >> 12;
        *rng ^= *rng << 25;
        *rng ^= *rng >> 27;
        rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let bases: [&[u8]; 4] = [
        b"GET /path?q=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0",
    ];
    let mut head = bases[(next() % 4) as usize].to_vec();
    let damage = next() % 8;
    for _ in 0..=damage {
        let at = (next() as usize) % head.len().max(1);
        match next() % 4 {
            0 => head[at] = next() as u8,
            1 => head.insert(at, next() as u8),
            2 => {
                head.remove(at);
            }
            _ => head.truncate(at),
        }
        if head.is_empty() {
            head.push(next() as u8);
        }
    }
    if next() % 16 == 0 {
        let len = (next() % 4096) as usize;
        head = (0..len).map(|_| next() as u8).collect();
    }
    head
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn three_thousand_mangled_heads_leave_both_serving() {
    let pair = Pair::start().await;
    for (name, addr, _) in pair.each() {
        let mut rng = 0x9E37_79B9_7F4A_7C15_u64;
        let mut sent = JoinSet::new();
        for i in 0..3000 {
            let head = mangled_head(&mut rng);
            sent.spawn(async move {
                let Ok(mut stream) = TcpStream::connect(addr).await else {
                    panic!("connection {i} refused");
                };
                let _ = stream.write_all(&head).await;
                let _ = stream.shutdown().await;
                let mut sink = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut sink))
                    .await;
            });
            if sent.len() >= 100 {
                sent.join_next().await.unwrap().unwrap();
            }
        }
        while let Some(done) = sent.join_next().await {
            done.unwrap();
        }
        let res = h1(addr, get("/", &[])).await;
        assert_eq!(res.status(), 200, "{name} serves after 3,000 mangled heads");
    }
    let _ = &pair.app;
}

/// Streams opened and reset at once on one h2c connection, for at most a
/// second or until the server closes the connection: how many were sent.
async fn rapid_reset(addr: SocketAddr) -> u32 {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(H2_PREFACE).await.unwrap();
    stream
        .write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    let (mut read, mut write) = stream.into_split();
    // Drain whatever the server writes, so that it never blocks on us.
    let drain = tokio::spawn(async move {
        let mut buf = [0u8; 16384];
        while let Ok(1..) = read.read(&mut buf).await {}
    });
    // GET http://a/: :method GET, :scheme http, :path / from the static
    // table, :authority "a" as a literal.
    let block = [0x82, 0x86, 0x84, 0x01, 0x01, b'a'];
    let start = tokio::time::Instant::now();
    let mut id: u32 = 1;
    'send: while start.elapsed() < Duration::from_secs(1) {
        let mut batch = Vec::new();
        for _ in 0..50 {
            let sid = id.to_be_bytes();
            // HEADERS, END_STREAM | END_HEADERS.
            batch.extend_from_slice(&[0, 0, block.len() as u8, 1, 5]);
            batch.extend_from_slice(&sid);
            batch.extend_from_slice(&block);
            // RST_STREAM, CANCEL.
            batch.extend_from_slice(&[0, 0, 4, 3, 0]);
            batch.extend_from_slice(&sid);
            batch.extend_from_slice(&8u32.to_be_bytes());
            id += 2;
        }
        if write.write_all(&batch).await.is_err() || drain.is_finished() {
            break 'send;
        }
    }
    drain.abort();
    id / 2
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn rapid_reset_reaches_the_app_no_more_than_through_go() {
    let pair = Pair::start().await;
    let mut reached = Vec::new();
    for (name, addr, pid) in pair.each() {
        let seen = pair.app.seen().len();
        let cpu = cpu_time(pid);
        let sent = rapid_reset(addr).await;
        let burnt = cpu_time(pid) - cpu;
        let through = pair.app.seen().len() - seen;
        eprintln!("{name}: {sent} streams sent, {through} reached the app, {burnt:?} of CPU");
        reached.push(through);
        // Go may still be working through what reached it.
        until(&format!("{name} to serve h2c again"), async || {
            h2(addr, get("http://a/", &[])).await.status() == 200
        })
        .await;
    }
    assert!(reached[1] <= reached[0], "{reached:?}");
}

/// The benchmark's Go app on `port`, killed when dropped.
struct GoApp(Child);

impl GoApp {
    fn start(bin: &std::path::Path, port: u16) -> Self {
        let child = Command::new(bin)
            .arg("-addr")
            .arg(format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        GoApp(child)
    }
}

impl Drop for GoApp {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The statuses four clients see, a request after another each, until
/// `stop` is set.
async fn load(addr: SocketAddr, stop: tokio::sync::watch::Receiver<bool>) -> Vec<u16> {
    let mut tasks = JoinSet::new();
    for _ in 0..4 {
        let stop = stop.clone();
        tasks.spawn(async move {
            let mut statuses = Vec::new();
            while !*stop.borrow() {
                statuses.push(h1(addr, get("/", &[])).await.status().as_u16());
            }
            statuses
        });
    }
    tasks.join_all().await.concat()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "compares with Knative's Go queue-proxy, built with Go: scripts/test runs it"]
async fn an_app_killed_and_restarted_under_load_gives_502_then_200_as_through_go() {
    let bin = target_dir().join("e2e").join("bench-app");
    let built = Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(workspace().join("benches").join("app"))
        .status()
        .unwrap();
    assert!(built.success(), "the benchmark's app builds");
    let port = closed_port();
    let mut app = Some(GoApp::start(&bin, port));
    let env = knative_env(port);
    let go = GoQueueProxy::start(&env).await;
    let qp = QProxy::start_env(&env);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let loads = [go.main, qp.main].map(|addr| tokio::spawn(load(addr, stopped.clone())));

    let answer = |status: u16, what: &'static str| {
        let addr = qp.main;
        within(what, async move {
            while h1(addr, get("/", &[])).await.status() != status {}
        })
    };
    answer(200, "a 200 before the app is killed").await;
    app.take();
    answer(502, "a 502 while the app is down").await;
    app = Some(GoApp::start(&bin, port));
    answer(200, "a 200 once the app is back").await;
    stop.send(true).unwrap();
    for (name, task) in ["go", "qproxy"].into_iter().zip(loads) {
        let statuses = task.await.unwrap();
        let other: Vec<_> = statuses
            .iter()
            .filter(|s| **s != 200 && **s != 502)
            .collect();
        assert!(other.is_empty(), "{name}: {other:?}");
        assert!(statuses.contains(&502), "{name} saw the app down");
        assert_eq!(statuses.last(), Some(&200), "{name} ended serving");
    }
    drop(app);
}
