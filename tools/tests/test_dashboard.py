import json
import re

from qproxy_tools.dashboard import panels, results


def test_the_committed_dashboard_is_its_panels_json():
    with open(panels.FILE) as f:
        assert f.read() == panels.text()


def selectors(expr):
    return re.findall(r"([a-z_:]+)\{([^}]*)\}", expr)


def test_every_selector_picks_the_revision_by_its_target_labels():
    for panel in panels.panels():
        for target in panel.targets:
            found = [(family, labels) for family, labels in selectors(target.expr) if family != "label_replace"]
            assert found, target.expr
            for family, labels in found:
                assert labels.startswith(panels.SELECTOR), (panel.title, family)


def test_knative_panels_read_both_generations_and_qproxys_only_its_own():
    for panel in panels.panels():
        for target in panel.targets:
            families = {family for family, _ in selectors(target.expr)}
            if panel.source == "qproxy":
                assert all(f.startswith("qproxy_") for f in families), panel.title
            else:
                assert any(f.startswith("revision_") for f in families), panel.title
                assert any(f.startswith(("http_server_", "kn_serving_")) for f in families), panel.title


def test_the_classic_latencies_are_turned_into_seconds():
    for panel in panels.panels():
        for target in panel.targets:
            if "revision_request_latencies" in target.expr or "revision_app_request_latencies" in target.expr:
                classic = target.expr.split(" or ")[0]
                assert classic.endswith("/ 1000)"), target.expr


def test_the_grafana_model():
    model = json.loads(panels.text())
    assert model["uid"] == "qproxy-revision"
    names = [v["name"] for v in model["templating"]["list"]]
    assert names == ["datasource", "namespace", "revision"]
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in model["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, p["title"]
                cells.add((x, y))
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}"
            assert [t["refId"] for t in p["targets"]] == [chr(ord("A") + i) for i in range(len(p["targets"]))]
    titles = [p["title"] for p in model["panels"] if p["type"] != "row"]
    assert titles == [p.title for p in panels.panels()]
    assert len(titles) == len(set(titles))


def test_the_full_queue_panel_counts_no_503_of_the_app():
    (panel,) = [p for p in panels.panels() if p.title == "503s from a full queue, per second"]
    expr = panel.targets[0].expr
    # A revision whose app never answers 503 still has a figure: its
    # queue-proxy's 503s less nothing.
    assert "or sum(rate(revision_request_count" in expr
    assert 'response_code="503"' in expr and 'http_response_status_code="503"' in expr


def record(queue_image, series_by_panel, start=100.0, end=130.0):
    """A results.json of one run, with one role."""
    out = []
    for (title, kind, source, legend), series in series_by_panel.items():
        out.append(
            {
                "panel": title,
                "kind": kind,
                "source": source,
                "ref_id": "A",
                "legend": legend,
                "expr": "",
                "series": series,
            }
        )
    return {
        "queue_image": queue_image,
        "scrape_interval": 5,
        "rate_interval": "20s",
        "loads": {"queue": {"start": start, "end": end}},
        "results": {"queue": out},
    }


RPS = ("Requests per second, by status code", "timeseries", "knative", "{{code}}")
COUNT = ("Requests in the range, by status code", "stat", "knative", "{{code}}")
WAIT = ("Time in the queue", "timeseries", "qproxy", "p99")


def rps(code, value, start=100.0):
    return {"metric": {"code": code}, "values": [[start + t, value] for t in range(0, 35, 5)]}


def test_a_figure_is_the_mean_while_the_load_ran_after_the_first_window():
    rec = record("go", {RPS: [{"metric": {"code": "200"}, "values": [[90, 100], [125, 4], [130, 6], [140, 100]]}]})
    assert results.figures(rec) == {("queue", RPS[0], "200"): 5.0}


def test_pods_are_left_out_of_a_series_name_and_the_highest_kept():
    assert results.name("{{pod}} ready", {"pod": "x-1"}) == "ready"
    assert results.name("{{pod}}", {"pod": "x-1"}) == ""
    assert results.name("{{code}}", {"code": "503"}) == "503"


def test_knatives_panels_agree_within_the_noise():
    go = record(
        "go", {RPS: [rps("200", 5.0), rps("503", 15.0)], COUNT: [{"metric": {"code": "503"}, "values": [[1, 440]]}]}
    )
    qp = record(
        "qproxy",
        {
            RPS: [rps("200", 5.2), rps("503", 14.0)],
            COUNT: [{"metric": {"code": "503"}, "values": [[1, 452]]}],
            WAIT: [{"metric": {}, "values": [[125, 2.0]]}],
        },
    )
    lines, ok = results.compare(go, qp)
    assert ok, lines
    assert any("qproxy's own" in line for line in lines)


def test_a_knative_panel_that_differs_fails():
    go = record("go", {RPS: [rps("503", 15.0)]})
    qp = record("qproxy", {RPS: [rps("503", 5.0)]})
    lines, ok = results.compare(go, qp)
    assert not ok
    assert any("**differ**" in line for line in lines)


def test_a_series_only_one_run_has_fails_unless_it_is_small():
    go = record("go", {RPS: [rps("200", 5.0)]})
    small = record("qproxy", {RPS: [rps("200", 5.0), rps("500", 0.5)]})
    large = record("qproxy", {RPS: [rps("200", 5.0), rps("500", 9.0)]})
    assert results.compare(go, small)[1]
    assert not results.compare(go, large)[1]


def test_qproxys_series_from_knatives_queue_proxy_fail():
    go = record("go", {WAIT: [{"metric": {}, "values": [[125, 2.0]]}]})
    qp = record("qproxy", {WAIT: [{"metric": {}, "values": [[125, 2.0]]}]})
    lines, ok = results.compare(go, qp)
    assert not ok
    assert any("served by Knative's queue-proxy" in line for line in lines)


def test_a_quantile_of_no_requests_is_no_figure():
    rec = record("go", {RPS: [{"metric": {"code": "200"}, "values": [[125, None], [130, 6]]}]})
    assert results.figures(rec) == {("queue", RPS[0], "200"): 6.0}
