//! The byte tunnel of an upgraded connection (WebSocket and the like).
//!
//! Once the app has answered `101 Switching Protocols` and the client has
//! received it, bytes are copied both ways. When one side finishes sending,
//! the other side's write half is shut down and the copy the other way goes
//! on until it finishes too, as current Knative's Go reverse proxy does: a
//! client that half-closes still gets the rest of the app's answer.

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

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
        let (mut client, mut app) = (TokioIo::new(client), TokioIo::new(app));
        match tokio::io::copy_bidirectional(&mut client, &mut app).await {
            Ok((up, down)) => tracing::debug!(up, down, "upgraded connection closed"),
            Err(e) => tracing::debug!(error = %e, "upgraded connection failed"),
        }
    });
}
