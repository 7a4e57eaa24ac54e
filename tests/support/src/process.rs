//! The `qproxy` binary, run as a child process with exactly the
//! environment a test gives it, and read through its JSON log lines.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Instant, SystemTime};

use qproxy::config::Generation;
use serde_json::Value;

use crate::{deadline, until_blocking};

/// The `qproxy` binary the tests run: `QPROXY_BIN` when set, else the one
/// cargo built beside the running test (`target/<profile>/qproxy`, which
/// `cargo test` builds with the qproxy package's own tests).
///
/// A binary older than the workspace's sources would test old code: that
/// fails the test, with what to do.
pub fn qproxy_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("QPROXY_BIN") {
            return PathBuf::from(bin);
        }
        let bin = crate::profile_dir().join("qproxy");
        let built = std::fs::metadata(&bin)
            .and_then(|m| m.modified())
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e}; build it with `cargo build -p qproxy` (or run \
                     `cargo test --workspace`), or set QPROXY_BIN",
                    bin.display()
                )
            });
        if let Some(newer) = newest_source(&crate::workspace().join("crates"), built) {
            panic!(
                "{} is older than {}: rebuild it with `cargo build -p qproxy` \
                 (or run `cargo test --workspace`), or set QPROXY_BIN",
                bin.display(),
                newer.display()
            );
        }
        bin
    })
}

/// A Rust source or manifest under `dir` changed after `than`, if any.
fn newest_source(dir: &Path, than: SystemTime) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if name != "tests"
                && name != "benches"
                && let Some(found) = newest_source(&path, than)
            {
                return Some(found);
            }
        } else if (path.extension().is_some_and(|e| e == "rs") || name == "Cargo.toml")
            && entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|m| m > than)
        {
            return Some(path);
        }
    }
    None
}

/// A running `qproxy` process, killed when dropped.
pub struct QProxy {
    child: Child,
    logs: Arc<(Mutex<Collected>, Condvar)>,
    /// Main port, on IPv4 loopback.
    pub main: SocketAddr,
    /// Whether the ports are bound dual-stack (`[::]`), not IPv4 only.
    pub dual_stack: bool,
    /// Admin port.
    pub admin: SocketAddr,
    /// Autoscaler stats port.
    pub stats: SocketAddr,
    /// User metrics port, when served.
    pub metrics: Option<SocketAddr>,
    /// TLS port, when `QPROXY_CERT_DIR` holds a certificate and key.
    pub tls: Option<SocketAddr>,
}

/// The environment a default install of classic Knative (serving v0.42)
/// gives a revision whose app listens on `user_port`, with every qproxy
/// port on "any free port" and no drain quiet period (so that `SIGTERM`
/// stops at once; the drain tests set their own).
pub fn knative_env(user_port: u16) -> Vec<(String, String)> {
    knative_env_of(Generation::Classic, user_port)
}

/// The same for current Knative (serving v0.50): its stock
/// `OBSERVABILITY_CONFIG` in place of the classic variables.
pub fn current_knative_env(user_port: u16) -> Vec<(String, String)> {
    knative_env_of(Generation::Current, user_port)
}

/// The environment a default install of `generation` gives, as
/// [`knative_env`] describes.
pub fn knative_env_of(generation: Generation, user_port: u16) -> Vec<(String, String)> {
    let mut vars = qproxy::config::knative_defaults(generation, user_port);
    for name in [
        "QUEUE_SERVING_PORT",
        "QUEUE_SERVING_TLS_PORT",
        "QPROXY_ADMIN_PORT",
        "QPROXY_STATS_PORT",
        "QPROXY_METRICS_PORT",
        "QPROXY_DRAIN_QUIET_SECONDS",
    ] {
        vars.set(name, "0");
    }
    vars.iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `env` with each of `vars` set, replacing any value it had.
pub fn with_vars(mut env: Vec<(String, String)>, vars: &[(&str, &str)]) -> Vec<(String, String)> {
    for (name, value) in vars {
        env.retain(|(k, _)| k != name);
        env.push(((*name).to_owned(), (*value).to_owned()));
    }
    env
}

/// `env` with the top-level keys of `patch` set in its
/// `OBSERVABILITY_CONFIG` (current Knative's settings), the others kept.
pub fn with_observability(env: Vec<(String, String)>, patch: &Value) -> Vec<(String, String)> {
    let current = env
        .iter()
        .find(|(k, _)| k == "OBSERVABILITY_CONFIG")
        .map(|(_, v)| v.as_str())
        .unwrap_or("{}");
    let mut doc: Value = serde_json::from_str(current).expect("OBSERVABILITY_CONFIG is JSON");
    if let (Some(doc), Some(patch)) = (doc.as_object_mut(), patch.as_object()) {
        for (k, v) in patch {
            doc.insert(k.clone(), v.clone());
        }
    }
    with_vars(env, &[("OBSERVABILITY_CONFIG", &doc.to_string())])
}

/// `env` with request logs on, written by `template`, probes included if
/// `probes`.
pub fn with_request_log(
    env: Vec<(String, String)>,
    template: &str,
    probes: bool,
) -> Vec<(String, String)> {
    with_vars(
        env,
        &[
            ("SERVING_ENABLE_REQUEST_LOG", "true"),
            ("SERVING_REQUEST_LOG_TEMPLATE", template),
            (
                "SERVING_ENABLE_PROBE_REQUEST_LOG",
                if probes { "true" } else { "false" },
            ),
        ],
    )
}

/// The environment of a default install of `generation` with request
/// logs on, written by `template`, probes included if `probes`: classic
/// Knative's variables, or current Knative's `OBSERVABILITY_CONFIG`.
pub fn request_log_env(
    generation: Generation,
    user_port: u16,
    template: &str,
    probes: bool,
) -> Vec<(String, String)> {
    match generation {
        Generation::Classic => with_request_log(knative_env(user_port), template, probes),
        Generation::Current => with_observability(
            current_knative_env(user_port),
            &serde_json::json!({
                "enableRequestLog": true,
                "requestLogTemplate": template,
                "enableProbeRequestLog": probes,
            }),
        ),
    }
}

/// Runs `qproxy` with exactly `env` (nothing inherited) and waits for it to exit.
pub fn run_to_exit(env: &[(String, String)]) -> std::process::Output {
    Command::new(qproxy_bin())
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("qproxy runs")
}

impl QProxy {
    /// Starts qproxy in front of an app on `user_port`, with Knative's
    /// default environment changed by `overrides`.
    pub fn start(user_port: u16, overrides: &[(&str, &str)]) -> Self {
        Self::start_env(&with_vars(knative_env(user_port), overrides))
    }

    /// Starts qproxy in front of an app on `user_port` with CPU profiles on
    /// (and `extra` set); returns it and its profiling port.
    pub fn start_profiling(user_port: u16, extra: &[(&str, &str)]) -> (Self, SocketAddr) {
        let on = [("ENABLE_PROFILING", "true"), ("QPROXY_PROFILING_PORT", "0")];
        let env = with_vars(knative_env(user_port), &on);
        let qp = Self::start_env(&with_vars(env, extra));
        let port = qp.listening("profile");
        (qp, port)
    }

    /// Starts qproxy with exactly `env` and waits until its ports are bound.
    pub fn start_env(env: &[(String, String)]) -> Self {
        Self::start_command(Command::new(qproxy_bin()), env)
    }

    /// Starts qproxy by `command` (another binary, or this one run through
    /// a wrapper such as `chroot`), with exactly `env`, and waits until its
    /// ports are bound.
    pub fn start_command(command: Command, env: &[(String, String)]) -> Self {
        let mut qp = Self::spawn_command(command, env);
        let vars = qproxy::config::Vars::from_pairs(env.iter().map(|(k, v)| (k, v)));
        let config = qproxy::Config::from_vars(&vars).ok();
        let metrics_served = config
            .as_ref()
            .is_some_and(|c| c.observability.prometheus_metrics());
        let tls_served = config.as_ref().is_some_and(|c| {
            env.iter().any(|(k, _)| k == "QPROXY_CERT_DIR")
                && c.cert_dir.join("tls.crt").exists()
                && c.cert_dir.join("tls.key").exists()
        });
        qp.main = qp.listening("main");
        qp.dual_stack = qp.bound("main").is_ipv6();
        qp.admin = qp.listening("admin");
        qp.stats = qp.listening("stats");
        if metrics_served {
            qp.metrics = Some(qp.listening("metrics"));
        }
        if tls_served {
            qp.tls = Some(qp.listening("tls"));
        }
        qp
    }

    /// Starts qproxy with exactly `env`, without waiting for anything.
    pub fn spawn_env(env: &[(String, String)]) -> Self {
        Self::spawn_command(Command::new(qproxy_bin()), env)
    }

    fn spawn_command(mut command: Command, env: &[(String, String)]) -> Self {
        let mut child = command
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("qproxy starts");
        let logs = Arc::new((Mutex::new(Collected::default()), Condvar::new()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        collect_lines(stdout, "stdout", logs.clone());
        collect_lines(stderr, "stderr", logs.clone());
        QProxy {
            child,
            logs,
            main: unspecified(),
            dual_stack: false,
            admin: unspecified(),
            stats: unspecified(),
            metrics: None,
            tls: None,
        }
    }

    /// The log lines written to `stream` (`stdout` or `stderr`) so far.
    pub fn logs_on(&self, stream: &str) -> Vec<Value> {
        self.logs()
            .into_iter()
            .filter(|l| l["_stream"] == stream)
            .collect()
    }

    /// The loopback address of the named server (`main`, `admin`,
    /// `profile`, ...), from its start-up log line.
    pub fn listening(&self, server: &str) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.bound(server).port()))
    }

    /// The address the named server reported binding.
    fn bound(&self, server: &str) -> SocketAddr {
        let line = self.wait_for_log(&format!("{server} server start"), |l| {
            l["message"] == "Starting http server" && l["server"] == server
        });
        line["address"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .expect("address field")
    }

    /// Waits for a log line matching `pred`.
    pub fn wait_for_log(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.wait_for_logs(what, 1, pred)
    }

    /// Waits until `n` log lines match `pred`; returns the `n`th.
    pub fn wait_for_logs(&self, what: &str, n: usize, pred: impl Fn(&Value) -> bool) -> Value {
        let (lines, changed) = &*self.logs;
        let deadline = Instant::now() + deadline();
        let mut guard = lines.lock().unwrap();
        loop {
            if let Some(l) = guard.lines.iter().filter(|l| pred(l)).nth(n - 1) {
                return l.clone();
            }
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("no log line for {what}; logs: {:#?}", guard.lines));
            guard = changed.wait_timeout(guard, left).unwrap().0;
        }
    }

    /// What it wrote on stdout that is not a JSON log line: request log
    /// lines of a template that does not write JSON.
    pub fn raw_lines(&self) -> Vec<String> {
        self.logs_on("stdout")
            .into_iter()
            .filter_map(|l| l["_raw"].as_str().map(str::to_owned))
            .collect()
    }

    /// Every log line so far.
    pub fn logs(&self) -> Vec<Value> {
        self.logs.0.lock().unwrap().lines.clone()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak resident memory so far, in KiB (`VmHWM`).
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/PID/status")
    }

    /// Waits for the process to exit on its own and returns its status;
    /// every line it wrote is in [`Self::logs`] by then.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + deadline();
        let child = &mut self.child;
        let status = until_blocking(crate::deadline(), "qproxy to exit", || {
            child.try_wait().unwrap()
        });
        // What it wrote last may still be in the pipes: every line is
        // collected once both have reached their end.
        let (collected, changed) = &*self.logs;
        let mut guard = collected.lock().unwrap();
        while guard.ended < 2 {
            let left = deadline
                .checked_duration_since(Instant::now())
                .expect("qproxy's output ends once it has exited");
            guard = changed.wait_timeout(guard, left).unwrap().0;
        }
        status
    }

    /// Sends a signal (`TERM`, `INT`, ...) to the process.
    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    /// Stops the process with SIGTERM and returns every line it logged.
    /// It logs before it answers, so the lines of every answered request
    /// are there.
    pub fn stop_and_collect_logs(&mut self) -> Vec<Value> {
        self.signal("TERM");
        self.wait_for_log("the exit", |l| {
            l["message"] == "Shutdown complete, exiting..."
        });
        self.logs()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for QProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a tool to its end; its standard output, or the test fails with
/// the tool's output.
pub fn run_tool(command: &mut Command) -> Vec<u8> {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?} runs: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Unpacks the tar archive at `archive` (gzipped or not) into `into`,
/// created if missing, keeping the owners it names: an image's archive or
/// one of its layers.
pub fn untar(archive: &Path, into: &Path) {
    std::fs::create_dir_all(into).unwrap_or_else(|e| panic!("{}: {e}", into.display()));
    run_tool(
        Command::new("tar")
            .arg("--same-owner")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(into),
    );
}

/// Sends a signal (`TERM`, `INT`, `KILL` or `HUP`) to a process.
pub fn signal(pid: u32, sig: &str) {
    use rustix::process::{Pid, Signal, kill_process};
    let signal = match sig {
        "TERM" => Signal::TERM,
        "INT" => Signal::INT,
        "KILL" => Signal::KILL,
        "HUP" => Signal::HUP,
        other => panic!("no such signal in these tests: {other}"),
    };
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .expect("a process id");
    kill_process(pid, signal).unwrap_or_else(|e| panic!("kill -{sig} {pid:?}: {e}"));
}

/// What the child wrote on its two streams.
#[derive(Debug, Default)]
struct Collected {
    /// Every line so far, in the order read.
    lines: Vec<Value>,
    /// How many of the streams have reached their end.
    ended: usize,
}

/// Reads JSON log lines from one of the child's streams, tagging each with
/// `"_stream"`. Anything that is not a JSON object fails the test.
fn collect_lines(
    from: impl std::io::Read + Send + 'static,
    stream: &'static str,
    logs: Arc<(Mutex<Collected>, Condvar)>,
) {
    std::thread::spawn(move || {
        let (collected, changed) = &*logs;
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            // Log lines are JSON; request log lines are what their
            // template makes them, kept whole under `_raw`.
            let mut value: Value = serde_json::from_str(&line)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| serde_json::json!({ "_raw": line }));
            value["_stream"] = stream.into();
            collected.lock().unwrap().lines.push(value);
            changed.notify_all();
        }
        collected.lock().unwrap().ended += 1;
        changed.notify_all();
    });
}

fn unspecified() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
}
