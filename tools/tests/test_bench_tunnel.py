"""Load 13's client against a stand-in app on loopback, and its report."""

import socket
import threading

from qproxy_tools.bench import tunnel


class Fake:
    """A contender stand-in: a port, and no process of its own."""

    name = "stand-in"

    def __init__(self, port):
        self.port = port

    def pids(self):
        return []


def echo_app(answer=b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", ahead=b""):
    """A one-connection app on loopback: reads the head, answers `answer`
    (and `ahead`, as if sent with it), then echoes until the client stops
    sending. Its port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        with conn, listener:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(1)
            conn.sendall(answer + ahead)
            while data := conn.recv(65536):
                conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def test_head_end():
    assert tunnel.head_end(b"HTTP/1.1 101 X\r\n") is None
    assert tunnel.head_end(b"HTTP/1.1 101 X\r\n\r\nrest") == 18


def test_every_byte_comes_back():
    back, seconds = tunnel.stream(echo_app(), 2)
    assert back == 2 * tunnel.MIB
    assert seconds > 0


def test_bytes_with_the_head_count():
    back, _ = tunnel.stream(echo_app(ahead=b"xy"), 1)
    assert back >= tunnel.MIB


def test_a_tunnel_that_closes_early_says_how_much_came():
    port = echo_app(answer=b"HTTP/1.1 101 Switching Protocols\r\n\r\n", ahead=b"")
    back, _ = tunnel.stream(port, 1)
    assert back == tunnel.MIB


def test_an_answer_that_is_not_an_upgrade_is_an_error():
    port = echo_app(answer=b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
    try:
        tunnel.stream(port, 1)
    except RuntimeError as e:
        assert "no upgrade" in str(e)
    else:
        raise AssertionError("a 404 was taken for a tunnel")


def test_measure_says_rate_and_cpu_per_mib():
    r = tunnel.measure(Fake(echo_app()), 1)
    assert r["mib_per_s"] > 0
    assert r["cpu_ms_per_mib"] == 0


def short_app():
    """An app that answers 101, sends one byte and closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        with conn, listener:
            while b"\r\n\r\n" not in conn.recv(4096):
                pass
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\n\r\nz")

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def test_measure_refuses_a_short_echo():
    port = short_app()
    try:
        tunnel.measure(Fake(port), 1)
    except RuntimeError as e:
        assert "bytes back" in str(e)
    else:
        raise AssertionError("an echo of the wrong length was measured")


def test_qproxy_and_haproxy_run_beside_their_other_path():
    assert tunnel.tunnel_contenders(["direct", "qproxy", "nginx", "haproxy", "qproxy-nometrics"]) == [
        "direct",
        "qproxy",
        "qproxy-nosplice",
        "nginx",
        "haproxy",
        "haproxy-splice",
    ]


def test_medians_and_report():
    results = {
        "qproxy": tunnel.medians(
            [{"mib_per_s": 900, "cpu_ms_per_mib": 0.2}, {"mib_per_s": 1000, "cpu_ms_per_mib": 0.4}]
        ),
        "qproxy-nosplice": {"mib_per_s": 800, "cpu_ms_per_mib": 0.6},
    }
    assert results["qproxy"] == {"mib_per_s": 950, "cpu_ms_per_mib": 0.30000000000000004}
    lines = tunnel.report_lines(results)
    assert "| qproxy | 950 | 0.30 | 0.50 |" in lines
    assert "| qproxy-nosplice | 800 | 0.60 | 1.00 |" in lines
