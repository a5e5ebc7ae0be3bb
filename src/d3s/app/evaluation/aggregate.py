"""pass@k and Avg@n over problems and benchmarks (paper sec. 4.1, docs/method.md section 8).

Per benchmark: pass@k is the mean over problems of the unbiased per-problem estimator
`d3s.metrics.pass_at_k(n, c, k)`; Avg@n the mean over problems of c / n. The "Average" column of
Table 1 is the unweighted mean over benchmarks (check: Qwen2.5-Math-7B base pass@1,
(8.9 + 2.3 + 22.8 + 30.1 + 27.9 + 8.4 + 4.1) / 7 = 14.9, as printed).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from d3s.metrics import avg_at_n, pass_at_k


def benchmark_metrics(
    n_correct: Sequence[int], n: int, ks: Sequence[int]
) -> dict[str, float]:
    """`{"pass@k": ..., "avg@n": ...}` (fractions in [0, 1]) for one benchmark.

    Args:
        n_correct: `(P,)` correct samples per problem, each in [0, n].
        n: samples per problem.
        ks: the k values; each must be in [1, n].
    """
    if not n_correct:
        raise ValueError("no problems to aggregate")
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ValueError(f"k={bad} out of range: every k must be in [1, n={n}]")
    num = len(n_correct)
    out = {f"pass@{k}": sum(pass_at_k(n, c, k) for c in n_correct) / num for k in ks}
    out[f"avg@{n}"] = sum(avg_at_n(c, n) for c in n_correct) / num
    return out


def average_metrics(per_benchmark: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Unweighted mean over benchmarks of every metric they all report."""
    if not per_benchmark:
        return {}
    tables = list(per_benchmark.values())
    common = [m for m in tables[0] if all(m in t for t in tables)]
    return {m: sum(t[m] for t in tables) / len(tables) for m in common}
