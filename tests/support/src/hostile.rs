//! Hostile and broken clients, and what they cost the process they hit:
//! heads sent a line a second, connections that never send a byte, random
//! heads, and the process's CPU, memory and descriptors from `/proc`.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long Knative's servers give a request head (`ReadHeaderTimeout`).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(60);

/// How a connection a hostile client held ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// The server closed it, having written `bytes` bytes to it (an
    /// HTTP/1 answer, or HTTP/2 frames).
    Closed {
        /// How many bytes the server wrote before closing.
        bytes: usize,
    },
    /// Still open when the client gave up.
    Open,
}

/// Opens a connection to `addr`, sends `first`, then `every_second` once a
/// second (if any), never ending a head, for at most `give_up`; says how
/// the server ended it.
pub async fn hold(
    addr: SocketAddr,
    first: &[u8],
    every_second: Option<&'static [u8]>,
    give_up: Duration,
) -> Held {
    let Ok(stream) = TcpStream::connect(addr).await else {
        return Held::Closed { bytes: 0 };
    };
    let (mut read, mut write) = stream.into_split();
    let writer = async move {
        let _ = write.write_all(first).await;
        let Some(line) = every_second else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if write.write_all(line).await.is_err() {
                // A reset: the reader sees it too.
                return std::future::pending().await;
            }
        }
    };
    let reader = async move {
        let mut buf = [0u8; 1024];
        let mut bytes = 0;
        while let Ok(n @ 1..) = read.read(&mut buf).await {
            bytes += n;
        }
        Held::Closed { bytes }
    };
    tokio::select! {
        held = reader => held,
        () = writer => Held::Open,
        () = tokio::time::sleep(give_up) => Held::Open,
    }
}

/// A request head's first line, the start of what [`hold`] sends.
pub const REQUEST_LINE: &[u8] = b"GET / HTTP/1.1\r\n";

/// A header line, what [`hold`] sends every second to dribble a head.
pub const HEADER_LINE: &[u8] = b"X-Slow: a\r\n";

/// The HTTP/2 client preface, without the `SETTINGS` frame that must
/// follow it.
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Raises this process's limit on open files (the tests open tens of
/// thousands of connections): to 65,536 where it may (as root), else the
/// soft limit to the hard one; returns the limit in force.
pub fn raise_open_files() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let wanted = Rlimit {
        current: Some(65_536),
        maximum: Some(65_536),
    };
    let limit = getrlimit(Resource::Nofile);
    if limit.maximum.is_some_and(|max| max < 65_536) && setrlimit(Resource::Nofile, wanted).is_ok()
    {
        return 65_536;
    }
    let raised = Rlimit {
        current: limit.maximum,
        ..limit
    };
    let _ = setrlimit(Resource::Nofile, raised);
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// CPU time (user and system) the process `pid` has used so far.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th fields of the line.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// The resident memory of the process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// How many descriptors the process `pid` has open.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// How many of the descriptors the process `pid` has open are pipes'
/// ends (qproxy keeps some empty between splices).
pub fn open_pipe_ends(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| {
        d.filter_map(Result::ok)
            .filter(|e| {
                std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("pipe:"))
            })
            .count()
    })
}

/// How many threads the process `pid` runs.
pub fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}
