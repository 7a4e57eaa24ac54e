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


def test_results_md_has_the_harness_markers_once():
    with open(report.RESULTS) as f:
        page = f.read()
    assert page.count(report.BEGIN) == 1 and page.count(report.END) == 1
    assert page.index(report.BEGIN) < page.index(report.END)


def test_picture_names():
    assert report.svg_name("1 keep-alive c70") == "load1.svg"
    assert report.svg_name("4 64KiB c10") == "load4-64kib-c10.svg"
    assert report.svg_name("11 gRPC unary h2c 10x10") == "load11.svg"


def test_picture_links_name_load_4_by_its_size():
    assert report.picture_link("1 keep-alive c70") == "[1](load1.svg)"
    assert report.picture_link("4 1MiB c10") == "[4 1MiB](load4-1mib-c10.svg)"


def test_write_puts_the_tables_in_side_by_side_and_the_section_between_the_markers(tmp_path, monkeypatch):
    results = tmp_path / "RESULTS.md"
    results.write_text(f"# Results\n\n{report.BEGIN}\nold\n{report.END}\n\n## Other\n")
    monkeypatch.setattr(report, "BENCHES", str(tmp_path))
    monkeypatch.setattr(report, "RESULTS", str(results))
    args = run_args()
    report.write(args, "benches/harness.py --rounds 1 ", "today", "THE TABLES", throughput(), ["[1](load1.svg)"])
    page = (tmp_path / "side-by-side.md").read_text()
    assert page.startswith("# Side by side (`benches/harness.py`): every table of the run\n\n")
    assert "today: `benches/harness.py --rounds 1`, 1 rounds of 5 s, medians." in page
    assert "every contender: [1](load1.svg)." in page and page.endswith("THE TABLES\n")
    text = results.read_text()
    assert "old" not in text and text.endswith(f"{report.END}\n\n## Other\n")
    assert "| 1 keep-alive c70 | 22,225 / 38,883 | 43.6 / 42.6 | 41.7 / 41.8 |" in text
