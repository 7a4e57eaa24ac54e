//! Listening: every port is bound the way Go's `net.Listen(":port")`
//! binds it, one dual-stack socket on `[::]` (so both the pod IP and
//! loopback, IPv4 and IPv6, reach it), or `0.0.0.0` where the kernel has
//! no IPv6.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use socket2::{Domain, Socket, Type};
use tokio::net::TcpListener;

/// How long a request head may take to arrive: the `ReadHeaderTimeout` of
/// one minute Knative gives the queue-proxy's servers
/// (`knative.dev/pkg/network.NewServer` for the main port, and the admin,
/// stats and classic metrics servers). For h2c, the client's connection
/// preface and first `SETTINGS` frame count as the first head.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(60);

/// Current Knative's metrics server on 9091 gives request heads five
/// seconds (`knative.dev/pkg/observability/metrics/prometheus`).
pub(crate) const CURRENT_METRICS_HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// A port could not be listened on.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on port {port} for the {name} server: {source}")]
pub struct BindError {
    /// Which server.
    pub name: &'static str,
    /// The port asked for.
    pub port: u16,
    /// Why.
    #[source]
    pub source: io::Error,
}

/// A bound, listening port.
#[derive(Debug)]
pub(crate) struct Listener {
    pub(super) name: &'static str,
    pub(super) tcp: TcpListener,
    pub(super) addr: SocketAddr,
    /// How long a request head may take on this port.
    pub(super) head_timeout: Duration,
}

impl Listener {
    /// Binds `port` on all addresses, IPv4 and IPv6. Must be called within
    /// a Tokio runtime.
    pub(crate) fn bind(name: &'static str, port: u16) -> Result<Self, BindError> {
        let err = |source| BindError { name, port, source };
        let socket = match dual_stack(port) {
            Ok(s) => s,
            // No IPv6 in this kernel or namespace: IPv4 only, as Go falls back.
            Err(e) if ipv6_unavailable(&e) => ipv4_only(port).map_err(err)?,
            Err(e) => return Err(err(e)),
        };
        let std: std::net::TcpListener = socket.into();
        let addr = std.local_addr().map_err(err)?;
        let tcp = TcpListener::from_std(std).map_err(err)?;
        Ok(Self {
            name,
            tcp,
            addr,
            head_timeout: HEAD_TIMEOUT,
        })
    }

    /// Gives request heads on this port `timeout` instead of
    /// [`HEAD_TIMEOUT`].
    pub(crate) fn with_head_timeout(self, head_timeout: Duration) -> Self {
        Self {
            head_timeout,
            ..self
        }
    }

    /// The bound address (`[::]:8012` or `0.0.0.0:8012`).
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

fn dual_stack(port: u16) -> io::Result<Socket> {
    let socket = Socket::new(Domain::IPV6, Type::STREAM.nonblocking(), None)?;
    socket.set_only_v6(false)?;
    listen(socket, SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)))
}

fn ipv4_only(port: u16) -> io::Result<Socket> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM.nonblocking(), None)?;
    listen(socket, SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
}

fn listen(socket: Socket, addr: SocketAddr) -> io::Result<Socket> {
    // Go sets SO_REUSEADDR too: a restart must not wait for TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(backlog())?;
    Ok(socket)
}

fn ipv6_unavailable(e: &io::Error) -> bool {
    const EAFNOSUPPORT: i32 = 97;
    const EADDRNOTAVAIL: i32 = 99;
    matches!(e.raw_os_error(), Some(EAFNOSUPPORT | EADDRNOTAVAIL))
}

/// Raises the soft limit on open files to the hard one, as Go's runtime
/// does at start: some container runtimes set a soft limit of 1,024, which
/// would cap the connections a sidecar can hold far below what Knative's
/// Go queue-proxy holds. Returns the limit in force.
pub(crate) fn raise_open_files_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};

    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!(error = %e, "cannot raise the open files limit");
            return getrlimit(Resource::Nofile).current;
        }
    }
    limit.current
}

/// The listen backlog Go uses: the kernel's `somaxconn`.
fn backlog() -> i32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::net::TcpStream;

    #[tokio::test]
    async fn binds_dual_stack_and_reports_busy_ports() {
        let first = Listener::bind("main", 0).unwrap();
        let port = first.local_addr().port();
        assert_ne!(port, 0);
        let v4 = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await;
        assert!(v4.is_ok(), "IPv4 loopback reaches the listener");
        if first.local_addr().is_ipv6() {
            let v6 = TcpStream::connect((Ipv6Addr::LOCALHOST, port)).await;
            assert!(v6.is_ok(), "IPv6 loopback reaches the listener");
        }
        // The pod IP: the address of the interface the default route uses,
        // when this machine has one (a UDP "connect" sends nothing).
        let probe = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        if probe.connect((Ipv4Addr::new(192, 0, 2, 1), 9)).is_ok() {
            let ip = probe.local_addr().unwrap().ip();
            if !ip.is_loopback() && !ip.is_unspecified() {
                let pod = TcpStream::connect((ip, port)).await;
                assert!(pod.is_ok(), "the pod IP {ip} reaches the listener");
            }
        }
        let err = Listener::bind("admin", port).unwrap_err();
        assert_eq!(err.port, port);
        assert_eq!(err.source.kind(), io::ErrorKind::AddrInUse);
        assert!(err.to_string().starts_with(&format!(
            "cannot listen on port {port} for the admin server: "
        )));
    }
}
