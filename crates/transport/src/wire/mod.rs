//! The rules of HTTP/1.1 on the wire that the server and the client roles
//! share. qproxy's other paths use two of them: the `Content-Length`
//! reading (its h2c client) and the token rules (its hop-by-hop headers
//! and request log).

pub(crate) mod chunked;
pub(crate) mod date;
pub(crate) mod framing;
pub mod length;
pub(crate) mod read;
pub(crate) mod title_case;
pub mod token;
