//! The byte tunnel of an upgraded connection (WebSocket and the like).
//!
//! Once the app has answered `101 Switching Protocols` and the client has
//! received it, bytes are copied both ways. When one side finishes sending,
//! the other side's write half is shut down and the copy the other way goes
//! on, as classic Knative's Go reverse proxy does: a client that
//! half-closes still gets the rest of the app's answer.
//!
//! The request that opened the tunnel is not over while it runs: the `101`
//! response carries a [`Tunnel`] that keeps whatever the layers hold for
//! the request (its breaker slot, for one) until the tunnel closes, and the
//! tunnel is closed at the request's [`TunnelDeadline`], if it has one.
//! Once the client has stopped sending, the request is over, as current
//! Knative's queue-proxy ends the whole tunnel then: what it held is let go
//! of and a shutdown no longer waits for it. The rest of the app's answer
//! still goes to the client, for at most [`AFTER_CLIENT_ENDS`]: an app
//! that never closes its side holds nothing for long.
//!
//! A `CONNECT` over HTTP/2 is a tunnel too ([`AppSide::Stream`]), with a
//! stream instead of a connection on each side: the client's, upgraded by
//! hyper's server once the `2xx` is sent, and the app's, whose answer body
//! is read and whose request body is fed, as Go's reverse proxy streams
//! both.

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use futures_util::future::Either;
use http_body_util::BodyExt;
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::proxy::body::ProxyBody;
use crate::tunnel_registry::{Tunnel, TunnelDeadline};
use qproxy_transport::connector::AppIo;
use qproxy_transport::server::conn::upgraded_tcp;
use qproxy_transport::splice::{self, Copied};

/// Most bytes one read from the client puts in the app's stream.
const READ: usize = 16 * 1024;

/// How long the app's answer may still flow once the client has stopped
/// sending: as long as a shutdown waits for upgraded connections.
pub(crate) const AFTER_CLIENT_ENDS: Duration = Duration::from_secs(60);

/// The app's side of a tunnel.
pub(crate) enum AppSide {
    /// The app's HTTP/1.1 connection, after its `101` (or its `2xx` to
    /// `CONNECT`).
    Connection(AppIo),
    /// The app's h2c stream of an HTTP/2 `CONNECT`: its answer body, read,
    /// and its request body, fed.
    Stream {
        /// The app's answer body.
        from_app: ProxyBody,
        /// The app's request body.
        to_app: mpsc::Sender<Bytes>,
    },
}

/// Runs the tunnel between the client (once hyper's server has sent the
/// `101`, or the `2xx` to `CONNECT`) and the app's side in its own task,
/// at most until `deadline`, and returns the handle the response carries.
/// Where both are plain TCP connections and `splice` allows, their bytes
/// are spliced ([`splice`]).
pub(super) fn spawn(
    client: OnUpgrade,
    app: AppSide,
    deadline: Option<TunnelDeadline>,
    splice: bool,
) -> Tunnel {
    let tunnel = Tunnel::open();
    tokio::spawn(run(client, app, deadline, splice, tunnel.clone()));
    tunnel
}

/// The task of a tunnel [`spawn`] runs, which closes `tunnel` at its end:
/// what every open tunnel holds (about 1,100 bytes, optimised, with
/// qproxy's types).
fn run(
    client: OnUpgrade,
    app: AppSide,
    deadline: Option<TunnelDeadline>,
    splice: bool,
    tunnel: Tunnel,
) -> impl Future<Output = ()> + Send + 'static {
    let ends = tunnel.clone();
    let copy = async move {
        let client = match client.await {
            Ok(client) => client,
            Err(e) => {
                tracing::debug!(error = %e, "upgrade failed before the tunnel opened");
                return;
            }
        };
        match app {
            AppSide::Connection(app) if splice => match upgraded_tcp(client) {
                Ok((client, ahead)) => splice_connection(client, ahead, app, &ends).await,
                Err(client) => copy_connection(TokioIo::new(client), app, &ends).await,
            },
            AppSide::Connection(app) => copy_connection(TokioIo::new(client), app, &ends).await,
            AppSide::Stream { from_app, to_app } => {
                copy_stream(TokioIo::new(client), from_app, to_app).await;
            }
        }
    };
    // Not an `async` block around `copy`: one would keep `copy` beside the
    // future awaiting it, twice its room in every tunnel's task.
    let run = match deadline {
        Some(TunnelDeadline(at)) => Either::Left(tokio::time::timeout_at(at, copy).map(|timed| {
            if timed.is_err() {
                tracing::debug!("upgraded connection closed by the request timeout");
            }
        })),
        None => Either::Right(copy),
    };
    run.map(move |()| tunnel.close())
}

/// Copies bytes both ways between the client and the app's connection;
/// once the client stops sending, `ends` is closed and the app's answer
/// flows on for at most [`AFTER_CLIENT_ENDS`].
async fn copy_connection(client: TokioIo<Upgraded>, app: AppIo, ends: &Tunnel) {
    let (mut from_client, mut to_client) = tokio::io::split(client);
    let (mut from_app, mut to_app) = tokio::io::split(app);
    let up = pin!(async {
        let copied = tokio::io::copy(&mut from_client, &mut to_app).await;
        let _ = to_app.shutdown().await;
        copied.map(Copied::through_memory)
    });
    let down = pin!(async {
        let copied = tokio::io::copy(&mut from_app, &mut to_client).await;
        let _ = to_client.shutdown().await;
        copied.map(Copied::through_memory)
    });
    both_ways(up, down, ends).await;
}

/// [`copy_connection`] for two plain TCP connections, the client's and the
/// app's, their bytes spliced from socket to socket (what each side had
/// read of the other already, `client_ahead` and the app's, written
/// first).
async fn splice_connection(client: TcpStream, client_ahead: Bytes, app: AppIo, ends: &Tunnel) {
    let (app, app_ahead) = app.into_parts();
    let up = pin!(async {
        let moved = splice::forward(&client, client_ahead, &app).await;
        let _ = splice::shutdown_write(&app);
        moved
    });
    let down = pin!(async {
        let moved = splice::forward(&app, app_ahead, &client).await;
        let _ = splice::shutdown_write(&client);
        moved
    });
    both_ways(up, down, ends).await;
}

/// Runs a tunnel's two directions: once the client has stopped sending
/// (`up` ended), `ends` is closed and `down` runs on for at most
/// [`AFTER_CLIENT_ENDS`]. Its end is logged with the bytes each way,
/// spliced and through memory. The two are pinned where they were made: an
/// `async fn` that took them would keep them twice, as its arguments and
/// pinned.
async fn both_ways(
    mut up: Pin<&mut impl Future<Output = io::Result<Copied>>>,
    mut down: Pin<&mut impl Future<Output = io::Result<Copied>>>,
    ends: &Tunnel,
) {
    let (up, down) = tokio::select! {
        up = &mut up => {
            // The client is done: so is its request.
            ends.close();
            let down = tokio::time::timeout(AFTER_CLIENT_ENDS, down).await;
            (up, down.unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into())))
        }
        down = &mut down => (up.await, down),
    };
    match (up, down) {
        (Ok(up), Ok(down)) => tracing::debug!(
            up = up.total(),
            down = down.total(),
            up_spliced = up.spliced,
            down_spliced = down.spliced,
            "upgraded connection closed"
        ),
        (up, down) => tracing::debug!(?up, ?down, "upgraded connection failed"),
    }
}

/// Copies an HTTP/2 `CONNECT`'s bytes: what the client sends goes to
/// `to_app` (the app's request body), the app's answer body `from_app`
/// goes to the client. A side that ends half-closes the other, whose copy
/// goes on; a side that fails ends both.
async fn copy_stream(client: TokioIo<Upgraded>, from_app: ProxyBody, to_app: mpsc::Sender<Bytes>) {
    let (mut read, mut write) = tokio::io::split(client);
    let mut up = pin!(async move {
        let mut buf = BytesMut::new();
        loop {
            buf.reserve(READ);
            match read.read_buf(&mut buf).await {
                // Dropping `to_app` ends the app's request stream.
                Ok(0) => return true,
                Ok(_) => {
                    if to_app.send(buf.split().freeze()).await.is_err() {
                        return false;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "tunnel: reading the client failed");
                    return false;
                }
            }
        }
    });
    let mut down = pin!(async move {
        let mut from_app = pin!(from_app);
        while let Some(frame) = from_app.frame().await {
            let data = match frame.map(http_body::Frame::into_data) {
                Ok(Ok(data)) => data,
                Ok(Err(_)) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "tunnel: the app's stream failed");
                    return false;
                }
            };
            if let Err(e) = write.write_all(&data).await {
                tracing::debug!(error = %e, "tunnel: writing to the client failed");
                return false;
            }
        }
        write.shutdown().await.is_ok()
    });
    let clean = tokio::select! {
        ended = &mut up => ended && down.await,
        ended = &mut down => ended && up.await,
    };
    tracing::debug!(clean, "HTTP/2 CONNECT tunnel ended");
}

#[cfg(test)]
mod tests {
    use qproxy_core::body::ReplyBody;

    use super::*;

    /// Most bytes a tunnel's task may take, unoptimised: a quarter over the
    /// 1,128 it takes (2,048 with each direction's waits nested futures,
    /// 4,000 with its copy kept twice as well).
    const ROOM: usize = 1408;

    /// A tunnel's task keeps its copy once: not again beside the timeout
    /// that wraps it, nor its two directions again inside the wait for
    /// both; and each direction is a future of a few words. (Optimised,
    /// about 1,100 bytes, where it was 6,288.)
    #[test]
    fn a_tunnels_task_keeps_its_copy_once() {
        let (to_app, _from_client) = mpsc::channel(1);
        let app = AppSide::Stream {
            from_app: ProxyBody::Reply(ReplyBody::empty()),
            to_app,
        };
        let client = hyper::upgrade::on(http::Request::new(()));
        let task = run(client, app, None, true, Tunnel::open());
        let room = std::mem::size_of_val(&task);
        assert!(room <= ROOM, "{room} bytes");
    }
}
