from qproxy_tools.bench import scrape

METRICS = """# HELP qproxy_adaptive_concurrency_limit The limit.
# TYPE qproxy_adaptive_concurrency_limit gauge
qproxy_adaptive_concurrency_limit{revision="hello"} 12.0
qproxy_requests_total{code="200"} 40
"""

LIMIT = "qproxy_adaptive_concurrency_limit{"


def test_a_metrics_value_by_its_name():
    assert scrape.metric_value(METRICS, LIMIT) == 12
    assert scrape.metric_value(METRICS, "qproxy_requests_total{") == 40
    assert scrape.metric_value(METRICS, "qproxy_missing{") is None
    # A help line is not a sample.
    assert scrape.metric_value("# HELP x\n", "x{") is None


def test_a_trace_keeps_what_was_read_in_order():
    values = iter([None, 3, OSError("refused"), 5, 8])

    def read():
        value = next(values)
        if isinstance(value, Exception):
            raise value
        if value == 8:
            trace.done.set()
        return value

    trace = scrape.Trace(0, LIMIT, interval=0, read=read)
    trace.start()
    trace.join()
    points = trace.stop()
    # What failed or found nothing is left out.
    assert [v for _, v in points] == [3, 5, 8]
    times = [t for t, _ in points]
    assert times == sorted(times) and times[0] >= 0


def test_a_trace_reads_the_port_by_default(monkeypatch):
    seen = []
    monkeypatch.setattr(scrape, "scrape", lambda port, prefix: seen.append((port, prefix)))
    scrape.Trace(9091, LIMIT).read()
    assert seen == [(9091, LIMIT)]
