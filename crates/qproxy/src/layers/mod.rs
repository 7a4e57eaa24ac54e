//! The request-handling layers of the main port, one concern each.
//!
//! They are assembled, outermost first, in [`crate::stack`].

pub mod forwarded;
pub mod host_rewrite;
