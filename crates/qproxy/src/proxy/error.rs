//! Why a request could not be proxied, worded as Go's HTTP transport words
//! it: Knative's queue-proxy answers `502` with the error text as the body,
//! so that text is part of what clients see.

use std::io;
use std::net::SocketAddr;

use crate::go::go_quote;
use qproxy_transport::client::{ExchangeError, UploadError};
use qproxy_transport::connector::SendError;

/// A failure talking to the user container.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// The connection could not be made (app not listening, ...).
    #[error("dial tcp {addr}: connect: {}", errno_text(.source))]
    Connect {
        /// The user container's address.
        addr: SocketAddr,
        /// What `connect` said.
        #[source]
        source: io::Error,
    },
    /// The connection failed while the response was awaited.
    #[error("read tcp {}->{remote}: read: {}", local.map_or_else(|| "127.0.0.1".to_owned(), |l| l.to_string()), errno_text(.source))]
    Io {
        /// Our end of the connection, when known.
        local: Option<SocketAddr>,
        /// The user container's address.
        remote: SocketAddr,
        /// The socket error.
        #[source]
        source: io::Error,
    },
    /// The app closed the connection before a complete response.
    #[error("EOF")]
    Closed,
    /// The app sent something that is not HTTP.
    #[error("net/http: HTTP/1.x transport connection broken: {0}")]
    Protocol(String),
    /// The client's request body failed (the client went away).
    #[error("context canceled")]
    ClientGone,
    /// The request's host cannot be sent.
    #[error("http: invalid Host header")]
    InvalidHost,
    /// The client asked to switch to a protocol that is not printable ASCII.
    #[error("client tried to switch to invalid protocol {}", go_quote(.0))]
    InvalidClientUpgrade(Vec<u8>),
    /// The app switched to a protocol other than the one requested.
    #[error("backend tried to switch protocol {} when {} was requested", go_quote(.offered), go_quote(.requested))]
    UpgradeMismatch {
        /// What the client asked for.
        requested: Vec<u8>,
        /// What the app switched to.
        offered: Vec<u8>,
    },
    /// The h2c connection or stream failed (hyper's client said
    /// `http2 error` for every such failure).
    #[error("http2 error")]
    Http2(#[source] h2::Error),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

impl UpstreamError {
    /// Whether the failure is the client's doing, not worth an error log.
    pub(crate) fn is_client_gone(&self) -> bool {
        matches!(self, UpstreamError::ClientGone)
    }
}

impl From<SendError> for UpstreamError {
    /// What the transport said failed, in Go's transport's words.
    fn from(err: SendError) -> Self {
        match err {
            SendError::Dial { addr, source } => UpstreamError::Connect { addr, source },
            SendError::Exchange {
                local,
                remote,
                source,
            } => match source {
                ExchangeError::Io(source) | ExchangeError::Upload(UploadError::Io(source)) => {
                    UpstreamError::Io {
                        local: Some(local),
                        remote,
                        source,
                    }
                }
                ExchangeError::Closed => UpstreamError::Closed,
                ExchangeError::Malformed(_) => UpstreamError::Protocol(source.to_string()),
                // The client's body broke off: the client's doing.
                ExchangeError::Upload(
                    UploadError::Body(_) | UploadError::Length | UploadError::Failed,
                ) => UpstreamError::ClientGone,
            },
            SendError::Http2(source) => UpstreamError::Http2(source),
        }
    }
}

/// The text Go prints for an OS error: the C library's message, lower-cased
/// (`connection refused`, `connection reset by peer`, ...).
fn errno_text(err: &io::Error) -> String {
    let Some(code) = err.raw_os_error() else {
        return err.to_string();
    };
    let text = io::Error::from_raw_os_error(code).to_string();
    let text = text
        .strip_suffix(&format!(" (os error {code})"))
        .unwrap_or(&text);
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_refused_reads_like_go() {
        let e = UpstreamError::Connect {
            addr: "127.0.0.1:8080".parse().unwrap(),
            source: io::Error::from_raw_os_error(111),
        };
        assert_eq!(
            e.to_string(),
            "dial tcp 127.0.0.1:8080: connect: connection refused"
        );
    }

    #[test]
    fn reset_reads_like_go() {
        let e = UpstreamError::Io {
            local: Some("127.0.0.1:48708".parse().unwrap()),
            remote: "127.0.0.1:18080".parse().unwrap(),
            source: io::Error::from_raw_os_error(104),
        };
        assert_eq!(
            e.to_string(),
            "read tcp 127.0.0.1:48708->127.0.0.1:18080: read: connection reset by peer"
        );
    }

    /// What the transport says failed reads as Go's transport says it.
    #[test]
    fn the_transports_failures_read_like_go() {
        let (local, remote) = (
            "127.0.0.1:48708".parse().unwrap(),
            "127.0.0.1:18080".parse().unwrap(),
        );
        let exchange = |source| {
            UpstreamError::from(SendError::Exchange {
                local,
                remote,
                source,
            })
        };
        assert_eq!(exchange(ExchangeError::Closed).to_string(), "EOF");
        assert_eq!(
            exchange(ExchangeError::Upload(UploadError::Io(
                io::Error::from_raw_os_error(32)
            )))
            .to_string(),
            "read tcp 127.0.0.1:48708->127.0.0.1:18080: read: broken pipe"
        );
        assert_eq!(
            exchange(ExchangeError::Malformed("invalid status")).to_string(),
            "net/http: HTTP/1.x transport connection broken: malformed HTTP response: invalid status"
        );
        assert!(exchange(ExchangeError::Upload(UploadError::Length)).is_client_gone());
        let dial = UpstreamError::from(SendError::Dial {
            addr: remote,
            source: io::Error::from_raw_os_error(111),
        });
        assert_eq!(
            dial.to_string(),
            "dial tcp 127.0.0.1:18080: connect: connection refused"
        );
    }

    #[test]
    fn fixed_texts() {
        assert_eq!(UpstreamError::Closed.to_string(), "EOF");
        assert_eq!(
            UpstreamError::UpgradeMismatch {
                requested: b"websocket".to_vec(),
                offered: b"h2c".to_vec()
            }
            .to_string(),
            r#"backend tried to switch protocol "h2c" when "websocket" was requested"#
        );
        assert!(UpstreamError::ClientGone.is_client_gone());
    }

    #[test]
    fn an_invalid_upgrade_is_quoted_as_go_quotes_it() {
        assert_eq!(
            UpstreamError::InvalidClientUpgrade(b"x\xff".to_vec()).to_string(),
            r#"client tried to switch to invalid protocol "x\xff""#
        );
    }
}
