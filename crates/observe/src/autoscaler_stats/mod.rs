//! The autoscaler's request statistics, as the main port's [`layer`]
//! records them where Knative's `ProxyHandler` does (into
//! `autoscaler-client`'s sharded counters, which the `Stat` on 9090 reports),
//! and the [`view`] of them on the user metrics port (9091).

pub mod layer;
pub mod view;
