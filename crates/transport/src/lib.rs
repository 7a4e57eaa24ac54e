//! qproxy's HTTP transport, in one place: the server its clients talk to
//! (HTTP/1.1 its own, HTTP/2 and what else it does not take handed to
//! hyper), and the client of the app (HTTP/1.1 its own, h2c on `h2`),
//! reached through one connector.
//!
//! Its HTTP/1.1 is shaped like hyper's `proto/h1`, one codec with two
//! roles:
//!
//! | module | what it holds |
//! |---|---|
//! | [`wire`] | the rules both roles follow: header tokens, `Content-Length`, title-cased names, reads onto a buffer, the `Date` header, and the codec: how a body is framed, one encoder for what either role writes and one decoder for what the client reads (`framing`), on the chunked coding (`chunked`) |
//! | [`limits`] | the sizes a head may reach, and how many of its lines both parsers take on the stack |
//! | [`server`] | the server role: a client's connection from its first byte ([`server::conn::serve_connection`]: the first head read ahead, HTTP/1.1 told from h2c, one head clock, a graceful shutdown), a served connection (`Conn`: its read buffer, spare header map, write buffer and head clock) whose loop reads a request head, calls the service and writes the response, the hand-off to hyper for what it does not take |
//! | [`client`] | the client role: an app connection ([`client::Conn`]: its socket, the read buffer it keeps, the rest of a request body still being written), a request written on it, its response head and body read |
//! | [`pool`] | the app's connections kept alive between requests |
//! | [`connector`] | the app reached: dialing (a refused dial tried again), the pool, the rules for sending a request again, the h2c client (`h2c`: the app's one shared HTTP/2 connection, a request's stream on it, its body piped, its response body read); what failed, in the transport's words ([`connector::SendError`]) |
//! | [`splice`] | bytes moved between two TCP sockets through a pipe, never through user space (a tunnel's, and a large response body's through a pipe its server lends it), read through memory instead from a socket whose bytes are not in its TCP queue; pipes kept per thread |
//! | [`rewind`] | a connection whose first bytes were read already, given back before the rest: the server's first head read ahead, the bytes after an app's `101` |
//!
//! The rules are hyper's, so what a client or the app sees is what it saw
//! when hyper spoke for qproxy; `tests/server_vs_hyper.rs` compares the
//! two byte for byte. The crate names none of qproxy's own types: the
//! server is generic over the request body ([`server::MakeBody`]) and over
//! what the connection's owner decides ([`server::Lifecycle`]), the client
//! and the connector over the request body and the response body made of
//! the client's, the pool over the connection. The sidecar depends on it,
//! never the other way.

pub mod client;
pub mod connector;
pub mod limits;
pub mod pool;
pub mod rewind;
pub mod server;
pub mod splice;
pub mod wire;

/// A type-erased error, as hyper takes from bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
