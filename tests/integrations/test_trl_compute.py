"""Every cut saves compute, never changes the update.

The reference is the full masked computation: a training forward with the LM head and gradient at
every position of every kept row (TRL's own `_get_per_token_logps_and_entropies`), the same token
mask multiplied into the loss, and the per-rollout passes (old-policy, reference) run by TRL's code
over the rows. `D3SGRPOTrainer` instead truncates each micro-batch at its last kept column, runs the
LM head only at the kept tokens, computes the per-rollout passes for the kept rows only and replaces
a zero-gradient micro-batch by a 1-token forward. Given the same kept rows and token mask (both
trainers choose them from the same entropies), the losses, gradients and parameters must agree.
"""

import itertools
import math

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl_tiny import EOS, VOCAB, flat_params, make_rollout_func, run_training, step_logs  # noqa: E402

from d3s import policy_loss  # noqa: E402
from d3s.integrations.trl import D3SConfig, D3SGRPOTrainer  # noqa: E402


def full_masked_loss(trainer, model, inputs):
    """The loss as computed before the selective forward: logits at every position, the mask applied after."""
    settings = trainer.args.d3s_settings
    completion_ids = inputs["completion_ids"]
    input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
    per_token_logps, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
        trainer, model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
    )
    weights = inputs["importance_sampling_ratio"] if trainer.use_vllm else None
    P, S = trainer.accelerator.num_processes, completion_ids.size(0)
    ga, spg = trainer.current_gradient_accumulation_steps, trainer.args.steps_per_generation
    share = ga / spg / P
    # the divisors, written out as a plain reference (d3s.batch.loss_denominator is the code under test)
    if trainer.loss_type == "grpo":
        aggregation, denominator, accumulation = "sequence", max(float(inputs["d3s_num_rows"]), 1.0) * share, 1.0
    elif trainer.loss_type == "dapo":
        aggregation, denominator, accumulation = "token", max(float(inputs["d3s_num_tokens"]), 1.0) * share, 1.0
    elif trainer.loss_type == "bnpo":
        aggregation, denominator, accumulation = "token", None, float(ga)
    else:  # dr_grpo
        n_real = int(inputs["d3s_real"].sum())
        aggregation, denominator, accumulation = "token", float(max(n_real, 1) * trainer.max_completion_length), float(ga)
    loss, _ = policy_loss(
        per_token_logps,
        inputs.get("old_per_token_logps"),
        inputs["advantages"],
        mask,
        token_mask=inputs.get("d3s_token_mask"),
        importance_sampling_level=settings.importance_sampling_level,
        epsilon_low=trainer.epsilon_low,
        epsilon_high=trainer.epsilon_high,
        beta=trainer.beta,
        ref_per_token_logps=inputs.get("ref_per_token_logps"),
        normalizer=settings.normalizer,
        aggregation=aggregation,
        denominator=denominator,
        importance_sampling_ratio=weights,
        kl_importance_weighted=trainer.args.use_bias_correction_kl,
    )
    return loss / accumulation


class FullMaskedTrainer(D3SGRPOTrainer):
    """The same selection, the full masked computation; also checks the kept-row passes against TRL's."""

    pass_checks = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not self.model.training:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return full_masked_loss(self, model, inputs)

    def _d3s_kept_row_passes(self, batch, loss_mask, need_entropy):
        out = super()._d3s_kept_row_passes(batch, loss_mask, need_entropy)
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        T = batch["completion_ids"].size(1)
        with torch.no_grad():
            for key, model in (("old_per_token_logps", self.model), ("ref_per_token_logps", self.ref_model)):
                if key in batch:
                    trl_logps, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
                        self, model, input_ids, attention_mask, T
                    )
                    torch.testing.assert_close(batch[key] * loss_mask, trl_logps * loss_mask, rtol=1e-5, atol=1e-6)
                    FullMaskedTrainer.pass_checks += 1
        return out


SMALL = dict(per_device_train_batch_size=8, gradient_accumulation_steps=2)


def assert_same_update(a, b, rtol=1e-5):
    """Losses, every step's gradient and the final parameters agree to `rtol` of their scale (fp32)."""
    la, lb = [h["loss"] for h in step_logs(a)], [h["loss"] for h in step_logs(b)]
    assert la == pytest.approx(lb, rel=rtol, abs=rtol * max(1.0, *map(abs, lb)))
    assert len(a.grad_recorder.grads) == len(b.grad_recorder.grads) > 0
    for ga, gb in zip(a.grad_recorder.grads, b.grad_recorder.grads):
        torch.testing.assert_close(ga, gb, rtol=rtol, atol=rtol * float(gb.abs().max()))
    pa, pb = flat_params(a.model), flat_params(b.model)
    torch.testing.assert_close(pa, pb, rtol=rtol, atol=rtol * float(pb.abs().max()))


def both(tmp_path, **config):
    ours = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "selective", **config)
    ref = run_training(FullMaskedTrainer, D3SConfig, tmp_path / "full", **config)
    return ours, ref


# (variant, loss_type, importance_sampling_level, beta, num_iterations, steps_per_generation): every
# value of each setting appears with every value of every other (a pairwise cover) in the default
# suite; the whole grid is a slow test.
VARIANTS_UNDER_TEST = ("d3s", "d2s", "d1s-c", "d3s-i")
GRID = list(itertools.product(VARIANTS_UNDER_TEST, ("grpo", "dapo", "bnpo", "dr_grpo"), ("token", "sequence"),
                              (0.0, 0.04), (1, 2), (1, 2)))
PAIRWISE = [
    ("d3s", "grpo", "token", 0.0, 1, 1),
    ("d3s", "dapo", "sequence", 0.04, 2, 2),
    ("d3s", "bnpo", "token", 0.04, 2, 1),
    ("d3s", "dr_grpo", "sequence", 0.0, 1, 2),
    ("d2s", "grpo", "sequence", 0.04, 1, 2),
    ("d2s", "dapo", "token", 0.0, 2, 1),
    ("d2s", "bnpo", "sequence", 0.0, 1, 1),
    ("d2s", "dr_grpo", "token", 0.04, 2, 2),
    ("d1s-c", "grpo", "token", 0.04, 2, 2),
    ("d1s-c", "dapo", "sequence", 0.0, 1, 1),
    ("d1s-c", "bnpo", "token", 0.0, 1, 2),
    ("d1s-c", "dr_grpo", "sequence", 0.04, 2, 1),
    ("d3s-i", "grpo", "sequence", 0.0, 2, 1),
    ("d3s-i", "dapo", "token", 0.04, 1, 2),
    ("d3s-i", "bnpo", "sequence", 0.04, 1, 1),
    ("d3s-i", "dr_grpo", "token", 0.0, 2, 2),
]


class CheckingTrainer(D3SGRPOTrainer):
    """At every micro-batch, on the same weights and inputs: the selective loss and its gradients
    against the full masked computation's."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if not self.model.training:
            return loss
        reference = full_masked_loss(self, model, inputs)
        params = [p for p in model.parameters() if p.requires_grad]
        got = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        want = torch.autograd.grad(reference, params, retain_graph=True, allow_unused=True)
        got = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(got, params)])
        want = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(want, params)])
        scale = max(float(want.abs().max()), 1e-30)
        torch.testing.assert_close(loss.detach(), reference.detach(), rtol=1e-5, atol=1e-5 * max(1.0, abs(float(reference))))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale)
        self.checked.append(float(want.abs().max()))
        return loss


def _run_case(tmp_path, variant, loss_type, level, beta, iterations, spg):
    config = dict(variant=variant, loss_type=loss_type, importance_sampling_level=level, beta=beta,
                  num_iterations=iterations, steps_per_generation=spg, per_device_train_batch_size=16 // spg,
                  gradient_accumulation_steps=spg, max_steps=3, kl_log_every=0,
                  # small steps: at the helper's default 0.5, beta > 0 with two updates per batch drives the
                  # tiny model's log-probs so far from the reference that the KL overflows (loss ~1e18, or inf
                  # at unkept positions in the full computation), and the comparison means nothing
                  learning_rate=0.05)
    if variant == "d2s":
        config.update(k_init=0.3)  # a constant K that keeps several tokens per row

    def setup(trainer):
        trainer.checked = []

    run = run_training(CheckingTrainer, D3SConfig, tmp_path, setup=setup, **config)
    assert len(run.checked) == 3 * spg  # every micro-batch of every step was compared
    assert max(run.checked) > 0  # ... and some carried a gradient


@pytest.mark.parametrize("variant, loss_type, level, beta, iterations, spg", PAIRWISE)
def test_selective_forward_equals_the_full_masked_computation(tmp_path, variant, loss_type, level, beta, iterations,
                                                              spg):
    _run_case(tmp_path, variant, loss_type, level, beta, iterations, spg)


@pytest.mark.slow
@pytest.mark.parametrize("variant, loss_type, level, beta, iterations, spg", [c for c in GRID if c not in PAIRWISE])
def test_selective_forward_equals_the_full_masked_computation_whole_grid(tmp_path, variant, loss_type, level, beta,
                                                                         iterations, spg):
    _run_case(tmp_path, variant, loss_type, level, beta, iterations, spg)


def test_old_and_reference_passes_run_for_the_kept_rows_only(tmp_path):
    rows_seen = []

    def setup(trainer):
        def hook(module, args, kwargs):
            if not torch.is_grad_enabled():
                rows_seen.append(kwargs["input_ids"].size(0))

        trainer.model.model.register_forward_pre_hook(hook, with_kwargs=True)

    FullMaskedTrainer.pass_checks = 0
    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, variant="d1s-c", beta=0.04, num_iterations=2,
                       max_steps=2, kl_log_every=0, setup=setup, **SMALL)
    # 16 rollouts per generation, d1s-c keeps 8: the old-policy pass (num_iterations=2) and the entropy-free
    # run see 8 rows (the reference model is a separate module, not counted here)
    assert rows_seen and max(rows_seen) <= 8
    assert run.d3s_last_selection["kept"].numel() == 8
    ours, ref = both(tmp_path / "cmp", variant="d1s-c", beta=0.04, num_iterations=2, max_steps=2, kl_log_every=0,
                     **SMALL)
    assert FullMaskedTrainer.pass_checks > 0  # old and reference log-probs equal TRL's on the kept rows
    assert_same_update(ours, ref)


def test_token_cut_stops_the_forward_at_the_last_kept_column(tmp_path):
    widths, heads = [], []

    def setup(trainer):
        def hook(module, args, kwargs):
            if torch.is_grad_enabled():
                widths.append(kwargs["input_ids"].size(1))

        trainer.model.model.register_forward_pre_hook(hook, with_kwargs=True)

    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, variant="d2s", k_init=0.05, max_steps=2, max_len=8,
                       kl_log_every=0, setup=setup, **SMALL)
    prompt_len = 3
    assert widths and min(widths) < prompt_len + 8  # some micro-batch stopped before the full width
    mask = run.d3s_last_selection["token_mask"]
    assert int(mask.sum()) == run.d3s_last_selection["tokens_in_loss"]
    plain = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "grpo", variant="grpo", max_steps=2, max_len=8, **SMALL)
    computed = [h["d3s/tokens_computed"] for h in step_logs(run)]
    computed_plain = [h["d3s/tokens_computed"] for h in step_logs(plain)]
    assert all(a < b for a, b in zip(computed, computed_plain))  # the same batches, fewer positions computed
    assert 16 * (3 + 1) <= computed_plain[0] <= 16 * (3 + 8)  # every row, prompt + the batch's completion width


def test_zero_gradient_micro_batches_skip_the_forward_but_step_the_optimizer(tmp_path):
    """Rewards equal in every group from step 2 on: those steps skip the forward; AdamW still moves."""

    def reward(completions, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            return [float(len(c.split())) for c in completions]
        return [0.1] * len(completions)  # 0.1: TRL's advantages keep a 1e-5 residue here; ours are exactly 0

    common = dict(variant="d3s", max_steps=3, optim="adamw_torch", learning_rate=1e-2, kl_log_every=0, **SMALL)
    calls = []
    ours = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "ours", reward_funcs=reward, **common)
    calls = []
    ref = run_training(FullMaskedTrainer, D3SConfig, tmp_path / "ref", reward_funcs=reward, **common)
    logs = step_logs(ours)
    # step 1: the few kept tokens may all sit in one of the 2 micro-batches; then the other one is skipped
    assert logs[0]["d3s/skipped_forwards"] < 1.0 and [h["d3s/skipped_forwards"] for h in logs[1:]] == [1.0, 1.0]
    assert [h["d3s/sample_usefulness_rate"] for h in logs][1:] == [0.0, 0.0]
    for g in ours.grad_recorder.grads[1:]:
        assert torch.count_nonzero(g) == 0
    assert_same_update(ours, ref)
    calls = []
    one = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "one", reward_funcs=reward, **{**common, "max_steps": 1})
    assert not torch.equal(flat_params(one.model), flat_params(ours.model))  # zero-gradient steps still moved them


def test_constant_groups_train_with_advantage_exactly_zero(tmp_path):
    def reward(completions, **kwargs):  # groups of 4: the first group all 0.1, the others vary
        return [0.1 if i < 4 else float(len(c.split())) for i, c in enumerate(completions)]

    seen = []

    def setup(trainer):
        original = trainer._d3s_select

        def select(batch, entropies):
            out = original(batch, entropies)
            seen.append(batch["advantages"].clone())
            return out

        trainer._d3s_select = select

    # token selection alone keeps every rollout, so the sample usefulness rate sees every group
    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, token_selection=True, k_init=0.5, reward_funcs=reward,
                       max_steps=1, kl_log_every=0, setup=setup, **SMALL)
    assert torch.count_nonzero(seen[0][:4]) == 0  # TRL's own arithmetic leaves ~1e-5 here
    assert step_logs(run)[0]["d3s/sample_usefulness_rate"] == 0.75


def test_generation_entropies_choose_the_tokens_and_are_logged(tmp_path):
    """With transformers generation the mask's entropies come from `generate`'s logits (no extra pass)."""
    extra_passes = []

    def setup(trainer):
        def hook(module, args, kwargs):
            if not torch.is_grad_enabled() and kwargs.get("d3s_positions") is not None:
                extra_passes.append(kwargs["input_ids"].size(0))

        trainer.model.register_forward_pre_hook(hook, with_kwargs=True)

    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, rollout_func="generate", variant="d3s", max_steps=2,
                       kl_log_every=0, setup=setup, **SMALL)
    assert run.d3s_last_selection["entropy_source"] == "generation"
    assert extra_passes == []  # on-policy, beta = 0: no no-grad pass at all
    logs = step_logs(run)
    for h in logs:
        assert h["entropy/generated"] > 0 and h["entropy/trained"] > 0


def test_generation_entropies_match_the_training_forward(tmp_path):
    """The entropies read from `generate` equal those of a training-style forward on the same rows."""
    captured = {}

    def setup(trainer):
        original = trainer._d3s_select

        def select(batch, entropies):
            captured["batch"] = {k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}
            captured["entropies"] = entropies.clone()
            return original(batch, entropies)

        trainer._d3s_select = select

    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, rollout_func="generate", variant="d3s", max_steps=1,
                       kl_log_every=0, learning_rate=0.0, setup=setup, **SMALL)
    b = captured["batch"]
    mask = b["completion_mask"].bool()
    _, forward_entropies = run._d3s_no_grad_logps(run.model, b, b["completion_mask"], entropy=True)
    torch.testing.assert_close(captured["entropies"][mask], forward_entropies[mask], rtol=1e-4, atol=1e-5)


def test_kl_to_the_initial_policy_is_logged_at_beta_zero(tmp_path):
    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, variant="d3s", max_steps=3, kl_log_every=2,
                       kl_log_rollouts=4, **SMALL)
    kls = [h.get("kl") for h in step_logs(run)]
    assert kls[0] == 0.0  # the current policy IS the initial one at the first step
    assert kls[1] is None  # every 2 generations
    assert kls[2] > 0.0
    plain = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "grpo", variant="grpo", max_steps=1, **SMALL)
    assert step_logs(plain)[0]["kl"] == 0.0 and "entropy/trained" in step_logs(plain)[0]
    off = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "off", variant="d3s", max_steps=1, kl_log_every=0, **SMALL)
    assert step_logs(off)[0].get("kl") is None


def test_clip_ratio_extremes_are_logged_as_trl_does(tmp_path):
    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, variant="d1s-c", max_steps=2, num_iterations=2,
                       learning_rate=2.0, epsilon=0.05, kl_log_every=0, **SMALL)
    logs = step_logs(run)
    for h in logs:
        assert 0.0 <= h["clip_ratio/low_min"] <= h["clip_ratio/low_mean"] + 1e-9 or h["clip_ratio/low_mean"] == 0
        assert h["clip_ratio/high_max"] >= h["clip_ratio/high_mean"] - 1e-9


def test_non_finite_entropies_keep_the_exact_token_count(tmp_path):
    def setup(trainer):
        original = trainer._d3s_kept_row_passes

        def passes(batch, loss_mask, need_entropy):
            out = original(batch, loss_mask, need_entropy)
            if out["entropies"] is not None:
                out["entropies"][0] = float("nan")  # a whole row of broken entropies
            return out

        trainer._d3s_kept_row_passes = passes

    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, variant="d2s", k_init=0.2, max_steps=2, kl_log_every=0,
                       setup=setup, **SMALL)
    last = run.d3s_last_selection
    assert int(last["token_mask"].sum()) == last["tokens_in_loss"] > 0
    logs = step_logs(run)
    assert all(h["d3s/nonfinite_scores"] > 0 for h in logs)
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)


def test_multimodal_batches_are_refused_for_every_variant():
    from d3s.integrations.trl.rows import check_row_keys

    batch = {"prompt_ids": torch.zeros(2, 3), "completion_ids": torch.zeros(2, 3), "pixel_values": torch.zeros(2, 3)}
    with pytest.raises(NotImplementedError, match="pixel_values"):
        check_row_keys(batch)


@pytest.mark.parametrize("variant", ["grpo", "d3s"])
def test_rows_of_length_zero_and_kept_last_positions(tmp_path, variant):
    """Empty completions (EOS only, masked when truncated) and kept tokens at the last column: no NaN, same update."""
    config = dict(variant=variant, max_steps=2, kl_log_every=0, mask_truncated_completions=True,
                  rollout_func=make_rollout_func(8, 4, empty_every=3, full_every=2), **SMALL,
                  # small steps: at the helper's 0.5 the first update (gradient norm about 40) moves the tiny
                  # model so far that the second step's gradient amplifies the first step's float rounding
                  # to 2e-5 of its scale on AVX-512 CPUs (1e-6 on the first step); at 0.02 it stays near 2e-6
                  learning_rate=0.02)
    if variant == "grpo":
        run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, **config)
        trl_cfg = {k: v for k, v in config.items() if k not in ("variant", "kl_log_every")}
        trl = run_training(GRPOTrainer, GRPOConfig, tmp_path / "trl", **trl_cfg)
        assert torch.equal(flat_params(run.model), flat_params(trl.model))  # D3S off is TRL, bit for bit
        return
    ours, ref = both(tmp_path, **config)
    assert_same_update(ours, ref)
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in step_logs(ours))


class FakeVLLM:
    """Stands in for TRL's colocated vLLM engine (`trainer.vllm_generation`): deterministic completions and
    sampler log-probs that differ from the trainer's, so TRL's vLLM branch (old-policy pass, sampler
    correction ratio) runs on a CPU without vLLM. Real vLLM runs are in tests/vllm (opt-in)."""

    def __init__(self, max_len=6):
        self.max_len, self.syncs, self.calls = max_len, 0, 0

    def sync_weights(self):
        self.syncs += 1

    def generate(self, prompts, images, num_generations, profiler=None):
        self.calls += 1
        completions, logprobs = [], []
        for i, prompt in enumerate(prompts):
            n = 1 + (sum(prompt) * 7 + i * 3 + self.calls) % self.max_len
            ids = [3 + (sum(prompt) + 5 * i + 11 * t + self.calls) % (VOCAB - 3) for t in range(n - 1)] + [EOS]
            completions.append(ids)
            logprobs.append([[-0.3 - 0.2 * ((tok + t) % 4)] for t, tok in enumerate(ids)])
        return prompts, completions, logprobs, None


def fake_vllm_setup(mode, stash):
    def setup(trainer):
        trainer.use_vllm = True
        trainer.vllm_generation = FakeVLLM()
        trainer._last_loaded_step = -1
        trainer.vllm_importance_sampling_correction = True
        trainer.vllm_importance_sampling_mode = mode
        original = trainer._generate_and_score_completions

        def generate_and_score(inputs):
            out = original(inputs)
            stash.append({k: v.clone() for k, v in out.items() if isinstance(v, torch.Tensor)})
            if "kept" in getattr(trainer, "d3s_last_selection", {}):
                stash[-1]["d3s_kept"] = trainer.d3s_last_selection["kept"].clone()
            return out

        trainer._generate_and_score_completions = generate_and_score

    return setup


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_mask"])
def test_vllm_path_kept_rows_get_trls_sampler_terms(tmp_path, mode):
    """Under (fake) vLLM generation: old log-probs, sampling log-probs and the sampler-correction ratio of the
    kept rollouts equal TRL's for those rollouts; the update equals the full masked computation."""
    trl_batches, d3s_batches = [], []
    common = dict(rollout_func="generate", max_steps=2, per_device_train_batch_size=16)
    run_training(GRPOTrainer, GRPOConfig, tmp_path / "trl", setup=fake_vllm_setup(mode, trl_batches), **common)
    d3s = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "d3s", variant="d3s", kl_log_every=0,
                       setup=fake_vllm_setup(mode, d3s_batches), **common)
    trl_b, ours = trl_batches[0], d3s_batches[0]
    assert ours["completion_ids"].size(0) < trl_b["completion_ids"].size(0)  # only kept rows were carried
    first_kept = ours["d3s_kept"]  # the kept rows of the first generation, in the order they were dealt
    T = ours["completion_ids"].size(1)
    mask = ours["completion_mask"].bool()
    for key in ("old_per_token_logps", "sampling_per_token_logps"):
        torch.testing.assert_close(ours[key][mask], trl_b[key][first_kept][:, :T][mask], rtol=1e-5, atol=1e-6)
    ratio_trl = trl_b["importance_sampling_ratio"][first_kept]
    ratio_trl = ratio_trl if ratio_trl.size(1) == 1 else ratio_trl[:, :T]
    if ratio_trl.size(1) == 1:
        torch.testing.assert_close(ours["importance_sampling_ratio"], ratio_trl, rtol=1e-5, atol=1e-6)
    else:
        torch.testing.assert_close(ours["importance_sampling_ratio"][mask], ratio_trl[mask], rtol=1e-5, atol=1e-6)
    assert d3s.vllm_generation.syncs == 2  # weights synced before each generation, rows dropped or not


@pytest.mark.parametrize("mode", ["token_mask", "sequence_truncate"])
def test_vllm_path_selective_forward_equals_the_full_masked_computation(tmp_path, mode):
    stash = []

    def setup(trainer):
        fake_vllm_setup(mode, stash)(trainer)
        trainer.checked = []

    run = run_training(CheckingTrainer, D3SConfig, tmp_path, rollout_func="generate", variant="d3s", max_steps=2,
                       per_device_train_batch_size=8, gradient_accumulation_steps=2, kl_log_every=0, setup=setup)
    assert len(run.checked) == 4 and max(run.checked) > 0
    assert run.d3s_last_selection["entropy_source"] == "old-policy pass"  # no transformers logits under vLLM


class CheckingMoETrainer(D3SGRPOTrainer):
    """As `CheckingTrainer`, for a mixture-of-experts model: the reference adds TRL's router load-balancing loss
    over the micro-batch's real rows (TRL's own `_get_per_token_logps_and_entropies(compute_aux_loss=True)`)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if not self.model.training:
            return loss
        real = inputs["d3s_real"]
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)[real]
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)[real]
        _, _, aux = GRPOTrainer._get_per_token_logps_and_entropies(
            self, model, input_ids, attention_mask, inputs["completion_ids"].size(1), compute_aux_loss=True
        )
        reference = full_masked_loss(self, model, inputs)
        reference = reference + self.router_aux_loss_coef * aux / self.current_gradient_accumulation_steps
        params = [p for p in model.parameters() if p.requires_grad]
        got = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        want = torch.autograd.grad(reference, params, retain_graph=True, allow_unused=True)
        got = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(got, params)])
        want = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(want, params)])
        torch.testing.assert_close(loss.detach(), reference.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * max(float(want.abs().max()), 1e-30))
        self.checked.append(float(aux))
        return loss


@pytest.mark.parametrize("variant", ["d3s", "d1s-c", "d2s"])
def test_mixture_of_experts_router_loss_trains_over_the_kept_rows(tmp_path, variant):
    """With D3S on, a MoE model keeps TRL's router load-balancing loss (over every token of the kept rollouts)
    and logs `aux_loss`; the loss and its gradients equal the full computation's plus TRL's router loss."""
    from trl_tiny import tiny_moe

    def setup(trainer):
        trainer.checked = []
        assert trainer.aux_loss_enabled  # TRL turns it on for this model

    config = dict(variant=variant, max_steps=2, kl_log_every=0, learning_rate=0.05, **SMALL)
    if variant == "d2s":
        config.update(k_init=0.3)
    run = run_training(CheckingMoETrainer, D3SConfig, tmp_path, model_fn=tiny_moe, setup=setup, **config)
    assert len(run.checked) == 2 * 2 and all(a > 0 for a in run.checked)
    logs = step_logs(run)
    assert len(logs) == 2 and all(math.isfinite(h["aux_loss"]) and h["aux_loss"] > 0 for h in logs)
