//! What failed on the way to the app, in the transport's words.

use std::io;
use std::net::SocketAddr;

use crate::client::{ExchangeError, UploadError};

/// Why a request got no answer from the app.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The app could not be dialled (nothing listens, ...).
    #[error("dial {addr}: {source}")]
    Dial {
        /// The app's address.
        addr: SocketAddr,
        /// What the dial said.
        #[source]
        source: io::Error,
    },
    /// The exchange on a connection failed: the request could not be
    /// written, or no whole response head came back.
    #[error("{local}->{remote}: {source}")]
    Exchange {
        /// Our end of the connection.
        local: SocketAddr,
        /// The app's address.
        remote: SocketAddr,
        /// What failed.
        #[source]
        source: ExchangeError,
    },
    /// The h2c connection or stream failed.
    #[error("h2c: {0}")]
    Http2(#[source] h2::Error),
}

impl SendError {
    /// Whether the app's connection closed or failed under the request
    /// before it answered, so that a replayable request may be sent again
    /// (Go's `errServerClosedIdle` and `transportReadFromServerError`).
    pub fn is_dropped_connection(&self) -> bool {
        matches!(
            self,
            SendError::Exchange {
                source: ExchangeError::Closed
                    | ExchangeError::Io(_)
                    | ExchangeError::Upload(UploadError::Io(_)),
                ..
            }
        )
    }

    /// Whether the app refused the dial: nothing listens.
    pub fn is_refused(&self) -> bool {
        matches!(self, SendError::Dial { source, .. } if source.kind() == io::ErrorKind::ConnectionRefused)
    }
}
