"""Load 14: as many connections as one process may hold on these machines
(the descriptor limit's hard cap, 20,000 a process, which root cannot
raise here). Through each contender, fresh for each part: idle keep-alive
connections, each answered once, at rising counts up to 18,000; then
upgraded connections to the app's echo (`/tunnel`, two descriptors each in
the proxy) up to 8,000, each echoing a small message a round. At each
count the contender's RSS, descriptors and CPU; the slope of memory per
connection, fitted over the counts, gives 100,000 by extension (a slope,
not a measurement: 100,000 do not fit in one process here)."""

import os
import socket
import time

from .contenders import Contender
from .procs import TICK, cpu_ticks, rss_kib, start_app, stop
from .tunnel import UPGRADE, read_head

# The app's echo through a buffer of its own, which holds no pipe per
# tunnel (benches/app).
SCALE_UPGRADE = UPGRADE.replace(b"GET /tunnel HTTP/1.1", b"GET /tunnel?buffered HTTP/1.1", 1)

# The counts held, idle and upgraded.
IDLE_COUNTS = (1000, 5000, 10000, 18000)
TUNNEL_COUNTS = (1000, 4000, 8000)
# Echo rounds at each count of tunnels, and each round's message.
ECHO_ROUNDS = 5
ECHO = b"x" * 64
# How long the connections have been idle when measured: qproxy lets an
# idle connection's room go after a second (crates/transport/src/server).
IDLE_FOR = 2
# The contenders that take part, where asked for.
SCALE_CONTENDERS = ("qproxy", "qproxy-base", "go-qp", "nginx", "haproxy")
# Connections opened at once.
BATCH = 500
# How long a client's connect, send or read may wait before the part fails.
SOCKET_TIMEOUT = 30
# The count read off the slope.
EXTENDED = 100_000


def time_wait():
    """The loopback's TCP sockets in TIME_WAIT, as the kernel counts them."""
    with open("/proc/net/sockstat") as f:
        for line in f:
            if line.startswith("TCP:"):
                fields = line.split()
                return int(fields[fields.index("tw") + 1])
    return 0


def wait_ports_free(most=1000, deadline=120):
    """Waits (at most `deadline` seconds) until no more than `most` sockets
    are in TIME_WAIT: a part's closed connections hold their ports for a
    minute, and the next part's would otherwise run out of them."""
    end = time.monotonic() + deadline
    while time_wait() > most and time.monotonic() < end:
        time.sleep(1)


def descriptors(pids):
    """The descriptors the processes `pids` hold open."""
    n = 0
    for pid in pids:
        try:
            n += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            pass
    return n


def in_batches(n, open_some):
    """`n` connections opened by `open_some(k)`, BATCH at a time: each
    batch's answers come before the next batch connects, so that no
    listener's queue overflows (its dropped handshakes retried for
    longer than SOCKET_TIMEOUT)."""
    socks = []
    while len(socks) < n:
        socks += open_some(min(BATCH, n - len(socks)))
    return socks


def open_idle(port, n):
    """`n` connections to `port` that each had one request answered, left
    open."""
    return in_batches(n, lambda k: open_idle_now(port, k))


def open_idle_now(port, n):
    """`n` such connections, opened at once."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT)
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        socks.append(s)
    for s in socks:
        if not s.recv(4096).startswith(b"HTTP/1.1 200"):
            raise RuntimeError("a request was not answered 200")
    return socks


def open_tunnels(port, n):
    """`n` upgraded connections to the app's echo through `port`; raises
    unless each is answered 101."""
    return in_batches(n, lambda k: open_tunnels_now(port, k))


def open_tunnels_now(port, n):
    """`n` such connections, opened at once."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT)
        s.sendall(SCALE_UPGRADE)
        socks.append(s)
    for s in socks:
        buf, end = read_head(s)
        if not buf.startswith(b"HTTP/1.1 101"):
            raise RuntimeError(f"a tunnel was refused: {buf[:40]!r}")
        if len(buf) > end:
            raise RuntimeError("bytes came after the 101 before any were sent")
    return socks


def echo_round(socks):
    """Sends ECHO on every tunnel, then reads it back from each; a reset
    ends a tunnel as a close does."""
    for s in socks:
        s.sendall(ECHO)
    for s in socks:
        got = b""
        while len(got) < len(ECHO):
            try:
                more = s.recv(len(ECHO) - len(got))
            except ConnectionResetError:
                more = b""
            if not more:
                raise RuntimeError("a tunnel closed mid-echo")
            got += more
        if got != ECHO:
            raise RuntimeError("an echo came back changed")


def closed_by_peer(socks):
    """How many of `socks` the other end has closed (or reset)."""
    n = 0
    for s in socks:
        # A socket with a timeout waits for bytes before it reads, even
        # asked not to: non-blocking while it is looked at.
        timeout = s.gettimeout()
        s.settimeout(0)
        try:
            if s.recv(1, socket.MSG_PEEK) == b"":
                n += 1
        except BlockingIOError:
            pass
        except OSError:
            n += 1
        finally:
            s.settimeout(timeout)
    return n


def point(n, pids, ticks0, extra=None):
    """One count's figures: RSS, descriptors, CPU since `ticks0`."""
    out = {
        "n": n,
        "rss_kib": rss_kib(pids),
        "fds": descriptors(pids),
        "cpu_s": (cpu_ticks(pids) - ticks0) / TICK,
    }
    out.update(extra or {})
    return out


def counts(wanted, capacity):
    """The counts of `wanted` a contender taking `capacity` connections
    can hold, and its capacity last when it cannot hold them all."""
    held = [n for n in wanted if n <= capacity]
    return held + ([capacity] if capacity < wanted[-1] else [])


def hold_idle(c):
    """The idle part through a started contender `c`: one point a count."""
    pids = c.pids()
    start = {"rss_kib": rss_kib(pids), "fds": descriptors(pids)}
    ticks0 = cpu_ticks(pids)
    socks, points = [], []
    try:
        for n in counts(IDLE_COUNTS, c.capacity()):
            try:
                socks += open_idle(c.port, n - len(socks))
            except OSError as e:
                raise RuntimeError(f"opening {n:,} connections: {e}") from e
            time.sleep(IDLE_FOR)
            points.append(point(n, pids, ticks0, {"closed": closed_by_peer(socks)}))
    finally:
        for s in socks:
            s.close()
    return {"start": start, "points": points}


def hold_tunnels(c):
    """The upgraded part through a started contender `c`: one point a
    count, with the CPU its echo rounds took per round trip."""
    pids = c.pids()
    start = {"rss_kib": rss_kib(pids), "fds": descriptors(pids)}
    ticks0 = cpu_ticks(pids)
    socks, points = [], []
    try:
        # Two descriptors a tunnel in the proxy.
        for n in counts(TUNNEL_COUNTS, c.capacity() // 2):
            try:
                socks += open_tunnels(c.port, n - len(socks))
            except OSError as e:
                raise RuntimeError(f"opening {n:,} tunnels: {e}") from e
            before = cpu_ticks(pids)
            try:
                for _ in range(ECHO_ROUNDS):
                    echo_round(socks)
            except OSError as e:
                raise RuntimeError(f"echoing through {n:,} tunnels: {e}") from e
            echo_us = (cpu_ticks(pids) - before) / TICK * 1e6 / (ECHO_ROUNDS * n)
            points.append(point(n, pids, ticks0, {"echo_us": echo_us}))
    finally:
        for s in socks:
            s.close()
    return {"start": start, "points": points}


def run_scale(args, bins):
    """{contender: {"idle": part, "tunnels": part}} for the contenders
    asked for that take part (SCALE_CONTENDERS); a part that fails (a
    contender refusing connections past its limit) is reported as such."""
    results = {}
    for name in (n for n in args.contenders if n in SCALE_CONTENDERS):
        for part, hold in (("idle", hold_idle), ("tunnels", hold_tunnels)):
            wait_ports_free()
            # The app afresh too: what one part left in it is not the next's.
            app, app_port = start_app(bins, "unpinned")
            c = Contender(name, bins, "unpinned", connections=max(IDLE_COUNTS) + 1000)
            try:
                c.start(app_port)
                results.setdefault(name, {})[part] = hold(c)
            except (OSError, RuntimeError) as e:
                results.setdefault(name, {})[part] = {"failed": str(e)}
            finally:
                c.stop()
                stop(app)
            for line in part_lines(name, part, results[name][part]):
                print("  " + line, flush=True)
    return results


def slope(points, start):
    """(KiB per connection, KiB at none): the least-squares line through
    the points' RSS, the start's as the count 0."""
    xs = [0] + [p["n"] for p in points]
    ys = [start["rss_kib"]] + [p["rss_kib"] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    k = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return k, my - k * mx


def part_lines(name, part, r):
    """A contender's part as lines: each count's figures, then the slope."""
    if "failed" in r:
        return [f"{name:14} {part:7} failed: {r['failed']}"]
    lines = []
    for p in r["points"]:
        line = (
            f"{name:14} {part:7} {p['n']:6,} conns: RSS {p['rss_kib'] / 1024:7.1f} MiB, "
            f"{p['fds']:6,} descriptors, CPU {p['cpu_s']:6.2f} s"
        )
        if "echo_us" in p:
            line += f", {p['echo_us']:6.1f} µs CPU per echo"
        if p.get("closed"):
            line += f", {p['closed']:,} closed by the proxy"
        lines.append(line)
    k, b = slope(r["points"], r["start"])
    lines.append(
        f"{name:14} {part:7} slope {k:5.2f} KiB a connection; {EXTENDED:,} would hold "
        f"{(b + k * EXTENDED) / 1024:,.0f} MiB"
    )
    return lines


def report_lines(results):
    """Load 14's table for the side-by-side page."""
    out = [
        "",
        "Load 14: connections held (idle keep-alive, each answered once and idle "
        f"{IDLE_FOR} s; upgraded, each echoing {len(ECHO)} bytes a round, {ECHO_ROUNDS} rounds), "
        "the contender's RSS and descriptors at the largest count, the slope of RSS per "
        f"connection over the counts and {EXTENDED:,} read off it, CPU per echo at the largest count",
        "",
        "| contender | part | connections | RSS (MiB) | descriptors | KiB a connection (slope) "
        f"| {EXTENDED:,} by the slope (MiB) | CPU per echo (µs) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, parts in results.items():
        for part, r in parts.items():
            if "failed" in r:
                out.append(f"| {name} | {part} | failed: {r['failed']} | | | | | |")
                continue
            last = r["points"][-1]
            k, b = slope(r["points"], r["start"])
            echo = f"{last['echo_us']:.1f}" if "echo_us" in last else ""
            held = f"{last['n']:,}" + (f" ({last['closed']:,} closed by it)" if last.get("closed") else "")
            out.append(
                f"| {name} | {part} | {held} | {last['rss_kib'] / 1024:.1f} | {last['fds']:,} "
                f"| {k:.2f} | {(b + k * EXTENDED) / 1024:,.0f} | {echo} |"
            )
    return out
