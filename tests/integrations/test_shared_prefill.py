"""The shared-prefill generation path (`d3s.integrations.trl.decoding`) against transformers' own `generate`.

Greedy: the same completions, token for token (prompts of different lengths, repeated prompts, a prefix
all prompts share). Entropies: equal to a full forward's within fp32 tolerance. Sampled: the same
distribution (first tokens, lengths, whole-completion token frequencies) over a few thousand samples,
by a two-sample chi-square test. Through the trainer: greedy completions equal to TRL's path, the
generation entropies used, and refusals of what the path cannot honour.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from transformers import GenerationConfig  # noqa: E402
from trl import GRPOTrainer  # noqa: E402
from trl_tiny import EOS, PAD, length_reward, prompt_dataset, run_training, tiny_model  # noqa: E402

from d3s.entropy import token_entropy  # noqa: E402
from d3s.integrations.trl import D3SConfig, D3SGRPOTrainer  # noqa: E402
from d3s.integrations.trl.decoding import Sampling, common_prefix_length, distinct_rows, generate  # noqa: E402


def _model(seed: int = 4):
    """A tiny Llama whose end-of-sequence logit is raised, so that completions end at different lengths."""
    model = tiny_model(seed).eval()
    with torch.no_grad():
        model.lm_head.weight[EOS] *= 3
    return model


def _prompts(n_distinct: int, repeats: int, seed: int = 0, shared: int = 3) -> list[list[int]]:
    """`n_distinct` prompts of 2-9 own tokens after a prefix of `shared` tokens, each repeated `repeats` times."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 64) for _ in range(shared)]
    distinct = [prefix + [rng.randrange(3, 64) for _ in range(rng.randrange(2, 10))] for _ in range(n_distinct)]
    return [p for p in distinct for _ in range(repeats)]


def _reference(model, rows: list[list[int]], config: GenerationConfig) -> list[list[int]]:
    """transformers' `generate` on the left-padded rows, cut after the first EOS (TRL's post-processing)."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, width:]
    result = []
    for row in out.tolist():
        cut = row.index(EOS) + 1 if EOS in row else len(row)
        result.append(row[:cut])
    return result


def _config(do_sample: bool, max_new: int, **kw) -> GenerationConfig:
    settings = dict(temperature=None, top_p=None, top_k=None) if not do_sample else dict(top_k=0, **kw)
    return GenerationConfig(max_new_tokens=max_new, do_sample=do_sample, pad_token_id=PAD, eos_token_id=[EOS],
                            disable_compile=True, **settings)


def test_distinct_rows_and_common_prefix():
    rows = [[1, 2, 3], [4, 5], [1, 2, 3], [4, 5], [1, 2, 9]]
    distinct, owner = distinct_rows(rows)
    assert distinct == [[1, 2, 3], [4, 5], [1, 2, 9]] and owner == [0, 1, 0, 1, 2]
    assert common_prefix_length([[1, 2, 3], [1, 2, 9]]) == 2
    assert common_prefix_length([[1, 2, 3], [1, 2, 3, 4]]) == 2  # each prompt keeps one token of its own
    assert common_prefix_length([[7, 2], [1, 2]]) == 0


@pytest.mark.parametrize("n_distinct,repeats,shared,max_rows", [(3, 4, 3, None), (5, 1, 4, None), (4, 3, 0, 5),
                                                                 (1, 6, 2, None)])
def test_greedy_completions_equal_generate(n_distinct, repeats, shared, max_rows):
    model = _model()
    rows = _prompts(n_distinct, repeats, seed=n_distinct, shared=shared)
    want = _reference(model, rows, _config(False, 12))
    got = generate(model, rows, Sampling(12, (EOS,), PAD, do_sample=False), max_rows=max_rows)
    assert got.completion_ids == want
    if n_distinct > 1:
        lengths = [len(c) for c in want]
        assert min(lengths) < max(lengths)  # rows finish at different steps: some left the batch early
    assert got.positions["prefill"] < sum(map(len, rows))  # fewer prefill positions than one per row and token


def test_entropies_equal_a_full_forward():
    model = _model()
    rows = _prompts(3, 3, seed=1)
    torch.manual_seed(0)
    out = generate(model, rows, Sampling(10, (EOS,), PAD), entropy_temperature=0.7)
    for r, (prompt, completion) in enumerate(zip(rows, out.completion_ids)):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()  # (T, V)
        want = token_entropy(logits / 0.7)  # (T,)
        got = torch.stack([step[r] for step in out.step_entropies[: len(completion)]])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert all(float(step[r]) == 0.0 for step in out.step_entropies[len(completion):])  # finished: 0


def _chi_square_p(a: Counter, b: Counter) -> float:
    """p-value of a two-sample chi-square test of homogeneity (bins with fewer than 10 expected merged)."""
    keys = sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k]))
    na, nb = sum(a.values()), sum(b.values())
    bins, rest = [], [0, 0]
    for k in keys:
        if (a[k] + b[k]) * min(na, nb) / (na + nb) >= 10:
            bins.append((a[k], b[k]))
        else:
            rest[0] += a[k]
            rest[1] += b[k]
    if sum(rest):
        bins.append(tuple(rest))
    stat = 0.0
    for x, y in bins:
        total = x + y
        for observed, n in ((x, na), (y, nb)):
            expected = total * n / (na + nb)
            stat += (observed - expected) ** 2 / expected
    dof = len(bins) - 1
    # Wilson-Hilferty: the chi-square tail through a normal one
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_sampled_completions_have_the_same_distribution():
    """3,000 samples per path (2 prompts x 1,500), temperature 0.9, top-p 0.95: the first token, the length, every
    generated token and the length reward have the same distribution (no test rejects at p < 0.001)."""
    model = _model(3)
    rows = _prompts(2, 500, seed=7)
    sampling = Sampling(8, (EOS,), PAD, temperature=0.9, top_p=0.95)
    config = _config(True, 8, temperature=0.9, top_p=0.95)
    ours, theirs = [], []
    for rnd in range(3):
        torch.manual_seed(100 + rnd)
        ours += generate(model, rows, sampling).completion_ids
        torch.manual_seed(200 + rnd)
        theirs += _reference(model, rows, config)
    for name, key in [("first token", lambda c: c[0]), ("length", len),
                      ("reward", lambda c: sum(t % 7 == 0 for t in c))]:
        p = _chi_square_p(Counter(map(key, ours)), Counter(map(key, theirs)))
        assert p > 1e-3, f"{name}: p = {p:.2g}"
    p = _chi_square_p(Counter(t for c in ours for t in c), Counter(t for c in theirs for t in c))
    assert p > 1e-3, f"token frequencies: p = {p:.2g}"
    # and the test can tell distributions apart: a different temperature is rejected
    torch.manual_seed(300)
    hotter = generate(model, rows, Sampling(8, (EOS,), PAD, temperature=1.6, top_p=0.95)).completion_ids
    assert _chi_square_p(Counter(c[0] for c in hotter), Counter(c[0] for c in theirs[:1000])) < 1e-3


def _greedy_trainer(tmp_path, shared: bool, trainer_cls=D3SGRPOTrainer, **config):
    return run_training(
        trainer_cls, D3SConfig, tmp_path, reward_funcs=length_reward, train_dataset=prompt_dataset(),
        max_steps=2, generation_kwargs={"do_sample": False}, shared_prefill_generation=shared, rollout_func="generate",
        **config,
    )


class _Completions:
    def __init__(self):
        self.seen = []

    def __call__(self, trainer):
        original = trainer._generate_single_turn

        def recording(prompt_ids, *args, **kwargs):
            completion_ids, logprobs = original(prompt_ids, *args, **kwargs)
            self.seen.append(completion_ids)
            return completion_ids, logprobs

        trainer._generate_single_turn = recording


@pytest.mark.parametrize("lora", [False, True])
def test_trainer_greedy_completions_equal_trl_path(tmp_path, lora):
    """With greedy decoding, the trainer generates exactly TRL's completions, and trains the same (also LoRA)."""
    extra = {}
    if lora:
        peft = pytest.importorskip("peft")
        extra["peft_config"] = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    runs = {}
    for shared in (False, True):
        seen = _Completions()
        trainer = _greedy_trainer(tmp_path / str(shared), shared, variant="d3s", setup=seen, **extra)
        runs[shared] = (seen.seen, trainer.grad_recorder, trainer)
    assert runs[True][0] == runs[False][0] and len(runs[True][0]) == 2
    assert runs[True][2].d3s_last_selection["entropy_source"] == "generation"
    for a, b in zip(runs[True][1].grads, runs[False][1].grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def _args(tmp_path, **settings) -> D3SConfig:
    return D3SConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **settings)


def test_option_off_is_trl_generate(tmp_path):
    """Off by default: the trainer never enters the shared-prefill path."""
    assert _args(tmp_path).shared_prefill_generation is False
    assert GRPOTrainer._generate_single_turn is not D3SGRPOTrainer._generate_single_turn


@pytest.mark.parametrize("settings,named", [
    ({"use_vllm": True}, "use_vllm"),
    ({"use_transformers_continuous_batching": True}, "use_transformers_continuous_batching"),
    ({"repetition_penalty": 1.2}, "repetition_penalty"),
    ({"generation_kwargs": {"num_beams": 2}}, "num_beams"),
    ({"generation_kwargs": {"no_repeat_ngram_size": 3}}, "no_repeat_ngram_size"),
    ({"generation_kwargs": {"eos_token_id": [3, 4]}}, r"eos_token_id=\[3, 4\] is not honoured"),  # TRL stops there
    ({"cache_implementation": "static"}, "cache_implementation"),
])
def test_settings_it_cannot_honour_are_refused(tmp_path, settings, named):
    with pytest.raises(ValueError, match=named) as err:
        _args(tmp_path, shared_prefill_generation=True, **settings)
    assert "\n" not in str(err.value)
    _args(tmp_path, shared_prefill_generation=False, **settings)  # accepted with it off


def test_non_bool_value_is_refused(tmp_path):
    with pytest.raises(ValueError, match="shared_prefill_generation='yes'"):
        _args(tmp_path, shared_prefill_generation="yes")


def test_sample_tokens_draws_from_the_probabilities():
    """Inverse-CDF sampling: frequencies match the probabilities (chi-square), zero-probability tokens never drawn."""
    from d3s.integrations.trl.decoding import sample_tokens

    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(1, 50) * 2, dim=-1)
    probs[0, [0, 7, 49]] = 0.0  # as top-k / top-p leave them
    probs = probs / probs.sum()
    draws = sample_tokens(probs.expand(60_000, 50).contiguous())
    counts = torch.bincount(draws, minlength=50)
    assert counts[[0, 7, 49]].sum() == 0
    expected = probs[0] * draws.numel()
    used = expected > 0
    stat = float((((counts - expected) ** 2)[used] / expected[used]).sum())
    dof = int(used.sum()) - 1
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    assert 0.5 * math.erfc(z / math.sqrt(2)) > 1e-3
    assert sample_tokens(torch.tensor([[0.0, 0.0, 1.0]])).item() == 2
