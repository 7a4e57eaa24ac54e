from types import SimpleNamespace

from qproxy_tools.bench import adaptive, adaptive_plan, adaptive_report


def closed(limit=12, errors=0):
    return {
        "direct": [{"errors": 0, "goodput": 1400, "p50": 0.13, "p99": 0.18}],
        "qproxy": [{"errors": 0, "goodput": 1450, "p50": 0.12, "p99": 0.2}],
        "qproxy-adaptive": [{"errors": errors, "goodput": 4300, "p50": 0.046, "p99": 0.06, "limit": limit}],
    }


def test_the_smoke_fails_on_errors_and_on_a_limit_out_of_bounds():
    assert adaptive_report.problems({"closed": {64: closed()}, "open": {}}) == []
    assert adaptive_report.problems({"closed": {64: closed(errors=3)}, "open": {}}) == [
        "closed, knee 64, qproxy-adaptive: 3 errors"
    ]
    assert "not within" in adaptive_report.problems({"closed": {64: closed(limit=0)}, "open": {}})[0]
    assert "not within" in adaptive_report.problems({"closed": {64: closed(limit=None)}, "open": {}})[0]
    assert "not within" in adaptive_report.problems({"closed": {64: closed(limit=1001)}, "open": {}})[0]


def test_503s_fail_below_capacity_only():
    def open_load(factor, shed):
        return {"closed": {}, "open": {64: {(factor, "qproxy-adaptive"): [{"errors": 0, "shed": shed}]}}}

    assert adaptive_report.problems(open_load(0.5, 0)) == []
    assert adaptive_report.problems(open_load(0.5, 2)) != []
    assert adaptive_report.problems(open_load(1.5, 2)) == []


def test_the_section_states_its_premise_and_the_models_prediction():
    args = SimpleNamespace(
        rounds=1, open_rounds=1, seconds=10, connections=200, work=100000, rates=(0.5,), overflow=None
    )
    no_growth = closed(limit=20)
    results = {"closed": {64: closed(), 0: no_growth}, "capacity": {}, "open": {}}
    text = adaptive_report.section(args, "2026-11-29, commit abc, 2 vCPU X, Linux Y", results)
    assert text.startswith(adaptive_report.BEGIN) and text.rstrip().endswith(adaptive_report.END)
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
    text = adaptive_report.section(args, "today", results)
    assert "| 64 | 1.0× (1,000/s) | `qproxy-adaptive` | 900 | 850 | 300.0 ms | 400.0 ms | 12 | 3 | 7 |" in text


def test_the_overflow_run_is_the_options_alone():
    args = SimpleNamespace(rates=(0.5, 1.0), overflow=4.0)
    assert adaptive_plan.open_runs(args) == [
        (0.5, "qproxy"),
        (0.5, "qproxy-adaptive"),
        (1.0, "qproxy"),
        (1.0, "qproxy-adaptive"),
        (4.0, "qproxy-adaptive"),
    ]
    assert adaptive_plan.open_runs(SimpleNamespace(rates=(0.5,), overflow=None))[-1] == (0.5, "qproxy-adaptive")


def test_the_command_line_and_the_smokes_short_round():
    args = adaptive.parse_args(["--knees", "0,16", "--open-knees", ""])
    assert (args.knees, args.open_knees, args.rates, args.overflow) == ([0, 16], [], adaptive_plan.RATES, 4.0)
    smoke = adaptive.parse_args(["--smoke", "--rounds", "5"])
    assert (smoke.rounds, smoke.open_rounds, smoke.seconds, smoke.knees, smoke.open_knees) == (1, 1, 3, [64], [64])
    # Below capacity only, where no 503 may come.
    assert smoke.rates == (0.5,) and smoke.overflow is None


def test_the_adaptive_contender_has_the_option_and_a_metrics_port(monkeypatch):
    monkeypatch.setattr(adaptive.procs, "free_port", lambda: 19090)
    c, metrics = adaptive.contender({"qproxy": "/q"}, "qproxy-adaptive")
    assert (c.name, c.variant, metrics) == ("qproxy", "pinned", 19090)
    assert c.bins["qproxy-env"] == ["QPROXY_METRICS_PORT=19090", "QPROXY_OPTION_ADAPTIVE_CONCURRENCY=on"]
    c, metrics = adaptive.contender({"qproxy": "/q"}, "qproxy")
    assert metrics is None and c.bins["qproxy-env"] == []
    c, metrics = adaptive.contender({}, "direct")
    assert (c.name, metrics) == ("direct", None)


def test_a_measurement_traces_the_limit_and_stops_both(monkeypatch):
    events = []

    class FakeContender:
        port = 18000

        def start(self, app_port):
            events.append(("start", app_port))

        def stop(self):
            events.append("contender stopped")

    class FakeTrace:
        def __init__(self, port, prefix):
            events.append(("trace", port, prefix))

        def start(self):
            pass

        def stop(self):
            return [(0.1, 40), (0.2, 12)]

    monkeypatch.setattr(adaptive.procs, "start_app", lambda bins, variant: ("app", 9))
    monkeypatch.setattr(adaptive.procs, "stop", lambda app: events.append("app stopped"))
    monkeypatch.setattr(adaptive, "Trace", FakeTrace)
    monkeypatch.setattr(
        adaptive, "contender", lambda bins, name: (FakeContender(), 19090 if "adaptive" in name else None)
    )
    r = adaptive.measured({}, "qproxy-adaptive", lambda port: {"port": port})
    assert r == {"port": 18000, "limit": 12, "trace": [(0.1, 40), (0.2, 12)]}
    assert events == [
        ("start", 9),
        ("trace", 19090, "qproxy_adaptive_concurrency_limit{"),
        "contender stopped",
        "app stopped",
    ]
    assert adaptive.measured({}, "qproxy", lambda port: {"port": port}) == {"port": 18000}


def test_what_it_runs_is_built_or_installed(monkeypatch):
    monkeypatch.setattr(adaptive.binaries, "qproxy", lambda given: given or "/built")
    monkeypatch.setattr(adaptive.binaries, "app", lambda: "/app")
    monkeypatch.setattr(adaptive, "require_tools", lambda tools, who: {t: f"/{who}/{t}" for t in tools})
    monkeypatch.setattr(adaptive, "vegeta_bin", lambda: "/vegeta")
    bins = adaptive.build(SimpleNamespace(qproxy_bin=None))
    assert bins == {"qproxy": "/built", "app": "/app", "wrk": "/adaptive/wrk", "vegeta": "/vegeta"}


def test_the_apps_path_carries_the_work_and_the_knee():
    assert adaptive_plan.path(SimpleNamespace(work=1000), 64) == "/contended?work=1000&knee=64"
    assert adaptive_plan.knee_name(0) == "none" and adaptive_plan.knee_name(16) == "16"
    assert adaptive_report.ms(0.0123) == "12.3 ms" and adaptive_report.ms(None) == "–"


def test_the_section_goes_between_the_adaptive_markers(tmp_path, monkeypatch):
    page = tmp_path / "RESULTS.md"
    page.write_text(f"# R\n{adaptive_report.BEGIN}\nold\n{adaptive_report.END}\nafter\n")
    monkeypatch.setattr(adaptive_report, "RESULTS", str(page))
    adaptive_report.write(f"{adaptive_report.BEGIN}\nnew\n{adaptive_report.END}\n")
    assert page.read_text() == f"# R\n{adaptive_report.BEGIN}\nnew\n{adaptive_report.END}\nafter\n"
