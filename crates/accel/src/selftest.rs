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
    num::ParseIntError,
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
            report.push("kernel", false, why.to_string());
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
    if let Err(source) = fs::create_dir(&dir) {
        let why = SetupError::Cgroup { path: dir, source };
        report.push("setup", false, why.to_string());
        return report;
    }
    let outcome = echo(exe, &dir, &mut report);
    // The child has been reaped: the cgroup is empty.
    let _ = fs::remove_dir(&dir);
    if let Err(why) = outcome {
        report.push("setup", false, why.to_string());
    }
    report
}

/// Why the echo could not be run: a failure of the agent's side or of the
/// child's start, not a verdict on the kernel's programs.
#[derive(Debug, thiserror::Error)]
enum SetupError {
    /// The self-test's cgroup could not be made.
    #[error("creating the cgroup {path}: {source}")]
    Cgroup {
        /// The cgroup's directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The test's programs could not be loaded or attached; said with
    /// every cause, on one line.
    #[error("{}", chain(.0))]
    Programs(#[source] crate::Error),
    /// The test's maps could not be read or written.
    #[error("{0}")]
    Maps(#[source] crate::Error),
    /// The child could not be started.
    #[error("starting the self-test's child {exe}: {source}")]
    Spawn {
        /// This binary, run as the child.
        exe: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The child's stdout was not piped.
    #[error("the child has no stdout")]
    NoStdout,
    /// The child's stdin was not piped.
    #[error("the child has no stdin")]
    NoStdin,
    /// Reading the child's stdout failed.
    #[error("{0}")]
    Read(#[source] io::Error),
    /// Writing to the child's stdin failed.
    #[error("{0}")]
    Write(#[source] io::Error),
    /// The child's stdout ended before its first line.
    #[error("the self-test's child ended before it was ready")]
    EndedBeforeReady,
    /// The child's first line was not `ready NETNS PORT`.
    #[error("the self-test's child said {line:?}")]
    NotReady {
        /// What it said.
        line: String,
    },
    /// The network namespace's cookie in the child's first line is not a
    /// number.
    #[error("bad cookie in {line:?}")]
    BadCookie {
        /// The line.
        line: String,
        /// Why.
        #[source]
        source: ParseIntError,
    },
    /// The port in the child's first line is not a port.
    #[error("bad port in {line:?}")]
    BadPort {
        /// The line.
        line: String,
        /// Why.
        #[source]
        source: ParseIntError,
    },
    /// The child's stdout ended before it said `done`.
    #[error("the self-test's child ended before it was done")]
    EndedBeforeDone,
}

fn echo(exe: &Path, dir: &Path, report: &mut Report) -> Result<(), SetupError> {
    let mut accel = Accel::load(None, 1024).map_err(SetupError::Programs)?;
    accel.attach(dir).map_err(SetupError::Programs)?;
    let mut child = Command::new(exe)
        .arg(PEER_ARG)
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|source| SetupError::Spawn {
            exe: exe.to_owned(),
            source,
        })?;
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
    let counters = accel.counters().map_err(SetupError::Maps)?;
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

fn talk(child: &mut Child, accel: &mut Accel, report: &mut Report) -> Result<(), SetupError> {
    let stdout = child.stdout.take().ok_or(SetupError::NoStdout)?;
    let mut lines = BufReader::new(stdout).lines();
    let ready = lines
        .next()
        .ok_or(SetupError::EndedBeforeReady)?
        .map_err(SetupError::Read)?;
    let mut words = ready.split_whitespace();
    let (Some("ready"), Some(netns), Some(port)) = (words.next(), words.next(), words.next())
    else {
        return Err(SetupError::NotReady { line: ready });
    };
    let netns: u64 = match netns.parse() {
        Ok(netns) => netns,
        Err(source) => {
            return Err(SetupError::BadCookie {
                line: ready,
                source,
            });
        }
    };
    let port: u16 = match port.parse() {
        Ok(port) => port,
        Err(source) => {
            return Err(SetupError::BadPort {
                line: ready,
                source,
            });
        }
    };
    accel.allow(netns, port).map_err(SetupError::Maps)?;
    let mut stdin = child.stdin.take().ok_or(SetupError::NoStdin)?;
    let counters = |accel: &Accel| accel.counters().map_err(SetupError::Maps);
    let mut before = counters(accel)?;
    let mut attempt = 1;
    writeln!(stdin, "go").map_err(SetupError::Write)?;
    for line in lines {
        let line = line.map_err(SetupError::Read)?;
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
        writeln!(stdin, "{reply}").map_err(SetupError::Write)?;
    }
    Err(SetupError::EndedBeforeDone)
}

/// Why a check's connections did not take the path it tests: what it
/// tested was not what it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum OffPath {
    /// [`TCP_CHECK`]'s connection was redirected instead.
    #[error("its connection was not left on TCP")]
    NotOnTcp,
    /// Connections of a check of redirected sockets stayed on TCP.
    #[error("{fallbacks} of its connections fell back to TCP")]
    FellBack {
        /// How many.
        fallbacks: u64,
    },
    /// A check of redirected sockets saw no message redirected.
    #[error("nothing of it was redirected")]
    NotRedirected,
}

/// Whether a check's connections took the path it tests, from what the
/// counters saw while it ran (`seen`).
fn took_its_path(check: &str, seen: &crate::Counters) -> Result<(), OffPath> {
    if check == TCP_CHECK {
        return if seen.fallbacks > 0 {
            Ok(())
        } else {
            Err(OffPath::NotOnTcp)
        };
    }
    if seen.fallbacks > 0 {
        return Err(OffPath::FellBack {
            fallbacks: seen.fallbacks,
        });
    }
    if seen.redirected_messages == 0 {
        return Err(OffPath::NotRedirected);
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
type Probe = fn(&TcpListener, &TcpListener) -> Result<String, ProbeError>;

/// Why a check failed. Its text is what the child prints after
/// `fail NAME`, and what the check's line in the report says.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    /// A named step on a socket failed.
    #[error("{step}: {source}")]
    Io {
        /// Which step: `connect`, `server read`, ...
        step: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A call on a socket failed; said in the system's words alone.
    #[error("{source}")]
    Socket {
        /// Which call, for the debug form.
        call: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A named system call failed.
    #[error("{step}: {source}")]
    Sys {
        /// Which call: `poll`, `peek` or `FIONREAD`.
        step: &'static str,
        /// Why.
        #[source]
        source: rustix::io::Errno,
    },
    /// An epoll call failed; said in the system's words alone.
    #[error("{source}")]
    Epoll {
        /// Which call, for the debug form.
        call: &'static str,
        /// Why.
        #[source]
        source: rustix::io::Errno,
    },
    /// A thread of the check panicked.
    #[error("{thread} panicked")]
    Panicked {
        /// Which thread: `writer`, `echo` or `the reader`.
        thread: &'static str,
    },
    /// The echo's server saw EOF before every byte sent.
    #[error("the server saw {echoed} of {sent} bytes before EOF")]
    ShortEcho {
        /// Bytes it read.
        echoed: u64,
        /// Bytes sent.
        sent: usize,
    },
    /// The echo came back different.
    #[error("echo differs at byte {at}: {got} bytes back of {sent}")]
    EchoDiffers {
        /// The first byte that differs.
        at: usize,
        /// Bytes back.
        got: usize,
        /// Bytes sent.
        sent: usize,
    },
    /// Bytes sent never became readable.
    #[error("{want} bytes never arrived")]
    NeverArrived {
        /// Bytes sent.
        want: usize,
    },
    /// `FIONREAD` did not count the bytes waiting.
    #[error("FIONREAD says {reported} with {want} bytes waiting")]
    Fionread {
        /// What `FIONREAD` said.
        reported: u64,
        /// Bytes waiting.
        want: usize,
    },
    /// A read ended before the bytes sent.
    #[error("early EOF")]
    EarlyEof,
    /// An edge-triggered waiter was not woken by a message.
    #[error("no wake-up for message {round} of {rounds}")]
    NoWakeUp {
        /// The message, from 0.
        round: u32,
        /// Messages in the check.
        rounds: u32,
    },
    /// A wake-up came with less than the whole message readable.
    #[error("message {round}: read {got} of 100 bytes after its wake-up")]
    ShortWakeUp {
        /// The message, from 0.
        round: u32,
        /// Bytes read.
        got: usize,
    },
    /// The reader thread ended before it said which thread it is.
    #[error("the reader ended at once")]
    ReaderEnded,
    /// The reader thread was never seen asleep in its read.
    #[error("the reader never blocked")]
    NeverBlocked,
    /// The server read bytes where none were sent.
    #[error("the server read bytes never sent")]
    UnsentBytes,
    /// The blocked reader got less than the answer.
    #[error("the reader got {got} of 100 bytes")]
    ShortRead {
        /// Bytes it got.
        got: usize,
    },
    /// Blocking reads failed with `EAGAIN` before their timeout.
    #[error("{all} blocking reads failed with EAGAIN before their timeout ({here} in this check)")]
    SpuriousEagain {
        /// In every check of this child.
        all: u64,
        /// In the `blocking-read` check.
        here: u64,
    },
}

/// A named step on a socket that failed.
fn io_step(step: &'static str) -> impl FnOnce(io::Error) -> ProbeError {
    move |source| ProbeError::Io { step, source }
}

/// A call on a socket that failed, said in the system's words alone.
fn socket_call(call: &'static str) -> impl FnOnce(io::Error) -> ProbeError {
    move |source| ProbeError::Socket { call, source }
}

/// A named system call that failed.
fn sys_step(step: &'static str) -> impl FnOnce(rustix::io::Errno) -> ProbeError {
    move |source| ProbeError::Sys { step, source }
}

/// An epoll call that failed, said in the system's words alone.
fn epoll_call(call: &'static str) -> impl FnOnce(rustix::io::Errno) -> ProbeError {
    move |source| ProbeError::Epoll { call, source }
}

// Every wait of a check is on a condition; the deadline only bounds a
// failure, and is long enough for a node busy starting its pods.
const DEADLINE: Duration = Duration::from_secs(20);

fn connect(listener: &TcpListener) -> Result<(TcpStream, TcpStream), ProbeError> {
    let addr = listener
        .local_addr()
        .map_err(socket_call("local address"))?;
    let client = TcpStream::connect(addr).map_err(io_step("connect"))?;
    let (server, _) = listener.accept().map_err(io_step("accept"))?;
    for s in [&client, &server] {
        s.set_read_timeout(Some(DEADLINE))
            .map_err(socket_call("read timeout"))?;
        s.set_write_timeout(Some(DEADLINE))
            .map_err(socket_call("write timeout"))?;
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
fn check_integrity(inside: &TcpListener, _: &TcpListener) -> Result<String, ProbeError> {
    let sizes = [1usize, 100, 4096, 65_536, 1 << 20];
    let mut pairs = Vec::new();
    for _ in 0..4 {
        pairs.push(connect(inside)?);
    }
    let mut handles = Vec::new();
    for (i, (client, server)) in pairs.into_iter().enumerate() {
        let echo = thread::spawn(move || -> Result<u64, ProbeError> {
            let mut server = server;
            let mut buf = [0u8; 16 * 1024];
            let mut total = 0u64;
            loop {
                let n = read_blocking(&mut server, &mut buf).map_err(io_step("server read"))?;
                if n == 0 {
                    break;
                }
                total += n as u64;
                server
                    .write_all(&buf[..n])
                    .map_err(io_step("server write"))?;
            }
            server
                .shutdown(Shutdown::Write)
                .map_err(socket_call("server shutdown"))?;
            Ok(total)
        });
        let sent: Vec<u8> = sizes
            .iter()
            .enumerate()
            .flat_map(|(j, &n)| pattern((i * 10 + j) as u64, n))
            .collect();
        let writer = {
            let mut client = client.try_clone().map_err(socket_call("client clone"))?;
            let sent = sent.clone();
            thread::spawn(move || -> Result<(), ProbeError> {
                client.write_all(&sent).map_err(io_step("client write"))?;
                client
                    .shutdown(Shutdown::Write)
                    .map_err(socket_call("client shutdown"))
            })
        };
        handles.push((client, sent, echo, writer));
    }
    let mut bytes = 0;
    for (mut client, sent, echo, writer) in handles {
        let mut got = Vec::with_capacity(sent.len());
        read_to_end_blocking(&mut client, &mut vec![0u8; 64 * 1024], &mut got)
            .map_err(io_step("client read"))?;
        writer
            .join()
            .map_err(|_| ProbeError::Panicked { thread: "writer" })??;
        let echoed = echo
            .join()
            .map_err(|_| ProbeError::Panicked { thread: "echo" })??;
        if echoed != sent.len() as u64 {
            return Err(ProbeError::ShortEcho {
                echoed,
                sent: sent.len(),
            });
        }
        if got != sent {
            let at = got
                .iter()
                .zip(&sent)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(sent.len()));
            return Err(ProbeError::EchoDiffers {
                at,
                got: got.len(),
                sent: sent.len(),
            });
        }
        bytes += sent.len();
    }
    Ok(format!(
        "{bytes} bytes each way on 4 connections, half-closed"
    ))
}

/// Waits until `want` bytes can be read from `socket` (seen with
/// `MSG_PEEK`, which takes nothing), then asks `FIONREAD` once.
fn wait_fionread(socket: &TcpStream, want: usize) -> Result<(), ProbeError> {
    let start = Instant::now();
    let mut peek = vec![0u8; want + 1];
    loop {
        let left = DEADLINE.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(ProbeError::NeverArrived { want });
        }
        let timeout = rustix::event::Timespec {
            tv_sec: left.as_secs() as _,
            tv_nsec: left.subsec_nanos() as _,
        };
        let mut fds = [PollFd::new(socket, PollFlags::IN)];
        rustix::event::poll(&mut fds, Some(&timeout)).map_err(sys_step("poll"))?;
        // Without waiting: a blocking peek may fail with `EAGAIN` on the
        // kernels the `blocking-read` check is about.
        match rustix::net::recv(
            socket,
            &mut peek[..],
            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
        ) {
            Ok((waiting, _)) if waiting >= want => break,
            Ok(_) | Err(rustix::io::Errno::AGAIN) => {}
            Err(e) => return Err(sys_step("peek")(e)),
        }
    }
    let reported = rustix::io::ioctl_fionread(socket).map_err(sys_step("FIONREAD"))?;
    if reported == want as u64 {
        Ok(())
    } else {
        Err(ProbeError::Fionread { reported, want })
    }
}

fn check_fionread_redirected(inside: &TcpListener, _: &TcpListener) -> Result<String, ProbeError> {
    let (mut client, server) = connect(inside)?;
    client
        .write_all(&[7u8; 1000])
        .map_err(socket_call("client write"))?;
    wait_fionread(&server, 1000)?;
    Ok("1000 bytes waiting, 1000 reported".to_owned())
}

fn check_fionread_tcp(_: &TcpListener, outside: &TcpListener) -> Result<String, ProbeError> {
    // The client is in the map, its peer is not: its first message finds
    // no peer and the connection stays on TCP; what it receives comes
    // over TCP to a socket in the map.
    let (mut client, mut server) = connect(outside)?;
    client
        .write_all(b"hello")
        .map_err(socket_call("client write"))?;
    let mut buf = [0u8; 5];
    let mut got = 0;
    while got < buf.len() {
        match read_blocking(&mut server, &mut buf[got..]).map_err(socket_call("server read"))? {
            0 => return Err(ProbeError::EarlyEof),
            n => got += n,
        }
    }
    server
        .write_all(&[9u8; 1000])
        .map_err(socket_call("server write"))?;
    wait_fionread(&client, 1000)?;
    Ok("1000 bytes waiting, 1000 reported".to_owned())
}

fn check_epoll_edge(inside: &TcpListener, _: &TcpListener) -> Result<String, ProbeError> {
    let (mut client, server) = connect(inside)?;
    server
        .set_nonblocking(true)
        .map_err(socket_call("server nonblocking"))?;
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(epoll_call("epoll_create"))?;
    epoll::add(
        &ep,
        &server,
        epoll::EventData::new_u64(1),
        epoll::EventFlags::IN | epoll::EventFlags::ET,
    )
    .map_err(epoll_call("epoll_ctl"))?;
    let rounds: u32 = 200;
    let mut server = server;
    let mut buf = [0u8; 4096];
    for round in 0..rounds {
        client
            .write_all(&[round as u8; 100])
            .map_err(socket_call("client write"))?;
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
        .map_err(epoll_call("epoll_wait"))?;
        if woken == 0 {
            return Err(ProbeError::NoWakeUp { round, rounds });
        }
        let mut got = 0;
        loop {
            match server.read(&mut buf) {
                Ok(0) => return Err(ProbeError::EarlyEof),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(socket_call("server read")(e)),
            }
        }
        if got != 100 {
            return Err(ProbeError::ShortWakeUp { round, got });
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
fn check_blocking_read(inside: &TcpListener, _: &TcpListener) -> Result<String, ProbeError> {
    let before = SPURIOUS_EAGAIN.load(Ordering::Relaxed);
    let rounds = 200;
    for _ in 0..rounds {
        let (client, mut server) = connect(inside)?;
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let reader = {
            let mut client = client.try_clone().map_err(socket_call("client clone"))?;
            thread::spawn(move || -> Result<Vec<u8>, ProbeError> {
                // Everything that might sleep before the read is done
                // first: the thread is seen asleep only in the read.
                let mut got = Vec::with_capacity(4096);
                let mut buf = vec![0u8; 4096];
                let _ = tid_tx.send(rustix::thread::gettid().as_raw_nonzero().get());
                drop(tid_tx);
                read_to_end_blocking(&mut client, &mut buf, &mut got)
                    .map_err(io_step("client read"))?;
                Ok(got)
            })
        };
        let tid = tid_rx.recv().map_err(|_| ProbeError::ReaderEnded)?;
        let start = Instant::now();
        while !asleep(tid) {
            if start.elapsed() > DEADLINE {
                return Err(ProbeError::NeverBlocked);
            }
            thread::yield_now();
        }
        client
            .shutdown(Shutdown::Write)
            .map_err(socket_call("client shutdown"))?;
        let mut buf = [0u8; 16];
        if read_blocking(&mut server, &mut buf).map_err(io_step("server read"))? != 0 {
            return Err(ProbeError::UnsentBytes);
        }
        server
            .write_all(&[5u8; 100])
            .map_err(socket_call("server write"))?;
        server
            .shutdown(Shutdown::Write)
            .map_err(socket_call("server shutdown"))?;
        let got = reader.join().map_err(|_| ProbeError::Panicked {
            thread: "the reader",
        })??;
        if got.len() != 100 {
            return Err(ProbeError::ShortRead { got: got.len() });
        }
    }
    let all = SPURIOUS_EAGAIN.load(Ordering::Relaxed);
    let here = all - before;
    match all {
        0 => Ok(format!(
            "{rounds} half-closes under a blocked reader, no read failed early"
        )),
        all => Err(ProbeError::SpuriousEagain { all, here }),
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

    /// The child prints a failed check as `fail NAME DETAIL`, and the
    /// report, the logs and the tests read it: the words stay as they were.
    #[test]
    fn failures_read_as_they_always_have() {
        let refused = || io::Error::from(io::ErrorKind::ConnectionRefused);
        let texts = [
            (
                io_step("connect")(refused()).to_string(),
                format!("connect: {}", refused()),
            ),
            (
                socket_call("client write")(refused()).to_string(),
                refused().to_string(),
            ),
            (
                sys_step("FIONREAD")(rustix::io::Errno::INVAL).to_string(),
                format!("FIONREAD: {}", rustix::io::Errno::INVAL),
            ),
            (
                ProbeError::Panicked {
                    thread: "the reader",
                }
                .to_string(),
                "the reader panicked".to_owned(),
            ),
            (
                ProbeError::Fionread {
                    reported: 0,
                    want: 1000,
                }
                .to_string(),
                "FIONREAD says 0 with 1000 bytes waiting".to_owned(),
            ),
            (
                ProbeError::SpuriousEagain { all: 3, here: 1 }.to_string(),
                "3 blocking reads failed with EAGAIN before their timeout (1 in this check)"
                    .to_owned(),
            ),
            (
                took_its_path("integrity", &seen(200, 1))
                    .unwrap_err()
                    .to_string(),
                "1 of its connections fell back to TCP".to_owned(),
            ),
            (
                took_its_path(TCP_CHECK, &seen(2, 0))
                    .unwrap_err()
                    .to_string(),
                "its connection was not left on TCP".to_owned(),
            ),
            (
                SetupError::NotReady {
                    line: "hello".to_owned(),
                }
                .to_string(),
                r#"the self-test's child said "hello""#.to_owned(),
            ),
            (
                SetupError::Spawn {
                    exe: PathBuf::from("/bin/qproxy-accel"),
                    source: refused(),
                }
                .to_string(),
                format!(
                    "starting the self-test's child /bin/qproxy-accel: {}",
                    refused()
                ),
            ),
            (
                SetupError::Programs(crate::Error::NoPrograms).to_string(),
                "this build has no BPF programs (build qproxy-accel with --features bpf)"
                    .to_owned(),
            ),
        ];
        for (got, want) in texts {
            assert_eq!(got, want);
        }
    }

    /// Loading and attaching are said with every cause on one line; the
    /// maps' errors with their own words: as they were.
    #[test]
    fn a_programs_failure_is_said_with_its_causes() {
        let failed = || crate::Error::Map {
            what: "reading the counters",
            source: aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                call: "bpf_map_lookup_elem",
                io_error: io::Error::other("denied"),
            }),
        };
        assert_eq!(
            SetupError::Programs(failed()).to_string(),
            "reading the counters: `bpf_map_lookup_elem` failed: `bpf_map_lookup_elem` failed: \
             denied"
        );
        assert_eq!(
            SetupError::Maps(failed()).to_string(),
            "reading the counters: `bpf_map_lookup_elem` failed"
        );
    }
}
