import pytest

from qproxy_tools.bench import stats


def test_nearest_rank_percentiles():
    values = [float(v) for v in range(1, 101)]
    assert stats.percentile(values, 0.5) == 50
    assert stats.percentile(values, 0.99) == 99
    assert stats.percentile([7.0], 0.99) == 7.0
    assert stats.percentile([], 0.5) is None


def test_a_median_of_nothing_is_none():
    assert stats.median([]) is None
    assert stats.median([3, 1, 2]) == 2
    assert stats.median([1, 2, 3, 4]) == pytest.approx(2.5)


def test_a_median_of_rounds_leaves_out_those_without_the_key():
    assert stats.med([{"x": 3}, {"x": None}, {"x": 1}, {"x": 2}], "x") == 2
    assert stats.med([{"x": None}, {"y": 1}], "x") is None
    assert stats.med([], "x") is None


def test_the_90th_percentile_by_rounded_index():
    assert stats.p90([]) is None
    assert stats.p90([5.0]) == 5.0
    # Ten values: index round(0.9 * 9) = 8, the ninth.
    assert stats.p90([float(v) for v in range(10, 0, -1)]) == 9.0
    assert stats.p90([float(v) for v in range(1, 21)]) == 18.0
