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
    *,
    cut: str = "batch",
    min_per_rollout: int = 0,
    keep_last: bool = False,
) -> torch.Tensor:
    """Top-`fraction` tokens by |A| * H over all valid tokens of the batch (paper eq. 8).

    Args:
        advantages: `(S,)`, `(S, 1)` or `(S, T)` advantages of the kept rollouts.
        entropies: `(S, T)` policy entropies.
        completion_mask: `(S, T)` valid-token mask.
        fraction: K, a real number in (0, 1] (not a bool).
        cut, min_per_rollout, keep_last: where the cut is taken, a floor per rollout and whether each
            rollout's last token is kept (`select_tokens`); the defaults are the paper's cut.

    Returns:
        bool `(S, T)`: with the defaults, exactly `num_tokens_to_keep(n_valid, fraction)` valid tokens.

    Raises:
        ValueError: naming the argument, as `token_scores`, `num_tokens_to_keep` and `select_tokens` do.
    """
    scores = token_scores(advantages, entropies, completion_mask)  # (S, T)
    return select_tokens(scores, fraction, advantages=advantages, cut=cut, min_per_rollout=min_per_rollout,
                         keep_last=keep_last)


# -- Options beyond the paper (docs/method.md section 9.2): where the cut is taken, and a floor -------------

TOKEN_CUTS = ("batch", "sign", "rollout")
"""Where the top-K cut is taken: 'batch' (the paper: one threshold over every valid token), 'sign' (the
budget split between positive- and negative-advantage tokens in proportion to their counts, one
threshold within each), 'rollout' (the top ceil(K * n_i) tokens of each rollout)."""


def select_tokens(
    scores: torch.Tensor,
    fraction: float,
    *,
    advantages: torch.Tensor | None = None,
    cut: str = "batch",
    min_per_rollout: int = 0,
    keep_last: bool = False,
) -> torch.Tensor:
    """The token mask for scores from `token_scores`, with the cut taken where `cut` says, plus a floor.

    - `cut="batch"` (the paper): the top `k = num_tokens_to_keep(n_valid, fraction)` scores overall.
    - `cut="sign"`: the same `k` split between the valid tokens with A > 0 and those with A < 0 in
      proportion to their counts (`k_pos = floor(k * n_pos / (n_pos + n_neg) + 1/2)`, at least 1 for a
      sign that has tokens, capped at its count; the rest to the other sign, capped likewise), and the
      top scores taken within each sign. Tokens with A = 0 are kept only when no token has a sign
      (then the batch cut). An update that had both signs to choose from keeps both.
    - `cut="rollout"`: the top `num_tokens_to_keep(n_i, fraction)` scores of each rollout (row).
    - `min_per_rollout=m`: on top of the cut, every rollout whose advantage is non-zero keeps its top
      `min(m, n_i)` tokens.
    - `keep_last=True`: on top of the cut, every rollout whose advantage is non-zero keeps its last valid
      token: its end-of-sequence token when it stopped, the token at the length limit when it did not.

    Ties are broken by position (lower first), as in `top_tokens_mask`.

    Args:
        scores: `(S, T)` scores from `token_scores` (-inf on padding).
        fraction: K in (0, 1].
        advantages: `(S,)`, `(S, 1)` or `(S, T)`; needed for `cut="sign"`, `min_per_rollout > 0` and `keep_last`.
        cut: one of `TOKEN_CUTS`.
        min_per_rollout: an integer >= 0.
        keep_last: a bool.

    Returns:
        bool `(S, T)`, never a padding token.

    Raises:
        ValueError: naming the argument, for an unknown cut, a negative or non-integer floor, missing or
            mis-shaped advantages, or the errors of `top_tokens_mask`.
    """
    _checks.tensor("scores", scores, dims=(2,))
    if cut not in TOKEN_CUTS:
        raise ValueError(f"cut={cut!r}; valid: {', '.join(map(repr, TOKEN_CUTS))}")
    min_per_rollout = _checks.as_int("min_per_rollout", min_per_rollout, low=0)
    if not isinstance(keep_last, bool):
        raise ValueError(f"keep_last={keep_last!r} must be True or False")
    valid = scores > -float("inf")  # (S, T)
    n_valid = int(valid.sum())
    signs = None
    if cut == "sign" or min_per_rollout > 0 or keep_last:
        if advantages is None:
            raise ValueError(f"cut={cut!r}, min_per_rollout={min_per_rollout}, keep_last={keep_last} need the advantages")
        _checks.tensor("advantages", advantages)
        S, T = scores.shape
        if advantages.shape not in ((S,), (S, 1), (S, T)):
            raise ValueError(f"advantages {tuple(advantages.shape)} must be (S,), (S, 1) or (S, T) to match scores {(S, T)}")
        adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        signs = torch.sign(adv.detach().float()).expand(S, T) * valid  # (S, T) in {-1, 0, 1}, 0 on padding
    if cut == "batch":
        keep = top_tokens_mask(scores, num_tokens_to_keep(n_valid, fraction), n_valid=n_valid)
    elif cut == "rollout":
        fraction = _checks.as_float("fraction", fraction, low=0.0, high=1.0, low_open=True)
        per_row = [num_tokens_to_keep(int(n), fraction) for n in valid.sum(dim=1).tolist()]
        keep = _top_per_row(scores, torch.tensor(per_row, dtype=torch.long, device=scores.device))
    else:
        keep = _sign_cut(scores, signs, num_tokens_to_keep(n_valid, fraction), n_valid)
    if min_per_rollout > 0:
        signal = (signs != 0).any(dim=1)  # (S,) rows whose advantage is non-zero
        floor = valid.sum(dim=1).clamp(max=min_per_rollout) * signal  # (S,)
        keep = keep | _top_per_row(scores, floor)
    if keep_last:
        signal = (signs != 0).any(dim=1)  # (S,); a row with no valid token has no sign either
        S, T = scores.shape
        last = (valid * torch.arange(1, T + 1, device=scores.device)).argmax(dim=1)  # (S,) the last valid position
        keep = keep.clone()
        keep[torch.arange(S, device=scores.device)[signal], last[signal]] = True
    return keep


def _sign_cut(scores: torch.Tensor, signs: torch.Tensor, k: int, n_valid: int) -> torch.Tensor:
    """The `k` budget split between the signs of the advantage in proportion to their token counts."""
    positive, negative = signs > 0, signs < 0  # (S, T)
    n_pos, n_neg = int(positive.sum()), int(negative.sum())
    if n_pos + n_neg == 0:
        return top_tokens_mask(scores, k, n_valid=n_valid)
    k_pos = (2 * k * n_pos + n_pos + n_neg) // (2 * (n_pos + n_neg))  # floor(k * share + 1/2), in integers
    k_pos = min(n_pos, max(k_pos, 1 if n_pos else 0))
    k_neg = min(n_neg, max(k - k_pos, 1 if n_neg else 0))
    k_pos = min(n_pos, max(k_pos, k - k_neg))  # what the negative side cannot take goes back
    lowest = -float("inf")
    return (top_tokens_mask(scores.masked_fill(~positive, lowest), k_pos, n_valid=n_pos)
            | top_tokens_mask(scores.masked_fill(~negative, lowest), k_neg, n_valid=n_neg))


def _top_per_row(scores: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The top `counts[i]` non-padding scores of each row i; ties broken by position (lower first)."""
    if torch.isnan(scores).any():
        raise ValueError("scores contain NaN; build them with token_scores, which maps non-finite scores to LOWEST_SCORE")
    S, T = scores.shape
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices  # (S, T): equal scores keep their order
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(T, device=scores.device).expand(S, T))  # (S, T) place of each token
    return (rank < counts.unsqueeze(1)) & (scores > -float("inf"))
