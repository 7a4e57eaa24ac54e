//! The byte tunnel of an upgraded connection (WebSocket and the like).
//!
//! Once the app has answered `101 Switching Protocols` and the client has
//! received it, bytes are copied both ways. When one side finishes sending,
//! the other side's write half is shut down and the copy the other way goes
//! on until it finishes too, as current Knative's Go reverse proxy does: a
//! client that half-closes still gets the rest of the app's answer.
//!
//! The request that opened the tunnel is not over while it runs: the `101`
//! response carries a [`Tunnel`] that keeps whatever the layers hold for
//! the request (its breaker slot, for one) until the tunnel closes, and the
//! tunnel is closed at the request's [`TunnelDeadline`], if it has one.

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use crate::common::tunnel::{Tunnel, TunnelDeadline};

/// Runs the tunnel between the client and the app in its own task, and
/// returns the handle the response carries.
pub(super) fn spawn(client: OnUpgrade, app: OnUpgrade, deadline: Option<TunnelDeadline>) -> Tunnel {
    let tunnel = Tunnel::open();
    let handle = tunnel.clone();
    tokio::spawn(async move {
        let copy = async {
            let (client, app) = match tokio::try_join!(client, app) {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::debug!(error = %e, "upgrade failed before the tunnel opened");
                    return;
                }
            };
            let (mut client, mut app) = (TokioIo::new(client), TokioIo::new(app));
            match tokio::io::copy_bidirectional(&mut client, &mut app).await {
                Ok((up, down)) => tracing::debug!(up, down, "upgraded connection closed"),
                Err(e) => tracing::debug!(error = %e, "upgraded connection failed"),
            }
        };
        match deadline {
            Some(TunnelDeadline(at)) => {
                if tokio::time::timeout_at(at, copy).await.is_err() {
                    tracing::debug!("upgraded connection closed by the request timeout");
                }
            }
            None => copy.await,
        }
        tunnel.close();
    });
    handle
}
