//! Knative's Go queue-proxy, run next to qproxy as the oracle of
//! behaviour: serving v0.42.2 for classic Knative, v0.50.0 for current
//! Knative; [`GoQueueProxy::start`] picks the one of the generation its
//! environment belongs to (current when `OBSERVABILITY_CONFIG` is set), as
//! qproxy itself decides.
//!
//! Each binary is built once from the Go module proxy by
//! `tests/oracle/build.sh` (Go must be installed), or taken from
//! `QPROXY_ORACLE_CLASSIC` or `QPROXY_ORACLE_CURRENT`. The Go queue-proxy
//! binds the admin (8022), stats (9090) and metrics (9091) ports whatever
//! its environment says, so one runs at a time: [`GoQueueProxy::start`]
//! waits for the previous one to go.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};

use tokio::net::TcpStream;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::{closed_port, signal, until};

/// The oracle's fixed ports are one machine-wide resource.
static PORTS: LazyLock<Arc<AsyncMutex<()>>> = LazyLock::new(|| Arc::new(AsyncMutex::new(())));

/// A generation of Knative, and the version of its queue-proxy the tests
/// compare with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Oracle {
    /// Classic Knative: knative.dev/serving v0.42.2 (Knative 1.15).
    Classic,
    /// Current Knative: knative.dev/serving v0.50.0 (Knative 1.23).
    Current,
}

impl Oracle {
    /// The oracle of the generation `env` belongs to.
    pub fn of(env: &[(String, String)]) -> Self {
        let current = env
            .iter()
            .any(|(k, v)| k == "OBSERVABILITY_CONFIG" && !v.is_empty());
        if current {
            Oracle::Current
        } else {
            Oracle::Classic
        }
    }

    /// The knative.dev/serving version, a folder of `tests/oracle`.
    pub fn version(self) -> &'static str {
        match self {
            Oracle::Classic => "v0.42.2",
            Oracle::Current => "v0.50.0",
        }
    }

    /// The path of its binary, built on first use.
    pub fn binary(self) -> PathBuf {
        static BINARIES: [OnceLock<PathBuf>; 2] = [OnceLock::new(), OnceLock::new()];
        let (slot, var) = match self {
            Oracle::Classic => (&BINARIES[0], "QPROXY_ORACLE_CLASSIC"),
            Oracle::Current => (&BINARIES[1], "QPROXY_ORACLE_CURRENT"),
        };
        slot.get_or_init(|| {
            if let Some(bin) = std::env::var_os(var) {
                return PathBuf::from(bin);
            }
            let bin = crate::target_dir()
                .join("oracle")
                .join(format!("queue-{}", self.version()));
            let script = crate::workspace().join("tests/oracle/build.sh");
            let status = Command::new(&script)
                .arg(self.version())
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
                "building the Go queue-proxy {} failed; see tests/oracle/build.sh",
                self.version()
            );
            bin
        })
        .clone()
    }
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
    /// Starts the Go queue-proxy of the generation `env` belongs to, with
    /// `env` (its main port replaced by a free one), and waits until it
    /// serves.
    pub async fn start(env: &[(String, String)]) -> Self {
        let ports = PORTS.clone().lock_owned().await;
        let oracle = Oracle::of(env);
        let bin = tokio::task::spawn_blocking(move || oracle.binary())
            .await
            .unwrap();
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
        until("the Go queue-proxy to start", async || {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "the Go queue-proxy exited ({status}): {:#?}",
                    self.output.lock().unwrap()
                );
            }
            TcpStream::connect(self.main).await.is_ok()
                && TcpStream::connect(self.admin).await.is_ok()
        })
        .await;
    }

    /// Sends a signal (`TERM`, ...) to the process.
    pub fn signal(&self, sig: &str) {
        signal(self.child.id(), sig);
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
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
