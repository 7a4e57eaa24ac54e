//! Dialing the app: `TCP_NODELAY` on every connection, and a dial the app
//! refuses tried again for a while.
//!
//! A refused dial means nothing listens: the app has crashed, and the
//! kubelet restarts it within about a second. The request has not reached
//! the app, so it need not fail while the app comes back: the dial is tried
//! again, with a growing pause, for up to [`REFUSED_FOR`]. Go's transport
//! fails at once; an app that stays down fails the same way, that much
//! later.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

use super::error::SendError;

/// How long dials the app refuses are tried again.
pub const REFUSED_FOR: Duration = Duration::from_secs(2);
/// The first pause after a refused dial; each next one doubles, up to
/// [`REFUSED_PAUSE_MAX`].
const REFUSED_PAUSE: Duration = Duration::from_millis(5);
const REFUSED_PAUSE_MAX: Duration = Duration::from_millis(100);

/// A connection of its own to `addr` (no delay), and its local address;
/// dialed again while `addr` refuses, for up to [`REFUSED_FOR`].
pub(crate) async fn dial(addr: SocketAddr) -> Result<(TcpStream, SocketAddr), SendError> {
    let mut refused = None;
    let mut pause = REFUSED_PAUSE;
    loop {
        let source = match dial_once(addr).await {
            Ok(dialed) => return Ok(dialed),
            Err(source) => source,
        };
        let err = SendError::Dial { addr, source };
        if !err.is_refused() {
            return Err(err);
        }
        let now = tokio::time::Instant::now();
        let until = *refused.get_or_insert_with(|| {
            tracing::debug!(error = %err, "the app refused a connection; dialing again");
            now + REFUSED_FOR
        });
        if now >= until {
            return Err(err);
        }
        tokio::time::sleep_until((now + pause).min(until)).await;
        pause = (pause * 2).min(REFUSED_PAUSE_MAX);
    }
}

/// One dial of `addr`, `TCP_NODELAY` set.
async fn dial_once(addr: SocketAddr) -> io::Result<(TcpStream, SocketAddr)> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let local = tcp.local_addr()?;
    Ok((tcp, local))
}
