"""Load 13: a tunnel's bulk stream. One upgraded connection through each
contender to the app's echo (`/tunnel`), a number of MiB sent and the
same read back; the proxy's CPU per MiB that crossed it (each way
counted) and the rate. qproxy runs beside its copy through memory (the
`no-splice` option), HAProxy beside its `option splice-auto`."""

import socket
import statistics
import threading
import time

from .contenders import Contender
from .procs import TICK, cpu_ticks, start_app, stop

# Load 13's stream: each way, per round.
TUNNEL_MIB = 256
# The contenders that take part, where asked for (direct: the app alone).
TUNNEL_CONTENDERS = (
    "direct",
    "qproxy",
    "qproxy-nosplice",
    "qproxy-base",
    "go-qp",
    "nginx",
    "haproxy",
    "haproxy-splice",
    "envoy",
)

# The upgrade as a WebSocket client asks for it (HAProxy refuses one
# without its key); the app answers 101 and echoes (benches/app/main.go).
UPGRADE = (
    b"GET /tunnel HTTP/1.1\r\nHost: app\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
CHUNK = 256 * 1024
MIB = 1 << 20


def head_end(buf):
    """Where the response head in `buf` ends (after its blank line), or
    None while it is not whole."""
    i = buf.find(b"\r\n\r\n")
    return None if i < 0 else i + 4


def read_head(s):
    """What `s` has sent until its response head is whole, and where the
    head ends in it; raises if the connection closes first."""
    buf = b""
    while head_end(buf) is None:
        got = s.recv(4096)
        if not got:
            raise RuntimeError(f"the tunnel closed before its head: {buf!r}")
        buf += got
    return buf, head_end(buf)


def stream(port, mib):
    """Sends `mib` MiB through an upgraded connection to `port` and reads
    them back: (bytes back, seconds), reading until as many came back as
    went, or the tunnel closed; only then is it closed (nginx ends both
    sides of a tunnel at a half-close); a reset ends it as a close
    does. Raises on an answer other than 101."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(UPGRADE)
        buf, end = read_head(s)
        if not buf.startswith(b"HTTP/1.1 101"):
            raise RuntimeError(f"no upgrade: {buf[:end]!r}")
        back = len(buf) - end
        chunk = bytes(range(256)) * (CHUNK // 256)
        t0 = time.monotonic()

        def send():
            # A tunnel that closes early is told by what came back.
            try:
                for _ in range(mib * MIB // CHUNK):
                    s.sendall(chunk)
            except OSError:
                pass

        sender = threading.Thread(target=send)
        sender.start()
        view = bytearray(CHUNK)
        while back < mib * MIB:
            try:
                n = s.recv_into(view)
            except ConnectionResetError:
                # Closed with our bytes unread: as short as a close.
                n = 0
            if n == 0:
                break
            back += n
        seconds = time.monotonic() - t0
        sender.join()
        return back, seconds


def measure(contender, mib):
    """One stream through `contender` (started): its MiB/s, and the
    proxy's CPU in ms per MiB that crossed it (`2 × mib`: each way)."""
    before = cpu_ticks(contender.pids())
    back, seconds = stream(contender.port, mib)
    cpu = (cpu_ticks(contender.pids()) - before) / TICK
    if back != mib * MIB:
        raise RuntimeError(f"{contender.name}: {back} bytes back of {mib * MIB}")
    return {"mib_per_s": mib / seconds, "cpu_ms_per_mib": 1000 * cpu / (2 * mib)}


def run_tunnel(args, bins):
    """Load 13 for each contender that takes part: {name: medians of
    `args.rounds` streams of TUNNEL_MIB MiB}, the contenders in turn, each
    round one later."""
    names = tunnel_contenders(args.contenders)
    rounds = {}
    app, app_port = start_app(bins, "unpinned")
    try:
        for rnd in range(args.rounds):
            turn = rnd % len(names)
            for name in names[turn:] + names[:turn]:
                c = Contender(name, bins, "unpinned")
                c.start(app_port)
                try:
                    rounds.setdefault(name, []).append(measure(c, TUNNEL_MIB))
                finally:
                    c.stop()
    finally:
        stop(app)
    results = {name: medians(rs) for name, rs in rounds.items()}
    for name, r in results.items():
        print(f"  {name:17} {r['mib_per_s']:8.0f} MiB/s  {r['cpu_ms_per_mib']:6.2f} ms CPU per MiB", flush=True)
    return results


def tunnel_contenders(contenders):
    """Those of `contenders` that take part, and beside qproxy its copy
    through memory (`qproxy-nosplice`), beside HAProxy its `splice-auto`."""
    names = [n for n in contenders if n in TUNNEL_CONTENDERS]
    for name, beside in (("qproxy", "qproxy-nosplice"), ("haproxy", "haproxy-splice")):
        if name in names and beside not in names:
            names.insert(names.index(name) + 1, beside)
    return names


def medians(rounds):
    """The median of each figure over `rounds`."""
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}


def report_lines(results, base="qproxy-nosplice"):
    """Load 13's table in Markdown: each contender's rate, its CPU per MiB,
    and that CPU against `base`'s (the copy through memory)."""
    lines = [
        f"### Load 13: a tunnel's bulk stream ({TUNNEL_MIB} MiB each way, one upgraded connection)\n",
        f"| contender | MiB/s | CPU ms per MiB | × {base}'s CPU |",
        "|---|---|---|---|",
    ]
    ref = results.get(base, {}).get("cpu_ms_per_mib")
    for name, r in results.items():
        ratio = f"{r['cpu_ms_per_mib'] / ref:.2f}" if ref else "–"
        lines.append(f"| {name} | {r['mib_per_s']:.0f} | {r['cpu_ms_per_mib']:.2f} | {ratio} |")
    lines.append("")
    return lines
