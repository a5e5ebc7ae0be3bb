"""Sample-level down-sampling: keep the rollouts whose advantages carry the most signal.

Paper section 3.1 (eqs. 6-7), docs/method.md section 2. From m candidate advantages keep the n whose
(population) variance is largest. The advantages are NOT re-normalised afterwards — that is what
separates D3S from PODS (Xu et al., 2504.13818), which selects on rewards and re-normalises.

The exact algorithm. For a fixed size n, the variance sum((x - mean)^2) / n of a subset is a convex
function of the subset's values, so a maximiser is always an "extreme" subset: the k largest values
plus the n - k smallest, for some k in [0, n]. Sorting once and keeping prefix sums of x and x^2
scores all n + 1 candidates in O(n), hence O(m log m) time and O(m) memory in total, exact.

Determinism: the values are put in one total order, (value, index) ascending — a stable sort — and
the kept set is a prefix plus a suffix of that order. Among splits of equal variance the one taking
the FEWEST values from the top wins; "equal" means within 8 ulps of the input dtype (relative), so
that the rounding of the inputs cannot flip a tie — rewards and their standardised advantages pick
the same subset even in float32. Every process of a distributed run that gathers the same advantages therefore computes
the same subset.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

import torch

from d3s import _checks
from d3s.advantages import ScaleRewards, group_advantages

SampleSelection = Literal["none", "intra", "cross", "pods", "random", "random-intra"]
SAMPLE_SELECTIONS = ("none", "intra", "cross", "pods", "random", "random-intra")
"""Every rollout-selection mode. `random` and `random-intra` are controls, not methods (docs/method.md section 9.3)."""

# Splits whose scores are within this many input-dtype ulps (relative) of the best are ties.
_TIE_ULPS = 8


def _check_n(n: int, name: str = "n") -> int:
    """A count of values to keep: an integer >= 1 (Python, NumPy or 0-d torch; not a float, not a bool)."""
    return _checks.as_int(name, n, low=1)


def max_variance_mask(values: torch.Tensor, n: int) -> torch.Tensor:
    """Row-wise max-variance selection: keep `n` entries of every row of `values`.

    Args:
        values: `(R, m)` finite values; each row is selected independently.
        n: how many to keep per row; `n >= m` keeps everything.

    Returns:
        bool `(R, m)`, exactly `min(n, m)` True per row.
    """
    n = _check_n(n)
    _checks.tensor("values", values)
    if values.dim() != 2:
        raise ValueError(f"values must be 2-D (R, m), got shape {tuple(values.shape)}")
    if not torch.isfinite(values).all():
        bad = values[~torch.isfinite(values)][0].item()
        raise ValueError(f"values must be finite, found {bad}")
    R, m = values.shape
    if n >= m:
        return torch.ones(R, m, dtype=torch.bool, device=values.device)

    sorted_vals, order = torch.sort(values, dim=1, stable=True)  # (R, m): (value, index) ascending
    # Variance is shift- and scale-invariant: centre and scale to [-1, 1] in float64 so that the
    # prefix sums neither overflow nor cancel for huge or offset inputs.
    x = sorted_vals.double()
    x = x - x.mean(dim=1, keepdim=True)
    x = x / x.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    zero = torch.zeros(R, 1, dtype=x.dtype, device=x.device)
    s1 = torch.cat([zero, x.cumsum(dim=1)], dim=1)  # (R, m+1): s1[:, j] = sum of the j smallest
    s2 = torch.cat([zero, (x * x).cumsum(dim=1)], dim=1)  # (R, m+1)

    k = torch.arange(n + 1, device=x.device)  # (n+1,) values taken from the top
    lo, hi = n - k, m - k  # keep sorted positions [0, lo) and [hi, m)
    total1 = s1[:, lo] + s1[:, m : m + 1] - s1[:, hi]  # (R, n+1)
    total2 = s2[:, lo] + s2[:, m : m + 1] - s2[:, hi]  # (R, n+1)
    score = total2 - total1 * total1 / n  # (R, n+1): n * population variance of each split

    best = score.amax(dim=1, keepdim=True)  # (R, 1)
    rtol = max(_TIE_ULPS * torch.finfo(values.dtype).eps, 1e-12) if values.is_floating_point() else 1e-12
    is_best = score >= best - rtol * best.abs()  # (R, n+1)
    k_best = is_best.int().argmax(dim=1, keepdim=True)  # (R, 1): first (= fewest from the top)

    pos = torch.arange(m, device=x.device).unsqueeze(0)  # (1, m) sorted positions
    keep_sorted = (pos < n - k_best) | (pos >= m - k_best)  # (R, m)
    return torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)  # back to input order


def max_variance_subset(values: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the size-`n` subset of `values` with maximum population variance.

    Exact, O(m log m): the optimum is the k largest plus the n - k smallest values for some k, so
    one sort and prefix sums of x and x^2 score every candidate (module docstring; paper eq. 6).

    Args:
        values: `(m,)` finite values (typically advantages).
        n: subset size, >= 1; `n >= m` keeps every index.

    Returns:
        LongTensor `(min(n, m),)` of kept indices, ascending.

    Raises:
        ValueError: if `n < 1`, or `values` is not 1-D or holds NaN/inf.
    """
    _checks.tensor("values", values)
    if values.dim() != 1:
        raise ValueError(f"values must be 1-D (m,), got shape {tuple(values.shape)}")
    return max_variance_mask(values.unsqueeze(0), n).squeeze(0).nonzero().squeeze(1)


@dataclass(frozen=True)
class RolloutSelection:
    """The rollouts chosen for training from one generation batch of B groups x G rollouts.

    Attributes:
        indices: `(S,)` LongTensor of kept rows of the `(B*G,)` batch, ascending.
        advantages: `(S,)` advantages to train the kept rows on, in the order of `indices`
            (unchanged for `intra`/`cross`/`none`; re-normalised within each kept group for `pods`).
        mask: `(B*G,)` bool, True for kept rows.
        kept_per_group: `(B,)` LongTensor, how many rollouts of each group were kept.
    """

    indices: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    kept_per_group: torch.Tensor


def selection_generator(seed: int, index: int) -> torch.Generator:
    """The CPU generator the random controls draw from for generation batch `index` of a run seeded `seed`.

    A pure function of the two: a resumed run draws exactly what the uninterrupted one drew, and every process
    of a distributed run draws the same subset."""
    seed, index = _checks.as_int("seed", seed), _checks.as_int("index", index, low=0)
    digest = hashlib.sha256(f"d3s-random-selection:{seed}:{index}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def random_mask(valid: torch.Tensor, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Row-wise uniform choice: in every row of `valid`, `min(n, valid in the row)` of its True entries, each
    subset of that size equally likely (a uniform random permutation of the row's valid entries, cut at n).

    Args:
        valid: bool `(R, m)`, the entries that may be chosen.
        n: how many to keep per row, >= 1.
        generator: a CPU `torch.Generator`; None uses torch's global one.

    Returns:
        bool `(R, m)` on `valid`'s device.
    """
    n = _check_n(n)
    R, m = valid.shape
    keys = torch.rand(R, m, generator=generator)  # (R, m) i.i.d. uniform: the order of a uniform permutation
    keys = keys.masked_fill(~valid.cpu(), 2.0)  # invalid entries sort last, never among the first n valid ones
    rank = keys.argsort(dim=1).argsort(dim=1)  # (R, m): each entry's place in its row's random order
    return ((rank < n) & valid.cpu()).to(valid.device)


def _rowwise_mask_with_invalid(values: torch.Tensor, valid: torch.Tensor, n: int) -> torch.Tensor:
    """`max_variance_mask` per row, restricted to the valid entries of each row."""
    # (B, G) values and validity -> (B, G) keep mask
    full = valid.all(dim=1)  # (B,)
    keep = torch.zeros_like(valid)
    if full.any():
        keep[full] = max_variance_mask(values[full], n)
    for row in (~full).nonzero().flatten().tolist():  # rare: groups with unscorable rollouts
        cols = valid[row].nonzero().flatten()
        if cols.numel() > 0:
            keep[row, cols[max_variance_subset(values[row, cols], n)]] = True
    return keep


def select_rollouts(
    advantages: torch.Tensor,
    rewards: torch.Tensor,
    num_generations: int,
    n_keep: int,
    mode: SampleSelection,
    *,
    scale_rewards: ScaleRewards = "group",
    eps: float = 1e-4,
    generator: torch.Generator | None = None,
) -> RolloutSelection:
    """Choose the rollouts to train on (paper sec. 3.1; docs/method.md section 2).

    Args:
        advantages: `(B*G,)` group-relative advantages over the full groups (`group_advantages`).
        rewards: `(B*G,)` rewards; NaN marks an unscorable rollout, which is never kept.
        num_generations: G.
        n_keep: N, rollouts to keep per group; `cross` keeps `N * B` over the whole batch.
        mode: `none` keeps every scorable rollout (NaN rewards are tolerated: those rollouts are dropped); `intra` keeps the max-advantage-variance N of each
            group (D1S, D3S-I); `cross` keeps the max-advantage-variance N*B of the batch, groups may
            keep any number including 0 (D1S-C, D2S, D3S); `pods` keeps the max-REWARD-variance N of
            each group and re-normalises the advantages within the kept N (Xu et al., 2025). The controls
            (docs/method.md section 9.3) keep as many rollouts as the max-variance rule of the same scope, chosen
            uniformly at random among the scorable ones: `random` as many as `cross` (N*B of the batch),
            `random-intra` as many as `intra` (N of each group).
        scale_rewards, eps: the advantage convention, used by `pods` for its re-normalisation.
        generator: the CPU `torch.Generator` the random controls draw from (seed it per step for a run that
            resumes exactly); None draws from torch's global generator. The other modes ignore it.

    Returns:
        A `RolloutSelection`.

    Raises:
        ValueError: naming the argument, for tensors that are not both `(B*G,)`, an infinite reward,
            a non-finite advantage of a scorable rollout, counts that are not integers >= 1
            (`num_generations` must divide B*G), a bad `mode`, or an `eps` that is not finite >= 0.
    """
    _checks.tensor("advantages", advantages)
    _checks.tensor("rewards", rewards)
    if advantages.shape != rewards.shape or advantages.dim() != 1:
        raise ValueError(
            f"advantages {tuple(advantages.shape)} and rewards {tuple(rewards.shape)} must both be (B*G,)"
        )
    total = advantages.numel()
    num_generations = _checks.as_int("num_generations", num_generations, low=1)
    if total % num_generations != 0:
        raise ValueError(f"num_generations={num_generations} must divide the batch size {total}")
    n_keep = _check_n(n_keep, "n_keep")
    if mode not in SAMPLE_SELECTIONS:
        raise ValueError(f"mode={mode!r}; valid: {', '.join(map(repr, SAMPLE_SELECTIONS))}")
    eps = _checks.as_float("eps", eps, low=0.0)
    B, G = total // num_generations, num_generations
    valid = ~torch.isnan(rewards) if rewards.is_floating_point() else torch.ones_like(rewards, dtype=torch.bool)
    _checks.no_inf("rewards", rewards, "NaN marks an unscorable rollout, never kept")
    if mode in ("intra", "cross") and advantages.is_floating_point() and not torch.isfinite(advantages[valid]).all():
        bad = advantages[valid][~torch.isfinite(advantages[valid])][0].item()
        raise ValueError(f"advantages must be finite for every scorable rollout (non-NaN reward), found {bad}")

    if mode == "none":
        mask = valid.clone()
    elif mode == "intra":
        mask = _rowwise_mask_with_invalid(advantages.view(B, G), valid.view(B, G), n_keep).view(-1)
    elif mode == "pods":
        mask = _rowwise_mask_with_invalid(rewards.view(B, G), valid.view(B, G), n_keep).view(-1)
    elif mode == "cross":
        if valid.all():  # the common case: one selection over the whole batch
            mask = max_variance_mask(advantages.unsqueeze(0), n_keep * B).squeeze(0)
        else:
            mask = torch.zeros_like(valid)
            cand = valid.nonzero().flatten()  # (V,) scorable rows
            if cand.numel() > 0:
                mask[cand[max_variance_subset(advantages[cand], n_keep * B)]] = True
    elif mode == "random":
        mask = random_mask(valid.view(1, -1), n_keep * B, generator).view(-1)
    else:  # random-intra
        mask = random_mask(valid.view(B, G), n_keep, generator).view(-1)

    indices = mask.nonzero().flatten()  # (S,) ascending
    if mode == "pods":
        # Re-normalise within the kept N: the non-kept rewards become NaN, which the advantage
        # convention leaves out of every mean and std.
        kept_rewards = torch.where(mask, rewards, torch.full_like(rewards, float("nan")))
        new_adv = group_advantages(kept_rewards, G, scale_rewards=scale_rewards, eps=eps)[indices]
    else:
        new_adv = advantages[indices]
    return RolloutSelection(
        indices=indices,
        advantages=new_adv,
        mask=mask,
        kept_per_group=mask.view(B, G).sum(dim=1),
    )
