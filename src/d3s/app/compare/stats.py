"""The statistics of `d3s compare`, as pure functions: numbers in, numbers out (no files, no runs).

A comparison has a few seeds (4-8), each run paired with the same seed's reference run, so every variant
gives one paired difference per seed. What each number means, and why a t-interval from scipy and not a
bootstrap at this seed count (with the measured coverage): docs/compare.md, "Statistics".

A difference is "shown" (`shown`) only where two tests agree: its 95% t-interval excludes zero, and the exact
sign-flip test of its mean (`sign_flip_p_value`, no normality assumed), Holm-corrected over the arms of one
table (`holm`), gives p < 0.05. `leave_one_out` says how much the mean rests on one seed.

A budget curve is `[(compute_share, accuracy), ...]`, sorted by share: held-out accuracy against the compute
spent so far as a share of the same seed's reference run's whole compute (0 is the starting model, 1 the
reference's budget).
"""

from __future__ import annotations

import bisect
import math
from typing import Sequence

from d3s.app.intervals import FLAT, mean_interval, scipy_stats

Curve = Sequence[tuple[float, float]]  # [(compute_share, accuracy), ...], sorted by share

ALPHA = 0.05
"""The level of every test: a difference is shown where its Holm-corrected p-value is below it."""

SIGN_FLIP_MAX_SEEDS = 40
"""The most seeds `sign_flip_p_value` takes: it counts 2^n assignments through two halves of 2^(n/2) sums each
(about two seconds at 40 seeds); it refuses more."""


def paired_interval(diffs: Sequence[float]) -> tuple[float, float] | None:
    """95% t-interval of the mean paired difference (variant - reference, one per seed):
    mean(d) +- t_{0.975, n-1} * stdev(d) / sqrt(n), `scipy.stats.ttest_1samp(d, 0).confidence_interval()`.
    None for fewer than two seeds; (m, m) when every difference is the same (within 1e-12)."""
    return mean_interval(diffs)


def sign_flip_p_value(diffs: Sequence[float]) -> float | None:
    """The exact two-sided paired sign-flip (permutation) p-value of the mean of the paired differences `d`:

        p = #{s in {-1, +1}^n : |mean(s * d)| >= |mean(d)| - 1e-12} / 2^n

    Under the null hypothesis that variant and reference are exchangeable within each seed's pair, each
    difference is as likely to have either sign, so all 2^n sign assignments are equally likely; p is the share
    of them whose mean is at least as far from zero as the one observed (the observed assignment, and its
    mirror, included: p >= 2 / 2^n when any difference is non-zero, so 5 seeds can never give p < 0.0625). The
    1e-12 slack counts a tie in float noise as a tie. A difference of 0 flips to itself. 1.0 with one seed or
    every difference 0; None with no seed. Refuses more than `SIGN_FLIP_MAX_SEEDS` seeds.

    Counted exactly without listing the 2^n sums: each is a sum a over the first half's signs plus a sum b over
    the second half's, and for each a the b with |a + b| >= threshold are found by bisection in the sorted b."""
    n = len(diffs)
    if n == 0:
        return None
    if n > SIGN_FLIP_MAX_SEEDS:
        raise ValueError(f"{n} paired differences; the exact sign-flip test counts 2^n sign assignments and "
                         f"takes at most {SIGN_FLIP_MAX_SEEDS}")
    threshold = abs(math.fsum(diffs)) - n * FLAT  # |sum| >= threshold  <=>  |mean| >= |observed mean| - 1e-12
    if threshold <= 0:
        return 1.0
    firsts, seconds = _signed_sums(diffs[:n // 2]), sorted(_signed_sums(diffs[n // 2:]))
    hits = sum(len(seconds) - bisect.bisect_left(seconds, threshold - a)  # a + b >= threshold
               + bisect.bisect_right(seconds, -threshold - a)  # a + b <= -threshold
               for a in firsts)
    return hits / 2 ** n


def _signed_sums(values: Sequence[float]) -> list[float]:
    """The sum of every sign assignment of `values` (2^len of them; [0.0] for none)."""
    sums = [0.0]
    for d in values:
        sums = [x + d for x in sums] + [x - d for x in sums]
    return sums


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values, in the order given (None stays None and is not counted).

    With the m p-values sorted p_(1) <= ... <= p_(m), the adjusted p-value of the i-th is

        max_{j <= i} min(1, (m - j + 1) * p_(j))

    (step-down: the smallest is multiplied by m, the next by m - 1, ...; the running maximum keeps the order).
    A hypothesis whose adjusted p-value is below alpha is rejected by Holm's procedure at family-wise error rate
    alpha, for any dependence between the tests (Holm, 1979)."""
    known = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(known)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(known):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def leave_one_out(diffs: Sequence[float]) -> tuple[float, float] | None:
    """(min, max) of the mean paired difference over the n means that leave one seed out: how far one seed moves
    it. None with fewer than two seeds (with two: the two differences themselves)."""
    n = len(diffs)
    if n < 2:
        return None
    d = list(diffs)
    means = [math.fsum(d[:i] + d[i + 1:]) / (n - 1) for i in range(n)]
    return min(means), max(means)


def shown(ci: Sequence[float] | None, p_holm: float | None, alpha: float = ALPHA) -> bool:
    """Whether a paired difference is shown: its 95% interval excludes zero AND its Holm-corrected sign-flip
    p-value is below `alpha`. Everything else (no interval, no p-value, one test only) is "not shown"."""
    if ci is None or p_holm is None:
        return False
    return (ci[0] > 0 or ci[1] < 0) and p_holm < alpha


def paired_tests(diffs: dict[str, Sequence[float]]) -> dict[str, dict]:
    """For the arms of one table (`diffs`: each arm's paired differences against the reference, one per seed):
    `p_value` (`sign_flip_p_value`), `p_value_holm` (`holm` over the arms given) and `leave_one_out`."""
    p = {arm: sign_flip_p_value(d) for arm, d in diffs.items()}
    adjusted = dict(zip(p, holm(list(p.values()))))
    return {arm: {"p_value": p[arm], "p_value_holm": adjusted[arm],
                  "leave_one_out": list(loo) if (loo := leave_one_out(d)) else None}
            for arm, d in diffs.items()}


def minimum_detectable_difference(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """The smallest true mean paired difference that a two-sided paired t-test at level `alpha` detects with
    probability `power` from `n` seeds whose paired differences have standard deviation `sd`:

        MDD = (t_{1-alpha/2, n-1} + t_{power, n-1}) * sd / sqrt(n)

    the usual approximation of the noncentral t power (it ignores the far tail and takes the noncentral
    quantile as the central one shifted). Its exact power is a little under `power` at few seeds (0.784 at
    n = 4, 0.795 at 6, 0.798 at 8 for 0.8). None for fewer than two seeds."""
    _check_levels(alpha, power)
    if sd < 0:
        raise ValueError(f"sd={sd}; a standard deviation is >= 0")
    if n < 2:
        return None
    t, df = scipy_stats().t, n - 1
    return float((t.ppf(1 - alpha / 2, df) + t.ppf(power, df)) * sd / math.sqrt(n))


def seeds_needed(sd: float, difference: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """The fewest seeds n (>= 2) whose `minimum_detectable_difference(sd, n, alpha, power)` is <= `difference`.

    The search starts at the normal bound ((z_{1-alpha/2} + z_power) * sd / difference)^2, below which no n
    can do (t quantiles above one half exceed the normal ones), and counts up from there."""
    _check_levels(alpha, power)
    if difference <= 0:
        raise ValueError(f"difference={difference}; the difference to detect must be > 0")
    norm = scipy_stats().norm
    normal = (norm.ppf(1 - alpha / 2) + norm.ppf(power)) * sd / difference
    n = max(2, math.floor(normal * normal))
    while minimum_detectable_difference(sd, n, alpha, power) > difference:
        n += 1
    return n


def _check_levels(alpha: float, power: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha}; a test level is in (0, 1), e.g. 0.05")
    if not 0.5 <= power < 1:
        raise ValueError(f"power={power}; use a power in [0.5, 1), e.g. 0.8")


def probability_of_improvement(diffs: Sequence[float]) -> float | None:
    """Share of seeds where the variant beats the same seed's reference: mean over seeds of
    1[d > 0] + 1/2 * 1[|d| <= 1e-12] (a tie counts half). None with no seed.

    It is rliable's P(X > Y) restricted to the pairs the seeds make, not over all run pairs."""
    if not diffs:
        return None
    return sum(0.5 if abs(d) <= FLAT else float(d > 0) for d in diffs) / len(diffs)


def area_under_curve(points: Curve) -> float | None:
    """Mean accuracy over the budget: the trapezoid area under the curve over compute shares [0, 1] (an
    interval of length 1, so the area is the mean). The curve must start at share 0 (the starting model).

    A run that stopped short of share 1 keeps its last accuracy from there to 1 (flat); a run whose last
    step overshot 1 is cut at 1, its accuracy there interpolated linearly. None with fewer than two points."""
    if len(points) < 2:
        return None
    shares = [s for s, _ in points]
    if shares[0] != 0 or any(b < a for a, b in zip(shares, shares[1:])):
        raise ValueError(f"compute shares {shares}: a budget curve starts at 0 and does not go back")
    area = 0.0
    for (s0, a0), (s1, a1) in zip(points, points[1:]):
        if s0 >= 1:
            break
        if s1 > 1:  # the step that crossed the budget: keep its part up to 1
            a1 = a0 + (a1 - a0) * (1 - s0) / (s1 - s0)
            s1 = 1.0
        area += (s1 - s0) * (a0 + a1) / 2
    last_share, last_accuracy = points[-1]
    if last_share < 1:
        area += (1 - last_share) * last_accuracy
    return area


def reached_and_held(points: Curve, target: float) -> float | None:
    """The smallest compute share s > 0 of the curve from which on the accuracy stays at or above `target`
    (1e-12 slack): at s and at every later point. A passing touch does not count. None if the last point is
    below the target or the curve has no point past share 0.

    Every point given counts, a point past share 1 too: cut the curve at the budget first to ask within it."""
    held = None
    for share, accuracy in reversed(points):
        if accuracy < target - FLAT:
            break
        if share > 0:
            held = share
    return held
