"""What a run's records (`metrics.jsonl`, read by `d3s.app.runfiles.read_run_records`) say of it: seconds per
step and its parts, steps without signal and zero-gradient optimizer steps, the token cut, what generation bought
(`d3s compare` reports them), and `run_summary`, what `summary.json` holds."""

from __future__ import annotations

import statistics
import time
from typing import Any

from d3s.app.budget import FLOPS_CONVENTION
from d3s.app.runfiles import RunLog
from d3s.metrics import token_cut_warnings


TIME_PREFIX = "d3s/time/"
"""A record's `d3s/time/<part>` fields: the seconds of one part of a training step, as the trainer timed and
named them (`d3s.integrations.trl` logs them; together they add up to `step_time`)."""


def step_parts(records: list[dict]) -> list[str]:
    """The timed parts of a training step that `records` carry, in the order they first appear."""
    parts: dict[str, None] = {}
    for r in records:
        parts.update((key[len(TIME_PREFIX):], None) for key in r if key.startswith(TIME_PREFIX))
    return list(parts)


def step_seconds(records: list[dict]) -> dict[str, float] | None:
    """Mean seconds per training step: `step` (TRL's `step_time`: the micro-batches' work, generation included,
    the optimizer update not) and each timed part the records carry. None without train records."""
    train = [r for r in records if r.get("type") == "train"]
    out = {}
    for name, key in (("step", "step_time"), *((p, TIME_PREFIX + p) for p in step_parts(train))):
        values = [r[key] for r in train if r.get(key) is not None]
        if values:
            out[name] = sum(values) / len(values)
    return out or None


def no_signal_share(records: list[dict]) -> float | None:
    """Share of training steps in which every group had equal rewards: their gradient is zero for every variant.

    Read from `d3s/no_signal_step` (the groups handed on to training, after `dynamic_sampling`) where the
    records have it, else from TRL's `frac_reward_zero_std` = 1."""
    flags = [r.get("d3s/no_signal_step") for r in records if r.get("type") == "train"]
    flags = [f for f in flags if f is not None]
    if flags:
        return sum(f > 0.5 for f in flags) / len(flags)
    steps = [r.get("frac_reward_zero_std") for r in records if r.get("type") == "train"]
    steps = [s for s in steps if s is not None]
    return sum(s >= 1.0 - 1e-9 for s in steps) / len(steps) if steps else None


def zero_gradient_steps(records: list[dict]) -> dict | None:
    """Optimizer steps whose gradient was exactly zero (`d3s/zero_gradient`), how many of them still moved the
    weights (Adam's momentum) and how many were skipped (`skip_steps_without_signal`), of `steps` recorded.
    None for records made before these were logged."""
    steps = [r for r in records if r.get("type") == "train" and r.get("d3s/zero_gradient") is not None]
    if not steps:
        return None
    zero = [r for r in steps if r["d3s/zero_gradient"] > 0.5]
    return {"steps": len(steps), "zero_gradient": len(zero),
            "moved": sum(r.get("d3s/weights_moved", 0.0) > 0.5 for r in zero),
            "skipped": sum(r.get("d3s/optimizer_skipped", 0.0) > 0.5 for r in zero)}


def token_cut_summary(records: list[dict], *, token_selection: bool, k_init, k_final, token_cut: str,
                      max_grad_norm: float | None, keep_last_in_loss: bool = False, min_tokens_per_rollout: int = 0,
                      mask_truncated: bool = False) -> dict[str, Any] | None:
    """What `summary.json` says of the token cut and the update size: median tokens in the loss per kept rollout,
    the share of one-sided steps (`d3s/one_sided`), of steps whose gradient norm was clipped (`grad_norm`, logged
    before clipping, above `max_grad_norm`), and the token cut's warnings (`d3s.metrics.token_cut_warnings`).
    None without train records."""
    train = [r for r in records if r.get("type") == "train"]
    if not train:
        return None

    def values(key):
        return [r[key] for r in train if r.get(key) is not None]

    per_rollout, one_sided, norms = values("d3s/tokens_per_kept_rollout"), values("d3s/one_sided"), values("grad_norm")
    warnings = {}
    if token_selection:
        warnings = token_cut_warnings(per_rollout, one_sided, k_init=k_init, k_final=k_final, token_cut=token_cut,
                                      clipped=values("completions/clipped_ratio"), keep_last_in_loss=keep_last_in_loss,
                                      min_tokens_per_rollout=min_tokens_per_rollout, mask_truncated=mask_truncated)
    clip = max_grad_norm if max_grad_norm and max_grad_norm > 0 else None
    return {
        "tokens_per_kept_rollout": statistics.median(per_rollout) if per_rollout else None,
        "one_sided_steps": sum(v > 0.5 for v in one_sided) / len(one_sided) if one_sided else None,
        "clipped_steps": sum(n > clip for n in norms) / len(norms) if norms and clip else None,
        "warnings": list(warnings.values()),
    }


def generation_summary(records: list[dict]) -> dict[str, float | None] | None:
    """What a run's generation bought, from the `d3s/*` generation metrics of its train records (None when the
    records predate them): prompts skipped and flat groups generated per step, and the generation seconds per
    group with signal over the whole run (all generation time / all groups with signal handed to training)."""
    train = [r for r in records if r.get("type") == "train" and "d3s/signal_groups" in r]
    if not train:
        return None

    def total(key: str) -> float | None:
        values = [r[key] for r in train if r.get(key) is not None]
        return sum(values) if values else None

    signal, seconds = total("d3s/signal_groups"), total(TIME_PREFIX + "generation")
    skipped, flat = total("d3s/prompts_skipped"), total("d3s/flat_groups_generated")
    return {
        "prompts_skipped_per_step": None if skipped is None else skipped / len(train),
        "flat_groups_per_step": None if flat is None else flat / len(train),
        "groups_generated_per_step": (total("d3s/groups_generated") or 0.0) / len(train),
        "generation_s_per_signal_group": seconds / signal if seconds is not None and signal else None,
    }


def run_summary(run, config, steps: int, heldout_size: int, before: dict | None, after: dict, run_log: RunLog,
                started: float, version: str, budget: dict | None, load: dict | None = None) -> dict[str, Any]:
    """What `summary.json` records of a finished run (`run`, `config`: its `RunArgs` and `D3SConfig`; `started`:
    the `time.perf_counter()` of the command's start; `budget`: what its compute budget bought, or None; `load`:
    the machine's load when the command started and now, `{"start": ..., "end": ...}`, each
    `d3s.app.machine.machine_load()`); it holds every field of `SUMMARY_FIELDS`."""
    last_train = run_log.last("train") or {}
    generation = generation_summary(run_log.records)
    return {
        "variant": config.variant or "custom",
        "seed": config.seed,
        "steps": steps,
        "model": run.model,
        "task": run.task,
        "heldout_size": heldout_size,
        "before": {k: v for k, v in (before or {}).items() if k != "examples"},
        "after": {k: v for k, v in after.items() if k != "examples"},
        "train_wall_s": last_train.get("wall_s"),
        "trained_tokens": last_train.get("trained_tokens"),
        "generated_tokens": last_train.get("generated_tokens"),
        "computed_tokens": last_train.get("computed_tokens"),
        "flops": last_train.get("flops"),
        "flops_convention": FLOPS_CONVENTION,
        "budget": budget,
        "no_signal_steps": no_signal_share(run_log.records),
        "zero_gradient_steps": zero_gradient_steps(run_log.records),
        "below_start": [r["below_start"] for r in run_log.records if r.get("type") == "eval" and r.get("below_start")],
        "generation": {k: v for k, v in (generation or {}).items() if k != "generation_s_per_signal_group"} or None,
        "generation_s_per_signal_group": (generation or {}).get("generation_s_per_signal_group"),
        "step_seconds": step_seconds(run_log.records),
        "token_cut": token_cut_summary(
            run_log.records, token_selection=bool(config.token_selection), k_init=config.k_init,
            k_final=config.k_final, token_cut=config.token_cut, max_grad_norm=config.max_grad_norm,
            keep_last_in_loss=bool(config.keep_last_in_loss), min_tokens_per_rollout=config.min_tokens_per_rollout or 0,
            mask_truncated=bool(config.mask_truncated_completions),
        ),
        "command_wall_s": time.perf_counter() - started,
        "load": load,
        "code_version": version,
        "examples_after": after.get("examples", []),
    }
