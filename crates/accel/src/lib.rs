//! qproxy-accel: an opt-in eBPF bypass of the loopback hop between qproxy
//! and the app it fronts.
//!
//! Two small BPF programs (`bpf/accel.bpf.c`): a sockops program puts the
//! loopback sockets of each allowed pod's qproxy ↔ app connections in a
//! sockhash, and an sk_msg program hands each message straight to the peer
//! socket's receive queue, skipping TCP/IP on loopback. The node agent
//! (`src/main.rs`) finds the qproxies under a cgroup, allows their network
//! namespaces, refuses to attach on a kernel that fails its [`selftest`],
//! and exports the programs' counters.
//!
//! qproxy itself knows nothing of this: nothing it does depends on the
//! agent being there.

pub mod accel;
pub mod discover;
pub mod kernel;
pub mod maps;
pub mod selftest;
mod sys;

pub use accel::{Accel, Error};
pub use maps::{Counters, SockKey};
