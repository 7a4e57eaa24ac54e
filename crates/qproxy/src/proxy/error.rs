//! Why a request could not be proxied, worded as Go's HTTP transport words
//! it: Knative's queue-proxy answers `502` with the error text as the body,
//! so that text is part of what clients see.

use std::io;
use std::net::SocketAddr;

use crate::go::go_quote;

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
    /// Whether the app's connection closed or failed under the request
    /// before it answered, so that a replayable request may be sent again
    /// (Go's `errServerClosedIdle` and `transportReadFromServerError`).
    pub(crate) fn is_dropped_connection(&self) -> bool {
        matches!(self, UpstreamError::Closed | UpstreamError::Io { .. })
    }

    /// Whether the failure is the client's doing, not worth an error log.
    pub(crate) fn is_client_gone(&self) -> bool {
        matches!(self, UpstreamError::ClientGone)
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
