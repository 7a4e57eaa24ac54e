//! qproxy's HTTP/1.1, in one place: how it reads and writes the protocol
//! on the wire, shared by the server it runs for its clients and the
//! client it runs to the app.
//!
//! Shaped like hyper's `proto/h1`: [`wire`] holds the rules both roles
//! follow (header tokens, `Content-Length`, title-cased names, reads into
//! a buffer, the `Date` header), and [`limits`] the sizes both refuse
//! beyond; [`pool`] keeps the app's connections alive between requests. The rules are hyper's, so what a client or the app sees is what
//! it saw when hyper spoke for qproxy. The crate names none of qproxy's
//! own types: the sidecar depends on it, never the other way.

pub mod client;
pub mod limits;
pub mod pool;
pub mod server;
pub mod wire;

/// A type-erased error, as hyper takes from bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
