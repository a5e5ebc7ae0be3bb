"""Compute: the estimated model FLOPs of a run, and training until a compute budget is spent (docs/compare.md).

A run's compute is counted in a machine-independent unit, estimated model FLOPs, from positions the
trainer counts (`D3SGRPOTrainer.d3s_positions`, TRL's `num_tokens`), with N the model's non-embedding
parameters (input and output embeddings left out, as in Kaplan et al. 2020):

    FLOPs = 2 N (generated + no_grad) + 6 N trained

- generated: prompt and completion tokens of every rollout (TRL's `num_tokens`: a prompt's positions
  count once per rollout, padding not at all, whatever the generation path computed);
- no_grad: positions of the scoring passes without gradient (old-policy, reference, entropy);
- trained: positions of the training forwards (padding included, as computed), each forward 2N and its
  backward 4N per position.

Held-out evaluations and the KL monitor are measurement, not training, and are not counted.

With a budget (`d3s train --compute_budget F`) the run trains until it has spent F, whatever the number of
steps: `Budget` is the one rule for when it stops and when it evaluates, a pure function of the run's
cumulative FLOPs after each step, so a resumed run decides exactly as an uninterrupted one. The learning
rate and D3S's N/K schedule follow the share of the budget spent (`budget_lr_scheduler`,
`d3s.app.run_trainer.RunTrainer.d3s_progress`), so a run that gets twice the steps decays over twice the steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from d3s.app.errors import RecipeError

HORIZON = 100_000
"""The virtual number of steps over which a budgeted run replays its learning-rate schedule's shape."""


def non_embedding_parameters(model) -> int:
    """Parameters of `model` outside its input and output embeddings (a tied head counted once, and left out)."""
    skip = set()
    for get in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(model, get, lambda: None)()
        if module is not None:
            skip.update(id(p) for p in module.parameters())
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen and id(p) not in skip:
            seen.add(id(p))
            total += parameter_count(p)
    return total


def estimated_flops(n_params: int, generated: float, trained: float, no_grad: float) -> float:
    """`2 N (generated + no_grad) + 6 N trained` (see the module docstring)."""
    return 2.0 * n_params * (generated + no_grad) + 6.0 * n_params * trained


def parameter_count(p) -> int:
    """A parameter's size, also where DeepSpeed ZeRO-3 holds only a shard of it."""
    return int(getattr(p, "ds_numel", p.numel()))


@dataclass
class Budget:
    """Train until `flops` are spent; evaluate at `eval_shares` of them.

    After each step with cumulative FLOPs f and step cost d (f minus the previous step's f), a point at
    x FLOPs is reached when f >= x - d / 2: the step boundary nearest to x, with the step just done as the
    estimate of the next. The run stops when the budget is reached, and evaluates when a share is reached
    (once per share; several at one step are one evaluation).
    """

    flops: float
    eval_shares: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.flops > 0:
            raise RecipeError(f"compute_budget={self.flops!r} must be > 0 (estimated model FLOPs)")
        bad = [s for s in self.eval_shares if not 0 < s < 1]
        if bad or list(self.eval_shares) != sorted(set(self.eval_shares)):
            raise RecipeError(f"budget_eval_shares={','.join(map(str, self.eval_shares))}: give increasing shares "
                              "of the budget in (0, 1), e.g. 0.2,0.4,0.6,0.8 (the end is always evaluated)")

    def progress(self, spent: float) -> float:
        """The share of the budget spent, in [0, 1]."""
        return min(1.0, max(0.0, spent / self.flops))

    @staticmethod
    def _reached(point: float, spent: float, step: float) -> bool:
        return spent >= point - step / 2

    def done(self, spent: float, step: float) -> bool:
        return self._reached(self.flops, spent, step)

    def evaluations(self, cumulative: Sequence[float]) -> tuple[list[int], int]:
        """`(indices of the steps that evaluate, shares already passed)` for cumulative FLOPs after each step
        (index 0 is the first step)."""
        due, k, before = [], 0, 0.0
        for i, spent in enumerate(cumulative):
            hit = False
            while k < len(self.eval_shares) and self._reached(self.eval_shares[k] * self.flops, spent, spent - before):
                k, hit = k + 1, True
            if hit:
                due.append(i)
            before = spent
        return due, k


def budget_spent(budget: Budget, flops: Sequence[float]) -> bool:
    """Whether a run whose steps ended at cumulative `flops` (the records' `flops`) stopped at `budget`: its
    last step reached it (`Budget.done`), as the run decided when it stopped."""
    if not flops:
        return False
    return budget.done(flops[-1], flops[-1] - (flops[-2] if len(flops) > 1 else 0.0))


def parse_shares(text: str) -> tuple[float, ...]:
    """`"0.2,0.4"` -> `(0.2, 0.4)`; one line naming the value when it is not a list of numbers."""
    try:
        return tuple(float(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise RecipeError(f"budget_eval_shares={text!r}: give comma-separated shares in (0, 1), e.g. 0.2,0.4,0.6,0.8") \
            from None


def budget_lr_scheduler(args, optimizer, progress: Callable[[], float]):
    """The learning-rate schedule of `args` (type, warmup ratio, kwargs) over the share of the budget spent
    instead of the share of steps: its shape on `HORIZON` virtual steps, read at the real number
    `progress() * HORIZON` each time the scheduler steps. Only schedules that transformers builds as a `LambdaLR` (all but reduce_lr_on_plateau)."""
    import torch
    from transformers import get_scheduler

    if getattr(args, "warmup_steps", 0) and args.warmup_steps >= 1:
        raise RecipeError(f"warmup_steps={args.warmup_steps} counts steps, which a compute budget does not fix; give "
                          "the warmup as a share of the budget: warmup_steps below 1 (e.g. 0.1, the first tenth)")
    shape = get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=args.get_warmup_steps(HORIZON),
                          num_training_steps=HORIZON, scheduler_specific_kwargs=args.lr_scheduler_kwargs or {})
    if not isinstance(shape, torch.optim.lr_scheduler.LambdaLR) or len({id(f) for f in shape.lr_lambdas}) != 1:
        name = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
        raise RecipeError(f"lr_scheduler_type={name!r} cannot follow a compute budget; valid: a "
                          "schedule of the step alone, e.g. linear, cosine, constant, constant_with_warmup")
    factor = shape.lr_lambdas[0]
    for group in optimizer.param_groups:  # the base rates, as before `shape` scaled them
        group["lr"] = group["initial_lr"]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: factor(progress() * HORIZON))


def run_budget(run) -> Budget | None:
    """The `Budget` of a `d3s train` run's settings (`RunArgs`), None without `compute_budget`."""
    if not run.compute_budget:
        return None
    return Budget(run.compute_budget, parse_shares(run.budget_eval_shares))


def budget_summary(budget: Budget | None, flops: Sequence[float]) -> dict | None:
    """What `summary.json` says of a budgeted run whose steps ended at cumulative `flops`: the budget, what was
    spent, its share, and what ended the run ("budget", or "max_steps" when the cap on steps came first)."""
    if budget is None:
        return None
    spent = flops[-1] if flops else 0.0
    return {"flops": budget.flops, "spent": spent, "share": spent / budget.flops,
            "eval_shares": list(budget.eval_shares),
            "stopped_by": "budget" if budget_spent(budget, flops) else "max_steps"}


def count_compute(trainer, callback, model, run_log) -> None:
    """Set a run's trainer to count its FLOPs (N of `model`, the budget), continuing a resumed run's counts from
    its last record."""
    trainer.d3s_n_params = non_embedding_parameters(model)
    trainer.d3s_budget = callback.budget
    callback.trainer = trainer
    last = run_log.last("train")
    if last is not None:
        trainer.d3s_positions.trained = last.get("computed_tokens") or 0.0
        trainer.d3s_positions.no_grad = last.get("no_grad_tokens") or 0.0


def check_budget(run, config) -> None:
    """Refuse, in one line, settings a compute budget cannot run with."""
    if not run.compute_budget:
        return
    if config.max_steps < 1:
        raise RecipeError(f"compute_budget={run.compute_budget:g} needs max_steps >= 1 as a cap on the steps (the "
                          "budget ends the run); d3s compare sets it")
    if getattr(config, "schedule_clock", "steps") != "steps":
        raise RecipeError(f"schedule_clock={config.schedule_clock!r} with compute_budget: the schedule then follows "
                          "the share of the budget spent; leave schedule_clock at 'steps'")
    if run.eval_every:
        raise RecipeError(f"eval_every={run.eval_every} with compute_budget: evaluate at shares of the budget "
                          "(budget_eval_shares) instead, so that runs of different step costs compare")
    import torch

    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    budget_lr_scheduler(config, probe, lambda: 0.0)  # one line for a schedule that cannot follow a budget
