//! The integrity invariant, on a whole connection through the real main
//! port: a request with a generated body, framed by `Content-Length` or in
//! chunks (with trailers or chunk extensions), broken at a generated point
//! or not, sent on a client connection that served a request first, so
//! that the port's connection to the app is pooled; the app reads strict
//! HTTP/1.1 and records what it got.
//!
//! Input: a selector byte (its lowest bit the generation, and with it a
//! main port with `containerConcurrency` unlimited or 1; then the framing,
//! two bits; then the break, three bits; the last, whether the client
//! warms the connection first), two bytes of where the break falls, a
//! byte of chunk size, then the body.
//!
//! Beyond "no panic": the app sees the request complete only if the client
//! sent it whole, and then byte for byte (body and trailers); the client
//! gets `200 ok` only for a request the app saw complete; and what the
//! port writes to the app is strict HTTP/1.1.

#![no_main]

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use qproxy::fuzz::MainPort;
use qproxy_fuzz::{SeenLog, main_ports, paused_runtime, recording_app};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

struct World {
    runtime: Runtime,
    /// Classic with no limit, current with `containerConcurrency` 1.
    ports: [MainPort; 2],
    seen: SeenLog,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let runtime = paused_runtime();
        let (ports, seen) = runtime.block_on(async {
            let (app, seen) = recording_app().await.expect("the app listens");
            (main_ports(app), seen)
        });
        World {
            runtime,
            ports,
            seen,
        }
    })
}

/// How the request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Framing {
    Length,
    Chunked,
    Trailers,
    Extensions,
}

/// How the client breaks the request.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Break {
    None,
    /// It closes its side after this many bytes of the body's framing.
    Cut,
    BadSize,
    Overflow,
    DataLonger,
    MissingCrlf,
    BadTrailer,
}

/// A request the client sends: its bytes, and whether they are the whole
/// request.
#[derive(Debug)]
struct Sent {
    bytes: Vec<u8>,
    whole: bool,
    body: Vec<u8>,
    trailers: Vec<String>,
}

/// The request with `body`, framed and broken as asked; `at` picks the
/// chunk, or the byte, where the break falls.
fn request(
    target: &str,
    framing: Framing,
    brk: Break,
    at: usize,
    unit: usize,
    body: &[u8],
) -> Sent {
    let mut head = format!("POST {target} HTTP/1.1\r\nHost: example.com\r\n").into_bytes();
    let mut framed = Vec::new();
    let mut trailers = Vec::new();
    let mut brk = brk;
    if framing == Framing::Length {
        head.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        framed.extend_from_slice(body);
        // Only a cut breaks a length.
        if brk != Break::None {
            brk = Break::Cut;
        }
    } else {
        head.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
        if framing == Framing::Trailers {
            head.extend_from_slice(b"Trailer: X-Sum\r\n");
            trailers.push(format!("x-sum: {}", body.len()));
        }
        head.extend_from_slice(b"\r\n");
        let ext = if framing == Framing::Extensions {
            ";a=b"
        } else {
            ""
        };
        let chunks: Vec<&[u8]> = body.chunks(unit).collect();
        let target = at % (chunks.len() + 1);
        for (i, chunk) in chunks.iter().enumerate() {
            let here = i == target;
            match brk {
                Break::BadSize if here => framed.extend_from_slice(b"zz\r\n"),
                Break::Overflow if here => framed.extend_from_slice(b"fffffffffffffffffff0\r\n"),
                _ => framed.extend_from_slice(format!("{:x}{ext}\r\n", chunk.len()).as_bytes()),
            }
            framed.extend_from_slice(chunk);
            match brk {
                Break::DataLonger if here => framed.extend_from_slice(b"XX\r\n"),
                Break::MissingCrlf if here => {}
                _ => framed.extend_from_slice(b"\r\n"),
            }
        }
        let last = target == chunks.len();
        match brk {
            Break::BadSize | Break::Overflow if last => framed.extend_from_slice(b"zz\r\n\r\n"),
            Break::DataLonger | Break::MissingCrlf if last => {
                framed.extend_from_slice(b"0XX\r\n\r\n")
            }
            Break::BadTrailer => framed.extend_from_slice(b"0\r\nX-Bad trailer\r\n\r\n"),
            _ => {
                framed.extend_from_slice(b"0\r\n");
                if framing == Framing::Trailers {
                    framed.extend_from_slice(format!("X-Sum: {}\r\n", body.len()).as_bytes());
                }
                framed.extend_from_slice(b"\r\n");
            }
        }
    }
    let mut whole = brk == Break::None;
    if brk == Break::Cut {
        let keep = at % (framed.len() + 1);
        whole = keep == framed.len();
        framed.truncate(keep);
    }
    head.extend_from_slice(&framed);
    Sent {
        bytes: head,
        whole,
        body: body.to_vec(),
        trailers,
    }
}

/// Waits until every other task waits (time is paused: the clock moves
/// only then).
async fn quiet() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

/// The length of the first whole response at the start of `out` and
/// whether it is `200 ok`, or `None` while it is not all there.
fn first_response(out: &[u8]) -> Option<(usize, bool)> {
    let mut fields = [httparse::EMPTY_HEADER; 32];
    let mut res = httparse::Response::new(&mut fields);
    let httparse::Status::Complete(head) = res.parse(out).ok()? else {
        return None;
    };
    let length = res
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| {
            std::str::from_utf8(h.value)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        })?;
    let end = head.checked_add(length)?;
    (out.len() >= end).then(|| (end, res.code == Some(200) && &out[head..end] == b"ok"))
}

fuzz_target!(|data: &[u8]| {
    let [selector, at_hi, at_lo, unit, body @ ..] = data else {
        return;
    };
    let framing = match (selector >> 1) & 3 {
        0 => Framing::Length,
        1 => Framing::Chunked,
        2 => Framing::Trailers,
        _ => Framing::Extensions,
    };
    let brk = match (selector >> 3) & 7 {
        0 | 7 => Break::None,
        1 => Break::Cut,
        2 => Break::BadSize,
        3 => Break::Overflow,
        4 => Break::DataLonger,
        5 => Break::MissingCrlf,
        _ => Break::BadTrailer,
    };
    let warm = selector & 0x40 == 0;
    let at = usize::from(u16::from_be_bytes([*at_hi, *at_lo]));
    // A target of its own: what the app records of an earlier input's
    // request is not this one's.
    static INPUTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let target = format!(
        "/i/{}",
        INPUTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let sent = request(&target, framing, brk, at, usize::from(*unit).max(1), body);
    let world = world();
    let port = &world.ports[usize::from(selector & 1)];
    let (case_answer, served) = world.runtime.block_on(async {
        if let Ok(mut seen) = world.seen.lock() {
            seen.clear();
        }
        let (client, server) = tokio::io::duplex(256 * 1024);
        let remote = SocketAddr::from(([10, 0, 0, 9], 40_123));
        let mut serving = tokio::spawn(async move { port.serve(server, remote).await });
        let (mut read, mut write) = tokio::io::split(client);
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut warmed = 0;
        if warm {
            // A request served first: its connection to the app is pooled.
            let _ = write
                .write_all(b"GET /warm HTTP/1.1\r\nHost: example.com\r\n\r\n")
                .await;
            let answered = tokio::time::timeout(Duration::from_secs(60), async {
                loop {
                    if let Some((end, _)) = first_response(&out) {
                        return Some(end);
                    }
                    match read.read(&mut buf).await {
                        Ok(0) | Err(_) => return None,
                        Ok(n) => out.extend_from_slice(&buf[..n]),
                    }
                }
            })
            .await;
            match answered {
                Ok(Some(end)) => warmed = end,
                // The warm-up failed (a timeout that paused time fired while
                // bytes were still in the kernel): the app's records are
                // still checked.
                _ => return (None, false),
            }
        }
        for piece in sent.bytes.chunks(1 + usize::from(*unit) * 4) {
            if write.write_all(piece).await.is_err() {
                break;
            }
            quiet().await;
        }
        quiet().await;
        let _ = write.shutdown().await;
        let reading = async {
            loop {
                match read.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => out.extend_from_slice(&buf[..n]),
                }
            }
        };
        let served = tokio::time::timeout(Duration::from_secs(3600), async {
            reading.await;
            let _ = (&mut serving).await;
        })
        .await
        .is_ok();
        for _ in 0..3 {
            quiet().await;
        }
        let answer = out.get(warmed..).and_then(first_response).map(|(_, ok)| ok);
        (answer, served)
    });
    let _ = served;
    // What each recent input sent, by its target: a request the app reads
    // during this input may be an earlier one's (a pooled connection it
    // broke, written to again), and is held to what that one sent.
    static SENT: std::sync::Mutex<Vec<(String, Sent)>> = std::sync::Mutex::new(Vec::new());
    let mut sents = SENT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    sents.push((target.clone(), sent));
    if sents.len() > 64 {
        sents.remove(0);
    }
    let seen = world.seen.lock().map(|s| s.clone()).unwrap_or_default();
    for request in &seen {
        assert!(
            request.violation.is_none(),
            "the app read bytes no strict parser takes ({:?}) in {framing:?}, {brk:?}: {request:?}",
            request.violation,
        );
        if !request.complete || !request.target.starts_with("/i/") {
            continue;
        }
        let Some((_, sent)) = sents.iter().find(|(t, _)| *t == request.target) else {
            panic!("the app got a complete request no recent input sent: {request:?}");
        };
        assert!(
            sent.whole,
            "the app got a complete request the client never sent whole ({framing:?}, {brk:?}): {request:?}"
        );
        assert_eq!(request.body, sent.body, "the app got other bytes");
        assert_eq!(
            request.trailers, sent.trailers,
            "the app got other trailers"
        );
    }
    if case_answer == Some(true) {
        assert!(
            seen.iter().any(|s| s.target == target && s.complete),
            "the client got 200 ok for a request the app never had whole ({framing:?}, {brk:?})"
        );
    }
});
