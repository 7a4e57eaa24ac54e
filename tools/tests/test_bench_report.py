from types import SimpleNamespace

from qproxy_tools.bench import report


def rounds(**values):
    return [dict(values, errors=0, steal=0.01)]


def run_args():
    return SimpleNamespace(
        contenders=["direct", "qproxy", "nginx"],
        variants=["pinned", "unpinned"],
        loads=[1, 9],
        seconds=5,
        rounds=1,
        idle_seconds=30,
        instructions=0,
    )


def throughput():
    load1, tls = "1 keep-alive c70", "9 TLS keep-alive c70"
    return {
        ("pinned", load1, "direct"): rounds(rps=22225.4, cpu_us=None),
        ("unpinned", load1, "direct"): rounds(rps=38883.0, cpu_us=None),
        ("pinned", load1, "qproxy"): rounds(rps=15719, cpu_us=43.64),
        ("unpinned", load1, "qproxy"): rounds(rps=16490, cpu_us=42.6),
        ("pinned", load1, "nginx"): rounds(rps=16866, cpu_us=41.7),
        ("unpinned", load1, "nginx"): rounds(rps=14564, cpu_us=41.8),
        ("pinned", tls, "qproxy"): rounds(rps=14020, cpu_us=49.4),
        ("unpinned", tls, "qproxy"): rounds(rps=14730, cpu_us=44.8),
        ("pinned", tls, "nginx"): rounds(rps=15673, cpu_us=51.6),
        ("unpinned", tls, "nginx"): rounds(rps=11479, cpu_us=61.7),
    }


def test_the_compact_table_has_a_row_per_load_and_both_variants():
    text = report.compact(run_args(), throughput())
    assert "Proxy CPU per request (µs), pinned / unpinned; `direct` in requests per second:" in text
    assert "| load | direct | qproxy | nginx |" in text
    assert "| 1 keep-alive c70 | 22,225 / 38,883 | 43.6 / 42.6 | 41.7 / 41.8 |" in text
    # The app speaks no TLS: no figure for direct.
    assert "| 9 TLS keep-alive c70 | – | 49.4 / 44.8 | 51.6 / 61.7 |" in text


def test_the_full_tables_name_every_contender_of_every_load():
    text = report.report(run_args(), throughput(), None, None)
    assert "### Throughput and cost, pinned" in text and "### Throughput and cost, unpinned" in text
    assert "| 1 keep-alive c70 | qproxy | 15,719 | " in text
    # A TLS load has no direct row.
    assert "| 9 TLS keep-alive c70 | direct |" not in text


def test_a_section_replaces_what_lies_between_its_markers():
    page = "# Results\n\nbefore\n<!-- b -->\nold\n<!-- e -->\nafter\n"
    assert report.between_markers(page, "<!-- b -->\nnew\n<!-- e -->", "<!-- b -->", "<!-- e -->") == (
        "# Results\n\nbefore\n<!-- b -->\nnew\n<!-- e -->\nafter\n"
    )


def test_a_section_without_markers_goes_at_the_end():
    assert report.between_markers("# Results\n", "<!-- b -->x<!-- e -->", "<!-- b -->", "<!-- e -->") == (
        "# Results\n\n<!-- b -->x<!-- e -->\n"
    )


def test_results_md_has_the_harness_markers_once():
    with open(f"{report.BENCHES}/RESULTS.md") as f:
        page = f.read()
    assert page.count(report.BEGIN) == 1 and page.count(report.END) == 1
    assert page.index(report.BEGIN) < page.index(report.END)


def test_picture_names():
    assert report.svg_name("1 keep-alive c70") == "load1.svg"
    assert report.svg_name("4 64KiB c10") == "load4-64kib-c10.svg"
    assert report.svg_name("11 gRPC unary h2c 10x10") == "load11.svg"


def test_numbers_as_the_tables_show_them():
    assert report.fmt(None) == "–"
    assert report.fmt(1234.56) == "1,234.6"
    assert report.fmt(3.5, " µs", 0) == "4 µs"
    assert report.med([{"x": 3}, {"x": None}, {"x": 1}, {"x": 2}], "x") == 2
    assert report.med([{"x": None}], "x") is None
