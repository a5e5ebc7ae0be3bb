"""pass@k / Avg@n aggregation on hand-built result sets, checked against brute force."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from d3s.app.evaluation.aggregate import average_metrics, benchmark_metrics


def brute_pass_at_k(outcomes: list[bool], k: int) -> Fraction:
    """Share of k-subsets of the samples holding at least one correct one."""
    subsets = list(itertools.combinations(outcomes, k))
    return Fraction(sum(any(s) for s in subsets), len(subsets))


def test_hand_computed_values():
    # n = 4 samples; problems with 0, 1 and 4 correct.
    m = benchmark_metrics([0, 1, 4], n=4, ks=[1, 2, 4])
    assert m["pass@1"] == pytest.approx((0 + 0.25 + 1) / 3)
    # c = 1: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert m["pass@2"] == pytest.approx((0 + 0.5 + 1) / 3)
    assert m["pass@4"] == pytest.approx(2 / 3)
    assert m["avg@4"] == pytest.approx((0 + 0.25 + 1) / 3)


def test_matches_subset_enumeration():
    n = 6
    counts = [0, 1, 2, 3, 5, 6, 2]
    m = benchmark_metrics(counts, n=n, ks=[1, 2, 3, 6])
    for k in (1, 2, 3, 6):
        expected = sum(
            brute_pass_at_k([True] * c + [False] * (n - c), k) for c in counts
        ) / len(counts)
        assert m[f"pass@{k}"] == pytest.approx(float(expected), abs=1e-12)
    assert m["avg@6"] == pytest.approx(sum(counts) / (n * len(counts)))


def test_pass_at_1_equals_avg_and_pass_at_k_grows_with_k():
    m = benchmark_metrics([3, 0, 7, 8], n=8, ks=[1, 2, 4, 8])
    assert m["pass@1"] == pytest.approx(m["avg@8"])
    values = [m[f"pass@{k}"] for k in (1, 2, 4, 8)]
    assert values == sorted(values)
    assert m["pass@8"] == pytest.approx(3 / 4)  # 3 problems with any correct sample


def test_average_is_unweighted_over_benchmarks():
    # The paper's Table 1, Qwen2.5-Math-7B base, pass@1: mean of the seven columns = 14.9.
    row = [8.9, 2.3, 22.8, 30.1, 27.9, 8.4, 4.1]
    per = {f"b{i}": {"pass@1": v / 100} for i, v in enumerate(row)}
    assert round(100 * average_metrics(per)["pass@1"], 1) == 14.9
    # A big benchmark does not outweigh a small one.
    per = {
        "small": benchmark_metrics([4], n=4, ks=[1]),
        "big": benchmark_metrics([0] * 99, n=4, ks=[1]),
    }
    assert average_metrics(per)["pass@1"] == pytest.approx(0.5)


def test_bad_input():
    with pytest.raises(ValueError, match=r"k=\[8\] out of range"):
        benchmark_metrics([1, 2], n=4, ks=[1, 8])
    with pytest.raises(ValueError, match="no problems"):
        benchmark_metrics([], n=4, ks=[1])
    with pytest.raises(ValueError):
        benchmark_metrics([5], n=4, ks=[1])  # c > n
