"""`prompt_skip` (GRESO) and `dynamic_sampling` (DAPO) in D3SGRPOTrainer, on the tiny offline setup.

The dataset has 8 prompts read in order, 4 per generation batch, so every prompt comes back every
second step; prompts 0, 1 and 2 always get a flat reward (no signal).
"""

import contextlib

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl import GRPOTrainer  # noqa: E402
from trl_tiny import (StopAt, flat_params, length_reward, make_rollout_func, prompt_dataset, run_training,  # noqa: E402
                      step_logs)

from d3s.integrations.trl import D3SConfig, D3SGRPOTrainer  # noqa: E402
from d3s.integrations.trl.generation import DeferredPasses, GenerationEntropy  # noqa: E402
from d3s.integrations.trl.prompts import CHECKPOINT_FILE  # noqa: E402
from d3s.integrations.trl.rows import check_row_keys  # noqa: E402

FLAT = {0, 1, 2}
PROMPTS = prompt_dataset(8)["prompt"]
COMMON = dict(per_device_train_batch_size=8, gradient_accumulation_steps=2, shuffle_dataset=False)


def dataset() -> Dataset:
    return Dataset.from_dict({"prompt": PROMPTS, "flat": [i in FLAT for i in range(len(PROMPTS))]})


def flat_or_length_reward(completions, flat, **kwargs) -> list[float]:
    return [1.0 if f else r for f, r in zip(flat, length_reward(completions), strict=True)]


class PromptLog:
    """A rollout function that records the prompt indices of every generation round."""

    def __init__(self):
        self.inner = make_rollout_func(8, 4)
        self.rounds: list[list[int]] = []

    def __call__(self, prompts, trainer):
        self.rounds.append([PROMPTS.index(p) for p in prompts[::4]])
        return self.inner(prompts, trainer)


def train(tmp_path, **config):
    log = PromptLog()
    trainer = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, reward_funcs=flat_or_length_reward,
                           train_dataset=dataset(), rollout_func=log, **{**COMMON, **config})
    trainer.prompt_log = log
    return trainer


class TodaysTrainer(D3SGRPOTrainer):
    """The generation step as it was before the prompt options existed (a verbatim copy)."""

    def _generate_and_score_completions(self, inputs):
        training = self.model.training
        capture = contextlib.nullcontext()
        if training and not self.tools:
            capture = GenerationEntropy(self.accelerator.unwrap_model(self.model), self.temperature)
        defer = DeferredPasses(self) if training and self.d3s_active else contextlib.nullcontext()
        with self._d3s_timed("generation"), capture, defer:
            batch = GRPOTrainer._generate_and_score_completions(self, inputs)
        if not training:
            return batch
        check_row_keys(batch)
        T = batch["completion_ids"].size(1)
        entropies = capture.entropies(batch["completion_mask"], T) if isinstance(capture, GenerationEntropy) else None
        with self._d3s_timed("selection"):
            return self._d3s_select(batch, entropies)


NEW_METRICS = ("d3s/groups_generated", "d3s/flat_groups_generated", "d3s/signal_groups", "d3s/no_signal_step",
               "d3s/generation_s_per_signal_group", "d3s/prompts_skipped", "d3s/prompts_unfilled",
               "d3s/generation_rounds")


def assert_identical(a, b):
    assert torch.equal(flat_params(a.model), flat_params(b.model))
    for ga, gb in zip(a.grad_recorder.grads, b.grad_recorder.grads, strict=True):
        assert torch.equal(ga, gb)
    for la, lb in zip(step_logs(a), step_logs(b), strict=True):
        keys = {k for k in la if "time" not in k and k not in NEW_METRICS and "runtime" not in k and "per_second" not in k}
        assert {k: la[k] for k in keys} == {k: lb.get(k) for k in keys}


@pytest.mark.parametrize("variant", ["grpo", "d3s"])
def test_with_both_options_off_the_run_is_todays(tmp_path, variant):
    common = dict(variant=variant, max_steps=4, reward_funcs=flat_or_length_reward, train_dataset=dataset(), **COMMON)
    today = run_training(TodaysTrainer, D3SConfig, tmp_path / "today", **common)
    now = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "now", **common)
    assert_identical(today, now)
    # the options on, but never acting (p_e = 1 never skips; no extra round), change nothing either
    idle = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "idle", prompt_skip=True, prompt_skip_explore=1.0,
                        dynamic_sampling=True, dynamic_sampling_max_rounds=0, **common)
    assert_identical(today, idle)
    assert [h["d3s/flat_groups_generated"] for h in step_logs(now)] == [3, 0, 3, 0]
    assert [h["d3s/signal_groups"] for h in step_logs(now)] == [1, 4, 1, 4]


def test_prompt_skip_replaces_prompts_seen_flat(tmp_path):
    # p_e = 1e-6: a prompt flat once is skipped (probability 1 - 1e-6)
    run = train(tmp_path, variant="d3s", max_steps=4, prompt_skip=True, prompt_skip_explore=1e-6)
    assert run.prompt_log.rounds[:2] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    third = run.prompt_log.rounds[2]  # 0, 1, 2 come back: each replaced by a prompt with signal, 3 stays
    assert third[3] == 3 and len(set(third)) == 4 and set(third[:3]) < {4, 5, 6, 7}
    assert run.prompt_log.rounds[3] == [4, 5, 6, 7]
    logs = step_logs(run)
    assert [h["d3s/prompts_skipped"] for h in logs] == [0, 0, 3, 0]
    assert [h["d3s/flat_groups_generated"] for h in logs] == [3, 0, 0, 0]
    assert [h["d3s/signal_groups"] for h in logs] == [1, 4, 4, 4]
    assert all(h["d3s/generation_rounds"] == 1 for h in logs)


def test_dynamic_sampling_fills_the_batch_with_signal(tmp_path):
    run = train(tmp_path, variant="d3s", max_steps=3, dynamic_sampling=True)
    rounds = run.prompt_log.rounds
    assert rounds[0] == [0, 1, 2, 3] and not {0, 1, 2, 3} & set(rounds[1])  # a second round of fresh prompts
    logs = step_logs(run)
    assert [h["d3s/generation_rounds"] for h in logs] == [2, 1, 2]
    assert [h["d3s/groups_generated"] for h in logs] == [8, 4, 8]
    assert [h["d3s/signal_groups"] for h in logs] == [4, 4, 4]
    assert all(h["d3s/no_signal_step"] == 0 and h["d3s/sample_usefulness_rate"] == 1 for h in logs)
    assert all(h["d3s/rollouts_kept"] / h["d3s/rollout_ratio"] == 16 for h in logs)  # the batch kept its size


def test_dynamic_sampling_round_cap_and_flat_fill(tmp_path):
    # every prompt flat: the cap stops the rounds and flat groups fill the batch
    def flat_reward(completions, **kwargs):
        return [1.0] * len(completions)

    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, variant="d3s", max_steps=2, reward_funcs=flat_reward,
                       train_dataset=Dataset.from_dict({"prompt": prompt_dataset(40)["prompt"]}),
                       dynamic_sampling=True, dynamic_sampling_max_rounds=2, **COMMON)
    logs = step_logs(run)
    assert [h["d3s/generation_rounds"] for h in logs] == [3, 3]
    assert [h["d3s/flat_groups_generated"] for h in logs] == [12, 12]
    assert [h["d3s/no_signal_step"] for h in logs] == [1, 1]
    # no group with signal: the key is left out (a None would make TensorBoard's logger warn at every such step)
    assert all("d3s/generation_s_per_signal_group" not in h for h in logs)


def test_resume_restores_the_prompt_history(tmp_path):
    common = dict(variant="d3s", max_steps=6, prompt_skip=True, save_strategy="steps", save_steps=3)
    full = train(tmp_path / "full", **common)
    train(tmp_path / "part", callbacks=[StopAt(3)], **common)
    assert (tmp_path / "part" / "checkpoint-3" / CHECKPOINT_FILE).is_file()
    resumed = train(tmp_path / "part", resume_from_checkpoint=str(tmp_path / "part" / "checkpoint-3"), **common)
    assert resumed.prompt_log.rounds == full.prompt_log.rounds[3:]  # the same prompts chosen after the resume
    full_logs, resumed_logs = step_logs(full)[3:], [h for h in step_logs(resumed) if h["step"] > 3]
    assert sum(h["d3s/prompts_skipped"] for h in full_logs) > 0
    for key in ["d3s/prompts_skipped", "d3s/flat_groups_generated", "d3s/tokens_in_loss", "loss"]:
        assert [h[key] for h in resumed_logs] == pytest.approx([h[key] for h in full_logs], rel=1e-5), key
    torch.testing.assert_close(flat_params(resumed.model), flat_params(full.model), rtol=1e-5, atol=1e-6)


def test_without_the_history_a_resume_differs(tmp_path):
    """The check above has teeth: the same resume with the history file removed chooses other prompts."""
    common = dict(variant="d3s", max_steps=6, prompt_skip=True, prompt_skip_explore=1e-6, save_strategy="steps",
                  save_steps=3)
    full = train(tmp_path / "full", **common)
    train(tmp_path / "part", callbacks=[StopAt(3)], **common)
    (tmp_path / "part" / "checkpoint-3" / CHECKPOINT_FILE).unlink()
    resumed = train(tmp_path / "part", resume_from_checkpoint=str(tmp_path / "part" / "checkpoint-3"), **common)
    assert resumed.prompt_log.rounds != full.prompt_log.rounds[3:]


@pytest.mark.parametrize("bad, match", [
    ({"prompt_skip_explore": 0.0}, "prompt_skip_explore=0.0"),
    ({"prompt_skip_explore": 1.5}, "prompt_skip_explore=1.5"),
    ({"prompt_skip_history": 0}, "prompt_skip_history=0"),
    ({"dynamic_sampling_max_rounds": -1}, "dynamic_sampling_max_rounds=-1"),
])
def test_bad_values_are_refused(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        D3SConfig(output_dir=str(tmp_path), num_generations=4, use_cpu=True, report_to=[], **bad)
