"""`precision` takes effect: it settles the trainer's mixed precision when the settings are built (TrainingArguments
derives it there), over the recipe's `bf16` and a launcher's `--mixed_precision`, and the run records what ran."""

from __future__ import annotations

import json

import pytest
import torch

from d3s.app.errors import RecipeError
from d3s.app.recipe import parse_train_args
from d3s.app.recipe_changes import training_changes
from tests.run_helpers import records, train


@pytest.mark.parametrize(("precision", "launcher", "want"), [
    ("fp32", None, "no"),
    ("fp32", "bf16", "no"),  # the launcher's --mixed_precision does not override the recipe's precision
    ("bf16", None, "bf16"),
    ("bf16", "no", "bf16"),
    ("auto", None, "no"),  # auto is fp32 on a CPU
    ("auto", "bf16", "no"),
])
def test_precision_settles_the_trainers_mixed_precision(precision, launcher, want, monkeypatch):
    if launcher is None:
        monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", launcher)
    _, config, _ = parse_train_args(["--config", "smoke", "--use_cpu", "true", "--precision", precision,
                                     "--bf16", "true" if want == "no" else "false"])
    assert config.mixed_precision == want
    assert config.bf16 is (want == "bf16") and config.fp16 is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_bf16_on_a_gpu_without_a_gpu_is_refused_by_name():
    with pytest.raises(RecipeError, match=r"precision='bf16' with use_cpu false .* --use_cpu true"):
        parse_train_args(["--config", "smoke", "--use_cpu", "false", "--precision", "bf16"])


def test_bf16_precision_trains_under_autocast_and_is_recorded(tmp_path):
    """The same step in bf16 and in fp32 computes different gradients (before, `bf16` was set after the settings
    were built and both ran fp32: equal gradient norms), and `run_config.json` records the mixed precision that
    ran."""
    grad_norms = {}
    for precision in ("bf16", "fp32"):
        out = tmp_path / precision
        # the step needs a group with signal (else both gradients are 0): seed 1's first step on the generate path
        # has one
        assert train(out, "--precision", precision, "--max_steps", "1", "--eval_every", "0", "--plots", "false",
                     "--variant", "grpo", "--shared_prefill_generation", "false", "--seed", "1") == 0
        grad_norms[precision] = [r["grad_norm"] for r in records(out) if r["type"] == "train"]
        trainer = json.loads((out / "run_config.json").read_text())["trainer"]
        assert trainer["mixed_precision"] == ("bf16" if precision == "bf16" else "no")
    assert len(grad_norms["bf16"]) == len(grad_norms["fp32"]) == 1
    assert grad_norms["fp32"][0] > 0
    assert grad_norms["bf16"] != grad_norms["fp32"]


def test_reuse_compares_the_precision_that_ran_not_the_request():
    old = {"trainer": {"variant": "d3s", "bf16": True}}  # recorded before mixed_precision: it trained in fp32
    assert training_changes(old, {"trainer": {"variant": "d3s", "bf16": False, "mixed_precision": "no"}}) == ([], [])
    changed, _ = training_changes(old, {"trainer": {"variant": "d3s", "bf16": True, "mixed_precision": "bf16"}})
    assert changed == ["mixed_precision: 'no' -> 'bf16'"]
