//! The sizes an HTTP/1 message may reach, shared by qproxy's servers, its
//! server rules and its clients.

/// Largest request head accepted on HTTP/1: Go's `DefaultMaxHeaderBytes`
/// plus the slack Go's server allows. The servers size their buffers by
/// it, and the server rules refuse a head longer than it, as Go does.
pub const MAX_HEADER_BYTES: usize = (1 << 20) + 4096;

/// Most header fields in an HTTP/1 request or response head. Go counts
/// none, only bytes; hyper needs a number, and makes room for that many
/// fields each time it parses a head. Measured over 5,000 keep-alive
/// connections, 24,576 fields (the most an `http::HeaderMap` can hold
/// without panicking) cost 5.5 KiB more resident memory per connection,
/// 4,096 cost 2 KiB, and 1,024 nothing measurable; Knative's ingresses
/// (Envoy) pass at most 100 by default.
pub const MAX_HEADER_FIELDS: usize = 1_024;

/// Largest response head taken from the app: 2 MiB, where Go's transport
/// takes 10 (`MaxResponseHeaderBytes`). hyper's read buffer is bounded by
/// the same setting and grows towards it while a fast app streams a body:
/// at 10 MiB, a streamed response held up to 8 MiB of buffer per
/// connection; at 2 MiB, 2.
pub const MAX_RESPONSE_HEADER_BYTES: usize = 2 << 20;

/// Header lines parsed on the stack, by the server's parser and the
/// client's alike: a request head with more is not served by qproxy's own
/// server but handed to hyper, and a response head with more is parsed
/// again with room for [`MAX_HEADER_FIELDS`].
pub(crate) const STACK_HEADERS: usize = 64;
