//! qproxy: a drop-in replacement for Knative Serving's queue-proxy.
//!
//! - [`config`]: the environment contract, parsed once into a [`Config`].
//! - [`observe`]: logs in Knative's zap JSON shape.

pub mod config;
pub mod observe;

pub use config::{Config, ConfigError};
