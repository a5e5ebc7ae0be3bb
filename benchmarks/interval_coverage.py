"""How often does a 95% interval of a mean over a few paired seeds contain the true mean? The t-interval that
`d3s compare` reports (scipy.stats.ttest_1samp) against scipy.stats.bootstrap (BCa and percentile), on
simulated normal paired differences.

    python benchmarks/interval_coverage.py [--trials 20000] [--resamples 999] [--seed 0]

Each trial draws n paired differences from N(mu, sd) (mu = 0.02, sd = 0.08: accuracy points of the order the
committed campaigns show; coverage does not depend on them), builds each interval and counts whether it holds
mu. Every method sees the same draws; the numpy seed is fixed, so the output is reproducible. The bootstrap
runs vectorised over blocks of trials (seconds for all of them). The binomial standard error of a coverage
near 0.95 is sqrt(0.95 * 0.05 / trials): 0.0015 at 20,000 trials.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy import stats

MU, SD = 0.02, 0.08
SEEDS = (4, 6, 8)
BLOCK = 1000  # trials per vectorised bootstrap call (memory: BLOCK x resamples x n floats)


def t_coverage(draws: np.ndarray) -> float:
    """Share of rows whose 95% t-interval of the mean holds MU."""
    ci = stats.ttest_1samp(draws, 0.0, axis=1).confidence_interval(confidence_level=0.95)
    return float(np.mean((ci.low <= MU) & (MU <= ci.high)))


def bootstrap_coverage(draws: np.ndarray, method: str, resamples: int, rng: np.random.Generator) -> float:
    """Share of rows whose 95% scipy.stats.bootstrap interval of the mean (`method`) holds MU."""
    hits = 0
    for start in range(0, len(draws), BLOCK):
        block = draws[start:start + BLOCK]
        res = stats.bootstrap((block,), np.mean, axis=1, vectorized=True, n_resamples=resamples,
                              confidence_level=0.95, method=method, random_state=rng)
        ci = res.confidence_interval
        hits += int(np.sum((ci.low <= MU) & (MU <= ci.high)))
    return hits / len(draws)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20000, help="trials per seed count")
    ap.add_argument("--resamples", type=int, default=999, help="bootstrap resamples per interval")
    ap.add_argument("--seed", type=int, default=0, help="numpy seed")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"normal paired differences N({MU}, {SD}^2); nominal 95%; numpy seed {args.seed}; {args.trials} trials "
          f"per seed count; bootstrap with {args.resamples} resamples; standard error of a coverage near 0.95: "
          f"{math.sqrt(0.95 * 0.05 / args.trials):.4f}")
    print(f"{'seeds':>5}  {'t-interval':>10}  {'bootstrap BCa':>13}  {'bootstrap percentile':>20}")
    for n in SEEDS:
        draws = rng.normal(MU, SD, size=(args.trials, n))  # (trials, n)
        start = time.perf_counter()
        bca = bootstrap_coverage(draws, "BCa", args.resamples, rng)
        pct = bootstrap_coverage(draws, "percentile", args.resamples, rng)
        print(f"{n:>5}  {t_coverage(draws):>10.4f}  {bca:>13.4f}  {pct:>20.4f}"
              f"   ({time.perf_counter() - start:.0f} s bootstrapping)", flush=True)


if __name__ == "__main__":
    main()
