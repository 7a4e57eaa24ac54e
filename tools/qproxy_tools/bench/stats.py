"""The statistics the benchmarks report: medians of rounds, and
percentiles of latencies."""

import statistics


def median(values):
    """The median of `values`, None if there are none."""
    return statistics.median(values) if values else None


def med(rounds, key):
    """The median of `key` over the rounds that have it (not None)."""
    return median([r[key] for r in rounds if r.get(key) is not None])


def percentile(ordered, q):
    """The `q` quantile of an ordered list (nearest rank), None if empty."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def p90(values):
    """The 90th percentile of `values` (any order): the value nine tenths
    of the way from the least to the greatest, by rounded index; None if
    there are none."""
    values = sorted(values)
    return values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))] if values else None
