//! A whole client connection through the real main port: the bytes of an
//! HTTP/1.1 or h2c (prior knowledge) client, served through the whole
//! request stack (server rules, health checks, timeouts, the breaker,
//! metrics, request logs, the reverse proxy) to a stub app on loopback.
//!
//! Input: a selector byte, then the client's bytes. The selector's lowest
//! bit picks the generation (and with it a main port with
//! `containerConcurrency` 1 or unlimited); the others, the size of the
//! writes the client makes (1 to 1,017 bytes).
//!
//! Time is paused: the runtime's clock moves only when every task waits,
//! so the client waits for the port to go quiet after each write without
//! sleeping, and the head and revision timeouts fire in virtual time. (The
//! app is a real server on loopback, so "quiet" is sometimes reached while
//! its bytes are in the kernel: runs are not always the same, which
//! libFuzzer tolerates.)
//!
//! It must never panic; the port must end the connection once the client's
//! input ends; and what the port writes is HTTP: a status line for an
//! HTTP/1 client, a SETTINGS frame first for an h2c one.

#![no_main]

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use qproxy::fuzz::MainPort;
use qproxy_fuzz::{main_ports, paused_runtime, stub_app};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

struct World {
    runtime: Runtime,
    /// Classic with no limit, current with `containerConcurrency` 1.
    ports: [MainPort; 2],
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let runtime = paused_runtime();
        let ports = runtime.block_on(async {
            let app = stub_app().await.expect("the stub app listens");
            main_ports(app)
        });
        World { runtime, ports }
    })
}

/// Waits until every other task waits (time is paused: the clock moves
/// only then).
async fn quiet() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, input)) = data.split_first() else {
        return;
    };
    let world = world();
    let port = &world.ports[usize::from(selector & 1)];
    let chunk = 1 + usize::from(selector >> 1) * 8;
    let output = world.runtime.block_on(async {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let remote = SocketAddr::from(([10, 0, 0, 9], 40_123));
        let serving = tokio::spawn(async move { port.serve(server, remote).await });
        let (mut read, mut write) = tokio::io::split(client);
        let reading = tokio::spawn(async move {
            let mut output = Vec::new();
            let _ = read.read_to_end(&mut output).await;
            output
        });
        for piece in input.chunks(chunk) {
            if write.write_all(piece).await.is_err() {
                break;
            }
            quiet().await;
        }
        quiet().await;
        let _ = write.shutdown().await;
        // An hour of virtual time: past every timeout of the port. The
        // clock also moves while bytes to or from the app are still on
        // their way through the kernel, so a connection that outlives the
        // hour gets a few seconds of real time before it is called held.
        let mut serving = serving;
        if tokio::time::timeout(Duration::from_secs(3600), &mut serving)
            .await
            .is_err()
        {
            tokio::time::resume();
            let ended = tokio::time::timeout(Duration::from_secs(5), &mut serving).await;
            tokio::time::pause();
            assert!(ended.is_ok(), "the connection outlived its client's input");
        }
        reading.await.unwrap_or_default()
    });
    if output.is_empty() {
        return;
    }
    if input.starts_with(H2_PREFACE) {
        assert!(
            output.len() >= 9 && output[3] == 0x4,
            "an h2c connection began with something else than SETTINGS: {:?}",
            &output[..output.len().min(32)]
        );
    } else {
        assert!(
            output.starts_with(b"HTTP/1.1 ") || output.starts_with(b"HTTP/1.0 "),
            "an HTTP/1 connection got {:?}",
            &output[..output.len().min(64)]
        );
    }
});
