"""Compute: the model FLOPs a run computes, and training until a compute budget is spent (docs/compare.md).

A run's compute is counted in a machine-independent unit, model FLOPs of the matrix multiplications its passes
run, from the positions the trainer counts where each pass runs (`D3SGRPOTrainer.d3s_positions`,
`d3s.integrations.trl.positions`). With N_body the parameters of the body's matrices (every matrix outside the
input and output embeddings; SmolLM2-135M: 106.17M) and N_head = d_model x vocab those of the LM head (28.31M):

    FLOPs = 2 N_body (prefill + decode + no_grad) + 6 N_body trained
          + 2 N_head (generation_head + no_grad_head) + 8 N_head trained_head

- prefill, decode: positions of generation's forwards as the generation path computed them (the shared-prefill
  path prefills each distinct prompt once and decodes only the rows still generating; transformers' `generate`
  prefills every row's padded prompt and decodes every row until the longest completion ends);
- no_grad: positions of the scoring passes without gradient (old-policy, reference, entropy);
- trained: positions of the training forwards (padding included), each forward 2 N_body and its backward 4 N_body;
- generation_head: where generation runs the head (the last prefill position of each prefill call, every decode
  position); no_grad_head: where the scoring passes run it (and a training forward without gradient);
  trained_head: where a training forward runs it with gradient, 8 N_head per position: the chunked log-prob
  kernel's forward 2, and its backward 6 (it recomputes the logits, then the two gradients).

Left out: attention's scores and values (about 4 n_layers d_attn ctx per position forward, 2-4% of the body's
FLOPs at the default recipe's 60-120-token contexts), norms, activations and softmax, and the forward that gradient
checkpointing recomputes in the backward (a memory-for-compute trade of the recipe; torch stops it early where it
can, 1.5 N_body per trained position of a Llama layer instead of 2). Held-out evaluations and the
KL monitor are measurement, not training, and are not counted. This is convention `FLOPS_CONVENTION`; runs made
before it counted `LEGACY_FLOPS_CONVENTION` (`FLOPS_CONVENTIONS` says what each counts).

With a budget (`d3s train --compute_budget F`) the run trains until it has spent F, whatever the number of
steps: `Budget` is the one rule for when it stops and when it evaluates, a pure function of the run's
cumulative FLOPs after each step, so a resumed run decides exactly as an uninterrupted one. The learning
rate and D3S's N/K schedule follow the share of the budget spent (`budget_lr_scheduler`,
`d3s.app.run_trainer.RunTrainer.d3s_progress`), so a run that gets twice the steps decays over twice the steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from d3s.app.errors import RecipeError

FLOPS_CONVENTION = "computed-v2"
"""How `d3s train` counts a run's FLOPs now (the module docstring); recorded in `run_config.json` and `summary.json`."""

LEGACY_FLOPS_CONVENTION = "estimate-v1"
"""How runs counted them before they recorded a convention: a run without `flops_convention` counted these."""

FLOPS_CONVENTIONS = {
    LEGACY_FLOPS_CONVENTION: "estimated model FLOPs: 2N per prompt and completion token of every rollout (a prompt "
                             "once per rollout) and per scoring position, 6N per trained position, N the parameters "
                             "outside the embeddings, the LM head left out",
    FLOPS_CONVENTION: "model FLOPs as computed: generation as its path ran it (each distinct prompt prefilled once on "
                      "the shared-prefill path), the body's matrices 2 per parameter and position forward and 4 "
                      "backward, the LM head where it runs (8 per parameter and position with gradient), attention's "
                      "scores left out",
}
"""What each FLOP convention counts, in one line (docs/compare.md gives the formulas)."""

RECORD_COUNTS = {
    "prefill": "prefill_positions",
    "decode": "decode_positions",
    "generation_head": "generation_head_positions",
    "no_grad": "no_grad_tokens",
    "no_grad_head": "no_grad_head_positions",
    "trained": "computed_tokens",
    "trained_head": "trained_head_positions",
}
"""Each count of the trainer's positions (`d3s.integrations.trl.positions.COUNTS`) -> the field of a train record
of `metrics.jsonl` that holds its running total (a resumed run continues from them)."""


def flops_convention(saved: Mapping | None) -> str:
    """The FLOP convention a run's `summary.json` or `run_config.json` records (`LEGACY_FLOPS_CONVENTION` where it
    records none: it was made before they were)."""
    return (saved or {}).get("flops_convention") or LEGACY_FLOPS_CONVENTION


@dataclass(frozen=True)
class ModelShape:
    """The parameters a position's FLOPs are counted from."""

    n_body: int
    """Parameters of the body's matrix multiplications: every parameter of two or more dimensions outside the input
    and output embeddings (norm weights and biases left out)."""
    n_head: int
    """Parameters of the LM head's matrix: d_model x vocab (also when tied to the input embedding)."""


def model_shape(model) -> ModelShape:
    """The `ModelShape` of a transformers causal LM (a tied head counted once, as the head)."""
    head = model.get_output_embeddings()
    skip = set()
    for module in (model.get_input_embeddings(), head):
        if module is not None:
            skip.update(id(p) for p in module.parameters())
    seen, n_body = set(), 0
    for p in model.parameters():
        if id(p) not in seen and id(p) not in skip and len(getattr(p, "ds_shape", p.shape)) >= 2:
            seen.add(id(p))
            n_body += parameter_count(p)
    return ModelShape(n_body=n_body, n_head=parameter_count(head.weight) if head is not None else 0)


def computed_flops(shape: ModelShape, counts: Mapping[str, float]) -> float:
    """The FLOPs of `counts` (`RECORD_COUNTS`' keys: positions of the body and of the LM head per kind of pass), by
    the formula of the module docstring."""
    body_forward = counts["prefill"] + counts["decode"] + counts["no_grad"]
    head_forward = counts["generation_head"] + counts["no_grad_head"]
    return (2.0 * shape.n_body * (body_forward + 3.0 * counts["trained"])
            + 2.0 * shape.n_head * (head_forward + 4.0 * counts["trained_head"]))


def parameter_count(p) -> int:
    """A parameter's size, also where DeepSpeed ZeRO-3 holds only a shard of it."""
    return int(getattr(p, "ds_numel", p.numel()))


HORIZON = 100_000
"""The virtual number of steps over which a budgeted run replays its learning-rate schedule's shape."""


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
            raise RecipeError(f"compute_budget={self.flops!r} must be > 0 (model FLOPs)")
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
    """Set a run's trainer to count its FLOPs (the shape of `model`, the budget), continuing a resumed run's counts
    from its last record."""
    trainer.d3s_shape = model_shape(model)
    trainer.d3s_budget = callback.budget
    callback.trainer = trainer
    last = run_log.last("train")
    if last is not None:
        trainer.d3s_positions.restore({name: last.get(field) for name, field in RECORD_COUNTS.items()})


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
