"""The controls in the trainer: random selection (docs/method.md section 9.3), steps without signal (9.4), and
which prompts each step trained on. Tiny local model, deterministic rollouts (`trl_tiny`)."""

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from trl_tiny import StopAt, flat_params, run_training, step_logs, tiny_model  # noqa: E402

from d3s.integrations.trl import D3SConfig, D3SGRPOTrainer  # noqa: E402

SMALL = dict(per_device_train_batch_size=8, gradient_accumulation_steps=2)


class Recording(D3SGRPOTrainer):
    """Keeps the kept rollouts and the prompts of every generation batch."""

    def _d3s_select(self, batch, generation_entropies):
        out = super()._d3s_select(batch, generation_entropies)
        if self.model.training:
            self.kept_log = getattr(self, "kept_log", []) + [self.d3s_last_selection.get("kept")]
            self.prompt_log = getattr(self, "prompt_log", []) + [list(self.d3s_prompt_hashes)]
        return out


SCHEDULE = dict(n_init=2, n_final=4, schedule="linear", max_steps=4)


@pytest.mark.parametrize("control, rule", [("random", "cross"), ("random-intra", "intra")])
def test_random_selection_keeps_the_rule_s_count_at_every_step(tmp_path, control, rule):
    runs = {mode: run_training(Recording, D3SConfig, tmp_path / mode, sample_selection=mode, **SCHEDULE, **SMALL)
            for mode in (control, rule)}
    logs = {mode: step_logs(run) for mode, run in runs.items()}
    for key in ("d3s/n_keep", "d3s/rollouts_kept"):
        assert [h[key] for h in logs[control]] == [h[key] for h in logs[rule]], key
    assert [h["d3s/n_keep"] for h in logs[control]] == [2, 3, 3, 4]  # the schedule moves, and both follow it
    # the same rollouts generated (the model only changes after the first step), other rollouts kept
    first = {mode: run.kept_log[0].tolist() for mode, run in runs.items()}
    assert len(first[control]) == len(first[rule])
    kept = [set(k.tolist()) for k in runs[control].kept_log]
    assert any(k != set(first[rule]) for k in kept)


def test_random_selection_resumes_exactly(tmp_path):
    common = dict(sample_selection="random", n_init=2, n_final=4, schedule="linear", max_steps=4,
                  save_strategy="steps", save_steps=2, **SMALL)
    full = run_training(Recording, D3SConfig, tmp_path / "full", **common)
    run_training(Recording, D3SConfig, tmp_path / "part", callbacks=[StopAt(2)], **common)
    resumed = run_training(Recording, D3SConfig, tmp_path / "part",
                           resume_from_checkpoint=str(tmp_path / "part" / "checkpoint-2"), **common)
    assert [k.tolist() for k in resumed.kept_log] == [k.tolist() for k in full.kept_log[2:]]
    resumed_logs = [h for h in step_logs(resumed) if h["step"] > 2]
    assert [h["loss"] for h in resumed_logs] == pytest.approx([h["loss"] for h in step_logs(full)[2:]], rel=1e-5)
    torch.testing.assert_close(flat_params(resumed.model), flat_params(full.model), rtol=1e-5, atol=1e-6)


def test_every_step_records_its_prompts_and_a_longer_run_sees_a_longer_prefix(tmp_path):
    short = run_training(Recording, D3SConfig, tmp_path / "short", variant="grpo", max_steps=2, **SMALL)
    long = run_training(Recording, D3SConfig, tmp_path / "long", variant="d1s-c", max_steps=4, **SMALL)
    # one record per generation batch: 4 distinct prompts of the tiny dataset
    assert len(short.prompt_log) == 2 and all(len(p) == 4 for p in short.prompt_log)
    assert long.prompt_log[:2] == short.prompt_log
    assert long.prompt_log[2] != long.prompt_log[1]


def _zero_reward(completions, **kwargs):
    return [1.0] * len(completions)  # every group flat: every advantage 0, no policy gradient


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("variant", ["grpo", "d1s-c"])
def test_steps_without_signal_are_counted_and_skipped_when_asked(tmp_path, skip, variant):
    # Adam with momentum from a first step that had a signal, then steps without any
    calls = {"n": 0}

    def first_step_only(completions, **kwargs):
        calls["n"] += 1
        return [float(len(c)) for c in completions] if calls["n"] == 1 else [1.0] * len(completions)

    run = run_training(Recording, D3SConfig, tmp_path, variant=variant, reward_funcs=first_step_only, optim="adamw_torch",
                       learning_rate=1e-2, max_steps=3, skip_steps_without_signal=skip, **SMALL)
    logs = step_logs(run)
    assert [h["d3s/zero_gradient"] for h in logs] == [0.0, 1.0, 1.0]
    assert [h["d3s/optimizer_skipped"] for h in logs] == [0.0, float(skip), float(skip)]
    # Adam's momentum moves the weights on a zero gradient unless the step is skipped
    assert [h["d3s/weights_moved"] for h in logs] == [1.0, float(not skip), float(not skip)]


def test_skipping_leaves_weights_and_optimizer_state_as_they_were(tmp_path):
    run = run_training(Recording, D3SConfig, tmp_path, variant="d1s-c", reward_funcs=_zero_reward, optim="adamw_torch",
                       learning_rate=1e-2, max_steps=2, skip_steps_without_signal=True, **SMALL)
    assert all(h["d3s/optimizer_skipped"] == 1.0 for h in step_logs(run))
    assert not run.optimizer.state  # Adam never stepped: no moment was ever created
    torch.testing.assert_close(flat_params(run.model), flat_params(tiny_model(0)), rtol=0, atol=0)


def test_the_option_is_refused_where_the_model_is_sharded(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` with an FSDP config sets
    with pytest.raises(ValueError, match="skip_steps_without_signal=True under DeepSpeed"):
        D3SConfig("out", skip_steps_without_signal=True, use_cpu=True)
