"""95% intervals of the `d3s` command's reports: the Wilson interval of an accuracy over problems, and the
Student t-interval of a mean over seeds.

`d3s train` reports its held-out accuracy with a Wilson interval (`d3s.app.evaluation.heldout`);
`d3s compare` its accuracies over seeds with t-intervals and the pooled answers with a Wilson interval.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence


def wilson_interval(correct: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (better than p +- 1.96 sd near 0 or 1)."""
    if n <= 0:
        return 0.0, 1.0
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         15: 2.131, 20: 2.086, 30: 2.042}


def t_quantile_975(df: int) -> float:
    """Student's t 97.5% quantile (two-sided 95%), from a table; conservative between its rows."""
    if df < 1:
        raise ValueError(f"df={df}; need at least 1 (two seeds)")
    return _T975[min((k for k in _T975 if k >= df), default=30)] if df <= 30 else 1.96


def mean_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """95% t-interval of the mean of `values` (None with fewer than two)."""
    if len(values) < 2:
        return None
    m, half = statistics.mean(values), t_quantile_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return m - half, m + half
