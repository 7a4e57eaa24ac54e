import subprocess
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


def test_wrk_command_lines():
    assert loads.wrk_argv("wrk", "http://h/", 70, 5) == ["wrk", "-t1", "-c70", "-d5s", "--latency", "http://h/"]
    assert loads.wrk_argv("/bin/wrk", "https://h/x", 10, 2, threads=2, headers=("A: 1", "B: 2"), script="s.lua") == [
        "/bin/wrk",
        "-t2",
        "-c10",
        "-d2s",
        "--latency",
        "-H",
        "A: 1",
        "-H",
        "B: 2",
        "-s",
        "s.lua",
        "https://h/x",
    ]


def test_run_wrk_pins_the_client_and_reads_the_report(monkeypatch):
    calls = []

    def fake_run(argv, **kwargs):
        calls.append((argv, kwargs))
        return subprocess.CompletedProcess(argv, 0, stdout=WRK)

    monkeypatch.setattr(loads.subprocess, "run", fake_run)
    r = loads.run_wrk({"wrk": "/w"}, 18080, "/bytes?n=1", 10, 3, 1, "https", ["Connection: close"])
    assert calls[0][0] == [
        "taskset",
        "-c",
        "1",
        "/w",
        "-t1",
        "-c10",
        "-d3s",
        "--latency",
        "-H",
        "Connection: close",
        "https://127.0.0.1:18080/bytes?n=1",
    ]
    assert calls[0][1]["check"] is True
    assert r["requests"] == 1949 and r["seconds"] == 3
    loads.run_wrk({"wrk": "/w"}, 1, "/", 1, 1, None)
    assert calls[1][0][0] == "/w"


def test_run_h2load_sends_grpc_as_a_post_of_its_request_file(monkeypatch):
    calls = []

    def fake_run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=H2LOAD)

    monkeypatch.setattr(loads.subprocess, "run", fake_run)
    bins = {"h2load": "/h", "grpc-request": "/req"}
    assert loads.run_h2load(bins, 9, 2, None)["requests"] == 16150
    assert calls[0] == ["/h", "-c10", "-m10", "-D", "2", "http://127.0.0.1:9/"]
    loads.run_h2load(bins, 9, 2, 0, grpc=True)
    assert calls[1] == [
        "taskset",
        "-c",
        "0",
        "/h",
        "-c10",
        "-m10",
        "-D",
        "2",
        "-d",
        "/req",
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
        "http://127.0.0.1:9/grpc.health.v1.Health/Check",
    ]


# vegeta encode --to=csv: timestamp, code, latency (ns), bytes out, bytes
# in, error, body, attack, seq, method, url, headers.
VEGETA = """1795929767990744114,200,4000000,0,5,,,,0,GET,http://127.0.0.1:1/contended,
1795929768010804830,200,2000000,0,5,,,,1,GET,http://127.0.0.1:1/contended,
1795929768030682584,503,100000,0,31,,,,2,GET,http://127.0.0.1:1/contended,
1795929768050682584,0,30000000000,0,0,Get: timeout,,,3,GET,http://127.0.0.1:1/contended,
1795929768070682584,200,6000000,0,5,,,,4,GET,http://127.0.0.1:1/contended,
"""


def test_vegeta_results_read_whole():
    r = loads.parse_vegeta(VEGETA, seconds=2)
    assert r["sent"] == 5
    # The timeout's answer, 30 s after it was sent, ends the span.
    assert r["span"] == pytest.approx(30.06, abs=1e-3)
    assert r["goodput"] == pytest.approx(3 / 30.06, rel=1e-4)
    # Latency is the 2xx answers' only: the fast 503 and the timeout are not in it.
    assert r["p50"] == pytest.approx(0.004)
    assert r["p99"] == pytest.approx(0.006)
    assert r["shed"] == 1
    assert r["errors"] == 1


def test_goodput_over_the_runs_seconds_at_least():
    quick = "1000000000,200,1000000,0,5,,,,0,GET,u,\n1500000000,200,1000000,0,5,,,,1,GET,u,\n"
    assert loads.parse_vegeta(quick, seconds=10)["goodput"] == pytest.approx(0.2)


# A stand-in for vegeta: `attack` writes its arguments and the targets it
# read into the folder $VEGETA_OUT and passes on a line; `encode` writes
# that line's results as CSV, two answers.
VEGETA_STAND_IN = """#!/bin/sh
case "$1" in
  attack) echo "$@" > "$VEGETA_OUT/attack"; cat > "$VEGETA_OUT/targets"; echo results ;;
  encode) echo "$@" > "$VEGETA_OUT/encode"; cat > /dev/null
          echo "1000000000,200,2000000,0,5,,,,0,GET,u,"
          echo "1100000000,503,1000000,0,5,,,,1,GET,u," ;;
esac
"""


def test_run_vegeta_attacks_the_target_and_reads_the_encoded_results(tmp_path, monkeypatch):
    vegeta = tmp_path / "vegeta"
    vegeta.write_text(VEGETA_STAND_IN)
    vegeta.chmod(0o755)
    monkeypatch.setenv("VEGETA_OUT", str(tmp_path))
    r = loads.run_vegeta({"vegeta": str(vegeta)}, 18080, "/contended?knee=64", 1234.4, 3, None)
    assert (tmp_path / "attack").read_text() == "attack -rate=1234/s -duration=3s -timeout=30s -max-body=0\n"
    assert (tmp_path / "targets").read_text() == "GET http://127.0.0.1:18080/contended?knee=64\n"
    assert (tmp_path / "encode").read_text() == "encode --to=csv\n"
    assert r["sent"] == 2 and r["shed"] == 1 and r["errors"] == 0 and r["rate"] == 1234.4
    assert r["goodput"] == pytest.approx(1 / 3)
    # At least one request a second.
    loads.run_vegeta({"vegeta": str(vegeta)}, 1, "/", 0.2, 1, None)
    assert "-rate=1/s" in (tmp_path / "attack").read_text()


def test_a_failed_vegeta_is_an_error(tmp_path):
    vegeta = tmp_path / "vegeta"
    vegeta.write_text("#!/bin/sh\ncat > /dev/null\nexit 2\n")
    vegeta.chmod(0o755)
    with pytest.raises(RuntimeError, match="vegeta exited 2, its encoder 2"):
        loads.run_vegeta({"vegeta": str(vegeta)}, 1, "/", 10, 1, None)
