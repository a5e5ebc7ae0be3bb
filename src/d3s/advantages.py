"""Group-relative advantages (paper eq. 2, docs/method.md section 1).

    A_i = (R_i - mean_group(R)) / (std_group(R) + eps)

computed over the FULL group of G rollouts, before any down-sampling. The conventions are TRL's
(`GRPOTrainer._generate_and_score_completions`) and so are the values, with one deliberate
exception below (groups of equal rewards):

- std is the Bessel-corrected (sample) standard deviation, the one `torch.std` returns;
- eps = 1e-4 is added to the std, not to the variance;
- `scale_rewards="batch"` centres per group but divides by the std of the whole batch;
- `scale_rewards="none"` only centres (Dr. GRPO).

Degenerate cases are decided here, once:
- a group whose valid rewards are all equal gets advantage exactly 0 (never NaN, never rounding
  noise). TRL's arithmetic can leave a residue there (a group of sixteen rewards 0.1 gives 7.45e-5 in
  float32, since their float mean is not exactly 0.1); this function does not, so such a group is
  never counted as useful nor preferred by the selection;
- a NaN reward (a reward function that returned None) is left out of its group's mean and std and
  gets advantage 0; a group with a single valid reward has undefined std and gets advantage 0.
"""

from __future__ import annotations

from typing import Literal

import torch

from d3s import _checks

ScaleRewards = Literal["group", "batch", "none"]


def _nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Bessel-corrected std ignoring NaNs; NaN where fewer than two values are valid.

    Same arithmetic as TRL's `trl.trainer.utils.nanstd` (the advantages equal TRL's except in groups of
    equal rewards, see the module docstring).
    """
    if dim is None:
        mean = torch.nanmean(x)
        var = torch.nanmean((x - mean) ** 2)
        count = (~torch.isnan(x)).sum()
    else:
        mean = torch.nanmean(x, dim=dim, keepdim=True)
        var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
        count = (~torch.isnan(x)).sum(dim=dim, keepdim=True)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(var, float("nan")))
    std = torch.sqrt(var * correction)
    if dim is not None and not keepdim:
        std = std.squeeze(dim)
    return std


def group_advantages(
    rewards: torch.Tensor,
    num_generations: int,
    scale_rewards: ScaleRewards = "group",
    eps: float = 1e-4,
) -> torch.Tensor:
    """Group-relative advantages of B groups of G = `num_generations` rollouts (paper eq. 2).

    Args:
        rewards: `(B*G,)` real rewards (bool, integer or float), group-major (rows `g*G .. g*G+G-1`
            are one prompt's group). NaN marks a rollout that could not be scored: it is tolerated
            on purpose and gets advantage 0; +-inf is an error.
        num_generations: G, the group size.
        scale_rewards: `"group"` (divide by the group's std), `"batch"` (by the whole batch's std)
            or `"none"` (centre only).
        eps: added to the std before dividing.

    Returns:
        `(B*G,)` float advantages; 0 for NaN rewards and for groups whose valid rewards are equal.

    Raises:
        ValueError: naming the argument, for a non-tensor or non-1-D `rewards`, an infinite reward,
            a `num_generations` that is not an integer >= 1 dividing B*G, a bad `scale_rewards`, or
            an `eps` that is not a finite number >= 0.
    """
    _checks.tensor("rewards", rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (B*G,), got shape {tuple(rewards.shape)}")
    num_generations = _checks.as_int("num_generations", num_generations, low=1)
    if rewards.numel() % num_generations != 0:
        raise ValueError(
            f"num_generations={num_generations} must be >= 1 and divide the number of rewards "
            f"({rewards.numel()})"
        )
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards={scale_rewards!r}; valid: 'group', 'batch', 'none'")
    eps = _checks.as_float("eps", eps, low=0.0)
    _checks.no_inf("rewards", rewards, "NaN marks an unscorable rollout")

    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    grouped = rewards.view(-1, num_generations)  # (B, G)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)  # (B, 1)
    advantages = grouped - mean  # (B, G)
    if scale_rewards == "group":
        advantages = advantages / (_nanstd(grouped, dim=1, keepdim=True) + eps)
    elif scale_rewards == "batch":
        advantages = advantages / (_nanstd(rewards) + eps)

    # All valid rewards equal (max == min over the valid ones) -> exactly 0, whatever rounding did.
    valid = ~torch.isnan(grouped)  # (B, G)
    hi = torch.where(valid, grouped, torch.full_like(grouped, -float("inf"))).amax(dim=1, keepdim=True)
    lo = torch.where(valid, grouped, torch.full_like(grouped, float("inf"))).amin(dim=1, keepdim=True)
    advantages = torch.where(hi == lo, torch.zeros_like(advantages), advantages)
    # NaN rewards, single-valid groups and empty groups carry no signal.
    advantages = torch.nan_to_num(advantages, nan=0.0, posinf=0.0, neginf=0.0)
    return advantages.reshape(-1)  # (B*G,)


def weighted_rewards(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """One reward per rollout from F reward functions: sum_f w_f * r_f over the functions that scored it.

    Args:
        rewards_per_func: `(B*G, F)` rewards, NaN where a function did not score the rollout.
        reward_weights: `(F,)` weights.

    Returns:
        `(B*G,)`; NaN where no function scored the rollout (TRL's `nansum` would give 0 there).
    """
    _checks.tensor("rewards_per_func", rewards_per_func, dims=(2,), kind="float")
    _checks.tensor("reward_weights", reward_weights, dims=(1,))
    if reward_weights.numel() != rewards_per_func.size(1):
        raise ValueError(
            f"reward_weights has {reward_weights.numel()} weights for {rewards_per_func.size(1)} reward functions "
            "(rewards_per_func's columns); give one weight per function"
        )
    weights = reward_weights.to(rewards_per_func.device)
    rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # (B*G,)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = float("nan")
    return rewards


def zero_where_flat(
    advantages: torch.Tensor, rewards: torch.Tensor, num_generations: int, scale_rewards: ScaleRewards = "group"
) -> torch.Tensor:
    """A trainer's advantages with exactly 0 wherever `group_advantages(rewards, ...)` gives 0.

    Those are the rollouts of a group whose valid rewards are all equal and the unscorable ones; a
    trainer's float arithmetic can leave 1e-5-sized residues there (for rewards such as 0.1), which a
    max-variance selection would read as signal. Every other value is returned unchanged.

    Args:
        advantages: `(B*G,)` the trainer's advantages.
        rewards: `(B*G,)` the rewards they were computed from, NaN where unscorable.
        num_generations, scale_rewards: as for `group_advantages`.
    """
    _checks.tensor("advantages", advantages, dims=(1,), kind="float")
    reference = group_advantages(rewards, num_generations, scale_rewards=scale_rewards)  # (B*G,)
    if reference.shape != advantages.shape:
        raise ValueError(
            f"advantages {tuple(advantages.shape)} and rewards {tuple(rewards.shape)} must have the same shape"
        )
    return torch.where(reference.to(advantages.device) == 0, torch.zeros_like(advantages), advantages)
