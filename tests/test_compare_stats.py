"""`d3s compare`'s statistics against independent references: the t-interval by hand, the minimum detectable
difference against a Monte-Carlo power simulation and the exact noncentral t power, the area under a budget
curve against numpy's trapezoid on a refined grid, reached-and-held on hand-made curves, the sign-flip p-value
against a plain loop over the sign assignments and scipy's permutation test, Holm against a hand computation
and the closed test of Bonferroni tests it is, leave-one-out against its definition."""

import itertools
import math
import statistics
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from d3s.app.compare.stats import (
    area_under_curve,
    holm,
    leave_one_out,
    minimum_detectable_difference,
    paired_interval,
    paired_tests,
    probability_of_improvement,
    reached_and_held,
    seeds_needed,
    shown,
    sign_flip_p_value,
)


def test_paired_interval_by_hand():
    diffs = [0.05, 0.0, 0.10, -0.02, 0.035]
    m, sd, n = statistics.mean(diffs), statistics.stdev(diffs), len(diffs)
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    assert paired_interval(diffs) == pytest.approx((m - half, m + half), rel=1e-12)
    assert paired_interval([0.03]) is None and paired_interval([]) is None
    assert paired_interval([0.02, 0.02, 0.02]) == (0.02, 0.02)  # zero variance: the interval is the mean


def _rejection_rate(delta: float, sd: float, n: int, alpha: float, trials: int, rng) -> float:
    """Share of simulated seed sets (differences ~ N(delta, sd)) where a two-sided paired t-test rejects 0."""
    d = rng.normal(delta, sd, size=(trials, n))  # (trials, n)
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))  # (trials,)
    return float(np.mean(np.abs(t) > stats.t.ppf(1 - alpha / 2, n - 1)))


def _exact_power(delta: float, sd: float, n: int, alpha: float) -> float:
    """Power of the two-sided paired t-test from the noncentral t distribution."""
    crit, nc = stats.t.ppf(1 - alpha / 2, n - 1), delta * math.sqrt(n) / sd
    return float(stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc))


@pytest.mark.parametrize("n", [4, 6, 8])
def test_minimum_detectable_difference_has_its_power(n):
    sd, alpha, power = 0.08, 0.05, 0.8
    mdd = minimum_detectable_difference(sd, n, alpha, power)
    assert mdd == pytest.approx((stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * sd / math.sqrt(n))
    simulated = _rejection_rate(mdd, sd, n, alpha, 40_000, np.random.default_rng(n))
    exact = _exact_power(mdd, sd, n, alpha)
    assert simulated == pytest.approx(exact, abs=0.008)  # 4 standard errors of 40,000 trials
    assert power - 0.02 < exact <= power  # the approximation gives a little less than the power asked for


def test_minimum_detectable_difference_edges():
    assert minimum_detectable_difference(0.08, 1) is None
    assert minimum_detectable_difference(0.0, 5) == 0.0
    assert minimum_detectable_difference(0.16, 5) == pytest.approx(2 * minimum_detectable_difference(0.08, 5))
    with pytest.raises(ValueError, match="power=0.3"):
        minimum_detectable_difference(0.08, 5, power=0.3)
    with pytest.raises(ValueError, match="alpha=0"):
        minimum_detectable_difference(0.08, 5, alpha=0)


@pytest.mark.parametrize("sd, difference", [(0.08, 0.05), (0.08, 0.2), (0.05, 0.01), (0.0, 0.01), (0.1, 0.003)])
def test_seeds_needed_is_the_first_n_that_detects(sd, difference):
    n = seeds_needed(sd, difference)
    assert minimum_detectable_difference(sd, n) <= difference
    assert n == 2 or minimum_detectable_difference(sd, n - 1) > difference
    if n < 200:  # a plain count from 2
        assert n == next(k for k in range(2, 200) if minimum_detectable_difference(sd, k) <= difference)


def test_probability_of_improvement_counts_ties_half():
    assert probability_of_improvement([0.05, -0.01, 0.0, 0.02]) == pytest.approx(2.5 / 4)
    assert probability_of_improvement([0.65 - 0.6, 0.7 - 0.65 - 0.05]) == 0.75  # float noise is a tie
    assert probability_of_improvement([-0.1, -0.2]) == 0.0
    assert probability_of_improvement([]) is None


def _refined_area(points, up_to: float = 1.0) -> float:
    """numpy's trapezoid on a 20,001-point grid over [0, 1] of the curve interpolated linearly, flat past its
    last point (np.interp holds the end value): the definition, computed another way."""
    grid = np.linspace(0.0, up_to, 20_001)
    shares, accs = zip(*points)
    return float(np.trapezoid(np.interp(grid, shares, accs), grid))


@pytest.mark.parametrize("points", [
    [(0.0, 0.4), (0.25, 0.5), (0.5, 0.55), (0.75, 0.6), (1.0, 0.62)],  # ends at the budget
    [(0.0, 0.4), (0.3, 0.6), (0.6, 0.5)],  # stopped short: flat from 0.6
    [(0.0, 0.4), (0.5, 0.5), (0.9, 0.7), (1.2, 0.4)],  # overshot: cut at 1, interpolated there
    [(0.0, 0.4), (0.2, 0.6), (0.2, 0.6), (1.0, 0.5)],  # a step that computed nothing
])
def test_area_under_curve_against_a_refined_trapezoid(points):
    assert area_under_curve(points) == pytest.approx(_refined_area(points), abs=1e-9)


def test_area_under_curve_edges():
    assert area_under_curve([(0.0, 0.4), (1.0, 0.6)]) == pytest.approx(0.5)
    assert area_under_curve([(0.0, 0.7), (1.0, 0.7)]) == pytest.approx(0.7)  # a flat curve: its accuracy
    assert area_under_curve([(0.0, 0.4)]) is None
    with pytest.raises(ValueError, match="starts at 0"):
        area_under_curve([(0.1, 0.4), (1.0, 0.6)])
    with pytest.raises(ValueError, match="does not go back"):
        area_under_curve([(0.0, 0.4), (0.6, 0.5), (0.5, 0.6)])


def test_reached_and_held_ignores_a_transient_touch():
    curve = [(0.0, 0.40), (0.2, 0.61), (0.4, 0.55), (0.6, 0.60), (0.8, 0.65), (1.0, 0.62)]
    assert reached_and_held(curve, 0.60) == 0.6  # 0.2 touched 0.60, then fell back
    assert reached_and_held(curve, 0.62) == 0.8
    assert reached_and_held(curve, 0.63) is None  # above at 0.8, below at the end
    assert reached_and_held(curve, 0.6 + 1e-13) == 0.6  # within the slack


def test_reached_and_held_from_the_start_counts_the_first_step():
    curve = [(0.0, 0.70), (0.25, 0.72), (0.5, 0.71)]
    assert reached_and_held(curve, 0.6) == 0.25  # share 0 is the starting model, not a point reached
    assert reached_and_held([(0.0, 0.7)], 0.6) is None
    assert reached_and_held([], 0.6) is None


# --- the sign-flip test, Holm, leave-one-out, "shown" ----------------------------------------------------------


def _sign_flip_by_loop(diffs) -> float:
    """The definition, as a plain loop over the 2^n sign assignments."""
    n = len(diffs)
    observed = abs(sum(diffs) / n)
    hits = sum(abs(sum(s * d for s, d in zip(signs, diffs)) / n) >= observed - 1e-12
               for signs in itertools.product((1, -1), repeat=n))
    return hits / 2 ** n


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 11, 14])
def test_sign_flip_p_value_against_a_plain_loop_and_scipy(n):
    rng = np.random.default_rng(n)
    for _ in range(5):
        diffs = list(rng.normal(0.02, 0.05, size=n))
        p = sign_flip_p_value(diffs)
        assert p == pytest.approx(_sign_flip_by_loop(diffs), abs=1e-15)
        if n == 1:
            continue  # scipy's test takes two or more
        exact = stats.permutation_test((diffs,), np.mean, permutation_type="samples", n_resamples=np.inf,
                                       alternative="two-sided").pvalue
        assert p == pytest.approx(exact, abs=1e-12)


def test_sign_flip_p_value_on_accuracy_differences_with_ties():
    # accuracies are k/200: differences repeat and sums tie, in float noise too
    diffs = [0.61 - 0.6, 0.6 - 0.61, 0.63 - 0.6, 0.0, 0.57 - 0.6, 0.62 - 0.61]
    assert sign_flip_p_value(diffs) == _sign_flip_by_loop(diffs)
    grid = [k / 200 - 0.6 for k in (121, 125, 118, 120, 126, 123, 119)]
    assert sign_flip_p_value(grid) == _sign_flip_by_loop(grid)


@pytest.mark.parametrize("n", [1, 2, 4, 5, 6, 8, 12])
def test_sign_flip_p_value_closed_forms(n):
    # every difference positive: only the observed assignment and its mirror are as far from zero
    assert sign_flip_p_value([0.01 * (i + 1) for i in range(n)]) == min(1.0, 2 / 2 ** n)
    assert sign_flip_p_value([-0.03] * n) == min(1.0, 2 / 2 ** n)
    assert sign_flip_p_value([0.0] * n) == 1.0  # nothing to flip
    # one zero among positive differences: it flips to itself, so two assignments of the 2^n give each extreme
    if n >= 2:
        assert sign_flip_p_value([0.0] + [0.02] * (n - 1)) == 4 / 2 ** n


def test_sign_flip_p_value_edges():
    assert sign_flip_p_value([]) is None
    assert sign_flip_p_value([0.05]) == 1.0  # one seed: +d and -d are equally far from zero
    assert sign_flip_p_value([0.05, -0.05]) == 1.0  # mean 0: every assignment is as far from zero
    assert 0 < sign_flip_p_value([0.01] * 20) == 2 / 2 ** 20
    assert sign_flip_p_value([0.01] * 30) == 2 / 2 ** 30
    with pytest.raises(ValueError, match="41 paired differences"):
        sign_flip_p_value([0.01] * 41)


def _holm_by_closed_testing(p_values):
    """Holm's adjusted p-values as the closed test of Bonferroni tests: the adjusted p of hypothesis i is the
    largest, over every subset S of the hypotheses that holds i, of min(1, |S| * min_{j in S} p_j)."""
    m = len(p_values)
    return [max(min(1.0, len(S) * min(p_values[j] for j in S))
                for k in range(1, m + 1) for S in itertools.combinations(range(m), k) if i in S)
            for i in range(m)]


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04: x4 = 0.02, x3 = 0.03, x2 = 0.06, x1 = 0.04 -> kept at 0.06 (monotone)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.4]) == [0.8, 0.8]
    assert holm([0.6, 0.7, 0.9]) == [1.0, 1.0, 1.0]  # capped at 1
    assert holm([0.02]) == [0.02]  # a family of one is the p-value itself
    assert holm([]) == []
    assert holm([None, 0.01, None, 0.04]) == [None, 0.02, None, 0.04]  # None is passed through, not counted


def test_holm_against_closed_testing_of_bonferroni_tests():
    rng = np.random.default_rng(0)
    for m in (1, 2, 3, 4, 6):
        for _ in range(20):
            p = list(rng.uniform(0, 0.2, size=m) ** 2)
            assert holm(p) == pytest.approx(_holm_by_closed_testing(p), abs=1e-15)
    p = [0.01, 0.01, 0.02, 0.02]  # ties
    assert holm(p) == pytest.approx(_holm_by_closed_testing(p))


def test_leave_one_out_against_its_definition():
    diffs = [0.05, 0.0, 0.10, -0.02, 0.035]
    means = [statistics.mean(diffs[:i] + diffs[i + 1:]) for i in range(len(diffs))]
    assert leave_one_out(diffs) == pytest.approx((min(means), max(means)))
    assert leave_one_out([0.03, -0.01]) == (-0.01, 0.03)  # two seeds: each left alone
    assert leave_one_out([0.03]) is None and leave_one_out([]) is None


def test_shown_needs_both_the_interval_and_the_corrected_test():
    assert shown([0.01, 0.19], 0.02) and shown([-0.2, -0.01], 0.049)
    assert not shown([0.01, 0.19], 0.07)  # the interval excludes zero, the corrected test does not agree
    assert not shown([-0.05, 0.05], 0.001)  # the interval includes zero
    assert not shown([0.0, 0.1], 0.01)  # zero on its edge counts as included
    assert not shown(None, 0.01) and not shown([0.01, 0.19], None)


def test_paired_tests_correct_over_the_arms_of_one_table():
    up, mixed = [0.05, 0.06, 0.04, 0.07, 0.05, 0.03], [0.05, -0.02, 0.01, 0.03, -0.01, 0.02]
    out = paired_tests({"up": up, "mixed": mixed, "one": [0.1]})
    assert out["up"]["p_value"] == 2 / 64 and out["one"]["p_value"] == 1.0
    raw = [out[a]["p_value"] for a in ("up", "mixed", "one")]
    assert [out[a]["p_value_holm"] for a in ("up", "mixed", "one")] == holm(raw)
    assert out["up"]["p_value_holm"] == 3 * 2 / 64  # the smallest of three, times three
    assert out["up"]["leave_one_out"] == pytest.approx(list(leave_one_out(up)))
    assert out["one"]["leave_one_out"] is None


def test_the_tests_need_no_statsmodels():
    code = ("import sys; from d3s.app.compare import stats; stats.holm([0.01, 0.2]); "
            "stats.sign_flip_p_value([0.1, 0.2]); print('statsmodels' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
