//! `containerConcurrency` enforcement for qproxy.
//!
//! This crate will hold the concurrency limiter Knative calls a breaker:
//! `capacity` slots for requests inside the user container, a bounded FIFO
//! queue of waiting requests (`10 × capacity` in Knative), immediate refusal
//! (`pending request queue full`) once both are full, capacity changes at
//! run time, and lock-free gauges of requests in flight and waiting. It
//! knows nothing of HTTP: a plain async API and a tower layer over it.
//!
//! It is empty until that work lands; qproxy runs without a breaker
//! (`CONTAINER_CONCURRENCY=0` behaviour) meanwhile.
