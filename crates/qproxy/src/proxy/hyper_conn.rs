//! qproxy's HTTP/1.1 connections to the app spoken by hyper, kept alive in
//! [`qproxy_http1::pool`] beside qproxy's own.

use std::net::SocketAddr;

use hyper::client::conn::http1;
use qproxy_http1::pool::Pooled;

use crate::common::body::RequestBody;

/// An HTTP/1.1 connection to the app, spoken by hyper.
#[derive(Debug)]
pub(crate) struct HyperConn {
    /// Sends requests on it.
    pub(crate) sender: http1::SendRequest<RequestBody>,
    /// Our end, for error texts.
    pub(crate) local: SocketAddr,
}

impl Pooled for HyperConn {
    fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}
