"""Token-level down-sampling: keep the tokens where |advantage| x entropy is highest.

Paper section 3.2 (eq. 8), docs/method.md section 3. Over the valid completion tokens of the KEPT rollouts,
score s_i,t = |A_i,t| * H_i,t and keep the top ceil(K * n_valid) — one threshold over the whole
generation batch, never a padding token, at least one token when any is valid.

Three steps, exposed separately so that a distributed caller can apply one global cut:

    scores = token_scores(advantages, entropies, completion_mask)  # per process
    all_scores = gather(scores)           # every process's rows, padded with -inf, rank order
    k = num_tokens_to_keep(n_valid_global, fraction)
    mask = top_tokens_mask(all_scores, k)[my_rows]                 # identical on every process

Ties at the cut are broken by flattened position (lower first), so the count is exact and every
process that sees the same gathered scores keeps the same tokens.

Non-finite scores (a NaN or infinite entropy or advantage on a valid token) never decide the cut:
`token_scores` gives them the lowest finite score (`LOWEST_SCORE`), so they are kept only when the
count cannot be reached otherwise, and the count stays exactly ceil(K * n_valid). Count them with
`nonfinite_scores` to report them. `top_tokens_mask` refuses NaN scores.
"""

from __future__ import annotations

import math

import torch

from d3s import _checks

LOWEST_SCORE = torch.finfo(torch.float32).min
"""The score of a valid token whose |A| * H is not finite: below every real score, above padding."""


def token_scores(
    advantages: torch.Tensor, entropies: torch.Tensor, completion_mask: torch.Tensor
) -> torch.Tensor:
    """s_i,t = |A_i,t| * H_i,t on valid tokens, -inf on padding (paper eq. 8).

    Args:
        advantages: `(S,)` per-rollout, `(S, 1)` or `(S, T)` per-token advantages; bool advantages count as 0/1.
        entropies: `(S, T)` policy entropies (taken as given; detach them for a mask without grad).
        completion_mask: `(S, T)` 1/True on valid completion tokens.
        All three are torch tensors (a NumPy array is refused: convert it with `torch.as_tensor`).

    Returns:
        `(S, T)` float32 scores, detached: -inf on padding, `LOWEST_SCORE` where |A| * H is not
        finite (NaN or infinite entropy or advantage), |A| * H elsewhere.

    Raises:
        ValueError: naming the argument, for a non-tensor or complex argument or mismatched shapes.
    """
    advantages = _check_score_inputs(advantages, entropies, completion_mask)  # (S, 1) or (S, T)
    scores = advantages.detach().float().abs() * entropies.detach().float()  # (S, T), a new tensor
    scores.masked_fill_(~torch.isfinite(scores), LOWEST_SCORE)
    return scores.masked_fill_(~completion_mask.bool(), -float("inf"))


def _check_score_inputs(advantages, entropies, completion_mask) -> torch.Tensor:
    """The checks of `token_scores`; returns the advantages as `(S, 1)` or `(S, T)`."""
    _checks.tensor("advantages", advantages)
    _checks.tensor("entropies", entropies)
    _checks.tensor("completion_mask", completion_mask)
    if entropies.dim() != 2 or entropies.shape != completion_mask.shape:
        raise ValueError(
            f"entropies {tuple(entropies.shape)} and completion_mask {tuple(completion_mask.shape)} "
            "must both be (S, T)"
        )
    S, T = entropies.shape
    if advantages.shape not in ((S,), (S, 1), (S, T)):
        raise ValueError(
            f"advantages {tuple(advantages.shape)} must be (S,), (S, 1) or (S, T) to match entropies {(S, T)}"
        )
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def nonfinite_scores(advantages: torch.Tensor, entropies: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Number of valid tokens whose |A| * H is NaN or infinite (0-dim int64 tensor), for a metric.

    Same arguments and checks as `token_scores`.
    """
    advantages = _check_score_inputs(advantages, entropies, completion_mask)  # (S, 1) or (S, T)
    scores = advantages.detach().float().abs() * entropies.detach().float()  # (S, T)
    return (~torch.isfinite(scores) & completion_mask.bool()).sum()


def num_tokens_to_keep(n_valid: int, fraction: float) -> int:
    """ceil(fraction * n_valid), at least 1 when `n_valid > 0`, at most `n_valid`.

    The product is rounded to 9 decimals before the ceiling, so that 0.07 * 100 keeps 7 tokens and
    not 8 (0.07 is 0.0700000000000000067 in binary).

    Raises:
        ValueError: unless `fraction` is a real number in (0, 1] and `n_valid` an integer >= 0
            (Python, NumPy or 0-d torch; a float count such as 10.9 or 10.0 is never truncated, and
            a bool is neither).
    """
    fraction = _checks.as_float("fraction", fraction, low=0.0, high=1.0, low_open=True)
    n_valid = _checks.as_int("n_valid", n_valid, low=0)
    if n_valid == 0:
        return 0
    return min(n_valid, max(1, math.ceil(round(fraction * n_valid, 9))))


# Above this many scores `torch.kthvalue` finds the k-th largest faster than `torch.topk` on CPU
# (measured: 756 ms vs 1231 ms at 64M; 102 ms vs 83 ms at 8M).
_KTHVALUE_FROM = 1 << 24


def top_tokens_mask(scores: torch.Tensor, k: int, n_valid: int | None = None) -> torch.Tensor:
    """Exactly the `k` highest non-padding scores; ties broken by flattened position.

    Args:
        scores: `(S, T)` real tensor from `token_scores` (-inf marks padding, which is never kept).
        k: number of tokens to keep, an integer >= 0 (0 keeps none); clipped to the number of
            non-padding tokens.
        n_valid: the number of non-padding scores (an integer >= 0), if the caller knows it (saves
            one pass; it is taken as given, not counted again).

    Returns:
        bool `(S, T)` with exactly `min(k, n_valid)` True entries.

    Raises:
        ValueError: naming the argument, for `scores` that are not a real non-bool tensor or hold
            NaN, or a `k` or `n_valid` that is not an integer >= 0 (a float is never truncated).
    """
    _checks.tensor("scores", scores)
    if scores.dtype == torch.bool:
        raise ValueError("scores must be a real tensor of scores (token_scores), got torch.bool")
    k = _checks.as_int("k", k, low=0)
    if n_valid is not None:
        n_valid = _checks.as_int("n_valid", n_valid, low=0)
    flat = scores.reshape(-1)  # (S*T,)
    if torch.isnan(flat).any():
        bad = torch.isnan(scores).nonzero()[0].tolist()
        raise ValueError(
            f"scores contain NaN (first at row {bad[0]}, position {bad[-1]}); build them with token_scores, which "
            "maps non-finite scores to LOWEST_SCORE"
        )
    if n_valid is None:
        n_valid = int((flat > -float("inf")).sum())
    k = min(k, n_valid)
    if k <= 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    # The k-th largest value: everything above it is kept, then the first ties in flattened order.
    if flat.numel() >= _KTHVALUE_FROM and flat.device.type == "cpu":
        kth = torch.kthvalue(flat, flat.numel() - k + 1).values
    else:
        kth = torch.topk(flat, k, sorted=False).values.min()
    keep = flat > kth  # (S*T,)
    room = k - int(keep.sum())
    if room > 0:
        keep[(flat == kth).nonzero().squeeze(1)[:room]] = True
    return keep.view_as(scores)


def token_mask(
    advantages: torch.Tensor,
    entropies: torch.Tensor,
    completion_mask: torch.Tensor,
    fraction: float,
) -> torch.Tensor:
    """Top-`fraction` tokens by |A| * H over all valid tokens of the batch (paper eq. 8).

    Args:
        advantages: `(S,)`, `(S, 1)` or `(S, T)` advantages of the kept rollouts.
        entropies: `(S, T)` policy entropies.
        completion_mask: `(S, T)` valid-token mask.
        fraction: K, a real number in (0, 1] (not a bool).

    Returns:
        bool `(S, T)`: exactly `num_tokens_to_keep(n_valid, fraction)` valid tokens.

    Raises:
        ValueError: naming the argument, as `token_scores` and `num_tokens_to_keep` do.
    """
    scores = token_scores(advantages, entropies, completion_mask)  # (S, T)
    n_valid = int(completion_mask.bool().sum())
    return top_tokens_mask(scores, num_tokens_to_keep(n_valid, fraction), n_valid=n_valid)
