"""The arithmetic of one generation batch inside a trainer, as plain functions.

A trainer that down-samples rollouts has to decide three things the maths of the method leaves
open; they live here, apart from any trainer, so they can be tested against plain loops:

- `deal_rows`: the K kept rollouts of a generation batch (global row indices, gathered from every
  process) are dealt out again so that every process holds the same number of rows, a multiple of
  the micro-batches per generation; the remainder is padding (`-1`), which trains nothing.
- `loss_denominator`: what one micro-batch's loss is divided by, so that the update of a whole
  generation batch does not depend on how its rows are split over micro-batches and processes.
- `sampler_correction_ratio`: the truncated (or masked) importance ratio pi_old / pi_sampler that
  corrects for a sampler (vLLM) whose probabilities differ from the trainer's, per token or per
  sequence (TRL's `vllm_importance_sampling_correction`, the same arithmetic).
- `last_used_column`: where the forward of a causal model may stop: no position after a row's last
  used token can change that row's loss.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

LossType = Literal["grpo", "dapo", "bnpo", "dr_grpo"]
CorrectionMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not (
        isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point()
    ):
        raise ValueError(f"{name}={value!r} must be an integer")
    return int(value)


def deal_rows(kept: torch.Tensor, num_processes: int, steps_per_generation: int) -> torch.Tensor:
    """Deal the kept rows over processes: `(P, R)` global row indices, `-1` for padding.

    Every process gets R = steps_per_generation * ceil(K / (P * steps_per_generation)) rows (at
    least steps_per_generation), so each splits into `steps_per_generation` equal micro-batches.
    Kept rows are dealt in order, process 0 first; the padding (fewer than P * steps_per_generation
    rows) lands on the last process(es).

    Args:
        kept: `(K,)` global row indices of the kept rollouts.
        num_processes: P >= 1.
        steps_per_generation: micro-batches per generation batch, >= 1.
    """
    P, spg = _count("num_processes", num_processes), _count("steps_per_generation", steps_per_generation)
    if P < 1 or spg < 1:
        raise ValueError(f"num_processes={P} and steps_per_generation={spg} must be >= 1")
    if kept.dim() != 1 or kept.is_floating_point():
        raise ValueError(f"kept must be a 1-D integer tensor, got {tuple(kept.shape)} {kept.dtype}")
    K = kept.numel()
    rows_per_process = spg * max(1, math.ceil(K / (P * spg)))
    slots = torch.full((P * rows_per_process,), -1, dtype=torch.long, device=kept.device)  # (P*R,)
    slots[:K] = kept
    return slots.view(P, rows_per_process)  # (P, R)


def loss_denominator(
    loss_type: LossType,
    *,
    num_rows: int,
    num_tokens: int,
    num_processes: int,
    gradient_accumulation_steps: int,
    steps_per_generation: int,
    rows_in_micro_batch: int,
    max_completion_length: int,
) -> tuple[str, float | None, float]:
    """`(aggregation, denominator, accumulation divisor)` of one micro-batch's loss.

    `grpo` (mean over sequences) and `dapo` (mean over tokens) divide by a count over the WHOLE
    generation batch — `num_rows` rows or `num_tokens` tokens of all processes — taken as the share
    one process's micro-batch has of one optimizer step: an optimizer step sums
    `gradient_accumulation_steps` micro-batches on each of P processes and averages over processes,
    and a generation batch spans `steps_per_generation` micro-batches, so

        denominator = count * gradient_accumulation_steps / steps_per_generation / P.

    Summed over the micro-batches and averaged over processes, this is exactly the mean over the
    generation batch, however its rows are split. `bnpo` and `dr_grpo` keep TRL's per-micro-batch
    divisors (`None`: the micro-batch's own token count; `rows_in_micro_batch * max_completion_length`)
    and divide by `gradient_accumulation_steps`.
    """
    for name, value in (
        ("num_rows", num_rows),
        ("num_tokens", num_tokens),
        ("num_processes", num_processes),
        ("gradient_accumulation_steps", gradient_accumulation_steps),
        ("steps_per_generation", steps_per_generation),
        ("rows_in_micro_batch", rows_in_micro_batch),
        ("max_completion_length", max_completion_length),
    ):
        if _count(name, value) < 0:
            raise ValueError(f"{name}={value} must be >= 0")
    if min(num_processes, gradient_accumulation_steps, steps_per_generation) < 1:
        raise ValueError(
            f"num_processes={num_processes}, gradient_accumulation_steps={gradient_accumulation_steps}, "
            f"steps_per_generation={steps_per_generation} must be >= 1"
        )
    share = gradient_accumulation_steps / steps_per_generation / num_processes
    if loss_type == "grpo":
        return "sequence", max(int(num_rows), 1) * share, 1.0
    if loss_type == "dapo":
        return "token", max(int(num_tokens), 1) * share, 1.0
    if loss_type == "bnpo":
        return "token", None, float(gradient_accumulation_steps)
    if loss_type == "dr_grpo":
        return "token", float(max(int(rows_in_micro_batch), 1) * max_completion_length), float(gradient_accumulation_steps)
    raise ValueError(f"loss_type={loss_type!r}; valid: 'grpo', 'dapo', 'bnpo', 'dr_grpo'")


def sampler_correction_ratio(
    old_per_token_logps: torch.Tensor,
    sampling_per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: CorrectionMode,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """Importance ratio pi_old / pi_sampler that corrects for the sampler (vLLM), TRL's arithmetic.

    Per token, d = (log pi_old - log pi_sampler) * mask, with NaN (a token the sampler could not
    score) read as 0 (no correction). `token_*` modes: ratio exp(d) per token, `(S, T)`;
    `sequence_*` modes: exp(sum_t d) per sequence, `(S, 1)`. `*_truncate` clamps the ratio to
    [clip_min, clip_max]; `*_mask` sets ratios outside it to 0 (a missing bound is no bound).
    """
    if old_per_token_logps.shape != sampling_per_token_logps.shape or old_per_token_logps.shape != mask.shape:
        raise ValueError(
            f"old_per_token_logps {tuple(old_per_token_logps.shape)}, sampling_per_token_logps "
            f"{tuple(sampling_per_token_logps.shape)} and mask {tuple(mask.shape)} must all be (S, T)"
        )
    diff = torch.nan_to_num((old_per_token_logps - sampling_per_token_logps) * mask, nan=0.0)  # (S, T)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)  # (S, 1)
    elif mode not in ("token_mask", "token_truncate"):
        raise ValueError(
            f"mode={mode!r}; valid: 'token_truncate', 'token_mask', 'sequence_truncate', 'sequence_mask'"
        )
    ratio = torch.exp(diff)  # (S, T) or (S, 1)
    if mode.endswith("_truncate"):
        return ratio if clip_min is None and clip_max is None else torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def last_used_column(used: torch.Tensor) -> int:
    """1 + the last column holding a used token in any row of `(S, T)` `used`; 0 when none is used.

    A causal model's output at position t depends only on positions <= t, so a forward over the
    first `last_used_column(used)` completion positions gives every used token's log-probability.
    """
    if used.dim() != 2:
        raise ValueError(f"used must be (S, T), got {tuple(used.shape)}")
    cols = used.bool().any(dim=0).nonzero()  # (C, 1)
    return int(cols.max()) + 1 if cols.numel() > 0 else 0
