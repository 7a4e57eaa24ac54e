//! The kernel gate's second half: before attaching anything, the agent
//! runs the programs on a loopback echo of its own and checks what apps
//! rely on. A failed check attaches nothing.
//!
//! The echo runs in a child process (this binary, [`PEER_ARG`]) in a
//! network namespace of its own, inside a cgroup of its own under the
//! agent's, with programs and maps loaded for the test alone: nothing of
//! it touches a pod. The child checks:
//!
//! - **integrity**: concurrent connections echo 1 B to 1 MiB each way,
//!   byte for byte;
//! - **half-close**: a peer that shuts its writing side down is seen to
//!   end only after every byte before it;
//! - **FIONREAD**: a socket reports the bytes waiting for it, both when
//!   they came redirected and when they came over TCP to a socket in the
//!   map (a connection left on TCP: kernels with commit 929e30f93125 and
//!   without its fix report 0 there, and apps that size reads with
//!   FIONREAD wait forever);
//! - **edge-triggered epoll**: every redirected message wakes an
//!   `EPOLLET` waiter;
//! - **blocking reads**: a blocking `read` waits for data until its
//!   timeout rather than failing with `EAGAIN` when it is woken with
//!   nothing to read, as it is when its own side half-closes (6.18.44
//!   fails this: blocking apps see `EAGAIN`);
//!
//! and the agent then checks that the echo was redirected at all.
//!
//! The child runs one check at a time and waits for the agent's word
//! before the next. In between, the agent reads the programs' counters:
//! a check of redirected sockets one of whose connections fell back to
//! TCP (its first message found no peer, as happens when the kernel
//! defers the handshake's last step) tested TCP instead, and `fionread-tcp`
//! must have had its connection left on TCP. Such a check is run again, up
//! to [`ATTEMPTS`] times, then fails as inconclusive; each check's line
//! says what its connections did.

use std::{
    fs,
    io::{self, BufRead, BufReader, Read, Write},
    net::{Shutdown, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    thread,
    time::{Duration, Instant},
};

use rustix::event::{PollFd, PollFlags, epoll};

use crate::{Accel, kernel};

/// The self-test's own cgroups are named this, then the agent's PID.
const CGROUP_PREFIX: &str = "qproxy-accel-selftest-";

/// How long the whole echo may take before its child is killed and the
/// self-test fails: it takes well under a second when the kernel is sound.
const ECHO_DEADLINE: Duration = Duration::from_secs(120);

/// The argument that makes the agent's binary the self-test's child.
pub const PEER_ARG: &str = "__self-test-peer";

/// How many times a check is run before its connections' path counts
/// against it.
pub const ATTEMPTS: u32 = 3;

/// The check of a connection left on TCP; every other check tests
/// redirected sockets.
const TCP_CHECK: &str = "fionread-tcp";

/// One check and how it went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// Its name.
    pub name: String,
    /// Passed?
    pub ok: bool,
    /// What was seen.
    pub detail: String,
}

/// Every check of one run.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// In the order they ran.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.ok)
    }

    /// The failed checks, one line each.
    pub fn failures(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect()
    }

    fn push(&mut self, name: &str, ok: bool, detail: impl Into<String>) {
        self.checks.push(Check {
            name: name.to_owned(),
            ok,
            detail: detail.into(),
        });
    }
}

/// Where the self-test makes its cgroup: under the agent's own cgroup when
/// the agent is in the tree under `cgroup` (as a DaemonSet's pod under the
/// pods' cgroup is), else under `cgroup` itself.
///
/// Under its own: where the cgroup hierarchy is mounted with `nsdelegate`
/// (systemd does so), a process in a cgroup namespace of its own, as a
/// container's is, may move only between cgroups under its namespace's
/// root, its container's cgroup; the self-test's child moves from the
/// agent's cgroup into the test's.
pub fn parent(cgroup: &Path) -> PathBuf {
    crate::discover::cgroup_of(cgroup, std::process::id()).unwrap_or_else(|| cgroup.to_owned())
}

/// Runs the self-test: the kernel version, then the echo, with `exe` (this
/// binary) as its child, in a cgroup made for it under `cgroup`.
pub fn run(exe: &Path, cgroup: &Path) -> Report {
    let mut report = Report::default();
    let release = kernel::release();
    match kernel::check(&release) {
        Ok(()) => report.push("kernel", true, release),
        Err(why) => {
            report.push("kernel", false, why);
            return report;
        }
    }
    // The cgroups of self-tests an agent was killed in the middle of.
    if let Ok(entries) = fs::read_dir(cgroup) {
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(CGROUP_PREFIX)
            {
                let _ = fs::remove_dir(entry.path());
            }
        }
    }
    let dir = cgroup.join(format!("{CGROUP_PREFIX}{}", std::process::id()));
    if let Err(e) = fs::create_dir(&dir) {
        report.push(
            "setup",
            false,
            format!("creating the cgroup {}: {e}", dir.display()),
        );
        return report;
    }
    let outcome = echo(exe, &dir, &mut report);
    // The child has been reaped: the cgroup is empty.
    let _ = fs::remove_dir(&dir);
    if let Err(why) = outcome {
        report.push("setup", false, why);
    }
    report
}

fn echo(exe: &Path, dir: &Path, report: &mut Report) -> Result<(), String> {
    let mut accel = Accel::load(None, 1024).map_err(|e| chain(&e))?;
    accel.attach(dir).map_err(|e| chain(&e))?;
    let mut child = Command::new(exe)
        .arg(PEER_ARG)
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting the self-test's child {}: {e}", exe.display()))?;
    // A kernel that loses a wake-up would leave the child waiting: a
    // watchdog kills it at the deadline, and `talk` then sees it end.
    let (done, watch) = std::sync::mpsc::channel::<()>();
    let pid = child.id();
    let watchdog = thread::spawn(move || {
        if watch.recv_timeout(ECHO_DEADLINE).is_err()
            && let Some(pid) = i32::try_from(pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    });
    let result = talk(&mut child, &mut accel, report);
    let _ = done.send(());
    let _ = watchdog.join();
    let _ = child.kill();
    let _ = child.wait();
    result?;
    let counters = accel.counters().map_err(|e| e.to_string())?;
    report.push(
        "redirected",
        counters.redirected_messages > 0,
        format!(
            "{} messages, {} bytes redirected; {} fallbacks",
            counters.redirected_messages, counters.redirected_bytes, counters.fallbacks
        ),
    );
    Ok(())
}

fn talk(child: &mut Child, accel: &mut Accel, report: &mut Report) -> Result<(), String> {
    let stdout = child.stdout.take().ok_or("the child has no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let ready = lines
        .next()
        .ok_or("the self-test's child ended before it was ready")?
        .map_err(|e| e.to_string())?;
    let mut words = ready.split_whitespace();
    let (Some("ready"), Some(netns), Some(port)) = (words.next(), words.next(), words.next())
    else {
        return Err(format!("the self-test's child said {ready:?}"));
    };
    let netns: u64 = netns
        .parse()
        .map_err(|_| format!("bad cookie in {ready:?}"))?;
    let port: u16 = port.parse().map_err(|_| format!("bad port in {ready:?}"))?;
    accel.allow(netns, port).map_err(|e| e.to_string())?;
    let mut stdin = child.stdin.take().ok_or("the child has no stdin")?;
    let counters = |accel: &Accel| accel.counters().map_err(|e| e.to_string());
    let mut before = counters(accel)?;
    let mut attempt = 1;
    writeln!(stdin, "go").map_err(|e| e.to_string())?;
    for line in lines {
        let line = line.map_err(|e| e.to_string())?;
        if line == "done" {
            return Ok(());
        }
        let (ok, rest) = match (line.strip_prefix("ok "), line.strip_prefix("fail ")) {
            (Some(rest), _) => (true, rest),
            (_, Some(rest)) => (false, rest),
            _ => continue,
        };
        let (name, detail) = rest.split_once(' ').unwrap_or((rest, ""));
        let now = counters(accel)?;
        let seen = now.since(&before);
        before = now;
        let seen_line = format!(
            "{} messages, {} bytes redirected; {} fallbacks",
            seen.redirected_messages, seen.redirected_bytes, seen.fallbacks
        );
        let reply = match took_its_path(name, &seen) {
            Ok(()) => {
                report.push(name, ok, format!("{detail} ({seen_line})"));
                attempt = 1;
                "next"
            }
            Err(_) if attempt < ATTEMPTS => {
                attempt += 1;
                "again"
            }
            Err(why) => {
                report.push(
                    name,
                    false,
                    format!("inconclusive after {ATTEMPTS} runs: {why} ({seen_line})"),
                );
                attempt = 1;
                "next"
            }
        };
        writeln!(stdin, "{reply}").map_err(|e| e.to_string())?;
    }
    Err("the self-test's child ended before it was done".to_owned())
}

/// Whether a check's connections took the path it tests, from what the
/// counters saw while it ran (`seen`).
fn took_its_path(check: &str, seen: &crate::Counters) -> Result<(), String> {
    if check == TCP_CHECK {
        return if seen.fallbacks > 0 {
            Ok(())
        } else {
            Err("its connection was not left on TCP".to_owned())
        };
    }
    if seen.fallbacks > 0 {
        return Err(format!(
            "{} of its connections fell back to TCP",
            seen.fallbacks
        ));
    }
    if seen.redirected_messages == 0 {
        return Err("nothing of it was redirected".to_owned());
    }
    Ok(())
}

/// An error with its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The self-test's child: enters its own network namespace and cgroup,
/// then runs the echo's checks, printing one line each. Returns when it
/// is done; an error is a setup failure.
pub fn peer(cgroup: &Path) -> io::Result<()> {
    // Never outlive the agent, whatever kills it.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    crate::sys::unshare_netns()?;
    crate::sys::loopback_up()?;
    // A listener made before joining the test's cgroup: the sockets it
    // accepts are not the programs', so a connection to it is one whose
    // peer is not in the map (it stays on TCP).
    let outside = TcpListener::bind("127.0.0.1:0")?;
    let port = outside.local_addr()?.port();
    fs::write(cgroup.join("cgroup.procs"), "0").map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("joining the cgroup {}: {e}", cgroup.display()),
        )
    })?;
    let inside = TcpListener::bind(("127.0.0.2", port))?;
    let netns = crate::sys::netns_cookie(&inside)?;
    let mut out = io::stdout().lock();
    writeln!(out, "ready {netns} {port}")?;
    out.flush()?;
    let mut go = String::new();
    io::stdin().read_line(&mut go)?;
    // `blocking-read` comes last: it also reports what the checks before
    // it saw.
    let checks: [(&str, Probe); 5] = [
        ("integrity", check_integrity),
        ("fionread-redirected", check_fionread_redirected),
        ("fionread-tcp", check_fionread_tcp),
        ("epoll-edge", check_epoll_edge),
        ("blocking-read", check_blocking_read),
    ];
    // After each result, the agent says "next", or "again" when the
    // check's connections did not take the path it tests.
    let mut word = String::new();
    for (name, check) in checks {
        loop {
            match check(&inside, &outside) {
                Ok(detail) => writeln!(out, "ok {name} {detail}")?,
                Err(detail) => writeln!(out, "fail {name} {detail}")?,
            }
            out.flush()?;
            word.clear();
            io::stdin().read_line(&mut word)?;
            if word.trim_end() != "again" {
                break;
            }
        }
    }
    writeln!(out, "done")?;
    out.flush()
}

/// One check of the echo: the listener inside the programs' cgroup, and
/// the one outside it; what was seen, or why it failed.
type Probe = fn(&TcpListener, &TcpListener) -> Result<String, String>;

// Every wait of a check is on a condition; the deadline only bounds a
// failure, and is long enough for a node busy starting its pods.
const DEADLINE: Duration = Duration::from_secs(20);

fn connect(listener: &TcpListener) -> Result<(TcpStream, TcpStream), String> {
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let client = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    let (server, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
    for s in [&client, &server] {
        s.set_read_timeout(Some(DEADLINE))
            .map_err(|e| e.to_string())?;
        s.set_write_timeout(Some(DEADLINE))
            .map_err(|e| e.to_string())?;
    }
    Ok((client, server))
}

/// Blocking reads that failed with `EAGAIN` before their timeout, in
/// every check of this child: [`read_blocking`] counts them and reads
/// again, so that the other checks test what they are about.
static SPURIOUS_EAGAIN: AtomicU64 = AtomicU64::new(0);

/// A `read` on a blocking socket (with [`DEADLINE`] as its timeout) that
/// reads again when the kernel says `EAGAIN` before the timeout, counting
/// it in [`SPURIOUS_EAGAIN`].
fn read_blocking(socket: &mut TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    let start = Instant::now();
    loop {
        match socket.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && start.elapsed() < DEADLINE => {
                SPURIOUS_EAGAIN.fetch_add(1, Ordering::Relaxed);
            }
            other => return other,
        }
    }
}

/// [`Read::read_to_end`] through [`read_blocking`], reading into `buf`.
fn read_to_end_blocking(
    socket: &mut TcpStream,
    buf: &mut [u8],
    out: &mut Vec<u8>,
) -> io::Result<()> {
    loop {
        match read_blocking(socket, buf)? {
            0 => return Ok(()),
            n => out.extend_from_slice(&buf[..n]),
        }
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Four connections at once, each writing 1 B to 1 MiB and reading the
/// echo back; the client's half-close must reach the server only after
/// every byte, and the server's after every echoed byte.
fn check_integrity(inside: &TcpListener, _: &TcpListener) -> Result<String, String> {
    let sizes = [1usize, 100, 4096, 65_536, 1 << 20];
    let mut pairs = Vec::new();
    for _ in 0..4 {
        pairs.push(connect(inside)?);
    }
    let mut handles = Vec::new();
    for (i, (client, server)) in pairs.into_iter().enumerate() {
        let echo = thread::spawn(move || -> Result<u64, String> {
            let mut server = server;
            let mut buf = [0u8; 16 * 1024];
            let mut total = 0u64;
            loop {
                let n = read_blocking(&mut server, &mut buf)
                    .map_err(|e| format!("server read: {e}"))?;
                if n == 0 {
                    break;
                }
                total += n as u64;
                server
                    .write_all(&buf[..n])
                    .map_err(|e| format!("server write: {e}"))?;
            }
            server
                .shutdown(Shutdown::Write)
                .map_err(|e| e.to_string())?;
            Ok(total)
        });
        let sent: Vec<u8> = sizes
            .iter()
            .enumerate()
            .flat_map(|(j, &n)| pattern((i * 10 + j) as u64, n))
            .collect();
        let writer = {
            let mut client = client.try_clone().map_err(|e| e.to_string())?;
            let sent = sent.clone();
            thread::spawn(move || -> Result<(), String> {
                client
                    .write_all(&sent)
                    .map_err(|e| format!("client write: {e}"))?;
                client.shutdown(Shutdown::Write).map_err(|e| e.to_string())
            })
        };
        handles.push((client, sent, echo, writer));
    }
    let mut bytes = 0;
    for (mut client, sent, echo, writer) in handles {
        let mut got = Vec::with_capacity(sent.len());
        read_to_end_blocking(&mut client, &mut vec![0u8; 64 * 1024], &mut got)
            .map_err(|e| format!("client read: {e}"))?;
        writer.join().map_err(|_| "writer panicked")??;
        let echoed = echo.join().map_err(|_| "echo panicked")??;
        if echoed != sent.len() as u64 {
            return Err(format!(
                "the server saw {echoed} of {} bytes before EOF",
                sent.len()
            ));
        }
        if got != sent {
            let at = got
                .iter()
                .zip(&sent)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(sent.len()));
            return Err(format!(
                "echo differs at byte {at}: {} bytes back of {}",
                got.len(),
                sent.len()
            ));
        }
        bytes += sent.len();
    }
    Ok(format!(
        "{bytes} bytes each way on 4 connections, half-closed"
    ))
}

/// Waits until `want` bytes can be read from `socket` (seen with
/// `MSG_PEEK`, which takes nothing), then asks `FIONREAD` once.
fn wait_fionread(socket: &TcpStream, want: usize) -> Result<(), String> {
    let start = Instant::now();
    let mut peek = vec![0u8; want + 1];
    loop {
        let left = DEADLINE.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(format!("{want} bytes never arrived"));
        }
        let timeout = rustix::event::Timespec {
            tv_sec: left.as_secs() as _,
            tv_nsec: left.subsec_nanos() as _,
        };
        let mut fds = [PollFd::new(socket, PollFlags::IN)];
        rustix::event::poll(&mut fds, Some(&timeout)).map_err(|e| format!("poll: {e}"))?;
        // Without waiting: a blocking peek may fail with `EAGAIN` on the
        // kernels the `blocking-read` check is about.
        match rustix::net::recv(
            socket,
            &mut peek[..],
            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
        ) {
            Ok((waiting, _)) if waiting >= want => break,
            Ok(_) | Err(rustix::io::Errno::AGAIN) => {}
            Err(e) => return Err(format!("peek: {e}")),
        }
    }
    let reported = rustix::io::ioctl_fionread(socket).map_err(|e| format!("FIONREAD: {e}"))?;
    if reported == want as u64 {
        Ok(())
    } else {
        Err(format!(
            "FIONREAD says {reported} with {want} bytes waiting"
        ))
    }
}

fn check_fionread_redirected(inside: &TcpListener, _: &TcpListener) -> Result<String, String> {
    let (mut client, server) = connect(inside)?;
    client.write_all(&[7u8; 1000]).map_err(|e| e.to_string())?;
    wait_fionread(&server, 1000)?;
    Ok("1000 bytes waiting, 1000 reported".to_owned())
}

fn check_fionread_tcp(_: &TcpListener, outside: &TcpListener) -> Result<String, String> {
    // The client is in the map, its peer is not: its first message finds
    // no peer and the connection stays on TCP; what it receives comes
    // over TCP to a socket in the map.
    let (mut client, mut server) = connect(outside)?;
    client.write_all(b"hello").map_err(|e| e.to_string())?;
    let mut buf = [0u8; 5];
    let mut got = 0;
    while got < buf.len() {
        match read_blocking(&mut server, &mut buf[got..]).map_err(|e| e.to_string())? {
            0 => return Err("early EOF".to_owned()),
            n => got += n,
        }
    }
    server.write_all(&[9u8; 1000]).map_err(|e| e.to_string())?;
    wait_fionread(&client, 1000)?;
    Ok("1000 bytes waiting, 1000 reported".to_owned())
}

fn check_epoll_edge(inside: &TcpListener, _: &TcpListener) -> Result<String, String> {
    let (mut client, server) = connect(inside)?;
    server.set_nonblocking(true).map_err(|e| e.to_string())?;
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| e.to_string())?;
    epoll::add(
        &ep,
        &server,
        epoll::EventData::new_u64(1),
        epoll::EventFlags::IN | epoll::EventFlags::ET,
    )
    .map_err(|e| e.to_string())?;
    let rounds = 200;
    let mut server = server;
    let mut buf = [0u8; 4096];
    for round in 0..rounds {
        client
            .write_all(&[round as u8; 100])
            .map_err(|e| e.to_string())?;
        let mut events: Vec<epoll::Event> = Vec::with_capacity(4);
        let timeout = rustix::event::Timespec {
            tv_sec: DEADLINE.as_secs() as _,
            tv_nsec: 0,
        };
        let woken = epoll::wait(
            &ep,
            rustix::buffer::spare_capacity(&mut events),
            Some(&timeout),
        )
        .map_err(|e| e.to_string())?;
        if woken == 0 {
            return Err(format!("no wake-up for message {round} of {rounds}"));
        }
        let mut got = 0;
        loop {
            match server.read(&mut buf) {
                Ok(0) => return Err("early EOF".to_owned()),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        if got != 100 {
            return Err(format!(
                "message {round}: read {got} of 100 bytes after its wake-up"
            ));
        }
    }
    Ok(format!("{rounds} messages, {rounds} wake-ups"))
}

/// Whether the thread `tid` of this process is asleep (in a blocking
/// call: the only place the check's reader sleeps).
fn asleep(tid: i32) -> bool {
    fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
        .ok()
        .and_then(|stat| {
            let after = stat.rsplit_once(')')?.1;
            after.split_whitespace().next().map(|state| state == "S")
        })
        .unwrap_or(false)
}

/// A reader blocked on a socket in the map while its own side
/// half-closes, then the peer's answer: the blocking read must wait for the
/// answer. The half-close wakes the reader with nothing to read (when the
/// peer acknowledges the FIN); some kernels then fail the read with
/// `EAGAIN`. Fails if this or any check before it saw a blocking read
/// return `EAGAIN` before its timeout.
fn check_blocking_read(inside: &TcpListener, _: &TcpListener) -> Result<String, String> {
    let before = SPURIOUS_EAGAIN.load(Ordering::Relaxed);
    let rounds = 200;
    for _ in 0..rounds {
        let (client, mut server) = connect(inside)?;
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let reader = {
            let mut client = client.try_clone().map_err(|e| e.to_string())?;
            thread::spawn(move || -> Result<Vec<u8>, String> {
                // Everything that might sleep before the read is done
                // first: the thread is seen asleep only in the read.
                let mut got = Vec::with_capacity(4096);
                let mut buf = vec![0u8; 4096];
                let _ = tid_tx.send(rustix::thread::gettid().as_raw_nonzero().get());
                drop(tid_tx);
                read_to_end_blocking(&mut client, &mut buf, &mut got)
                    .map_err(|e| format!("client read: {e}"))?;
                Ok(got)
            })
        };
        let tid = tid_rx.recv().map_err(|_| "the reader ended at once")?;
        let start = Instant::now();
        while !asleep(tid) {
            if start.elapsed() > DEADLINE {
                return Err("the reader never blocked".to_owned());
            }
            thread::yield_now();
        }
        client
            .shutdown(Shutdown::Write)
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 16];
        if read_blocking(&mut server, &mut buf).map_err(|e| format!("server read: {e}"))? != 0 {
            return Err("the server read bytes never sent".to_owned());
        }
        server.write_all(&[5u8; 100]).map_err(|e| e.to_string())?;
        server
            .shutdown(Shutdown::Write)
            .map_err(|e| e.to_string())?;
        let got = reader.join().map_err(|_| "the reader panicked")??;
        if got.len() != 100 {
            return Err(format!("the reader got {} of 100 bytes", got.len()));
        }
    }
    let all = SPURIOUS_EAGAIN.load(Ordering::Relaxed);
    let here = all - before;
    match all {
        0 => Ok(format!(
            "{rounds} half-closes under a blocked reader, no read failed early"
        )),
        all => Err(format!(
            "{all} blocking reads failed with EAGAIN before their timeout ({here} in this check)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Counters;

    fn seen(redirected_messages: u64, fallbacks: u64) -> Counters {
        Counters {
            redirected_messages,
            fallbacks,
            ..Counters::default()
        }
    }

    #[test]
    fn a_check_of_redirected_sockets_needs_every_connection_redirected() {
        assert!(took_its_path("integrity", &seen(288, 0)).is_ok());
        // One connection of four left on TCP: that part tested TCP.
        assert!(took_its_path("integrity", &seen(200, 1)).is_err());
        assert!(took_its_path("blocking-read", &seen(0, 0)).is_err());
    }

    #[test]
    fn the_tcp_check_needs_its_connection_left_on_tcp() {
        assert!(took_its_path(TCP_CHECK, &seen(0, 1)).is_ok());
        assert!(took_its_path(TCP_CHECK, &seen(2, 0)).is_err());
    }
}
