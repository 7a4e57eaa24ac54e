//! What the accelerator's tests share: the kernel prerequisites, pods made
//! of a network namespace and a cgroup, the agent as a child process, and
//! the test app.
//!
//! Every wait is on a condition with a deadline.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

pub mod deploy;

use qproxy_test_support::{Check, eventually_blocking, until_blocking};
use std::{
    fs,
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    os::fd::AsFd,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    thread,
    time::Duration,
};

/// How long any single wait may take: a minute, or
/// `QPROXY_ACCEL_DEADLINE_SECS` (scripts/accel-vm gives an emulated
/// machine more).
pub fn deadline() -> Duration {
    qproxy_test_support::seconds_from_env("QPROXY_ACCEL_DEADLINE_SECS", 60)
}

static SERIAL: AtomicUsize = AtomicUsize::new(0);

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        SERIAL.fetch_add(1, Ordering::Relaxed)
    )
}

/// Waits until `f` gives something, or fails the test naming `what`: the
/// shared wait ([`qproxy_test_support::until_blocking`]) with this suite's
/// deadline.
pub fn until<C: Check>(what: &str, f: impl FnMut() -> C) -> C::Done {
    until_blocking(deadline(), what, f)
}

/// The agent's counters, shown as they are when a wait for one fails.
struct Counters(String);

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "\n{}", self.0)
    }
}

/// The machine this test needs: root, a cgroup2 mount, bpffs, and the
/// agent built with its programs. A machine without them fails the test,
/// saying which is missing: the tests are `#[ignore]`d for the machines
/// that cannot run them, and run (`--include-ignored`) where they can.
pub fn kernel() -> Kernel {
    let why = if !cfg!(feature = "bpf") {
        Some("built without the bpf feature (cargo test -p qproxy-accel --features bpf)")
    } else if !rustix::process::geteuid().is_root() {
        Some("not root")
    } else {
        None
    };
    if let Some(why) = why {
        panic!("cannot run here: {why}");
    }
    let root = cgroup2_mount()
        .unwrap_or_else(|| panic!("cannot run here: no cgroup2 mount"))
        .join(unique("qpa-test"));
    fs::create_dir(&root).unwrap();
    let bpffs = std::env::temp_dir().join(unique("qpa-bpffs"));
    fs::create_dir_all(&bpffs).unwrap();
    let status = Command::new("mount")
        .args(["-t", "bpf", "bpf"])
        .arg(&bpffs)
        .status()
        .unwrap();
    assert!(status.success(), "mounting bpffs at {}", bpffs.display());
    Kernel {
        cgroup: root,
        bpffs,
    }
}

/// Says `what` on the test's stderr past libtest's capture (which takes
/// only the print macros), so that a skip is seen even when tests pass.
pub fn loud(what: &str) {
    let _ = std::io::stderr().write_all(format!("\n*** {what} ***\n").as_bytes());
}

fn cgroup2_mount() -> Option<PathBuf> {
    cgroup2_mount_options().map(|(dir, _)| dir)
}

/// The first cgroup2 mount, and its options.
fn cgroup2_mount_options() -> Option<(PathBuf, String)> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_, dir, kind, options) = (f.next()?, f.next()?, f.next()?, f.next()?);
        (kind == "cgroup2").then(|| (PathBuf::from(dir), options.to_owned()))
    })
}

fn has_nsdelegate(options: &str) -> bool {
    options.split(',').any(|o| o == "nsdelegate")
}

/// The cgroup2 hierarchy mounted with `nsdelegate` (as systemd mounts it)
/// while this lives, then as it was. The option is the hierarchy's, not
/// one mount's; it restricts only processes in a cgroup namespace of their
/// own, which no other test starts.
pub struct NsDelegate {
    mount: PathBuf,
    /// The mount's options before, when they lacked `nsdelegate`.
    restore: Option<String>,
}

impl NsDelegate {
    pub fn on() -> Self {
        let (mount, options) = cgroup2_mount_options().expect("a cgroup2 mount");
        if has_nsdelegate(&options) {
            return NsDelegate {
                mount,
                restore: None,
            };
        }
        let ok = Command::new("mount")
            .args(["-o", "remount,nsdelegate"])
            .arg(&mount)
            .status()
            .unwrap();
        assert!(
            ok.success(),
            "remounting {} with nsdelegate",
            mount.display()
        );
        // The kernel ignores the option when the remount comes from a
        // cgroup namespace other than the first.
        assert!(
            cgroup2_mount_options()
                .is_some_and(|(dir, options)| dir == mount && has_nsdelegate(&options)),
            "{} has nsdelegate after the remount",
            mount.display()
        );
        NsDelegate {
            mount,
            restore: Some(options),
        }
    }
}

impl Drop for NsDelegate {
    fn drop(&mut self) {
        if let Some(options) = &self.restore {
            // Exactly the options it had: mount(8) would otherwise add the
            // current ones, nsdelegate among them.
            let ok = Command::new("mount")
                .args(["--options-mode", "ignore", "-o"])
                .arg(format!("remount,{options}"))
                .arg(&self.mount)
                .status();
            if !ok.is_ok_and(|s| s.success()) {
                loud(&format!(
                    "left {} mounted with nsdelegate",
                    self.mount.display()
                ));
            }
        }
    }
}

/// A cgroup for the test's pods and a bpffs of its own for the agent's
/// pins; both removed when dropped.
pub struct Kernel {
    /// The cgroup the agent is given (`--cgroup`); pods are below it.
    pub cgroup: PathBuf,
    /// A bpffs mount (`--pin-dir` goes below it).
    pub bpffs: PathBuf,
}

impl Kernel {
    /// The pin directory for the agent.
    pub fn pin_dir(&self) -> PathBuf {
        self.bpffs.join("qproxy-accel")
    }

    /// The pinned link that keeps the sockops program attached (the agent's
    /// layout, version 1).
    pub fn sockops_link(&self) -> PathBuf {
        self.pin_dir().join("v1/sockops_link")
    }

    /// A new pod under the test's cgroup.
    pub fn pod(&self) -> Pod {
        Pod::new(&self.cgroup)
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.bpffs).status();
        let _ = fs::remove_dir(&self.bpffs);
        remove_cgroup(&self.cgroup);
    }
}

fn remove_cgroup(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&e.path());
            }
        }
    }
    let _ = fs::write(dir.join("cgroup.kill"), "1");
    // Called from Drop, maybe while a test fails: no panic here, which
    // would abort the process and hide the test's own failure.
    eventually_blocking(deadline(), || {
        fs::read_to_string(dir.join("cgroup.procs")).map_or(true, |p| p.trim().is_empty())
    });
    if let Err(e) = fs::remove_dir(dir) {
        loud(&format!("left the cgroup {}: {e}", dir.display()));
    }
}

/// A pod: a network namespace with its loopback up, and a cgroup; the
/// processes started in it are in both from their first instruction.
pub struct Pod {
    /// The namespace's name (`ip netns`).
    pub netns: String,
    /// The pod's cgroup.
    pub cgroup: PathBuf,
    children: Vec<Child>,
}

impl Pod {
    fn new(parent: &Path) -> Self {
        let netns = unique("qpa");
        let ok = Command::new("ip")
            .args(["netns", "add", &netns])
            .status()
            .unwrap();
        assert!(ok.success(), "ip netns add {netns}");
        let ok = Command::new("ip")
            .args(["-n", &netns, "link", "set", "lo", "up"])
            .status()
            .unwrap();
        assert!(ok.success());
        let cgroup = parent.join(&netns);
        fs::create_dir(&cgroup).unwrap();
        Pod {
            netns,
            cgroup,
            children: Vec::new(),
        }
    }

    /// Starts `program` in the pod with exactly `env`; its process ID.
    pub fn spawn(&mut self, program: &Path, args: &[&str], env: &[(String, String)]) -> u32 {
        let procs = self.cgroup.join("cgroup.procs");
        let child = Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$0" && exec ip netns exec "$@""#)
            .arg(&procs)
            .arg(&self.netns)
            .arg(program)
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let pid = child.id();
        self.children.push(child);
        pid
    }

    /// Runs `program` in the pod to its end, for at most `deadline`;
    /// whether it exited 0.
    pub fn run(&mut self, deadline: Duration, program: &Path, args: &[&str]) -> bool {
        let pid = self.spawn(program, args, &[]);
        let i = self.children.iter().position(|c| c.id() == pid).unwrap();
        let mut child = self.children.remove(i);
        let status = until_blocking(
            deadline,
            &format!("{} to finish", program.display()),
            || child.try_wait().unwrap(),
        );
        status.success()
    }

    /// Makes `connections` short connections to the app's port (8080) from
    /// inside the pod, one request each, as a health checker or another
    /// container of the pod would; whether every one was answered within
    /// `deadline`.
    pub fn churn(&mut self, connections: u64, deadline: Duration) -> bool {
        let connections = connections.to_string();
        self.run(
            deadline,
            &go_app(),
            &["-addr", "127.0.0.1:8080", "-churn", &connections],
        )
    }

    /// Kills the process `pid` started in this pod and waits for it.
    pub fn kill(&mut self, pid: u32) {
        if let Some(i) = self.children.iter().position(|c| c.id() == pid) {
            let mut c = self.children.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs `f` in a thread inside the pod's network namespace: the sockets
    /// it makes belong to the pod, whichever thread uses them afterwards.
    pub fn inside<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let ns = fs::File::open(format!("/run/netns/{}", self.netns)).unwrap();
        thread::spawn(move || {
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .unwrap();
            f()
        })
        .join()
        .unwrap()
    }

    /// A connection to `port` on the pod's loopback.
    pub fn connect(&self, port: u16) -> TcpStream {
        self.inside(move || TcpStream::connect(("127.0.0.1", port)).unwrap())
    }

    /// Waits until something in the pod accepts connections on `port`.
    pub fn wait_listening(&self, port: u16) {
        until(&format!("port {port} in {}", self.netns), || {
            self.inside(move || TcpStream::connect(("127.0.0.1", port)).ok())
        });
    }

    /// What the pod's sockets with local port `port` received over TCP, in
    /// total (`ss`'s `bytes_received`), and how many are established.
    pub fn tcp_received(&self, port: u16) -> (u64, usize) {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.netns,
                "ss",
                "-tinH",
                "state",
                "established",
            ])
            .arg(format!("( sport = :{port} )"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let mut total = 0;
        let mut sockets = 0;
        for word in text.split_whitespace() {
            if let Some(n) = word.strip_prefix("bytes_received:") {
                total += n.parse::<u64>().unwrap();
            }
            if word.starts_with("cubic") || word.starts_with("reno") || word.starts_with("bbr") {
                sockets += 1;
            }
        }
        (total, sockets)
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        remove_cgroup(&self.cgroup);
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

/// The agent's binary, built with this test.
pub fn agent_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_qproxy-accel"))
}

/// A running agent, stopped (SIGKILL) when dropped.
pub struct Agent {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// Its metrics server.
    pub metrics: SocketAddr,
}

impl Agent {
    /// Starts the agent on the test's cgroup and pins, with `extra`
    /// arguments, and waits for its metrics server.
    pub fn start(kernel: &Kernel, extra: &[&str]) -> Self {
        Self::start_wrapped(kernel, &[], extra)
    }

    /// The same, run by `wrapper` (a command and its arguments, the agent
    /// after them), such as `setpriv` with fewer capabilities.
    pub fn start_wrapped(kernel: &Kernel, wrapper: &[&str], extra: &[&str]) -> Self {
        Self::start_binary(kernel, agent_bin(), wrapper, extra)
    }

    /// [`Agent::start_wrapped`] with another build of the agent, such as
    /// the one its image holds.
    pub fn start_binary(kernel: &Kernel, binary: &Path, wrapper: &[&str], extra: &[&str]) -> Self {
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(binary);
                c
            }
            None => Command::new(binary),
        };
        let mut child = command
            .arg("--cgroup")
            .arg(&kernel.cgroup)
            .arg("--pin-dir")
            .arg(kernel.pin_dir())
            .args(["--metrics-addr", "127.0.0.1:0", "--scan-interval", "0.1"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = lines.clone();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("agent: {line}");
                sink.lock().unwrap().push(line);
            }
        });
        let mut agent = Agent {
            child,
            lines,
            metrics: "0.0.0.0:0".parse().unwrap(),
        };
        let line = agent.wait_log("the metrics server", "metrics on http://");
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|s| s.split('/').next())
            .unwrap();
        agent.metrics = addr.parse().unwrap();
        agent
    }

    /// The first log line containing `needle`, waited for.
    pub fn wait_log(&self, what: &str, needle: &str) -> String {
        until(what, || self.line(|l| l.contains(needle)))
    }

    /// The gate's verdict, waited for: whether the programs attached
    /// (else the kernel failed the self-test and nothing is).
    pub fn wait_verdict(&self) -> bool {
        until("the agent's verdict", || {
            if self.logged("attached under") {
                Some(true)
            } else if self.logged("nothing is attached") {
                Some(false)
            } else {
                None
            }
        })
    }

    /// Whether some log line contains `needle` now.
    pub fn logged(&self, needle: &str) -> bool {
        self.line(|l| l.contains(needle)).is_some()
    }

    /// Waits until the agent allows the network namespace of process `pid`.
    pub fn wait_accelerating(&self, pid: u32) {
        let needle = format!("pid={pid} ");
        until(&format!("the agent to accelerate pid {pid}"), || {
            self.line(|l| l.contains("accelerating") && l.contains(&needle))
        });
    }

    /// The first log line so far that `pred` accepts.
    fn line(&self, pred: impl Fn(&str) -> bool) -> Option<String> {
        self.lines.lock().unwrap().iter().find(|l| pred(l)).cloned()
    }

    /// `GET path` on the metrics server: status and body.
    pub fn get(&self, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect_timeout(&self.metrics, deadline()).unwrap();
        s.set_read_timeout(Some(deadline())).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let status = text[9..12].parse().unwrap();
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }

    /// The value of an unlabelled series, if exported yet.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics");
        body.lines().find_map(|l| {
            let (n, v) = l.split_once(' ')?;
            (n == name).then(|| v.trim().parse().ok())?
        })
    }

    /// Waits until series `name` satisfies `pred`; its value.
    /// On a timeout, the panic shows every counter, so that a shortfall
    /// can be told from a fallback.
    pub fn wait_metric(&self, name: &str, pred: impl Fn(f64) -> bool) -> f64 {
        let what = format!("{name} to reach its expected value (the agent's counters below)");
        until(&what, || {
            self.metric(name).filter(|v| pred(*v)).ok_or_else(|| {
                let (_, all) = self.get("/metrics");
                let ours: Vec<String> = all
                    .lines()
                    .filter(|l| l.starts_with("qproxy_accel_"))
                    .map(str::to_owned)
                    .collect();
                Counters(ours.join("\n"))
            })
        })
    }

    /// Sends SIGTERM and waits for the agent to exit; whether it exited 0.
    pub fn terminate(mut self) -> bool {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let status = until("the agent to exit", || self.child.try_wait().unwrap());
        status.success()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test app (tests/apps/go), built once into target/.
pub fn go_app() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            // Built beforehand, as scripts/accel-vm does: an emulated
            // machine would take minutes to build Go's standard library.
            if let Some(app) = std::env::var_os("QPROXY_ACCEL_GO_APP") {
                return PathBuf::from(app);
            }
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/apps/go");
            let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("accel-go-app");
            let ok = Command::new("go")
                .args(["build", "-o"])
                .arg(&out)
                .arg(".")
                .current_dir(&dir)
                .env("CGO_ENABLED", "0")
                .status()
                .expect("go builds the test app");
            assert!(ok.success(), "go build in {}", dir.display());
            out
        })
        .clone()
}

/// The byte at offset `i` of every body the test app makes.
pub fn pattern(i: u64) -> u8 {
    ((i * 7 + i / 251) % 256) as u8
}

/// `len` bytes of the pattern from offset 0.
pub fn pattern_bytes(len: usize) -> Vec<u8> {
    (0..len as u64).map(pattern).collect()
}

/// Knative's default environment for a queue-proxy in front of an app on
/// 8080, with its own default ports (each pod has its own loopback).
pub fn qproxy_env() -> Vec<(String, String)> {
    qproxy::config::knative_defaults(qproxy::config::Generation::Classic, 8080)
        .iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A pod running the Go test app on 8080 and qproxy in front of it on
/// 8012; the pod and qproxy's process ID.
pub fn app_pod(kernel: &Kernel, id: &str) -> (Pod, u32) {
    app_pod_as(kernel, id, None)
}

/// The same, with qproxy run as user and group `uid` (Knative's image runs
/// it as 65532), when given.
pub fn app_pod_as(kernel: &Kernel, id: &str, uid: Option<u32>) -> (Pod, u32) {
    let app = go_app();
    pod_with(kernel, &app, &["-addr", "127.0.0.1:8080", "-id", id], uid)
}

/// A pod running the Python test app (tests/apps/python) on 8080 and
/// qproxy in front of it; the pod and qproxy's process ID.
pub fn python_pod(kernel: &Kernel) -> (Pod, u32) {
    let app = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/apps/python/app.py");
    let app = app.to_str().unwrap();
    pod_with(
        kernel,
        Path::new("python3"),
        &[app, "-addr", "127.0.0.1:8080"],
        None,
    )
}

fn pod_with(kernel: &Kernel, app: &Path, args: &[&str], uid: Option<u32>) -> (Pod, u32) {
    let mut pod = kernel.pod();
    pod.spawn(app, args, &[]);
    pod.wait_listening(8080);
    // QPROXY_BIN, or the qproxy cargo built beside this test.
    let qproxy = qproxy_test_support::qproxy_bin();
    let qp = match uid {
        None => pod.spawn(qproxy, &[], &qproxy_env()),
        Some(uid) => {
            let (reuid, regid) = (format!("--reuid={uid}"), format!("--regid={uid}"));
            let args = [
                reuid.as_str(),
                regid.as_str(),
                "--clear-groups",
                qproxy.to_str().unwrap(),
            ];
            pod.spawn(Path::new("setpriv"), &args, &qproxy_env())
        }
    };
    pod.wait_listening(8012);
    (pod, qp)
}

/// A pod whose qproxy the agent accelerates, the agent, and the kernel
/// setup under them; dropped in that order. Tests move the parts they use
/// out of it and keep the rest alive: a pattern that left `kernel` to `..`
/// would drop it at once, and the pod's cgroup with it.
pub struct Accelerated {
    /// The pod: the Go test app and qproxy.
    pub pod: Pod,
    /// qproxy's process.
    pub qproxy: u32,
    /// The agent, attached, accepting the kernel's FIONREAD failure.
    pub agent: Agent,
    /// The cgroup and bpffs of the test.
    pub kernel: Kernel,
}

/// The common start of a test of the accelerated path: the agent attached
/// with `extra` arguments, then a pod started after it, allowed.
pub fn accelerated(test: &str, extra: &[&str]) -> Accelerated {
    accelerated_with(extra, |kernel| app_pod(kernel, test))
}

/// [`accelerated`], the pod started by `start` (its qproxy's process ID
/// beside it).
pub fn accelerated_with(extra: &[&str], start: impl FnOnce(&Kernel) -> (Pod, u32)) -> Accelerated {
    let kernel = kernel();
    let agent = Agent::start(&kernel, extra);
    agent.wait_log("the programs attached", "attached under");
    let (pod, qproxy) = start(&kernel);
    agent.wait_accelerating(qproxy);
    Accelerated {
        pod,
        qproxy,
        agent,
        kernel,
    }
}

/// The pod's qproxy (`qp`) accelerated, requests on new connections to the
/// app, 100 at a time, until at least 200 messages were redirected.
///
/// A connection whose client writes before the kernel has put the server's
/// end in the map stays on TCP (the client's first message finds no peer).
/// On a loaded or emulated machine the server's end can join late, when
/// softirqs are deferred to ksoftirqd; such connections are counted as
/// fallbacks and answered all the same, and more connections are made.
///
/// The agent exports its counters every scan: after each round, the wait
/// is for the export that shows the round's 200 sockets in the map, so
/// that a round is never made again only because its count was not out yet.
pub fn churn_redirected(agent: &Agent, pod: &mut Pod, qp: u32) {
    agent.wait_accelerating(qp);
    let inserted = "qproxy_accel_inserted_total";
    until("200 messages redirected", || {
        let before = agent.wait_metric(inserted, |_| true);
        assert!(pod.churn(100, deadline()));
        agent.wait_metric(inserted, |v| v >= before + 200.0);
        agent
            .metric("qproxy_accel_redirected_messages_total")
            .filter(|v| *v >= 200.0)
    });
    if let Some(fell_back) = agent.metric("qproxy_accel_fallbacks_total") {
        eprintln!("connections that fell back to TCP: {fell_back}");
    }
}
