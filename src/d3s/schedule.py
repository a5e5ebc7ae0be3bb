"""The dynamic down-sampling schedule (paper sec. 3.3, eq. 9; docs/method.md section 4).

With training progress p in [0, 1] — 0 at the first update, 1 at the last: p = j / (J - 1) for the
j-th of J updates (counted from 0), p = 0 for a one-update run:

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

from d3s import _checks


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
        progress: p = j / (J - 1) for the j-th of J updates (from 0); 0 when J = 1.
        n_init, n_final: rollouts kept per group at p = 0 and p = 1 (any order; n_final < n_init
            gives a schedule that tightens instead of relaxing).
        k_init, k_final: token fractions in (0, 1] at p = 0 and p = 1.
        num_generations: G; N stays in [2, G].
        multiple_of: optional granularity of N (see module docstring).
        Numbers may be Python, NumPy or 0-d torch scalars; counts must be integers, not floats.

    Returns:
        `(n_keep, fraction)`; exactly `(n_init, k_init)` at p = 0 and `(n_final, k_final)` at p = 1
        (for `multiple_of` = 1).

    Raises:
        ValueError: naming the argument, for p outside [0, 1] or NaN, G < 2, an N that is not an
            integer in [2, G], a K outside (0, 1], or `multiple_of` < 1.
    """
    try:
        progress = _checks.as_float("progress", progress, low=0.0, high=1.0)
    except ValueError:
        raise ValueError(f"progress={progress!r} must be in [0, 1] (update index / (updates - 1))") from None
    num_generations = _checks.as_int("num_generations", num_generations, low=2)
    n_init, n_final = (_checks.as_int(name, value, low=2, high=num_generations)
                       for name, value in (("n_init", n_init), ("n_final", n_final)))
    k_init, k_final = (_checks.as_float(name, value, low=0.0, high=1.0, low_open=True)
                       for name, value in (("k_init", k_init), ("k_final", k_final)))
    multiple_of = _checks.as_int("multiple_of", multiple_of, low=1)

    p = float(progress)
    n = math.floor((1.0 - p) * n_init + p * n_final + 0.5)
    n = min(max(n, 2), num_generations)
    if multiple_of > 1:
        n = min(max(multiple_of, n - n % multiple_of), num_generations)
    k = k_init if k_init == k_final else (1.0 - p) * k_init + p * k_final  # constant stays exact
    k = min(max(k, 1e-12), 1.0)
    return n, k


def generation_index(
    optimizer_steps: int, micro_step: int, gradient_accumulation_steps: int, micro_batches_per_generation: int
) -> int:
    """Index (from 0) of the generation batch a trainer is working on.

    A trainer that generates once every `micro_batches_per_generation` micro-batches (TRL:
    `steps_per_generation * num_iterations`) and steps the optimizer every
    `gradient_accumulation_steps` micro-batches has run `optimizer_steps * gradient_accumulation_steps
    + micro_step % gradient_accumulation_steps` micro-batches so far (`micro_step`: its running
    micro-batch counter, TRL's `_step`).
    """
    ga = _checks.as_int("gradient_accumulation_steps", gradient_accumulation_steps, low=1)
    every = _checks.as_int("micro_batches_per_generation", micro_batches_per_generation, low=1)
    done = _checks.as_int("optimizer_steps", optimizer_steps, low=0) * ga
    return (done + _checks.as_int("micro_step", micro_step, low=0) % ga) // every


def generation_progress(
    index: int, max_steps: int, gradient_accumulation_steps: int, micro_batches_per_generation: int
) -> float:
    """Training progress p of generation batch `index`: 0 for the first, 1 for the last (section 4).

    A run of `max_steps` optimizer steps has J = ceil(max_steps * gradient_accumulation_steps /
    micro_batches_per_generation) generation batches and p = index / (J - 1), clipped to [0, 1];
    p = 0 when J <= 1. A pure function of the counters, so a resumed run continues exactly.
    """
    ga = _checks.as_int("gradient_accumulation_steps", gradient_accumulation_steps, low=1)
    every = _checks.as_int("micro_batches_per_generation", micro_batches_per_generation, low=1)
    total = math.ceil(max(_checks.as_int("max_steps", max_steps), 0) * ga / every)
    if total <= 1:
        return 0.0
    return min(max(_checks.as_int("index", index) / (total - 1), 0.0), 1.0)


SCHEDULE_CLOCKS = ("steps", "learning_rate")
"""What training progress p counts (docs/method.md section 9.2): 'steps' (the paper: generation batches),
'learning_rate' (the share of the learning-rate schedule's total step size already spent)."""


def learning_rate_progress(
    index: int, rates, gradient_accumulation_steps: int, micro_batches_per_generation: int
) -> float:
    """Training progress p of generation batch `index`, counted in learning rate instead of steps.

    Generation batch g starts at optimizer step s_g = floor(g * micro_batches_per_generation /
    gradient_accumulation_steps). With C(s) = rates[0] + ... + rates[s - 1] (the step size spent before
    step s) and J generation batches, p = C(s_g) / C(s_(J-1)): 0 for the first batch, 1 for the last,
    and exactly `generation_progress` when the rate is constant and a generation batch is one
    optimizer step. Under a decaying schedule N and K relax while the steps are still large (cosine
    over 20 steps: p = 0.5 by step 6 instead of 10). 0 when the rates before the last batch sum to 0.

    Args:
        index: the generation batch (from 0).
        rates: the learning rate of every optimizer step of the run, in order (`len(rates)` = max_steps;
            non-negative numbers).
        gradient_accumulation_steps, micro_batches_per_generation: as in `generation_progress`.
    """
    ga = _checks.as_int("gradient_accumulation_steps", gradient_accumulation_steps, low=1)
    every = _checks.as_int("micro_batches_per_generation", micro_batches_per_generation, low=1)
    index = _checks.as_int("index", index, low=0)
    rates = [_checks.as_float(f"rates[{i}]", r, low=0.0) for i, r in enumerate(rates)]
    total = math.ceil(len(rates) * ga / every)  # generation batches
    if total <= 1:
        return 0.0
    spent = [0.0]
    for r in rates:
        spent.append(spent[-1] + r)  # spent[s] = C(s)

    def start(g: int) -> int:
        return min(g * every // ga, len(rates))

    whole = spent[start(total - 1)]
    if whole <= 0.0:
        return 0.0
    return min(max(spent[start(min(index, total - 1))] / whole, 0.0), 1.0)
