from types import SimpleNamespace

import pytest

from qproxy_tools.bench import cost

# perf stat -x, as it reports on stderr: value, unit, event, run time,
# share; an event it could not count says so in the value.
PERF = """123456789,,instructions:u,1000,100.00,,
4321,,raw_syscalls:sys_enter,1000,100.00,,
<not supported>,,context-switches,0,100.00,,
"""


def test_perf_counts_read_by_event():
    assert cost.Perf.parse(PERF) == {"instructions": 123456789, "syscalls": 4321}
    assert cost.Perf.parse("") == {}


def test_perf_without_processes_counts_nothing():
    assert cost.Perf([]).stop() == {}


class FakeContender:
    variant = "pinned"

    def pids(self):
        return [10, 11]


def test_the_cost_per_request_of_a_load(monkeypatch):
    ticks = {(10, 11): iter([100, 100 + 2 * cost.TICK]), (7,): iter([50, 50 + cost.TICK])}
    machine = iter([(5, 1000), (15, 1100)])
    monkeypatch.setattr(cost, "cpu_ticks", lambda pids: next(ticks[tuple(pids)]))
    monkeypatch.setattr(cost, "machine_ticks", lambda: next(machine))
    monkeypatch.setattr(cost, "rss_kib", lambda pids, field: 2048 if field == "VmHWM:" else 0)
    cpus = []

    def load(client_cpu):
        cpus.append(client_cpu)
        return {"requests": 1000}

    r = cost.measured(FakeContender(), {}, load, SimpleNamespace(smoke=True), 7)
    # The client runs on the app's CPU, pinned.
    assert cpus == [1]
    assert r["steal"] == pytest.approx(0.1)
    assert r["cpu_s"] == pytest.approx(2)
    assert r["cpu_us"] == pytest.approx(2000)
    assert r["vs_app"] == pytest.approx(2)
    assert r["instructions"] is None and r["syscalls"] is None
    assert r["peak_rss"] == 2


def test_direct_has_no_proxy_cost(monkeypatch):
    monkeypatch.setattr(cost, "cpu_ticks", lambda pids: 0)
    monkeypatch.setattr(cost, "machine_ticks", lambda: (0, 0))
    direct = SimpleNamespace(variant="unpinned", pids=lambda: [])
    r = cost.measured(direct, {}, lambda cpu: {"requests": 0, "cpu": cpu}, SimpleNamespace(smoke=True), 7)
    assert r["cpu"] is None
    assert r["cpu_us"] is None and r["vs_app"] is None and r["peak_rss"] is None
    assert r["steal"] == 0
