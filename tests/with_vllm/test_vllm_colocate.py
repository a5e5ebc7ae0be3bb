"""D3SGRPOTrainer under TRL's vLLM generation (colocate mode, one process, CPU), on a tiny random Llama.

Under vLLM, TRL recomputes the old policy's log-probs after generation (`old_per_token_logps`),
keeps vLLM's own (`sampling_per_token_logps`), weights the loss with their importance-sampling
ratio (`importance_sampling_ratio`, per token or per sequence) and copies the trainer's weights into
the engine before each generation. These tests check each of those with D3S in the way.

vLLM generates in bfloat16 here (its CPU default for a float32 checkpoint) while the trainer runs in
float32, so the sampling and training log-probs really differ and the ratio is not 1.
"""

from __future__ import annotations

import math

import pytest
import torch
import vllm_tiny as vt

pytestmark = pytest.mark.vllm

G = vt.BASE["num_generations"]
# Drops rollouts and tokens at every step (constant schedule): half the rollouts, half their tokens
DOWN_SAMPLING = dict(sample_selection="cross", n_init=G // 2, token_selection=True, k_init=0.5)


def _trainers():
    from trl import GRPOConfig, GRPOTrainer

    from d3s.integrations.trl import D3SConfig, D3SGRPOTrainer

    return GRPOConfig, GRPOTrainer, D3SConfig, D3SGRPOTrainer


def _run(trainer_cls, config_cls, out, model_path, **overrides):
    return vt.train(vt.build(trainer_cls, vt.make_config(config_cls, out, **overrides), model_path))


# -- D3S off is TRL ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "d3s_fields",
    [
        {"variant": "grpo"},
        # N = G and K = 100% through selection, re-dealing and the token mask: still plain GRPO
        {"sample_selection": "cross", "n_init": G, "token_selection": True, "k_init": 1.0},
    ],
    ids=["grpo", "keep-all-through-selection"],
)
def test_without_down_sampling_matches_trl(tmp_path, tiny_model_path, d3s_fields):
    GRPOConfig, GRPOTrainer, D3SConfig, D3SGRPOTrainer = _trainers()
    trl_run = _run(GRPOTrainer, GRPOConfig, tmp_path / "trl", tiny_model_path)
    d3s_run = _run(D3SGRPOTrainer, D3SConfig, tmp_path / "d3s", tiny_model_path, **d3s_fields)

    trl_logs, d3s_logs = vt.step_logs(trl_run), vt.step_logs(d3s_run)
    assert len(trl_logs) == len(d3s_logs) == 2
    # the same rollouts (same engine seed, same weights at each generation) ...
    for key in ("reward", "completions/mean_length", "sampling/importance_sampling_ratio/mean"):
        assert [h[key] for h in d3s_logs] == pytest.approx([h[key] for h in trl_logs], rel=1e-6), key
    # ... so the same update, with the importance-sampling weights in the loss
    assert [h["loss"] for h in d3s_logs] == pytest.approx([h["loss"] for h in trl_logs], rel=1e-5, abs=1e-7)
    torch.testing.assert_close(vt.flat_params(d3s_run.model), vt.flat_params(trl_run.model), rtol=1e-5, atol=1e-7)
    assert not torch.equal(vt.flat_params(d3s_run.model), _initial_params(tiny_model_path))


def _initial_params(model_path):
    from transformers import AutoModelForCausalLM

    return vt.flat_params(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32))


# -- every variant ----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["grpo", "gspo", "pods", "d1s", "d1s-c", "d2s", "d3s", "d3s-i"])
def test_every_variant_trains(tmp_path, tiny_model_path, variant):
    _, _, D3SConfig, D3SGRPOTrainer = _trainers()
    run = _run(D3SGRPOTrainer, D3SConfig, tmp_path, tiny_model_path, variant=variant)
    logs = vt.step_logs(run)
    assert len(logs) == 2
    for h in logs:
        assert math.isfinite(h["loss"]) and math.isfinite(h["grad_norm"])
        assert 0 < h["d3s/rollout_ratio"] <= 1
        assert 0 < h["d3s/token_consumption_ratio"] <= 1
    assert not torch.equal(vt.flat_params(run.model), _initial_params(tiny_model_path))


# -- importance sampling on the kept rollouts -------------------------------------------------------


class _Recorder:
    """Records, at every generation, the trainer's weights and TRL's whole generation batch (before
    D3S selects), and every batch the loss receives."""

    def __init__(self, monkeypatch, trainer):
        from trl import GRPOTrainer

        self.weights, self.generated, self.trained = [], [], []
        trl_generate = GRPOTrainer._generate_and_score_completions

        def generate(trainer_self, inputs):
            model = trainer_self.accelerator.unwrap_model(trainer_self.model)
            self.weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            out = trl_generate(trainer_self, inputs)
            self.generated.append({k: v.clone() if torch.is_tensor(v) else v for k, v in out.items()})
            return out

        monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", generate)
        compute_loss = trainer.compute_loss

        def recording_compute_loss(model, inputs, *args, **kwargs):
            self.trained.append({k: v.clone() if torch.is_tensor(v) else v for k, v in inputs.items()})
            return compute_loss(model, inputs, *args, **kwargs)

        monkeypatch.setattr(trainer, "compute_loss", recording_compute_loss)


def _row_key(batch, i):
    """A rollout's identity: its prompt and completion token ids (padding removed)."""
    prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
    completion = batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist()
    return tuple(prompt), tuple(completion)


def _logps_by_hand(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """`(n,)` log-probs of the completion tokens under `model`: one plain forward, no batching."""
    ids = torch.tensor([*prompt, *completion]).unsqueeze(0)  # (1, P+n)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1] / temperature  # (n, V)
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)  # (n,)


def _is_ratio_by_hand(old, sampling, mask, mode, clip_min, clip_max):
    """TRL's vLLM importance-sampling weight of one rollout, written out: `(T,)` or `(1,)`."""
    diff = (old - sampling) * mask  # (T,)
    ratio = diff.sum().exp().reshape(1) if mode.startswith("sequence") else diff.exp()
    if mode.endswith("truncate"):
        return ratio.clamp(min=clip_min, max=clip_max)
    return ratio.masked_fill((ratio < clip_min) | (ratio > clip_max), 0.0)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_importance_sampling_uses_the_kept_rollouts(tmp_path, tiny_model_path, monkeypatch, mode):
    """For every trained row: vLLM's sampling log-probs of that very rollout, old log-probs equal to a
    plain forward of the weights that generated it, and TRL's importance weight of those two."""
    from transformers import AutoModelForCausalLM

    _, _, D3SConfig, D3SGRPOTrainer = _trainers()
    clip_min, clip_max = 0.98, 1.02  # narrow, so that some ratios are clipped or masked
    args = vt.make_config(
        D3SConfig, tmp_path, **DOWN_SAMPLING, vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_min=clip_min, vllm_importance_sampling_clip_max=clip_max,
    )
    trainer = vt.build(D3SGRPOTrainer, args, tiny_model_path)
    rec = _Recorder(monkeypatch, trainer)
    vt.train(trainer)
    assert len(rec.generated) == len(rec.trained) == 2, "one generation and one micro-batch per step"
    assert all(h["d3s/rollout_ratio"] < 1 for h in vt.step_logs(trainer))  # D3S dropped rollouts

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    exercised = False
    for step, (weights, full, kept) in enumerate(zip(rec.weights, rec.generated, rec.trained)):
        policy.load_state_dict(weights)  # the weights that generated this batch
        where = {}
        for j in range(full["completion_ids"].size(0)):
            where.setdefault(_row_key(full, j), j)
        real = kept["completion_mask"].sum(dim=1) > 0  # (S,) padding rows have no token
        assert 0 < int(real.sum()) < full["completion_ids"].size(0)
        for i in real.nonzero().flatten().tolist():
            key = _row_key(kept, i)
            assert key in where, f"step {step}: a trained row is not one of the generated rollouts"
            n = len(key[1])
            mask = kept["completion_mask"][i].float()  # (T,)
            old, sampling = kept["old_per_token_logps"][i], kept["sampling_per_token_logps"][i]  # (T,)
            # vLLM's log-probs of that very rollout (bfloat16 engine: close to, not equal to, the trainer's)
            torch.testing.assert_close(sampling[:n], full["sampling_per_token_logps"][where[key], :n], rtol=0, atol=0)
            by_hand = _logps_by_hand(policy, *key, args.temperature)  # (n,)
            torch.testing.assert_close(old[:n], by_hand, rtol=1e-5, atol=1e-5)
            assert (sampling[:n] - by_hand).abs().max() < 0.2
            # the importance weight of exactly those two
            ratio = kept["importance_sampling_ratio"][i]  # (T,) token modes, (1,) sequence modes
            expected = _is_ratio_by_hand(old, sampling, mask, mode, clip_min, clip_max)
            raw = ((old - sampling) * mask).sum().exp().reshape(1) if mode.startswith("sequence") else (old - sampling).exp()
            if mode.startswith("token"):
                ratio, expected, raw = ratio[:n], expected[:n], raw[:n]
            assert ratio.shape == expected.shape
            torch.testing.assert_close(ratio, expected, rtol=1e-6, atol=1e-7)
            exercised |= bool((ratio != raw).any())
    assert exercised, f"no ratio fell outside [{clip_min}, {clip_max}]: the {mode} branch was not exercised"


# -- weight sync ------------------------------------------------------------------------------------


def test_weight_sync_after_skipped_rows(tmp_path, tiny_model_path):
    """Before every generation the engine holds the trainer's current weights, also after steps whose
    update skipped rollouts (cross-group selection) and tokens (the token mask)."""
    _, _, D3SConfig, D3SGRPOTrainer = _trainers()
    trainer = vt.build(D3SGRPOTrainer, vt.make_config(D3SConfig, tmp_path, **DOWN_SAMPLING, max_steps=3),
                       tiny_model_path)
    engine, seen = trainer.vllm_generation, []
    generate = engine.generate

    def checking_generate(*args, **kwargs):
        seen.append((vt.vllm_weight_mismatch(trainer), vt.flat_params(trainer.model)))
        return generate(*args, **kwargs)

    engine.generate = checking_generate
    vt.train(trainer)
    logs = vt.step_logs(trainer)
    assert len(seen) == 3
    assert all(h["d3s/rollout_ratio"] < 1 and h["d3s/token_consumption_ratio"] < 1 for h in logs)
    assert [mismatch for mismatch, _ in seen] == [0.0, 0.0, 0.0]
    assert not torch.equal(seen[0][1], seen[1][1]) and not torch.equal(seen[1][1], seen[2][1])  # weights moved
