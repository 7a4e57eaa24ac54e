from types import SimpleNamespace

import pytest

from qproxy_tools.bench import loads

# wrk 4.1's report with --latency, as it printed it here.
WRK = """Running 1s test @ http://127.0.0.1:18777/nonexistent
  1 threads and 2 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.15ms    0.86ms  12.36ms   95.63%
    Req/Sec     1.78k   167.37     1.94k    81.82%
  Latency Distribution
     50%    1.00ms
     75%    1.28ms
     90%    1.60ms
     99%    4.78ms
  1949 requests in 1.10s, 0.97MB read
  Non-2xx or 3xx responses: 1949
Requests/sec:   1772.69
Transfer/sec:      0.88MB
"""

H2LOAD = """finished in 2.00s, 8075.50 req/s, 1.20MB/s
requests: 16151 total, 16251 started, 16151 done, 16150 succeeded, 1 failed, 0 errored, 0 timeout
status codes: 16151 2xx, 0 3xx, 0 4xx, 0 5xx
                     min         max         mean         sd        +/- sd
time for request:      412us     30.01ms     12.17ms      2.10ms    70.00%
"""


def test_durations_in_wrk_units():
    assert loads.parse_duration("412us") == pytest.approx(412e-6)
    assert loads.parse_duration("1.5ms") == pytest.approx(1.5e-3)
    assert loads.parse_duration("2.00s") == pytest.approx(2.0)
    assert loads.parse_duration("1m") == pytest.approx(60.0)
    assert loads.parse_duration("fast") is None


def test_wrk_report_read_whole():
    r = loads.parse_wrk(WRK)
    assert r["requests"] == 1949
    assert r["rps"] == pytest.approx(1772.69)
    assert r["p50"] == pytest.approx(1.00e-3)
    assert r["p90"] == pytest.approx(1.60e-3)
    assert r["p99"] == pytest.approx(4.78e-3)
    assert r["errors"] == 1949
    assert r["bytes_per_s"] == pytest.approx(0.88 * 1024**2)


def test_wrk_socket_errors_count_as_errors():
    text = WRK.replace("  Non-2xx or 3xx responses: 1949\n", "  Socket errors: connect 1, read 2, write 3, timeout 4\n")
    assert loads.parse_wrk(text)["errors"] == 10


def test_wrk_without_errors():
    text = WRK.replace("  Non-2xx or 3xx responses: 1949\n", "")
    assert loads.parse_wrk(text)["errors"] == 0


def test_h2load_report():
    r = loads.parse_h2load(H2LOAD)
    assert r["requests"] == 16150
    assert r["rps"] == pytest.approx(8075.50)
    assert r["errors"] == 1
    assert r["p50"] == pytest.approx(12.17e-3)
    assert r["p99"] is None


def test_an_unreadable_h2load_report_is_an_error():
    assert loads.parse_h2load("h2load: connection refused\n")["errors"] == 1


def test_loads_by_number_in_the_methods_order():
    args = SimpleNamespace(seconds=1, loads=[1, 2, 3, 11, 12, 4, 9, 10])
    assert list(loads.throughput_loads(args)) == [
        "1 keep-alive c70",
        "2 sequential c1",
        "3 h2c 10x10",
        loads.GRPC_UNARY,
        "4 64KiB c10",
        "4 1MiB c10",
        loads.EVENTS_LOAD,
        loads.TLS_KEEP_ALIVE,
        loads.TLS_HANDSHAKES,
    ]


def test_the_events_script_is_a_1kib_post():
    with open(loads.EVENTS_SCRIPT) as f:
        script = f.read()
    assert 'wrk.method = "POST"' in script
    assert 'string.rep("x", 1014)' in script
