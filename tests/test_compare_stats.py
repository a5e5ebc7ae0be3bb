"""`d3s compare`'s statistics against independent references: the t-interval by hand, the minimum detectable
difference against a Monte-Carlo power simulation and the exact noncentral t power, the area under a budget
curve against numpy's trapezoid on a refined grid, reached-and-held on hand-made curves."""

import math
import statistics

import numpy as np
import pytest
from scipy import stats

from d3s.app.compare.stats import (
    area_under_curve,
    minimum_detectable_difference,
    paired_interval,
    probability_of_improvement,
    reached_and_held,
    seeds_needed,
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
