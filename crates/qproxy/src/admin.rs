//! The admin server (8022): the drain hook the user container's preStop
//! calls.
//!
//! Like Knative's, it answers as Go's `http.ServeMux` with one route:
//! `/wait-for-drain`, any method, drains (see [`Admin`]); anything else is
//! `404 page not found`. The other small servers are the autoscaler's
//! [stats](crate::stat_server), the [request metrics](qproxy_observe) and
//! [profiling](crate::profiling).

use std::future::Future;
use std::time::Duration;

use http::{Request, Response};
use qproxy_core::body::RequestBody;
use tokio::sync::watch;

use crate::drain::Drainer;
use qproxy_core::Endpoint;
use qproxy_core::body::ReplyBody;
use qproxy_core::reply::not_found;

/// Path of the drain hook the user container's preStop calls.
pub(crate) const WAIT_FOR_DRAIN: &str = "/wait-for-drain";

/// How long `/wait-for-drain` waits for `SIGTERM` before calling its
/// drain off.
pub(crate) const TERM_GRACE: Duration = Duration::from_secs(1);

/// The admin server on 8022.
///
/// `/wait-for-drain` is the user container's preStop hook: it starts the
/// main port's drain (or joins the one under way) and answers an empty
/// `200` once the drain completes. A preStop hook also runs when the
/// kubelet restarts a user container that failed its liveness probe, and
/// then no `SIGTERM` follows: so if none arrives within [`TERM_GRACE`],
/// the drain is reset and the proxy serves on as before.
#[derive(Debug, Clone)]
pub(crate) struct Admin {
    /// The main port's drain.
    pub(crate) drainer: Drainer,
    /// Turns `true` once `SIGTERM` (or `SIGINT`) has arrived.
    pub(crate) terminating: watch::Receiver<bool>,
}

impl Admin {
    /// Answers `req`.
    pub(crate) async fn answer<B>(self, req: Request<B>) -> Response<ReplyBody> {
        if req.uri().path() != WAIT_FOR_DRAIN {
            return not_found();
        }
        tracing::info!("Attached drain handler from user-container");
        let Admin {
            drainer,
            mut terminating,
        } = self;
        let reset = drainer.clone();
        tokio::spawn(async move {
            let term = async {
                // A closed channel means the process is stopping anyway.
                let _ = terminating.wait_for(|t| *t).await;
            };
            if tokio::time::timeout(TERM_GRACE, term).await.is_err() {
                reset.reset();
            }
        });
        drainer.drain().await;
        Response::new(ReplyBody::empty())
    }
}

impl Endpoint for Admin {
    fn respond(
        self,
        req: Request<RequestBody>,
    ) -> impl Future<Output = Response<ReplyBody>> + Send {
        self.answer(req)
    }
}
