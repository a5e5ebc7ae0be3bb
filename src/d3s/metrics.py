"""Evaluation estimators (docs/method.md section 8) and training diagnostics (section 7).

pass@k, unbiased (Chen et al. 2021, the human-eval estimator): with n samples of which c are
correct,

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i)

The product form never builds a binomial coefficient, so it is exact and stable for n in the
thousands (C(4000, 2000) overflows a float64). Avg@n is the plain mean accuracy c / n.
"""

from __future__ import annotations

import math
import statistics

import torch

from d3s import _checks


def _check_counts(n, c) -> tuple[int, int]:
    """Integer counts (Python, NumPy or 0-d torch; a float such as 2.7 is an error, never truncated)."""
    n = _checks.as_int("n", n)
    if n < 1:
        raise ValueError(f"n={n} must be >= 1 (samples per problem)")
    c = _checks.as_int("c", c)
    if not 0 <= c <= n:
        raise ValueError(f"c={c} must be in [0, n={n}] (correct samples)")
    return n, c


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from `n` samples with `c` correct: 1 - C(n-c, k) / C(n, k).

    Raises:
        ValueError: unless n, c, k are integers with 1 <= k <= n and 0 <= c <= n.
    """
    n, c = _check_counts(n, c)
    k = _checks.as_int("k", k)
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, n={n}]")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    # prod_{i=n-c+1}^{n} (1 - k/i), in log space: a sum of log1p terms, exact to rounding.
    log_fail = math.fsum(math.log1p(-k / i) for i in range(n - c + 1, n + 1))
    return 1.0 - math.exp(log_fail)


def avg_at_n(c: int, n: int) -> float:
    """Avg@n: mean accuracy over the n samples of one problem, c / n (integer counts, 0 <= c <= n)."""
    n, c = _check_counts(n, c)
    return c / n


def sample_usefulness_rate(
    advantages: torch.Tensor, kept: torch.Tensor, num_generations: int
) -> torch.Tensor:
    """Share of trained groups whose kept rollouts carry a non-zero advantage (paper sec. 4.5, SUR).

    Args:
        advantages: `(B*G,)` advantages of the whole generation batch.
        kept: `(B*G,)` bool, rollouts trained on.
        num_generations: G.

    Returns:
        Scalar tensor in [0, 1]; groups with no kept rollout are not counted (0 if none is kept).
        A NaN advantage counts as non-zero (useful), as `!=` has it.
    """
    _checks.tensor("advantages", advantages, dims=(1,))
    _checks.tensor("kept", kept, dims=(1,), kind="bool")
    if kept.shape != advantages.shape:
        raise ValueError(f"kept {tuple(kept.shape)} and advantages {tuple(advantages.shape)} must both be (B*G,)")
    num_generations = _checks.as_int("num_generations", num_generations, low=1)
    if advantages.numel() % num_generations:
        raise ValueError(f"num_generations={num_generations} must divide the batch size {advantages.numel()}")
    adv = advantages.view(-1, num_generations)  # (B, G)
    k = kept.view(-1, num_generations)  # (B, G)
    trained = k.any(dim=1)  # (B,)
    useful = ((adv != 0) & k).any(dim=1)  # (B,)
    return useful.sum().float() / trained.sum().clamp(min=1).float()


def population_variance(values: torch.Tensor) -> torch.Tensor:
    """Population variance (divide by m) of all entries — the quantity sample selection maximises (eq. 6).

    Computed and returned in float64 for float64 values, in float32 for every other dtype (float32,
    float16, bfloat16, integer, bool), as a 0-dim tensor. 0 for an empty tensor; NaN if any value
    is NaN (propagated, not hidden).
    """
    _checks.tensor("values", values)
    dtype = torch.float64 if values.dtype == torch.float64 else torch.float32
    if values.numel() == 0:
        return values.new_zeros((), dtype=dtype)
    return values.to(dtype).var(correction=0)


def advantage_balance(
    advantages: torch.Tensor, tokens: torch.Tensor, offered: torch.Tensor
) -> tuple[float, bool]:
    """How two-sided the tokens in a loss are (docs/method.md section 7).

    Args:
        advantages: `(S,)`, `(S, 1)` or `(S, T)` advantages of the rows.
        tokens: `(S, T)` bool, the tokens in the loss.
        offered: `(S, T)` bool, the tokens the cut chose from (the valid tokens of the kept rollouts).

    Returns:
        `(balance, one_sided)`: balance = sum of A over the tokens in the loss / sum of |A| over them, in
        [-1, 1] (0 when they carry no advantage); one_sided: the offered tokens had both signs of A but
        the tokens in the loss have one only. Over every token of every group, GRPO's advantages
        sum to about 0 (exactly, for equal lengths).
    """
    _checks.tensor("tokens", tokens, dims=(2,), kind="bool")
    _checks.tensor("offered", offered, dims=(2,), kind="bool")
    _checks.tensor("advantages", advantages)
    S, T = tokens.shape
    if offered.shape != tokens.shape or advantages.shape not in ((S,), (S, 1), (S, T)):
        raise ValueError(
            f"advantages {tuple(advantages.shape)}, tokens {tuple(tokens.shape)} and offered {tuple(offered.shape)} "
            "must be (S,)/(S, 1)/(S, T), (S, T), (S, T)"
        )
    adv = (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages).double().expand(S, T)  # (S, T)
    chosen = adv[tokens]  # (n,)
    mass = float(chosen.abs().sum())
    balance = float(chosen.sum()) / mass if mass > 0 else 0.0
    both_offered = bool((adv[offered] > 0).any()) and bool((adv[offered] < 0).any())
    both_kept = bool((chosen > 0).any()) and bool((chosen < 0).any())
    return balance, both_offered and not both_kept


FEW_TOKENS_PER_ROLLOUT = 2.0
"""Below this many tokens in the loss per kept rollout (median over steps) the token cut has degenerated."""
ONE_SIDED_SHARE = 0.25
"""Above this share of one-sided steps (tokens of one sign of advantage only) the token cut has degenerated."""
MIN_STEPS_TO_WARN = 3
LENGTH_CAP_WINDOW = 5
"""Generation batches compared at the start and at the end of a run for the length-cap warning."""
LENGTH_CAP_SHARE = 0.5
"""At or above this share of completions cut off at `max_completion_length` (mean of the last
`LENGTH_CAP_WINDOW` generation batches, and not below the first window's) completions have drifted to the cap."""


def token_cut_warnings(
    tokens_per_rollout: list[float], one_sided: list[float], *, k_init: float, k_final: float, token_cut: str = "batch",
    clipped: list[float] | None = None, keep_last_in_loss: bool = False, min_tokens_per_rollout: int = 0,
    mask_truncated: bool = False,
) -> dict[str, str]:
    """What the token cut's record says is degenerate, each with the setting to change (empty: nothing).

    Returns `{kind: message}`, kinds 'few_tokens', 'one_sided' and 'length_cap'.

    Args:
        tokens_per_rollout: tokens in the loss per kept rollout (`d3s/tokens_per_kept_rollout`) of each step of a
            run with a token cut.
        one_sided: `d3s/one_sided` (0/1) of each step so far.
        k_init, k_final, token_cut, keep_last_in_loss, min_tokens_per_rollout: the run's token-cut settings (named
            in the messages; a floor already set is not advised again).
        mask_truncated: TRL's `mask_truncated_completions`: a completion cut off at the length cap has no token in
            the loss, yet the rollout selection can keep it; 'few_tokens' then names that first.
        clipped: the share of completions cut off at `max_completion_length` (TRL's `completions/clipped_ratio`)
            of each generation batch so far; 'length_cap' when the last `LENGTH_CAP_WINDOW` average at least
            `LENGTH_CAP_SHARE` and no less than the first ones (a run that learns shorter answers lowers it).
    """
    found = {}
    w = LENGTH_CAP_WINDOW
    if clipped and len(clipped) >= 2 * w:
        first, last = statistics.mean(clipped[:w]), statistics.mean(clipped[-w:])
        if last >= LENGTH_CAP_SHARE and last >= first:
            if keep_last_in_loss:
                advice = "compare a variant without a token cut (d1s-c), or raise max_completion_length"
            else:
                advice = ("a token cut trains few of the tokens that end a completion: compare a variant without a "
                          "token cut (d1s-c) first, then keep_last_in_loss=True (it helped on the arith-2digit "
                          "recipe and hurt on the default one)")
            found["length_cap"] = (
                f"completions stay at max_completion_length: {last:.0%} cut off over the last {w} generation "
                f"batches ({first:.0%} over the first {w}); {advice}"
            )
    if len(tokens_per_rollout) < MIN_STEPS_TO_WARN:
        return found
    median = statistics.median(tokens_per_rollout)
    if median < FEW_TOKENS_PER_ROLLOUT:
        advice = ["raise k_init"] + (["set min_tokens_per_rollout (e.g. 4)"] if not min_tokens_per_rollout else [])
        advice = ", ".join(advice) + ", or set token_cut='rollout'"
        if mask_truncated:
            cut = f" ({statistics.mean(clipped):.0%} of completions were)" if clipped else ""
            advice = ("mask_truncated_completions leaves every completion cut off at max_completion_length out of the "
                      f"loss{cut}, and the rollout selection still keeps such rollouts: raise max_completion_length "
                      f"or turn mask_truncated_completions off; else {advice}")
        floor = f", a floor of {min_tokens_per_rollout}" if min_tokens_per_rollout else ""
        found["few_tokens"] = (
            f"the token cut leaves {median:.1f} tokens per kept rollout (median of {len(tokens_per_rollout)} steps; "
            f"K = {k_init:g} -> {k_final:g} of short completions{floor}): {advice}"
        )
    if one_sided:
        share = sum(v > 0.5 for v in one_sided) / len(one_sided)
        if share > ONE_SIDED_SHARE and token_cut != "sign":
            found["one_sided"] = (
                f"{share:.0%} of steps train on tokens of one sign of advantage only (the kept rollouts had both): "
                "set token_cut='sign'"
            )
    return found
