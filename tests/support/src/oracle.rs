//! Knative's Go queue-proxy (serving v0.42.2), run next to qproxy as the
//! oracle of behaviour.
//!
//! The binary is built once from the Go module proxy by
//! `tests/oracle/build.sh` (Go must be installed), or taken from
//! `QPROXY_ORACLE_BIN`. The Go queue-proxy binds the admin (8022), stats
//! (9090) and metrics (9091) ports whatever its environment says, so one
//! runs at a time: [`GoQueueProxy::start`] waits for the previous one to go.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Instant;

use tokio::net::TcpStream;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::{DEADLINE, closed_port, signal};

/// The oracle's fixed ports are one machine-wide resource.
static PORTS: LazyLock<Arc<AsyncMutex<()>>> = LazyLock::new(|| Arc::new(AsyncMutex::new(())));

/// The path of the Go queue-proxy, built on first use.
pub fn binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            if let Some(bin) = std::env::var_os("QPROXY_ORACLE_BIN") {
                return PathBuf::from(bin);
            }
            let bin = crate::target_dir().join("oracle").join("queue-v0.42.2");
            let script = crate::workspace().join("tests/oracle/build.sh");
            let status = Command::new(&script)
                .arg(&bin)
                .status()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot run {}: {e} (Go is needed to build the oracle)",
                        script.display()
                    )
                });
            assert!(
                status.success(),
                "building the Go queue-proxy failed; see tests/oracle/build.sh"
            );
            bin
        })
        .clone()
}

/// A running Go queue-proxy, killed when dropped.
pub struct GoQueueProxy {
    child: Child,
    /// Main port, on IPv4 loopback.
    pub main: SocketAddr,
    /// Admin port (always 8022).
    pub admin: SocketAddr,
    output: Arc<Mutex<Vec<String>>>,
    _ports: OwnedMutexGuard<()>,
}

impl GoQueueProxy {
    /// Starts the Go queue-proxy with `env` (its main port replaced by a
    /// free one) and waits until it serves.
    pub async fn start(env: &[(String, String)]) -> Self {
        let ports = PORTS.clone().lock_owned().await;
        let bin = tokio::task::spawn_blocking(binary).await.unwrap();
        let main_port = closed_port();
        let mut child = Command::new(bin)
            .env_clear()
            .envs(
                env.iter()
                    .filter(|(k, _)| k != "QUEUE_SERVING_PORT")
                    .map(|(k, v)| (k, v)),
            )
            .env("QUEUE_SERVING_PORT", main_port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the Go queue-proxy starts");
        let output = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let output = output.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    output.lock().unwrap().push(line);
                }
            });
        }
        let mut go = GoQueueProxy {
            child,
            main: SocketAddr::from((Ipv4Addr::LOCALHOST, main_port)),
            admin: SocketAddr::from((Ipv4Addr::LOCALHOST, 8022)),
            output,
            _ports: ports,
        };
        go.wait_serving().await;
        go
    }

    async fn wait_serving(&mut self) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "the Go queue-proxy exited ({status}): {:#?}",
                    self.output.lock().unwrap()
                );
            }
            if TcpStream::connect(self.main).await.is_ok()
                && TcpStream::connect(self.admin).await.is_ok()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the Go queue-proxy did not start"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Sends a signal (`TERM`, ...) to the process.
    pub fn signal(&self, sig: &str) {
        signal(self.child.id(), sig);
    }

    /// What it has written so far.
    pub fn output(&self) -> Vec<String> {
        self.output.lock().unwrap().clone()
    }
}

impl Drop for GoQueueProxy {
    fn drop(&mut self) {
        // Killed, not stopped: it would drain for 30 s with its ports held.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
