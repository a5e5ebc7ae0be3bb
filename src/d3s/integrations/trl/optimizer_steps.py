"""Optimizer steps without signal: counted, and skipped when asked (docs/method.md section 9.4).

A step whose gradient is exactly zero (every trained rollout has advantage 0 and nothing else, a KL term or a
router loss, carries gradient) still moves the weights under Adam: its momentum and weight decay keep stepping.
`install` wraps the optimizer's `step` so that every optimizer step logs

- `d3s/zero_gradient`: 1 when the step's gradient (after clipping, every process alike: gradients are
  all-reduced before the step) is exactly zero, else 0;
- `d3s/weights_moved`: 1 when the step changed the weights, measured on the first `SAMPLE` entries of every
  parameter (Adam moves every entry whose momentum is non-zero, so a sample sees a real move);
- `d3s/optimizer_skipped`: 1 when the step was skipped: with `skip_steps_without_signal` a zero-gradient step
  leaves the weights and the optimizer's state (momentum, step count) as they were. The learning-rate schedule
  and the trainer's step counter still advance: the step happened, it had nothing to learn from.

Not installed where DeepSpeed or FSDP own the parameters (their gradients are not on the parameters; the
config refuses the option there).
"""

from __future__ import annotations

import types

import torch

SAMPLE = 64
"""Entries of each parameter compared before and after a step for `d3s/weights_moved`."""


def _params(optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def gradient_is_zero(params) -> bool:
    """Whether every gradient of `params` is absent or exactly zero."""
    return all(p.grad is None or not bool(p.grad.any()) for p in params)


def _sample(params) -> list[torch.Tensor]:
    return [p.detach().reshape(-1)[:SAMPLE].clone() for p in params]


def install(optimizer, metrics, skip: bool) -> None:
    """Wrap `optimizer.step` (see the module docstring); `metrics` is the trainer's `_metrics["train"]`. A second
    call on the same optimizer only updates `metrics` and `skip`."""
    state = getattr(optimizer, "_d3s_step_signal", None)
    if state is not None:
        state.update(metrics=metrics, skip=skip)
        return
    state = optimizer._d3s_step_signal = {"metrics": metrics, "skip": skip}
    step = optimizer.step  # the bound method

    def signal_step(opt, *args, **kwargs):
        params = _params(opt)
        zero = gradient_is_zero(params)
        before = _sample(params)
        skipped = zero and state["skip"]
        result = None if skipped else step(*args, **kwargs)
        moved = any(not torch.equal(b, p.detach().reshape(-1)[:SAMPLE]) for b, p in zip(before, params))
        state["metrics"]["d3s/zero_gradient"].append(float(zero))
        state["metrics"]["d3s/weights_moved"].append(float(moved))
        state["metrics"]["d3s/optimizer_skipped"].append(float(skipped))
        return result

    # A bound method, as torch's learning-rate schedulers expect to find (they wrap `step.__func__`)
    optimizer.step = types.MethodType(signal_step, optimizer)
