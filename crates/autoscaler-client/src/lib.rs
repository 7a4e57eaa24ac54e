//! The figures Knative's autoscaler scrapes from every queue-proxy.
//!
//! - [`RequestStats`]: requests in flight and arriving, as time-weighted
//!   averages and counts per reporting window, direct and through the
//!   activator, with the arithmetic of Knative's `RequestStats` and no lock
//!   on the recording path.
//! - [`Stat`]: the protobuf message Knative's autoscaler decodes
//!   (`stat.proto` in this crate), derived with prost.
//! - [`Reporter`]: turns a window's [`Report`] into the latest [`Stat`],
//!   ready to serve as protobuf.
//! - [`Clock`]: where times come from, so that tests can drive them.
//!
//! It knows nothing of HTTP servers: qproxy records the events and serves
//! `GET :9090/metrics`.

mod clock;
mod reporter;
mod stat;
mod stats;

pub use clock::{Clock, ManualClock, MonotonicClock};
pub use reporter::{Published, Reporter};
pub use stat::Stat;
pub use stats::{Event, Nanos, Report, RequestStats, SHARDS};
