"""D3SGRPOTrainer against TRL's GRPOTrainer on a tiny local model (CPU, no downloads).

Generation is replaced by a deterministic `rollout_func` (see `trl_tiny`), so both trainers see the
same completions and the comparisons are exact.
"""

import math

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl_tiny import (  # noqa: E402
    RecordingRollout,
    RowCounter,
    StopAt,
    flat_params,
    length_reward,
    make_rollout_func,
    prompt_dataset,
    run_training,
    step_logs,
    tiny_model,
    tiny_tokenizer,
)

from d3s import VARIANTS, linear_schedule, num_tokens_to_keep  # noqa: E402
from d3s.integrations.trl import D3SConfig, D3SGRPOTrainer  # noqa: E402

SMALL = dict(per_device_train_batch_size=8, gradient_accumulation_steps=2)  # 2 micro-batches per generation


def assert_same_training(a, b, rtol=1e-5, atol=1e-7):
    losses_a = [h["loss"] for h in step_logs(a)]
    losses_b = [h["loss"] for h in step_logs(b)]
    assert losses_a == pytest.approx(losses_b, rel=rtol, abs=atol)
    assert len(a.grad_recorder.grads) == len(b.grad_recorder.grads) > 0
    for ga, gb in zip(a.grad_recorder.grads, b.grad_recorder.grads):
        assert ga.abs().max() > 0
        torch.testing.assert_close(gb, ga, rtol=rtol, atol=atol)
    torch.testing.assert_close(flat_params(b.model), flat_params(a.model), rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "loss_type, extra",
    [
        ("grpo", {}),
        ("cispo", {}),  # TRL's losses that only the D3S-off path runs
        ("sapo", {}),
        ("luspo", {"importance_sampling_level": "sequence"}),
        ("vespo", {}),
        ("dapo", {"top_entropy_quantile": 0.2}),
        ("dapo", {"entropy_coef": 0.01}),
        ("dapo", {"delta": 2.0, "num_iterations": 2}),
        ("dapo", {"beta": 0.04, "use_bias_correction_kl": False}),  # + k3 KL to a reference model
        ("dapo", {"beta": 0.04, "num_iterations": 2}),  # + TRL's default importance-weighted KL
        ("bnpo", {"num_iterations": 2}),  # + old log-probs (two updates per generation)
        ("dr_grpo", {}),
    ],
)
def test_without_selection_matches_trl(tmp_path, loss_type, extra):
    common = dict(loss_type=loss_type, max_steps=3, **SMALL, **extra)
    trl_run = run_training(GRPOTrainer, GRPOConfig, tmp_path / "trl", **common)
    variant = "gspo" if extra.get("importance_sampling_level") == "sequence" else "grpo"
    d3s_run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "d3s", variant=variant, **common)
    assert_same_training(trl_run, d3s_run)
    # D3S off IS TRL's computation: bit for bit, not only within a tolerance
    assert torch.equal(flat_params(trl_run.model), flat_params(d3s_run.model))
    for ga, gb in zip(trl_run.grad_recorder.grads, d3s_run.grad_recorder.grads):
        assert torch.equal(ga, gb)
    if "beta" in extra:
        assert all(h["kl"] >= 0 for h in step_logs(d3s_run)) and step_logs(d3s_run)[-1]["kl"] > 0
        assert [h["kl"] for h in step_logs(d3s_run)] == pytest.approx([h["kl"] for h in step_logs(trl_run)])


def test_reward_funcs_is_optional_as_in_trl(tmp_path):
    """TRL 1.16 takes rewards from `environment_factory` too, so `reward_funcs` may be left out; TRL then says what
    is missing when there is no reward source at all."""
    import inspect

    ours = inspect.signature(D3SGRPOTrainer.__init__).parameters["reward_funcs"]
    theirs = inspect.signature(GRPOTrainer.__init__).parameters["reward_funcs"]
    assert ours.default is theirs.default is None
    args = D3SConfig(output_dir=str(tmp_path), variant="d3s", num_generations=4, use_cpu=True, report_to=[], **SMALL)
    with pytest.raises(ValueError, match="No reward source provided"):
        D3SGRPOTrainer(tiny_model(), args=args, train_dataset=prompt_dataset(), processing_class=tiny_tokenizer())


def test_gspo_matches_trl_sequence_level_ratio(tmp_path):
    # two updates per generation, so the ratio moves away from 1 and clipping happens
    common = dict(loss_type="grpo", max_steps=3, num_iterations=2, learning_rate=2.0, epsilon=0.05, **SMALL)
    trl_run = run_training(GRPOTrainer, GRPOConfig, tmp_path / "trl", importance_sampling_level="sequence", **common)
    d3s_run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "d3s", variant="gspo", **common)
    assert d3s_run.args.importance_sampling_level == "sequence"
    assert max(h["clip_ratio/region_mean"] for h in step_logs(d3s_run)) > 0  # the clip is exercised
    # exp(logp - sg(logp) + sg(s)) and exp(s) round differently: float32 noise after 3 steps at lr 2
    assert_same_training(trl_run, d3s_run, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_keeping_everything_through_the_selection_path_matches_trl(tmp_path, micro_batches):
    # N = G and K = 100% go through selection, re-dealing, the global token mask and the D3S
    # denominators, and must still be plain GRPO.
    common = dict(loss_type="dapo", max_steps=3, per_device_train_batch_size=16 // micro_batches,
                  gradient_accumulation_steps=micro_batches)
    trl_run = run_training(GRPOTrainer, GRPOConfig, tmp_path / "trl", **common)
    d3s_run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "d3s", sample_selection="cross", n_init=4,
                           token_selection=True, k_init=1.0, **common)
    assert [h["d3s/rollout_ratio"] for h in step_logs(d3s_run)] == [1.0] * 3
    assert [h["d3s/token_consumption_ratio"] for h in step_logs(d3s_run)] == [1.0] * 3
    assert_same_training(trl_run, d3s_run)


def test_training_forward_sees_only_the_kept_rollouts(tmp_path):
    trl_rows, d3s_rows = RowCounter(), RowCounter()
    run_training(GRPOTrainer, GRPOConfig, tmp_path / "trl", max_steps=2, callbacks=[trl_rows], **SMALL)
    run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "d3s", variant="d1s-c", max_steps=2, callbacks=[d3s_rows],
                 **SMALL)
    # 4 prompts x G = 4; d1s-c keeps N = 1/4 of G (scaled 8/32 -> clipped to 2) per group on average
    assert trl_rows.rows_per_step == [16, 16]
    assert d3s_rows.rows_per_step == [8, 8]


def test_counts_follow_the_schedule(tmp_path):
    max_steps, G, B = 4, 4, 4
    counter, rollout = RowCounter(), RecordingRollout(make_rollout_func(8, G))
    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, sample_selection="cross", n_init=2, n_final=4,
                       token_selection=True, k_init=0.1, k_final=0.5, schedule="linear", max_steps=max_steps,
                       callbacks=[counter], rollout_func=rollout, **SMALL)
    logs = step_logs(run)
    for step, h in enumerate(logs):
        n_keep, fraction = linear_schedule(step / (max_steps - 1), 2, 4, 0.1, 0.5, G)  # first p = 0, last p = 1
        assert (h["d3s/n_keep"], h["d3s/k_fraction"]) == (n_keep, pytest.approx(fraction))
        assert h["d3s/rollouts_kept"] == n_keep * B
        # rows dealt to the 2 micro-batches: a multiple of 2, the rest are zero-weight padding rows
        assert counter.rows_per_step[step] == 2 * math.ceil(n_keep * B / 2) == n_keep * B + h["d3s/padding_rows"]
    assert [h["d3s/n_keep"] for h in logs] == [2, 3, 3, 4]  # the schedule really moves
    assert (logs[0]["d3s/progress"], logs[-1]["d3s/progress"]) == (0.0, 1.0)
    assert logs[-1]["d3s/k_fraction"] == 0.5  # the last step runs at the final values
    # the token budget is exactly ceil(K * valid tokens of the kept rollouts), and the mask has that many
    last = run.d3s_last_selection
    assert int(last["token_mask"].sum()) == last["tokens_in_loss"] == logs[-1]["d3s/tokens_in_loss"]
    valid = sum(len(rollout.last_completion_ids[i]) for i in last["kept"].tolist())
    assert last["tokens_in_loss"] == num_tokens_to_keep(valid, last["fraction"])


# grpo with the sequence-level ratio IS gspo (and refused as a contradiction), gspo is never token-level
VARIANT_OBJECTIVES = [(name, objective) for name in VARIANTS for objective in ("token", "sequence")
                      if (name, objective) not in {("grpo", "sequence"), ("gspo", "token")}]


@pytest.mark.parametrize("name, objective", VARIANT_OBJECTIVES)
def test_every_variant_trains_with_both_objectives(tmp_path, name, objective):
    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, variant=name, importance_sampling_level=objective,
                       max_steps=2, **SMALL)
    expected_level = {"token": "token", "sequence": "sequence_token"}[objective]
    assert run.args.d3s_settings.importance_sampling_level == expected_level
    logs = step_logs(run)
    assert len(logs) == 2
    assert all(math.isfinite(h["loss"]) and math.isfinite(h["grad_norm"]) for h in logs)
    assert any(h["grad_norm"] > 0 for h in logs)
    v = VARIANTS[name]
    assert logs[0]["d3s/rollout_ratio"] == (1.0 if v.sample_selection == "none" else 0.5)
    assert (logs[0]["d3s/token_consumption_ratio"] < 0.2) == v.token_selection


METHOD_SECTION_7 = [
    "d3s/token_consumption_ratio",
    "d3s/sample_usefulness_rate",
    "d3s/advantage_variance",
    "grad_norm",
    "entropy",
    "kl",
    "reward",
    "d3s/n_keep",
    "d3s/k_fraction",
]


def test_every_method_section_7_metric_is_logged(tmp_path):
    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, variant="d3s", beta=0.04, max_steps=2, **SMALL)
    for h in step_logs(run):
        missing = [k for k in METHOD_SECTION_7 if k not in h or h[k] is None or not math.isfinite(h[k])]
        assert not missing
        assert 0 < h["d3s/token_consumption_ratio"] < 1
        assert 0 <= h["d3s/sample_usefulness_rate"] <= 1
        assert h["d3s/advantage_variance"] > 0


def slow_reward(completions, **kwargs):
    """The length reward, 0.2 s late: scoring belongs to generation's share of the step."""
    import time

    time.sleep(0.2)
    return length_reward(completions)


@pytest.mark.parametrize("variant", ["grpo", "d3s"])
def test_where_a_step_s_time_goes(tmp_path, variant):
    """`d3s/time/*`: the parts add up to TRL's step_time, and a slow reward lands in generation."""
    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, variant=variant, reward_funcs=slow_reward,
                       max_steps=3, kl_log_every=2, **SMALL)
    parts = ["generation", "selection", "kl_monitor", "forward", "backward"]
    logs = step_logs(run)
    assert len(logs) == 3
    for i, h in enumerate(logs):
        times = {p: h[f"d3s/time/{p}"] for p in parts}
        assert all(t >= 0 for t in times.values()), times
        assert sum(times.values()) == pytest.approx(h["step_time"], rel=1e-6)
        assert times["generation"] >= 0.2  # one generation per optimizer step here (2 micro-batches)
        assert times["forward"] > 0 and times["selection"] > 0
        assert (times["kl_monitor"] > 0) == (i % 2 == 0), (i, times)  # measured every 2nd generation


# -- bad input ------------------------------------------------------------------------------------


def none_or_nan_reward(completions, **kwargs):
    """None for every 3rd completion, NaN for every 5th, otherwise the length reward."""
    base = length_reward(completions)
    return [None if i % 3 == 0 else float("nan") if i % 5 == 0 else r for i, r in enumerate(base)]


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


def all_none_reward(completions, **kwargs):
    return [None] * len(completions)


@pytest.mark.parametrize(
    "variant, loss_type", [("d3s", "grpo"), ("d1s-c", "dapo"), ("d3s-i", "dapo"), ("pods", "grpo")]
)
def test_unscorable_rollouts_are_never_trained_and_counted(tmp_path, variant, loss_type):
    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, variant=variant, loss_type=loss_type,
                       reward_funcs=none_or_nan_reward, max_steps=2, **SMALL)
    logs = step_logs(run)
    assert all(math.isfinite(h["loss"]) and math.isfinite(h["grad_norm"]) for h in logs)
    assert all(h["d3s/unscorable_rollouts"] > 0 for h in logs)
    kept = set(run.d3s_last_selection["kept"].tolist())
    unscorable = {i for i in range(16) if i % 3 == 0 or i % 5 == 0}  # rows in rank order = reward order
    assert kept and not kept & unscorable


@pytest.mark.parametrize("reward", [constant_reward, all_none_reward])
@pytest.mark.parametrize("variant", ["d3s", "d3s-i"])
def test_no_signal_at_all_gives_a_zero_finite_update(tmp_path, reward, variant):
    before = flat_params(__import__("trl_tiny").tiny_model(0))
    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, variant=variant, reward_funcs=reward, max_steps=2,
                       **SMALL)
    for h in step_logs(run):
        assert h["loss"] == 0.0 and h["grad_norm"] == 0.0
        assert h["d3s/sample_usefulness_rate"] == 0.0
    torch.testing.assert_close(flat_params(run.model).cpu(), before)
    if reward is all_none_reward:
        assert step_logs(run)[0]["d3s/unscorable_rollouts"] == 16
        assert step_logs(run)[0]["d3s/rollouts_kept"] == 0  # every row is padding, nothing crashes


@pytest.mark.parametrize("loss_type, micro_batches", [("grpo", 1), ("dapo", 2), ("dr_grpo", 2)])
def test_empty_and_truncated_completions(tmp_path, loss_type, micro_batches):
    # rows 0, 4, 8, 12 answer EOS alone (empty text); rows 5, 10, 15 hit the length limit and are
    # masked out (mask_truncated_completions): they have no loss token at all
    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, variant="d3s", loss_type=loss_type,
                       mask_truncated_completions=True, rollout_func=make_rollout_func(8, 4, empty_every=4),
                       per_device_train_batch_size=16 // micro_batches, gradient_accumulation_steps=micro_batches,
                       max_steps=2)
    logs = step_logs(run)
    assert all(math.isfinite(h["loss"]) and math.isfinite(h["grad_norm"]) for h in logs)
    assert [h["d3s/empty_completions"] for h in logs] == [3, 3]
    assert any(h["grad_norm"] > 0 for h in logs)


# -- resume ---------------------------------------------------------------------------------------


def test_resume_continues_the_schedule_and_the_run(tmp_path):
    common = dict(sample_selection="cross", n_init=2, n_final=4, token_selection=True, k_init=0.1, k_final=0.6,
                  schedule="linear", max_steps=4, save_strategy="steps", save_steps=2, **SMALL)
    full = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "full", **common)
    run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "part", callbacks=[StopAt(2)], **common)  # stop at 2 ...
    resumed = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "part",  # ... and resume from its checkpoint
                           resume_from_checkpoint=str(tmp_path / "part" / "checkpoint-2"), **common)
    full_logs = step_logs(full)
    resumed_logs = [h for h in step_logs(resumed) if h["step"] > 2]  # the checkpoint's history holds steps 1-2
    assert [h["step"] for h in resumed_logs] == [3, 4]
    assert [h["d3s/n_keep"] for h in resumed_logs] == [3, 4]  # the schedule did not restart
    for key in ["d3s/n_keep", "d3s/k_fraction", "d3s/progress", "d3s/rollouts_kept", "d3s/tokens_in_loss", "loss"]:
        assert [h[key] for h in resumed_logs] == pytest.approx([h[key] for h in full_logs[2:]], rel=1e-5), key
    torch.testing.assert_close(flat_params(resumed.model), flat_params(full.model), rtol=1e-5, atol=1e-6)


def test_evaluation_scores_the_full_eval_batch(tmp_path):
    from trl_tiny import prompt_dataset

    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, variant="d3s", max_steps=2, eval_strategy="steps",
                       eval_steps=1, per_device_eval_batch_size=8, eval_dataset=prompt_dataset(4), **SMALL)
    evals = [h for h in run.state.log_history if "eval_loss" in h]
    assert len(evals) == 2 and all(math.isfinite(h["eval_loss"]) for h in evals)
    assert all("eval_d3s/n_keep" not in h for h in evals)  # no down-sampling in evaluation
