// SPDX-License-Identifier: (Apache-2.0 OR GPL-2.0-only)
//
// qproxy-accel's kernel half: the loopback connections between qproxy and
// the app it fronts skip the TCP/IP stack.
//
// sockops: when a loopback connection is established in a network namespace
// the agent allows (qpa_allowed: netns cookie -> the app's port, USER_PORT)
// and one of its ends is that port, the socket joins the sockhash qpa_socks,
// keyed by (netns cookie, local address and port, remote address and port).
//
// sk_msg: runs on every send of a socket in qpa_socks. On the socket's first
// message it looks its peer up (the key with the ends swapped): found, the
// bytes go straight to the peer's receive queue (bpf_msg_redirect_hash with
// BPF_F_INGRESS) for the connection's whole life; not found, they go over
// TCP for the connection's whole life. The decision is kept in the socket's
// own storage (qpa_verdicts), which lives and dies with the socket: it is
// never evicted and never inherited by a later connection on the same ports,
// so a connection's bytes never take two paths, and redirected bytes never
// overtake bytes sent before them over TCP. The program always answers
// SK_PASS: a message is redirected or sent, never dropped.
//
// Nothing here deletes a socket from qpa_socks: the kernel removes each one
// as it closes.

#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define EEXIST 17
#define AF_INET 2
#define AF_INET6 10

// The layout src/maps.rs mirrors (SockKey): no implicit padding, so that
// every byte of a key is written and two keys for one connection compare
// equal. Addresses are IPv6; IPv4 ones are stored v4-mapped
// (::ffff:a.b.c.d), so that a dual-stack socket and a plain IPv4 one agree.
struct sock_key {
	__u64 netns;
	__u32 local_ip[4];
	__u32 remote_ip[4];
	__u32 local_port;
	__u32 remote_port;
};
_Static_assert(sizeof(struct sock_key) == 48, "sock_key has no padding");

// A connection's path, decided on its first message.
enum verdict {
	VERDICT_UNDECIDED = 0,
	VERDICT_REDIRECT = 1,
	VERDICT_TCP = 2,
};

// Indices of qpa_counters, in the order src/maps.rs reads them
// (Counters::from_slots; a test there checks that the two agree).
enum counter {
	COUNTER_REDIRECTED_MESSAGES = 0,
	COUNTER_REDIRECTED_BYTES = 1,
	COUNTER_FALLBACKS = 2,
	COUNTER_INSERT_FAILURES = 3,
	COUNTER_INSERTED = 4,
	COUNTER_PEER_GONE = 5,
	COUNTER_LEN = 6,
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct sock_key);
	__type(value, __u32);
} qpa_socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u32);
} qpa_allowed SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u32);
} qpa_verdicts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTER_LEN);
	__type(key, __u32);
	__type(value, __u64);
} qpa_counters SEC(".maps");

// Copies an IPv6 address out of a context word by word: the verifier
// allows only direct loads of context fields, not a pointer to them.
#define COPY_IP6(dst, src)             \
	do {                           \
		(dst)[0] = (src)[0];   \
		(dst)[1] = (src)[1];   \
		(dst)[2] = (src)[2];   \
		(dst)[3] = (src)[3];   \
	} while (0)

static __always_inline void count(enum counter which, __u64 n)
{
	__u32 key = which;
	__u64 *value = bpf_map_lookup_elem(&qpa_counters, &key);

	if (value)
		*value += n;
}

// Fills an address in the key's form from a socket's fields; false when it is
// not a loopback address (127.0.0.0/8, ::1, or ::ffff:127.0.0.0/104).
static __always_inline int loopback(__u32 family, __u32 ip4, const __u32 ip6[4], __u32 out[4])
{
	if (family == AF_INET) {
		if ((bpf_ntohl(ip4) >> 24) != 127)
			return 0;
		out[0] = 0;
		out[1] = 0;
		out[2] = bpf_htonl(0xffff);
		out[3] = ip4;
		return 1;
	}
	if (family != AF_INET6)
		return 0;
	out[0] = ip6[0];
	out[1] = ip6[1];
	out[2] = ip6[2];
	out[3] = ip6[3];
	if (out[0] != 0 || out[1] != 0)
		return 0;
	if (out[2] == 0 && out[3] == bpf_htonl(1))
		return 1;
	return out[2] == bpf_htonl(0xffff) && (bpf_ntohl(out[3]) >> 24) == 127;
}

SEC("sockops")
int qpa_sockops(struct bpf_sock_ops *skops)
{
	struct sock_key key = {};
	__u32 local6[4], remote6[4];
	__u32 *user_port;
	__u32 *verdict;
	struct bpf_sock *sk;
	long err;

	if (skops->op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB &&
	    skops->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;

	key.netns = bpf_get_netns_cookie(skops);
	user_port = bpf_map_lookup_elem(&qpa_allowed, &key.netns);
	if (!user_port)
		return 1;

	key.local_port = skops->local_port;
	key.remote_port = bpf_ntohl(skops->remote_port);
	if (key.local_port != *user_port && key.remote_port != *user_port)
		return 1;

	COPY_IP6(local6, skops->local_ip6);
	COPY_IP6(remote6, skops->remote_ip6);
	if (!loopback(skops->family, skops->local_ip4, local6, key.local_ip) ||
	    !loopback(skops->family, skops->remote_ip4, remote6, key.remote_ip))
		return 1;

	// The socket's verdict storage is made before it joins the map: a
	// socket in the map always has one, so its first message decides
	// once. No storage, no acceleration.
	sk = skops->sk;
	if (!sk) {
		count(COUNTER_INSERT_FAILURES, 1);
		return 1;
	}
	verdict = bpf_sk_storage_get(&qpa_verdicts, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!verdict) {
		count(COUNTER_INSERT_FAILURES, 1);
		return 1;
	}
	*verdict = VERDICT_UNDECIDED;

	err = bpf_sock_hash_update(skops, &qpa_socks, &key, BPF_NOEXIST);
	// Already there: while an agent replaces another, both programs run.
	if (err == -EEXIST)
		return 1;
	if (err != 0) {
		count(COUNTER_INSERT_FAILURES, 1);
		return 1;
	}
	count(COUNTER_INSERTED, 1);
	return 1;
}

SEC("sk_msg")
int qpa_msg(struct sk_msg_md *msg)
{
	struct sock_key peer = {};
	__u32 local6[4], remote6[4];
	struct bpf_sock *sk = msg->sk;
	__u32 *verdict;
	__u32 size = msg->size;

	if (!sk)
		return SK_PASS;
	verdict = bpf_sk_storage_get(&qpa_verdicts, sk, 0, 0);
	if (!verdict || *verdict == VERDICT_TCP)
		return SK_PASS;

	// The peer's key: this socket's ends swapped.
	peer.netns = bpf_get_netns_cookie(msg);
	peer.local_port = bpf_ntohl(msg->remote_port);
	peer.remote_port = msg->local_port;
	COPY_IP6(local6, msg->local_ip6);
	COPY_IP6(remote6, msg->remote_ip6);
	if (!loopback(msg->family, msg->remote_ip4, remote6, peer.local_ip) ||
	    !loopback(msg->family, msg->local_ip4, local6, peer.remote_ip)) {
		*verdict = VERDICT_TCP;
		count(COUNTER_FALLBACKS, 1);
		return SK_PASS;
	}

	if (bpf_msg_redirect_hash(msg, &qpa_socks, &peer, BPF_F_INGRESS) == SK_PASS) {
		*verdict = VERDICT_REDIRECT;
		count(COUNTER_REDIRECTED_MESSAGES, 1);
		count(COUNTER_REDIRECTED_BYTES, size);
		return SK_PASS;
	}
	// No peer: on the first message, TCP for good. Later (the peer has
	// closed and left the map), this message goes the way TCP would take
	// it, to a socket that no longer reads.
	if (*verdict == VERDICT_UNDECIDED) {
		*verdict = VERDICT_TCP;
		count(COUNTER_FALLBACKS, 1);
	} else {
		count(COUNTER_PEER_GONE, 1);
	}
	return SK_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";
