//! The byte tunnel of an upgraded connection (WebSocket and the like).
//!
//! Once the app has answered `101 Switching Protocols` and the client has
//! received it, bytes are copied both ways until either side closes; then
//! both connections are closed, as Go's reverse proxy does.

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncWriteExt, copy, split};

/// Runs the tunnel between the client and the app in its own task.
pub(super) fn spawn(client: OnUpgrade, app: OnUpgrade) {
    tokio::spawn(async move {
        let (client, app) = match tokio::try_join!(client, app) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(error = %e, "upgrade failed before the tunnel opened");
                return;
            }
        };
        let (mut client_rx, mut client_tx) = split(TokioIo::new(client));
        let (mut app_rx, mut app_tx) = split(TokioIo::new(app));
        let outcome = tokio::select! {
            r = copy(&mut client_rx, &mut app_tx) => r.map(|_| "client"),
            r = copy(&mut app_rx, &mut client_tx) => r.map(|_| "app"),
        };
        match outcome {
            Ok(side) => tracing::debug!(closed_by = side, "upgraded connection closed"),
            Err(e) => tracing::debug!(error = %e, "upgraded connection failed"),
        }
        let _ = app_tx.shutdown().await;
        let _ = client_tx.shutdown().await;
    });
}
