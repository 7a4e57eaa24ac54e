"""Load 14's clients against stand-in apps on loopback, its slope and its
report."""

import os
import socket
import threading

import pytest

from qproxy_tools.bench import scale


def app(answer, echo=False):
    """An app on loopback that answers each connection's head with
    `answer`, then (`echo`) echoes what comes until the client closes;
    its port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def one(conn):
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                got = conn.recv(1)
                if not got:
                    return
                head += got
            conn.sendall(answer)
            while echo and (data := conn.recv(65536)):
                conn.sendall(data)
            while conn.recv(65536):
                pass

    def serve():
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def test_idle_connections_are_each_answered_then_held():
    port = app(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    socks = scale.open_idle(port, 5)
    try:
        assert len(socks) == 5
        assert all(s.fileno() >= 0 for s in socks)
    finally:
        for s in socks:
            s.close()


def test_an_idle_connection_not_answered_200_is_refused():
    port = app(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
    with pytest.raises(RuntimeError, match="not answered 200"):
        scale.open_idle(port, 2)


def test_tunnels_are_upgraded_and_echo():
    port = app(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", echo=True)
    socks = scale.open_tunnels(port, 3)
    try:
        scale.echo_round(socks)
        scale.echo_round(socks)
    finally:
        for s in socks:
            s.close()


def test_a_refused_upgrade_is_reported():
    port = app(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    with pytest.raises(RuntimeError, match="refused"):
        scale.open_tunnels(port, 1)


def test_an_echo_that_does_not_come_back_is_reported():
    # The app answers 101 and then closes at once: no echo.
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(1)
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    socks = scale.open_tunnels(listener.getsockname()[1], 1)
    try:
        with pytest.raises(RuntimeError, match="closed mid-echo"):
            scale.echo_round(socks)
    finally:
        socks[0].close()
        listener.close()


def test_descriptors_counts_this_process_s_open_files():
    before = scale.descriptors([os.getpid()])
    r, w = os.pipe()
    try:
        assert scale.descriptors([os.getpid()]) == before + 2
    finally:
        os.close(r)
        os.close(w)
    assert scale.descriptors([2**22 + 1]) == 0


def test_the_slope_is_the_least_squares_line_through_the_counts():
    start = {"rss_kib": 1000}
    points = [{"n": n, "rss_kib": 1000 + 2 * n} for n in (1000, 5000, 10000)]
    k, b = scale.slope(points, start)
    assert k == pytest.approx(2.0)
    assert b == pytest.approx(1000.0)


def part(points_rss, echo=None):
    points = []
    for n, rss in points_rss:
        p = {"n": n, "rss_kib": rss, "fds": n + 10, "cpu_s": n / 1000}
        if echo is not None:
            p["echo_us"] = echo
        points.append(p)
    return {"start": {"rss_kib": 8192, "fds": 10}, "points": points}


def test_the_report_gives_the_largest_count_and_the_slope_s_hundred_thousand():
    results = {
        "qproxy": {
            "idle": part([(1000, 8192 + 2500), (18000, 8192 + 45000)]),
            "tunnels": part([(1000, 8192 + 4000), (8000, 8192 + 32000)], echo=12.5),
        },
        "nginx": {"idle": {"failed": "connection refused"}},
    }
    lines = scale.report_lines(results)
    table = "\n".join(lines)
    row = next(line for line in lines if line.startswith("| qproxy | idle"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:5] == ["18,000", f"{(8192 + 45000) / 1024:.1f}", "18,010"]
    assert cells[5] == "2.50"
    # 8 MiB at none, 2.5 KiB a connection: 100,000 hold 8 + 244 MiB.
    assert cells[6] == "252"
    tunnels = next(line for line in lines if line.startswith("| qproxy | tunnels"))
    assert tunnels.rstrip().endswith("| 12.5 |")
    assert "| nginx | idle | failed: connection refused |" in table


def test_part_lines_say_each_count_and_a_failure():
    lines = scale.part_lines("qproxy", "tunnels", part([(1000, 9000), (8000, 40000)], echo=3.0))
    assert "1,000 conns" in lines[0] and "µs CPU per echo" in lines[0]
    assert "slope" in lines[-1] and "100,000 would hold" in lines[-1]
    assert scale.part_lines("haproxy", "idle", {"failed": "refused"}) == ["haproxy        idle    failed: refused"]


def test_a_contender_holds_the_counts_it_can_then_its_capacity():
    assert scale.counts((1000, 5000, 10000, 18000), 19000) == [1000, 5000, 10000, 18000]
    assert scale.counts((1000, 5000, 10000, 18000), 9950) == [1000, 5000, 9950]
    assert scale.counts((1000, 4000, 8000), 4975) == [1000, 4000, 4975]


def test_time_wait_is_read_from_the_kernel_s_count():
    assert scale.time_wait() >= 0
    # Nothing to wait for when the bound is above any count.
    scale.wait_ports_free(most=10**9, deadline=0)


def test_connections_the_other_end_closed_are_counted():
    listener = socket.create_server(("127.0.0.1", 0))
    # With a timeout, as the part's clients have one: an open socket
    # with nothing to read is looked at without waiting for it.
    a = socket.create_connection(listener.getsockname(), timeout=60)
    b = socket.create_connection(listener.getsockname(), timeout=60)
    a_peer, _ = listener.accept()
    b_peer, _ = listener.accept()
    try:
        b_peer.close()
        assert b.recv(1, socket.MSG_PEEK) == b""
        assert scale.closed_by_peer([a, b]) == 1
        assert a.gettimeout() == 60
    finally:
        for s in (a, b, a_peer, listener):
            s.close()


def test_the_report_says_how_many_the_proxy_closed():
    r = part([(1000, 9000)])
    r["points"][0]["closed"] = 7
    row = next(line for line in scale.report_lines({"nginx": {"idle": r}}) if line.startswith("| nginx"))
    assert "| 1,000 (7 closed by it) |" in row
    assert "7 closed by the proxy" in scale.part_lines("nginx", "idle", r)[0]


def test_connections_are_opened_a_batch_at_a_time():
    batches = []

    def open_some(k):
        batches.append(k)
        return [object()] * k

    assert len(scale.in_batches(2 * scale.BATCH + 7, open_some)) == 2 * scale.BATCH + 7
    assert batches == [scale.BATCH, scale.BATCH, 7]
    assert scale.in_batches(0, open_some) == []


def test_the_tunnels_ask_for_the_app_s_buffered_echo():
    assert scale.SCALE_UPGRADE.startswith(b"GET /tunnel?buffered HTTP/1.1\r\n")
    assert scale.SCALE_UPGRADE.endswith(b"\r\n\r\n")
