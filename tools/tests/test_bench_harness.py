from types import SimpleNamespace

import pytest

from qproxy_tools.bench import harness


def test_the_command_lines_lists_are_split():
    args = harness.parse_args(["--contenders", "qproxy,nginx", "--loads", "1,4", "--base-bin", "/b"])
    assert args.contenders == ["qproxy", "nginx", "qproxy-base"]
    assert args.loads == [1, 4]
    assert args.variants == ["pinned", "unpinned"]
    assert (args.rounds, args.seconds, args.instructions) == (3, 5, 20000)
    assert harness.parse_args(["--contenders", "qproxy-base", "--base-bin", "/b"]).contenders == ["qproxy-base"]


def test_the_smoke_is_one_short_round_of_load_1():
    args = harness.parse_args(["--smoke", "--rounds", "9", "--contenders", "nginx", "--qproxy-env", "A=1"])
    assert (args.rounds, args.seconds, args.contenders, args.loads, args.variants) == (
        1,
        2,
        ["direct", "qproxy"],
        [1],
        ["unpinned"],
    )
    assert args.qproxy_env == ["A=1"]


def test_allocations_are_read_from_the_benchs_lines():
    out = "running\nallocations per request: GET 3\nother: 1\nallocations per request: POST 1KiB 5\n"
    assert harness.parse_allocations(out) == ["GET 3", "POST 1KiB 5"]


class FakeContender:
    """A contender that records how it was made and started."""

    made = []

    def __init__(self, name, bins, variant, cc=0, tls=False):
        self.name, self.variant, self.cc, self.tls = name, variant, cc, tls
        self.port, self.tls_port, self.app_pid = 8000, 8443, None
        FakeContender.made.append(self)

    def start(self, app_port):
        self.app_port = app_port

    def stop(self):
        self.stopped = True


@pytest.fixture
def stand_ins(monkeypatch):
    FakeContender.made = []
    wrk_runs, apps = [], []
    monkeypatch.setattr(harness, "Contender", FakeContender)
    monkeypatch.setattr(harness, "start_app", lambda bins, variant: (apps.append(variant) or SimpleNamespace(pid=7), 9))
    monkeypatch.setattr(harness, "stop", lambda app: apps.append("stopped"))
    monkeypatch.setattr(harness, "check_app_answers", lambda port: None)

    def run_wrk(bins, port, path, conns, seconds, cpu, scheme="http"):
        wrk_runs.append((port, path, conns, seconds, cpu, scheme))
        return {"rps": 100.0 * conns, "non2xx": 0, "requests": 10, "errors": 0}

    monkeypatch.setattr(harness, "run_wrk", run_wrk)
    return SimpleNamespace(wrk=wrk_runs, apps=apps)


def test_load_5_runs_each_limit_against_the_slow_app_with_twice_its_connections(stand_ins):
    args = SimpleNamespace(contenders=["direct", "qproxy", "nginx", "go-qp"], seconds=4)
    results = harness.run_concurrency(args, {})
    assert sorted(results) == [(1, "go-qp"), (1, "qproxy"), (10, "go-qp"), (10, "qproxy")]
    assert [(c.name, c.cc, c.variant) for c in FakeContender.made] == [
        ("qproxy", 1, "unpinned"),
        ("go-qp", 1, "unpinned"),
        ("qproxy", 10, "unpinned"),
        ("go-qp", 10, "unpinned"),
    ]
    assert stand_ins.wrk[0] == (8000, "/sleep?ms=10", 2, 4, None, "http")
    assert stand_ins.wrk[2][2] == 20
    assert all(c.stopped and c.app_port == 9 for c in FakeContender.made)
    assert stand_ins.apps == ["unpinned", "stopped"]


def test_each_round_starts_one_contender_later(stand_ins, monkeypatch):
    measured = []

    def fake_measured(c, bins, warm, args, app_pid):
        measured.append((c.name, app_pid))
        return {"rps": 1.0, "errors": 0, "steal": 0.0}

    monkeypatch.setattr(harness, "measured", fake_measured)
    args = SimpleNamespace(
        variants=["pinned"], loads=[1], rounds=3, contenders=["direct", "qproxy", "nginx"], smoke=False, seconds=1
    )
    results = harness.run_throughput(args, {})
    assert [name for name, _ in measured] == [
        "direct",
        "qproxy",
        "nginx",
        "qproxy",
        "nginx",
        "direct",
        "nginx",
        "direct",
        "qproxy",
    ]
    assert {pid for _, pid in measured} == {7}
    assert sorted(results) == [("pinned", "1 keep-alive c70", n) for n in ("direct", "nginx", "qproxy")]
    assert all(len(rounds) == 3 for rounds in results.values())
    # A second of warming up before each, the client pinned.
    assert stand_ins.wrk == [(8000, "/", 10, 1, 1, "http")] * 9


def test_the_tls_loads_skip_direct_and_warm_up_on_the_tls_port(stand_ins, monkeypatch):
    monkeypatch.setattr(harness, "measured", lambda c, *rest: {"rps": 1.0, "errors": 0, "steal": 0.0})
    monkeypatch.setattr(harness.os, "geteuid", lambda: 1000)
    args = SimpleNamespace(
        variants=["unpinned"], loads=[9], rounds=1, contenders=["direct", "qproxy", "go-qp"], smoke=False, seconds=1
    )
    results = harness.run_throughput(args, {})
    # The app speaks no TLS; the Go queue-proxy's certificate path needs root.
    assert list(results) == [("unpinned", "9 TLS keep-alive c70", "qproxy")]
    assert [(c.name, c.tls) for c in FakeContender.made] == [("qproxy", True)]
    assert stand_ins.wrk == [(8443, "/", 10, 1, None, "https")]


def test_the_smoke_does_not_warm_up(stand_ins, monkeypatch):
    monkeypatch.setattr(harness, "measured", lambda c, *rest: {"rps": 1.0, "errors": 0, "steal": 0.0})
    args = SimpleNamespace(variants=["unpinned"], loads=[1], rounds=1, contenders=["qproxy"], smoke=True, seconds=1)
    harness.run_throughput(args, {})
    assert stand_ins.wrk == []
