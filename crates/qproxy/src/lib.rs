//! qproxy: a drop-in replacement for Knative Serving's queue-proxy.
//!
//! - [`config`]: the environment contract, parsed once into a [`Config`].

pub mod config;

pub use config::{Config, ConfigError};
