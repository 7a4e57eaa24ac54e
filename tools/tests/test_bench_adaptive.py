from types import SimpleNamespace

import pytest

from qproxy_tools.bench import adaptive

# vegeta encode --to=csv: timestamp, code, latency (ns), bytes out, bytes
# in, error, body, attack, seq, method, url, headers.
VEGETA = """1795929767990744114,200,4000000,0,5,,,,0,GET,http://127.0.0.1:1/contended,
1795929768010804830,200,2000000,0,5,,,,1,GET,http://127.0.0.1:1/contended,
1795929768030682584,503,100000,0,31,,,,2,GET,http://127.0.0.1:1/contended,
1795929768050682584,0,30000000000,0,0,Get: timeout,,,3,GET,http://127.0.0.1:1/contended,
1795929768070682584,200,6000000,0,5,,,,4,GET,http://127.0.0.1:1/contended,
"""


def test_vegeta_results_read_whole():
    r = adaptive.parse_vegeta(VEGETA, seconds=2)
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
    assert adaptive.parse_vegeta(quick, seconds=10)["goodput"] == pytest.approx(0.2)


def test_nearest_rank_percentiles():
    values = [float(v) for v in range(1, 101)]
    assert adaptive.percentile(values, 0.5) == 50
    assert adaptive.percentile(values, 0.99) == 99
    assert adaptive.percentile([7.0], 0.99) == 7.0
    assert adaptive.percentile([], 0.5) is None


def closed(limit=12, errors=0):
    return {
        "direct": [{"errors": 0, "goodput": 1400, "p50": 0.13, "p99": 0.18}],
        "qproxy": [{"errors": 0, "goodput": 1450, "p50": 0.12, "p99": 0.2}],
        "qproxy-adaptive": [{"errors": errors, "goodput": 4300, "p50": 0.046, "p99": 0.06, "limit": limit}],
    }


def test_the_smoke_fails_on_errors_and_on_a_limit_out_of_bounds():
    assert adaptive.problems({"closed": {64: closed()}, "open": {}}) == []
    assert adaptive.problems({"closed": {64: closed(errors=3)}, "open": {}}) == [
        "closed, knee 64, qproxy-adaptive: 3 errors"
    ]
    assert "not within" in adaptive.problems({"closed": {64: closed(limit=0)}, "open": {}})[0]
    assert "not within" in adaptive.problems({"closed": {64: closed(limit=None)}, "open": {}})[0]
    assert "not within" in adaptive.problems({"closed": {64: closed(limit=1001)}, "open": {}})[0]


def test_503s_fail_below_capacity_only():
    def open_load(factor, shed):
        return {"closed": {}, "open": {64: {(factor, "qproxy-adaptive"): [{"errors": 0, "shed": shed}]}}}

    assert adaptive.problems(open_load(0.5, 0)) == []
    assert adaptive.problems(open_load(0.5, 2)) != []
    assert adaptive.problems(open_load(1.5, 2)) == []


def test_the_section_states_its_premise_and_the_models_prediction():
    args = SimpleNamespace(
        rounds=1, open_rounds=1, seconds=10, connections=200, work=100000, rates=(0.5,), overflow=None
    )
    no_growth = closed(limit=20)
    results = {"closed": {64: closed(), 0: no_growth}, "capacity": {}, "open": {}}
    text = adaptive.section(args, "2026-11-29, commit abc, 2 vCPU X, Linux Y", results)
    assert text.startswith(adaptive.BEGIN) and text.rstrip().endswith(adaptive.END)
    assert "2026-11-29, commit abc" in text
    assert "with K none its cost does not grow" in text
    # (1 + 200/64) / (1 + 12/64) = 3.47
    assert "knee 64: 2.97× (the model alone: 3.47×)" in text
    assert "knee none: 2.97× (the model alone: 1.00×)" in text


def test_the_open_load_shows_what_the_generator_sent():
    args = SimpleNamespace(
        rounds=1, open_rounds=1, seconds=10, connections=200, work=400000, rates=(1.0,), overflow=None
    )
    rounds = [{"sent": 9000, "goodput": 850.0, "p50": 0.3, "p99": 0.4, "shed": 12, "errors": 3, "limit": 7}]
    results = {
        "closed": {},
        "capacity": {64: 1000.0},
        "open": {64: {(1.0, "qproxy"): rounds, (1.0, "qproxy-adaptive"): rounds}},
    }
    text = adaptive.section(args, "today", results)
    assert "| 64 | 1.0× (1,000/s) | `qproxy-adaptive` | 900 | 850 | 300.0 ms | 400.0 ms | 12 | 3 | 7 |" in text


def test_the_overflow_run_is_the_options_alone():
    args = SimpleNamespace(rates=(0.5, 1.0), overflow=4.0)
    assert adaptive.open_runs(args) == [
        (0.5, "qproxy"),
        (0.5, "qproxy-adaptive"),
        (1.0, "qproxy"),
        (1.0, "qproxy-adaptive"),
        (4.0, "qproxy-adaptive"),
    ]
    assert adaptive.open_runs(SimpleNamespace(rates=(0.5,), overflow=None))[-1] == (0.5, "qproxy-adaptive")
