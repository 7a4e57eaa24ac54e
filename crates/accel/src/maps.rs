//! What the BPF programs and the agent share: the sockhash key and the
//! counters, laid out as `bpf/accel.bpf.c` lays them out.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// The key of a socket in the sockhash: its network namespace and both of
/// its ends. `struct sock_key` in `bpf/accel.bpf.c`; the two must agree
/// byte for byte.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockKey {
    /// The network namespace's cookie.
    pub netns: u64,
    /// The local address, IPv6 (IPv4 v4-mapped), as the kernel stores it:
    /// network byte order in each word.
    pub local_ip: [u32; 4],
    /// The remote address, in the same form.
    pub remote_ip: [u32; 4],
    /// The local port, host byte order.
    pub local_port: u32,
    /// The remote port, host byte order.
    pub remote_port: u32,
}

// No padding: 8 + 16 + 16 + 4 + 4, as the C side asserts too.
const _: () = assert!(std::mem::size_of::<SockKey>() == 48);

impl SockKey {
    /// The key of a socket in namespace `netns` with these two ends.
    pub fn new(netns: u64, local: SocketAddr, remote: SocketAddr) -> Self {
        Self {
            netns,
            local_ip: words(local.ip()),
            remote_ip: words(remote.ip()),
            local_port: u32::from(local.port()),
            remote_port: u32::from(remote.port()),
        }
    }
}

fn words(ip: IpAddr) -> [u32; 4] {
    let v6: Ipv6Addr = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let o = v6.octets();
    // Each word holds four address bytes in network order, as read from
    // memory by the kernel: a native-endian read of those bytes.
    std::array::from_fn(|i| {
        u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
    })
}

/// The BPF programs' counters (`enum counter` in `bpf/accel.bpf.c`),
/// summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Messages handed straight to the peer socket.
    pub redirected_messages: u64,
    /// Their bytes.
    pub redirected_bytes: u64,
    /// Connections left on TCP because their peer was not in the map at
    /// their first message.
    pub fallbacks: u64,
    /// Sockets that qualified but could not join the map (full, or no
    /// memory for their verdict).
    pub insert_failures: u64,
    /// Sockets that joined the map.
    pub inserted: u64,
    /// Messages of redirected connections sent after the peer had closed
    /// (and left the map): they go the way TCP takes them.
    pub peer_gone: u64,
}

/// The length of the counters array (`COUNTER_LEN` in the C enum, whose
/// order [`Counters::from_slots`] follows; a test checks both).
pub(crate) const COUNTER_LEN: u32 = 6;

impl Counters {
    pub(crate) fn from_slots(slots: [u64; COUNTER_LEN as usize]) -> Self {
        let [
            redirected_messages,
            redirected_bytes,
            fallbacks,
            insert_failures,
            inserted,
            peer_gone,
        ] = slots;
        Self {
            redirected_messages,
            redirected_bytes,
            fallbacks,
            insert_failures,
            inserted,
            peer_gone,
        }
    }

    /// What was counted since `before`, a reading of the same counters.
    pub fn since(&self, before: &Self) -> Self {
        Self {
            redirected_messages: self
                .redirected_messages
                .saturating_sub(before.redirected_messages),
            redirected_bytes: self
                .redirected_bytes
                .saturating_sub(before.redirected_bytes),
            fallbacks: self.fallbacks.saturating_sub(before.fallbacks),
            insert_failures: self.insert_failures.saturating_sub(before.insert_failures),
            inserted: self.inserted.saturating_sub(before.inserted),
            peer_gone: self.peer_gone.saturating_sub(before.peer_gone),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_keys_are_v4_mapped_in_network_order() {
        let key = SockKey::new(
            7,
            "127.0.0.1:40000".parse().unwrap(),
            "127.0.0.2:8080".parse().unwrap(),
        );
        assert_eq!(
            key.local_ip[..3],
            [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff])]
        );
        assert_eq!(key.local_ip[3], u32::from_ne_bytes([127, 0, 0, 1]));
        assert_eq!(key.remote_ip[3], u32::from_ne_bytes([127, 0, 0, 2]));
        assert_eq!((key.local_port, key.remote_port), (40000, 8080));
        let v6 = SockKey::new(
            7,
            "[::ffff:127.0.0.1]:40000".parse().unwrap(),
            "[::ffff:127.0.0.2]:8080".parse().unwrap(),
        );
        assert_eq!(key, v6, "a dual-stack socket's key is its IPv4 peer's");
    }

    /// The index `enum counter` in the programs' source gives `name`.
    fn c_index(name: &str) -> u64 {
        let source = include_str!("../bpf/accel.bpf.c");
        let prefix = format!("COUNTER_{name} = ");
        let line = source
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in bpf/accel.bpf.c"));
        line[prefix.len()..]
            .trim_end_matches(',')
            .parse()
            .unwrap_or_else(|_| panic!("{line:?} gives no index"))
    }

    #[test]
    fn counters_are_read_where_the_programs_count_them() {
        assert_eq!(c_index("LEN"), u64::from(COUNTER_LEN));
        // Each slot holds its own index: each field must hold the index
        // the C enum gives its name.
        let read = Counters::from_slots(std::array::from_fn(|i| i as u64));
        for (field, name) in [
            (read.redirected_messages, "REDIRECTED_MESSAGES"),
            (read.redirected_bytes, "REDIRECTED_BYTES"),
            (read.fallbacks, "FALLBACKS"),
            (read.insert_failures, "INSERT_FAILURES"),
            (read.inserted, "INSERTED"),
            (read.peer_gone, "PEER_GONE"),
        ] {
            assert_eq!(field, c_index(name), "COUNTER_{name}");
        }
    }
}
