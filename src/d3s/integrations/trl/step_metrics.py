"""The metrics D3SGRPOTrainer adds to TRL's, and where a step's time goes: each written from one place here.

All of them go to TRL's metric store (`trainer._metrics["train"]`, pinned in `compat.PRIVATE_TRL_API`)
and are logged with TRL's. Definitions: docs/trl.md. Every function that reduces over processes makes
the same collective calls on every rank.
"""

from __future__ import annotations

import contextlib
import sys
import time

import torch
from transformers import TrainerCallback

from d3s.integrations.trl.compat import REPLACED_TRL_METRICS, nanmax, nanmin
from d3s.loss import clip_shares
from d3s.metrics import population_variance, sample_usefulness_rate, token_cut_warnings

STEP_TIME_PARTS = ("generation", "selection", "kl_monitor", "forward")
"""Parts of an optimizer step timed directly (`d3s/time/<part>`); `backward` is TRL's `step_time` minus these."""


class StepTimer:
    """Adds up, per optimizer step, the wall-clock of the parts in `STEP_TIME_PARTS`."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.times = dict.fromkeys(STEP_TIME_PARTS, 0.0)

    @contextlib.contextmanager
    def timed(self, part: str, training: bool):
        """Adds the block's wall-clock to this step's `part` (training only; on CUDA the device is
        synchronised at both ends, so queued kernels are counted where they were issued)."""
        if not training:
            yield
            return
        if self.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize()
            self.times[part] += time.perf_counter() - start

    def end_step(self, metrics: dict) -> None:
        """Log `d3s/time/*` for the optimizer step that just ended, and start the next one from 0."""
        times, self.times = self.times, dict.fromkeys(STEP_TIME_PARTS, 0.0)
        times["selection"] -= times["kl_monitor"]  # measured inside the selection block
        step_time = metrics["step_time"][-1] if metrics["step_time"] else sum(times.values())
        times["backward"] = max(step_time - sum(times.values()), 0.0)
        for part, seconds in times.items():
            metrics[f"d3s/time/{part}"].append(seconds)


class StepEnd(TrainerCallback):
    """Ends the `StepTimer`'s optimizer step: `on_step_end` runs once per optimizer step, after TRL's last
    `training_step` of it has logged `step_time` and before the step's metrics are logged."""

    def __init__(self, timer: StepTimer, metrics: dict):
        self.timer, self.metrics = timer, metrics  # metrics: the trainer's `_metrics["train"]`

    def on_step_end(self, args, state, control, **kwargs):
        self.timer.end_step(self.metrics)


def log_selection(
    metrics: dict,
    *,
    progress: float,
    n_keep: int,
    fraction: float,
    num_generations: int,
    rewards: torch.Tensor,
    trained_advantages: torch.Tensor,
    kept_mask: torch.Tensor,
    kept_advantages: torch.Tensor,
    valid_per_row: torch.Tensor,
    tokens_in_loss: int,
    padding_rows: int | None = None,
    nonfinite_scores: int | None = None,
    balance: tuple[float, bool] | None = None,
) -> None:
    """The `d3s/*` metrics of one generation batch (all processes), selected or not.

    Args:
        rewards: `(B*G,)` NaN where unscorable.
        trained_advantages: `(B*G,)` the advantage each rollout trains with, 0 where not kept.
        kept_mask: `(B*G,)` bool, the kept rollouts.
        kept_advantages: `(K,)` the advantages whose variance is logged.
        valid_per_row: `(B*G,)` loss tokens per rollout.
        padding_rows: zero-weight rows added to deal the kept ones evenly (None: nothing was dealt).
        nonfinite_scores: token scores that were not finite (None: no token cut).
        balance: `(balance, one_sided)` of the tokens in the loss (`d3s.metrics.advantage_balance`).
    """
    kept = int(kept_mask.sum())
    tokens_generated = float(valid_per_row.sum())
    metrics["d3s/progress"].append(progress)
    metrics["d3s/n_keep"].append(float(n_keep))
    metrics["d3s/k_fraction"].append(float(fraction))
    metrics["d3s/rollouts_kept"].append(float(kept))
    metrics["d3s/rollout_ratio"].append(kept / kept_mask.numel())
    if padding_rows is not None:
        metrics["d3s/padding_rows"].append(float(padding_rows))
    metrics["d3s/tokens_in_loss"].append(float(tokens_in_loss))
    metrics["d3s/token_consumption_ratio"].append(tokens_in_loss / max(tokens_generated, 1.0))
    metrics["d3s/sample_usefulness_rate"].append(
        sample_usefulness_rate(trained_advantages, kept_mask, num_generations).item()
    )
    metrics["d3s/advantage_variance"].append(population_variance(kept_advantages).item())
    metrics["d3s/unscorable_rollouts"].append(float(torch.isnan(rewards).sum()))
    metrics["d3s/empty_completions"].append(float((valid_per_row == 0).sum()))
    if nonfinite_scores is not None:
        metrics["d3s/nonfinite_scores"].append(float(nonfinite_scores))
    metrics["d3s/tokens_per_kept_rollout"].append(tokens_in_loss / max(kept, 1))
    if balance is not None:
        metrics["d3s/advantage_balance"].append(float(balance[0]))
        metrics["d3s/one_sided"].append(float(balance[1]))


def whole_rollout_balance(advantages: torch.Tensor, valid_per_row: torch.Tensor) -> tuple[float, bool]:
    """`(balance, one_sided)` when every valid token of the trained rollouts is in the loss: sum A_i n_i /
    sum |A_i| n_i over rollouts i (0 where none carries an advantage); never one-sided."""
    weighted = advantages.double() * valid_per_row.double()  # (B*G,)
    mass = float(weighted.abs().sum())
    return (float(weighted.sum()) / mass if mass > 0 else 0.0), False


def learning_rates(args, max_steps: int) -> list[float]:
    """The learning rate of each of `max_steps` optimizer steps under `args`' scheduler, replayed on a
    stand-in optimizer as transformers' Trainer builds it (warmup, `lr_scheduler_kwargs`)."""
    from transformers.optimization import get_scheduler

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=args.learning_rate)
    scheduler = get_scheduler(
        args.lr_scheduler_type, optimizer, num_warmup_steps=args.get_warmup_steps(max_steps),
        num_training_steps=max_steps, scheduler_specific_kwargs=args.lr_scheduler_kwargs or {},
    )
    rates = []
    for _ in range(max_steps):
        rates.append(float(scheduler.get_last_lr()[0]))
        optimizer.step()
        scheduler.step()
    return rates


class TokenCutDiagnosis:
    """Watches `d3s/tokens_per_kept_rollout`, `d3s/one_sided` and the share of completions cut off at the length cap,
    and says once on stderr (main process) when the token cut degenerates (`token_cut_warnings`)."""

    def __init__(self, args):
        self.args = args
        self.tokens_per_rollout: list[float] = []
        self.one_sided: list[float] = []
        self.clipped: list[float] = []
        self.said: set[str] = set()

    def update(self, tokens_per_rollout: float, one_sided: bool, token_selection: bool, main_process: bool = True,
               clipped: float | None = None):
        """One generation batch; `clipped`: its share of completions cut off at `max_completion_length`."""
        if not token_selection:
            return
        self.tokens_per_rollout.append(float(tokens_per_rollout))
        self.one_sided.append(float(one_sided))
        if clipped is not None:
            self.clipped.append(float(clipped))
        args = self.args
        found = token_cut_warnings(self.tokens_per_rollout, self.one_sided, k_init=args.k_init, k_final=args.k_final,
                                   token_cut=args.token_cut, clipped=self.clipped,
                                   keep_last_in_loss=bool(args.keep_last_in_loss),
                                   min_tokens_per_rollout=args.min_tokens_per_rollout or 0,
                                   mask_truncated=bool(args.mask_truncated_completions))
        for kind, message in found.items():
            if kind not in self.said:  # one warning per kind, the first time it holds
                self.said.add(kind)
                if main_process:
                    print(f"d3s: warning: {message}", file=sys.stderr, flush=True)


def log_generation(metrics: dict, flat: torch.Tensor, seconds: float, counts: dict | None) -> None:
    """What a generation batch's generation bought: its groups with signal, and what it cost to get them.

    Args:
        flat: `(B,)` bool, the groups of the batch handed on to training that have no signal (all processes).
        seconds: wall-clock of the generation (every round, reward scoring included), this process.
        counts: from `prompts.generate` when `prompt_skip` or `dynamic_sampling` is on, else None (then
            everything generated is handed on).
    """
    signal = int((~flat).sum())
    generated = counts["groups_generated"] if counts else flat.numel()
    metrics["d3s/groups_generated"].append(float(generated))
    metrics["d3s/flat_groups_generated"].append(float(counts["flat_generated"] if counts else flat.sum()))
    metrics["d3s/signal_groups"].append(float(signal))
    metrics["d3s/no_signal_step"].append(float(signal == 0))
    if signal:  # not logged for a batch without signal (TRL would log an all-NaN mean as None, which loggers refuse)
        metrics["d3s/generation_s_per_signal_group"].append(seconds / signal)
    if counts:
        metrics["d3s/prompts_skipped"].append(float(counts["skipped"]))
        metrics["d3s/prompts_unfilled"].append(float(counts["unfilled"]))
        metrics["d3s/generation_rounds"].append(float(counts["rounds"]))


def log_generated_entropy(accelerator, metrics: dict, entropies, loss_mask, also_as_entropy: bool) -> None:
    """`entropy/generated`: mean policy entropy over every generated token of every rollout (all ranks).

    With `also_as_entropy` it is TRL's `entropy` too (a run that trains on a subset of the tokens; plain
    runs log `entropy` from their training forward, over every token).
    """
    if entropies is None:
        return
    mask = loss_mask.to(entropies.dtype)
    totals = accelerator.reduce(torch.stack([(entropies * mask).sum(), mask.sum()]).float(), reduction="sum")
    value = (totals[0] / totals[1].clamp(min=1.0)).item()
    metrics["entropy/generated"].append(value)
    if also_as_entropy:
        metrics["entropy"].append(value)


def replace_sampling_metrics(accelerator, metrics: dict, old_per_token_logps, sampling_per_token_logps, loss_mask, ratio):
    """TRL logged its sampler metrics (`REPLACED_TRL_METRICS`) from placeholders; replace them with the
    kept rows' values."""
    device = ratio.device
    delta = torch.abs(old_per_token_logps - sampling_per_token_logps)
    mask = loss_mask.bool()
    delta = delta[mask & ~torch.isnan(delta)]
    flat = ratio.flatten() if ratio.size(1) == 1 else ratio[mask]
    zero = torch.zeros((), device=device)
    values = (
        (delta.mean() if delta.numel() else zero, "mean"),
        (delta.max() if delta.numel() else zero, "max"),
        (flat.min() if flat.numel() else zero, "min"),
        (flat.mean() if flat.numel() else zero, "mean"),
        (flat.max() if flat.numel() else zero, "max"),
    )
    for name, (value, how) in zip(REPLACED_TRL_METRICS, values):
        gathered = accelerator.gather(value.float().reshape(1))
        value = {"mean": gathered.nanmean(), "max": gathered.max(), "min": gathered.min()}[how].item()
        if metrics[name]:
            metrics[name][-1] = value
        else:
            metrics[name].append(value)


def log_loss_metrics(
    accelerator,
    metrics: dict,
    loss_metrics: dict | None,
    *,
    per_token_logps,
    old_per_token_logps,
    advantages,
    used,
    entropies,
    epsilon_low: float,
    epsilon_high: float,
    with_kl: bool,
) -> None:
    """TRL's loss metrics over the tokens in the loss, reduced over all ranks.

    `loss_metrics` is `d3s.policy_loss`'s; None for a micro-batch that skipped its forward (it
    contributes no token, but makes the same collective calls).
    """
    device = advantages.device
    names = ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]
    if with_kl:
        names.append("kl")
    if loss_metrics is None:
        sums = torch.zeros(2 + len(names), device=device)
        low = high = torch.full((1,), float("nan"), device=device)
    else:
        u = used.to(per_token_logps.dtype)
        n_used = loss_metrics["tokens_used"]
        sums = torch.stack(
            [(entropies.detach().float() * u).sum(), n_used.float()] + [(loss_metrics[n] * n_used).float() for n in names]
        )
        with torch.no_grad():  # TRL's per-sequence extremes of the clipped shares
            old = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
            coef = torch.exp(per_token_logps.detach() - old)  # (S, T)
            low, high = clip_shares(coef, advantages, used, epsilon_low, epsilon_high)
    skipped = accelerator.reduce(torch.tensor(float(loss_metrics is None), device=device), reduction="mean")
    metrics["d3s/skipped_forwards"].append(float(skipped))  # share of (rank, micro-batch) forwards skipped
    totals = accelerator.reduce(sums, reduction="sum")
    n = totals[1].clamp(min=1.0)
    if float(totals[1]) > 0:
        metrics["entropy/trained"].append((totals[0] / n).item())
        if "entropy/generated" not in metrics:
            metrics["entropy"].append((totals[0] / n).item())
        for i, name in enumerate(names):
            metrics[name].append((totals[2 + i] / n).item())
    low_all = accelerator.gather(accelerator.pad_across_processes(low, pad_index=float("nan")))
    high_all = accelerator.gather(accelerator.pad_across_processes(high, pad_index=float("nan")))
    if not torch.isnan(low_all).all():
        metrics["clip_ratio/low_min"].append(nanmin(low_all).item())
        metrics["clip_ratio/high_max"].append(nanmax(high_all).item())


def log_unchanged_batch(metrics, progress: float, num_generations: int, rewards, advantages, trl_advantages,
                        valid_per_row) -> dict:
    """The selection metrics of a batch nothing is cut from (`variant` grpo or gspo); returns its
    `d3s_last_selection`. `rewards`, `advantages`, `trl_advantages`, `valid_per_row`: `(B*G,)`, all ranks."""
    G, n_valid = num_generations, int(valid_per_row.sum())
    log_selection(
        metrics, progress=progress, n_keep=G, fraction=1.0, num_generations=G, rewards=rewards,
        trained_advantages=advantages, kept_mask=torch.ones_like(advantages, dtype=torch.bool),
        kept_advantages=trl_advantages, valid_per_row=valid_per_row, tokens_in_loss=n_valid,
        balance=whole_rollout_balance(advantages, valid_per_row),
    )
    return {"kept": torch.arange(advantages.numel()), "n_keep": G, "fraction": 1.0, "tokens_in_loss": n_valid,
            "entropy_source": "training forward"}


def log_aux_loss(accelerator, metrics, aux_loss) -> None:
    """TRL's `aux_loss` metric: the mean over the ranks whose micro-batch computed one (all ranks call)."""
    value = torch.full((1,), float("nan"), device=accelerator.device) if aux_loss is None else aux_loss
    gathered = accelerator.gather(value.detach().float().reshape(1))
    if not torch.isnan(gathered).all():
        metrics["aux_loss"].append(gathered.nanmean().item())
