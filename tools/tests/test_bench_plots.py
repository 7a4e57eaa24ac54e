from types import SimpleNamespace
from unittest import mock

import pytest

from qproxy_tools.bench import plots


@pytest.fixture
def plt(monkeypatch):
    """A stand-in for pyplot: every figure and axis records its calls."""
    fake = mock.MagicMock()

    def subplots(*shape, **kwargs):
        count = shape[1] if len(shape) > 1 else 1
        axes = [mock.MagicMock(name=f"ax{i}") for i in range(count)]
        fake.axes = axes
        return mock.MagicMock(name="figure"), axes if count > 1 else axes[0]

    fake.subplots.side_effect = subplots
    fake.get_cmap.return_value.colors = ["c0", "c1", "c2"]
    monkeypatch.setattr(plots.plotting, "pyplot", lambda: fake)
    return fake


def saved(plt):
    return [c.args[0] for c in plt.close.call_args_list[0].args[0].savefig.call_args_list]


def test_a_loads_picture_has_each_contenders_medians_per_variant(plt, tmp_path):
    args = SimpleNamespace(contenders=["direct", "qproxy", "nginx"], variants=["pinned", "unpinned"])
    load = "1 keep-alive c70"
    throughput = {
        ("pinned", load, "qproxy"): [{"rps": 10.0, "cpu_us": 4.0}, {"rps": 30.0, "cpu_us": 2.0}],
        ("unpinned", load, "qproxy"): [{"rps": 40.0, "cpu_us": 1.0}],
        ("pinned", load, "nginx"): [{"rps": 5.0, "cpu_us": 9.0}],
    }
    plots.load_picture(args, throughput, load, str(tmp_path / "load1.svg"))
    rps, cpu = plt.axes
    heights = {c.kwargs["label"]: c.args[1] for c in rps.bar.call_args_list}
    # direct has no rounds: no bar; a variant without rounds is 0.
    assert heights == {"qproxy": [20.0, 40.0], "nginx": [5.0, 0]}
    assert {c.kwargs["label"]: c.args[1] for c in cpu.bar.call_args_list}["qproxy"] == [3.0, 1.0]
    assert saved(plt) == [str(tmp_path / "load1.svg")]


def test_no_instructions_picture_without_load_1(plt, tmp_path):
    assert plots.instructions_picture({"nginx": {}}, str(tmp_path / "i.svg")) is False
    assert not plt.subplots.called


def test_the_instructions_picture_stacks_qproxys_parts(plt, tmp_path):
    instructions = {
        "qproxy": {"load 1": 30000, "load 1 parts": {"other": 1000}},
        "nginx": {"load 1": 20000},
    }
    assert plots.instructions_picture(instructions, str(tmp_path / "i.svg")) is True
    ax = plt.axes[0]
    widths = [c.args[1] for c in ax.barh.call_args_list]
    assert widths[-1] == 20000 and 1000 in widths
    ax.axvline.assert_called_once()
    assert saved(plt) == [str(tmp_path / "i.svg")]


def test_the_adaptive_picture_draws_the_closed_goodput_and_the_first_trace(plt, tmp_path):
    def rounds(goodput, trace=None):
        return [{"goodput": goodput, "trace": trace}]

    results = {
        "closed": {64: {"direct": rounds(1.0), "qproxy": rounds(2.0), "qproxy-adaptive": rounds(3.0, [(0.1, 9)])}},
        "open": {},
        "capacity": {},
    }
    plots.adaptive_picture(SimpleNamespace(rates=(0.5,)), results, str(tmp_path / "adaptive.svg"))
    closed, limit = plt.axes
    assert [c.args[1] for c in closed.bar.call_args_list] == [[1.0], [2.0], [3.0]]
    limit.plot.assert_called_once()
    assert limit.plot.call_args.args[:2] == ([0.1], [9])
    assert saved(plt) == [str(tmp_path / "adaptive.svg")]


def test_the_cluster_pictures_are_throughput_and_cold_starts(plt, tmp_path):
    rounds = [
        {"image": i, "path": p, "rps": 1.0, "p90": 0.001, "cpu_us_qp": 1.0, "cpu_us_app": 2.0}
        for i in ("go", "qproxy")
        for p in ("app", "qp", "activator")
    ]
    tries = [{"image": "go", "seconds": 1.5}, {"image": "qproxy", "seconds": None}]
    plots.cluster_pictures(str(tmp_path), rounds, tries)
    figures = [c.args[0] for c in plt.close.call_args_list]
    paths = [c.args[0] for f in figures for c in f.savefig.call_args_list]
    assert paths == [str(tmp_path / "throughput.svg"), str(tmp_path / "coldstart.svg")]
    # A try without a first byte is not in the box plot.
    assert plt.axes[0].boxplot.call_args.args[0] == [[1.5], []]
