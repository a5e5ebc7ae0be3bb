"""Compute budgets (`d3s.app.budget`): the FLOP count against what hooks on the model count independently in a
run, the stop and evaluation rule against a plain loop, the learning rate over the share spent against transformers' own schedule,
and a budgeted `d3s train` run end to end: it stops at the budget, evaluates at its shares, its N/K schedule and
learning rate follow the share spent, and a kill then a resume ends in the uninterrupted run."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from d3s.app.budget import (FLOPS_CONVENTION, RECORD_COUNTS, Budget, ModelShape, budget_lr_scheduler, computed_flops,
                            model_shape)
from d3s.app.errors import RecipeError
from d3s.app.recipe import parse_train_args

pytest.importorskip("trl")

from run_helpers import _sigint_raises, _use_cache, cache  # noqa: E402,F401  (fixtures)
from run_helpers import assert_same_run, killed, records, train, train_killed_at  # noqa: E402

BUDGETED = ("--eval_every", "0", "--max_steps", "16", "--plots", "false")


# ---------------------------------------------------------------------------------------------
# The rule, the schedule, the parameter count
# ---------------------------------------------------------------------------------------------


def _first_reaching(point: float, cumulative: list[float]) -> int | None:
    """The first step whose end is the boundary nearest `point`, judged with that step's cost: a plain loop."""
    before = 0.0
    for i, spent in enumerate(cumulative):
        if point - spent <= (spent - before) / 2:
            return i
        before = spent
    return None


@pytest.mark.parametrize("trial", range(200))
def test_stops_and_evaluations_are_the_nearest_step_boundaries(trial):
    rng = random.Random(trial)
    costs = [rng.uniform(0.5, 3.0) for _ in range(rng.randint(1, 30))]
    cumulative = [sum(costs[: i + 1]) for i in range(len(costs))]
    flops = rng.uniform(1.0, sum(costs) * 1.2)
    shares = tuple(sorted({round(rng.uniform(0.05, 0.95), 3) for _ in range(rng.randint(0, 5))}))
    budget = Budget(flops, shares)
    due, passed = budget.evaluations(cumulative)
    want = sorted({i for s in shares if (i := _first_reaching(s * flops, cumulative)) is not None})
    assert due == want
    assert passed == sum(_first_reaching(s * flops, cumulative) is not None for s in shares)
    stop = _first_reaching(flops, cumulative)
    assert [budget.done(c, c - (cumulative[i - 1] if i else 0.0)) for i, c in enumerate(cumulative)].index(True) \
        == stop if stop is not None else not any(
            budget.done(c, c - (cumulative[i - 1] if i else 0.0)) for i, c in enumerate(cumulative))


@pytest.mark.parametrize("kind,warmup", [("linear", 0.0), ("cosine", 0.0), ("cosine", 0.1), ("constant_with_warmup", 0.2)])
def test_the_learning_rate_follows_the_share_spent_as_transformers_follows_steps(kind, warmup):
    from transformers import get_scheduler

    _, config, _ = parse_train_args(["--config", "smoke", "--lr_scheduler_type", kind, "--warmup_steps", str(warmup)])
    steps = 1000  # a divisor of the virtual horizon: the shares k / steps are exact there
    params = [torch.zeros(1, requires_grad=True)]
    theirs = get_scheduler(kind, torch.optim.SGD(params, lr=2.0), num_warmup_steps=config.get_warmup_steps(steps),
                           num_training_steps=steps)
    share = [0.0]
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=2.0)
    ours = budget_lr_scheduler(config, optimizer, lambda: share[0])
    for k in range(steps):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(theirs.get_last_lr()[0], rel=1e-9, abs=1e-12), k
        theirs.step()
        share[0] = (k + 1) / steps
        ours.step()


def test_the_model_shape_is_the_bodys_matrices_and_the_head():
    from transformers import LlamaConfig, LlamaForCausalLM

    for tied in (True, False):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=101, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tied))
        body = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name
                   and "lm_head" not in name and p.dim() == 2)  # norm weights left out: no matrix product
        assert model_shape(model) == ModelShape(n_body=body, n_head=16 * 101) and body == 2 * (4 * 16 * 16 + 3 * 16 * 32)


def test_the_flops_formula_by_hand():
    shape = ModelShape(n_body=10, n_head=3)
    counts = {"prefill": 1, "decode": 2, "generation_head": 4, "no_grad": 8, "no_grad_head": 16, "trained": 32,
              "trained_head": 64}
    assert set(counts) == set(RECORD_COUNTS)
    body = 2 * 10 * (1 + 2 + 8) + 6 * 10 * 32  # forwards 2 N_body, training forward and backward 6 N_body
    head = 2 * 3 * (4 + 16) + 8 * 3 * 64  # forwards 2 N_head, with gradient 8 N_head (the kernel recomputes)
    assert computed_flops(shape, counts) == body + head


@pytest.mark.parametrize("args,named", [
    (["--compute_budget", "1e9", "--max_steps", "-1"], "max_steps"),
    (["--compute_budget", "1e9", "--eval_every", "2"], "eval_every=2"),
    (["--compute_budget", "1e9", "--eval_every", "0", "--schedule_clock", "learning_rate"], "schedule_clock"),
    (["--compute_budget", "1e9", "--eval_every", "0", "--warmup_steps", "3"], "warmup_steps=3"),
    (["--compute_budget", "1e9", "--eval_every", "0", "--lr_scheduler_type", "reduce_lr_on_plateau"],
     "reduce_lr_on_plateau"),
    (["--compute_budget", "1e9", "--eval_every", "0", "--budget_eval_shares", "0.5,0.2"], "0.5,0.2"),
    (["--compute_budget", "1e9", "--eval_every", "0", "--budget_eval_shares", "half"], "half"),
    (["--compute_budget", "-1"], "compute_budget=-1"),
    (["--budget_eval_shares", "0.5"], "needs compute_budget"),
])
def test_settings_a_budget_cannot_run_with_are_refused_in_one_line(args, named):
    with pytest.raises(RecipeError) as err:
        parse_train_args(["--config", "smoke", *args])
    assert named in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


def _train_records(out: Path) -> list[dict]:
    return [r for r in records(out) if r["type"] == "train"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache) -> Path:
    """A GRPO smoke run of 4 steps, its forward passes counted by a hook on the model."""
    out = tmp_path_factory.mktemp("reference") / "run"
    assert train(out, "--variant", "grpo", "--plots", "false") == 0
    return out


def _budget(reference: Path) -> float:
    """A quarter of the reference's FLOPs: a smoke D3S step costs about a tenth of a GRPO one (the same generation,
    a token cut that trains a few tokens), so 16 steps would not spend the whole."""
    return json.loads((reference / "summary.json").read_text())["flops"] / 4


@pytest.fixture(scope="module")
def budgeted(reference, tmp_path_factory, cache) -> Path:
    """A D3S run on a quarter of the reference's compute, evaluated at a third and two thirds of it."""
    flops = _budget(reference)
    out = tmp_path_factory.mktemp("budgeted") / "run"
    assert train(out, "--compute_budget", repr(flops), "--budget_eval_shares", "0.33,0.67", *BUDGETED) == 0
    return out


@pytest.mark.parametrize("variant,shared", [("grpo", False), ("d3s", True)])
def test_the_flops_count_what_the_model_computes(tmp_path, cache, monkeypatch, variant, shared):
    """The records' FLOPs are `computed_flops` of the position counts they hold; the forwards of the body and the
    generation's LM head, which hooks on every linear layer count independently (2 x in x out per position of each
    call's input; the held-out evaluation aside), are exactly those counts. Plain GRPO through transformers'
    `generate` (padded rows decoded to the longest completion) and TRL's own training forward; D3S through the
    shared-prefill path and the selective head."""
    from d3s.app import train as train_mod

    counted = {"grad": 0, "linear": 0, "evaluating": False}
    load = train_mod._load_model

    def load_counting(*args, **kwargs):
        model, tokenizer, path = load(*args, **kwargs)
        counted["shape"] = model_shape(model)

        def hook(module, args, kwargs):
            if torch.is_grad_enabled() and module.training:
                ids = kwargs.get("input_ids", args[0] if args else None)
                counted["grad"] += ids.numel()

        def linear(module, args, output):
            if not counted["evaluating"]:
                x = args[0]
                counted["linear"] += 2 * module.in_features * module.out_features * (x.numel() // x.size(-1))

        model.register_forward_pre_hook(hook, with_kwargs=True)
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_hook(linear)
        return model, tokenizer, path

    evaluate = train_mod.heldout_accuracy

    def evaluating(*args, **kwargs):  # measurement: not counted
        counted["evaluating"] = True
        try:
            return evaluate(*args, **kwargs)
        finally:
            counted["evaluating"] = False

    monkeypatch.setattr(train_mod, "_load_model", load_counting)
    monkeypatch.setattr(train_mod, "heldout_accuracy", evaluating)
    out = tmp_path / "run"
    assert train(out, "--variant", variant, "--shared_prefill_generation", str(shared).lower(), "--plots", "false",
                 "--kl_log_every", "0") == 0
    last = _train_records(out)[-1]
    counts = {name: last[field] for name, field in RECORD_COUNTS.items()}
    shape = counted["shape"]
    assert last["flops"] == computed_flops(shape, counts)
    assert counts["trained"] == counted["grad"] > 0
    assert counts["prefill"] > 0 and counts["decode"] > 0 and counts["trained_head"] > 0
    body = counts["prefill"] + counts["decode"] + counts["no_grad"] + counts["trained"]
    assert counted["linear"] == 2 * shape.n_body * body + 2 * shape.n_head * counts["generation_head"]
    if variant == "grpo":  # on-policy, beta = 0: no scoring pass; TRL's head scores every completion token
        assert counts["no_grad"] == counts["no_grad_head"] == 0
        assert counts["trained_head"] == last["trained_tokens"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["flops"] == last["flops"] and summary["flops_convention"] == FLOPS_CONVENTION
    assert json.loads((out / "run_config.json").read_text())["flops_convention"] == FLOPS_CONVENTION


def test_a_budgeted_run_stops_at_the_budget_and_evaluates_at_its_shares(reference, budgeted):
    flops = _budget(reference)
    summary = json.loads((budgeted / "summary.json").read_text())
    train_recs = _train_records(budgeted)
    spent = [r["flops"] for r in train_recs]
    assert summary["budget"]["stopped_by"] == "budget" and summary["budget"]["flops"] == flops
    done = [Budget(flops).done(f, f - before) for before, f in zip([0.0, *spent], spent)]
    assert done.index(True) == len(spent) - 1  # the first step boundary the rule accepts (steps vary in cost here)
    assert len(train_recs) > 4  # a D3S step costs less than a GRPO one: more steps on a quarter of its compute
    evals = [r["step"] for r in records(budgeted) if r["type"] == "eval"]
    want = [train_recs[_first_reaching(s * flops, spent)]["step"] for s in (0.33, 0.67)]
    assert evals == [0, *want, train_recs[-1]["step"]]
    for before, rec in zip([0.0, *spent], train_recs):  # the schedule and learning rate of the share spent
        assert rec["d3s/progress"] == pytest.approx(before / flops, abs=1e-12)
        assert rec["learning_rate"] == pytest.approx(1e-3 * (1 - before / flops), rel=1e-6)  # smoke: linear


@pytest.mark.slow
@pytest.mark.parametrize("point,at", [("step", 6), ("eval", "last")])
def test_a_killed_budgeted_run_resumes_to_the_uninterrupted_one(reference, budgeted, tmp_path, point, at):
    flops = _budget(reference)
    last = _train_records(budgeted)[-1]["step"]
    out = tmp_path / "run"
    extra = ("--compute_budget", repr(flops), "--budget_eval_shares", "0.33,0.67", *BUDGETED)
    done = train_killed_at(out, point, last if at == "last" else at, *extra)
    assert killed(done), done.stderr[-3000:]
    assert train(out, "--resume", "true", *extra) == 0
    assert_same_run(out, budgeted)
    assert math.isfinite(json.loads((out / "summary.json").read_text())["flops"])
