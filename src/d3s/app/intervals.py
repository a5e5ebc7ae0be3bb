"""95% intervals of the `d3s` command's reports, from scipy.stats: the Wilson interval of an accuracy over
problems, and the Student t-interval of a mean over seeds.

`d3s train` reports its held-out accuracy with a Wilson interval (`d3s.app.evaluation.heldout`);
`d3s compare` its accuracies over seeds with t-intervals and the pooled answers with a Wilson interval.
Why a t-interval and not a bootstrap at 4-8 seeds: docs/compare.md, "Statistics". scipy is imported when a
number is computed, not with the module: it would add about half a second to `d3s --help`.
"""

from __future__ import annotations

import statistics
from typing import Sequence

CONFIDENCE = 0.95
FLAT = 1e-12  # values that differ by no more than this are one value (float noise of k/n - k'/n)


def scipy_stats():
    """`scipy.stats`, with an install hint when scipy is missing."""
    try:
        from scipy import stats
    except ImportError as err:
        raise ImportError("d3s's intervals need scipy: pip install 'd3s[train]'") from err
    return stats


def wilson_interval(correct: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of the proportion `correct / n` (better than p +- 1.96 sd near 0 or 1):
    `scipy.stats.binomtest(correct, n).proportion_ci(method="wilson")`. (0, 1) when there is nothing (n <= 0)."""
    if n <= 0:
        return 0.0, 1.0
    ci = scipy_stats().binomtest(correct, n).proportion_ci(confidence_level=CONFIDENCE, method="wilson")
    return float(ci.low), float(ci.high)


def mean_interval(values: Sequence[float],
                  bounds: tuple[float, float] | None = None) -> tuple[float, float] | None:
    """95% t-interval of the mean of `values`: mean +- t_{0.975, n-1} * stdev / sqrt(n) (stdev with n - 1),
    `scipy.stats.ttest_1samp(values, 0).confidence_interval()`. None with fewer than two values; (m, m) when
    they are all equal (within 1e-12), where scipy would warn and return nan.

    `bounds` (low, high): the range the mean cannot leave (an accuracy's (0, 1)); the interval is cut to it, as
    at 2 seeds t_{0.975, 1} = 12.7 can stretch it far past (an interval of an accuracy reaching -25.9%)."""
    if len(values) < 2:
        return None
    if max(values) - min(values) <= FLAT:
        m = statistics.fmean(values)
        return m, m
    ci = scipy_stats().ttest_1samp(values, 0.0).confidence_interval(confidence_level=CONFIDENCE)
    low, high = float(ci.low), float(ci.high)
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return low, high
