//! The rules of HTTP/1.1 on the wire that the server and the client roles
//! share.

pub mod date;
pub mod length;
pub mod read;
pub mod title_case;
pub mod token;
