"""The dynamic down-sampling schedule (paper sec. 3.3, eq. 9; METHOD section 4).

With training progress p = step / total_steps in [0, 1]:

    N(p) = (1 - p) * N_init + p * N_final     rollouts kept per group
    K(p) = (1 - p) * K_init + p * K_final     fraction of tokens kept

Early in training few rollouts and few tokens carry the update (exploitation of the strongest
signal); later both cuts relax. init == final is a constant schedule (D1S, D2S). The schedule is a
pure function of p, so a run resumed at step s continues exactly where it stopped.

Rounding rule for N: round half up (floor(x + 0.5)), then clip to [2, G] (a single rollout has no
variance), then, if `multiple_of` > 1, round down to a multiple of it (never below `multiple_of`,
never above G) for trainers that split the kept rollouts into equal micro-batches.
"""

from __future__ import annotations

import math


def linear_schedule(
    progress: float,
    n_init: int,
    n_final: int,
    k_init: float,
    k_final: float,
    num_generations: int,
    *,
    multiple_of: int = 1,
) -> tuple[int, float]:
    """(N(p), K(p)) of paper eq. 9 at `progress` p in [0, 1].

    Args:
        progress: p = step / total_steps.
        n_init, n_final: rollouts kept per group at p = 0 and p = 1 (any order; n_final < n_init
            gives a schedule that tightens instead of relaxing).
        k_init, k_final: token fractions in (0, 1] at p = 0 and p = 1.
        num_generations: G; N stays in [2, G].
        multiple_of: optional granularity of N (see module docstring).

    Returns:
        `(n_keep, fraction)`; exactly `(n_init, k_init)` at p = 0 and `(n_final, k_final)` at p = 1
        (for `multiple_of` = 1).
    """
    if not (isinstance(progress, (int, float)) and 0.0 <= progress <= 1.0):
        raise ValueError(f"progress={progress!r} must be in [0, 1] (step / total_steps)")
    if num_generations < 2:
        raise ValueError(f"num_generations={num_generations} must be >= 2")
    for name, value in (("n_init", n_init), ("n_final", n_final)):
        if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= num_generations:
            raise ValueError(
                f"{name}={value!r} must be an integer in [2, num_generations={num_generations}] "
                "(one rollout has no variance)"
            )
    for name, value in (("k_init", k_init), ("k_final", k_final)):
        if not 0.0 < value <= 1.0:
            raise ValueError(f"{name}={value} must be in (0, 1]")
    if multiple_of < 1:
        raise ValueError(f"multiple_of={multiple_of} must be >= 1")

    p = float(progress)
    n = math.floor((1.0 - p) * n_init + p * n_final + 0.5)
    n = min(max(n, 2), num_generations)
    if multiple_of > 1:
        n = min(max(multiple_of, n - n % multiple_of), num_generations)
    k = k_init if k_init == k_final else (1.0 - p) * k_init + p * k_final  # constant stays exact
    k = min(max(k, 1e-12), 1.0)
    return n, k
