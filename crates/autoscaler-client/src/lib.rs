//! The figures Knative's autoscaler scrapes from every queue-proxy.
//!
//! This crate will hold the request statistics (time-weighted average
//! concurrency and request rate, split into direct and activator-proxied
//! traffic) recorded without a lock on the hot path, the `Stat` protobuf
//! message of Knative's `stat.proto`, and the reporter that publishes one
//! `Stat` per second for `GET :9090/metrics`. It knows nothing of HTTP
//! servers: qproxy wires it.
//!
//! It is empty until that work lands.
