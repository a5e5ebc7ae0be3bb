"""The FLOP count (`d3s.app.budget.computed_flops` of the positions `d3s.integrations.trl.positions` counts) against
the matrix multiplications the model runs, on SmolLM2-135M-Instruct's shapes (hidden 576, 9 heads, 3 key/value
heads, intermediate 1536, vocabulary 49152, tied embeddings) with 2 of its 30 layers, randomly initialised:

- generation: forward hooks on every `nn.Linear` (2 x in x out per position of each call's input) while the
  shared-prefill path (`decoding.generate`) and transformers' `generate` run, against the count of each path;
- training and scoring forwards: every matrix product torch runs (`aten.mm`, `aten.addmm`, forward and backward,
  the chunked LM-head kernel's included) while `selective_forward` runs, against the count; attention's scores run
  in SDPA, which is not a matrix product here (left out, as docs/compare.md says), and the rotary embedding's tiny
  batched product is not counted either.

Each layer counts alike, so two layers check the per-layer count; the 30-layer shapes are checked on the meta
device, and against the embedded model's GGUF metadata where that package is installed. Last, the trainer's totals
for TRL's own scoring passes (once per generation batch, however many updates use it). A whole `d3s train` run's
records against hooks on every linear layer: `tests/test_budget.py`.
"""

from __future__ import annotations

import contextlib
import types

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM  # noqa: E402

from d3s.app.budget import ModelShape, computed_flops, model_shape  # noqa: E402
from d3s.integrations.trl.decoding import Sampling, generate  # noqa: E402
from d3s.integrations.trl.positions import (COUNTS, generate_positions, labelled_positions,  # noqa: E402
                                            unpadded_positions)
from d3s.integrations.trl.selective_head import add_selective_lm_head, selective_forward  # noqa: E402

SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_attention_heads=9,
               num_key_value_heads=3, head_dim=64, tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=100000.0)
"""SmolLM2-135M-Instruct's config (the embedded model's GGUF metadata, `d3s.app.models`), but for its 30 layers."""
LAYER = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536  # q and o, k and v (3 heads of 64), gate, up and down
EOS = 7


def _model(layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SMOLLM2, num_hidden_layers=layers, eos_token_id=EOS, pad_token_id=0)).eval()


def _counts(**given) -> dict[str, float]:
    return {name: float(given.get(name, 0)) for name in COUNTS}


class LinearFlops:
    """2 x in x out per position of every `nn.Linear` call, from its input's shape (forward hooks)."""

    def __init__(self, model):
        self.flops = 0
        self.handles = [m.register_forward_hook(self.hook) for m in model.modules() if isinstance(m, torch.nn.Linear)]

    def hook(self, module, args, output):
        x = args[0]
        self.flops += 2 * module.in_features * module.out_features * (x.numel() // x.size(-1))

    def close(self):
        for h in self.handles:
            h.remove()


class MatmulFlops(TorchDispatchMode):
    """2 x m x k x n of every `aten.mm` and `aten.addmm` (out-of-place, in-place, `out=`) torch runs."""

    def __init__(self):
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        if packet is torch.ops.aten.mm:
            a, b = args[0], args[1]
            self.flops += 2 * a.size(0) * a.size(1) * b.size(1)
        elif packet in (torch.ops.aten.addmm, torch.ops.aten.addmm_):
            a, b = args[1], args[2]
            self.flops += 2 * a.size(0) * a.size(1) * b.size(1)
        return func(*args, **(kwargs or {}))


def test_the_shapes_are_smollm2s():
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2, num_hidden_layers=30))
    shape = model_shape(model)
    assert shape == ModelShape(n_body=30 * LAYER, n_head=576 * 49152) == ModelShape(106_168_320, 28_311_552)
    norms = (2 * 30 + 1) * 576  # left out of N_body: no matrix product
    assert sum(p.numel() for p in model.parameters()) == shape.n_body + shape.n_head + norms == 134_515_008


def test_the_config_is_the_embedded_models():
    pytest.importorskip("gguf")
    from gguf import GGUFReader

    from d3s.app.models import embedded_gguf_file

    try:
        path = embedded_gguf_file()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    reader = GGUFReader(path)
    fields = reader.fields

    def value(key):
        field = fields[key]
        return field.parts[field.data[0]].tolist()[0]

    assert [value(f"llama.{k}") for k in ("block_count", "embedding_length", "feed_forward_length",
                                          "attention.head_count", "attention.head_count_kv", "vocab_size")] \
        == [30, SMOLLM2["hidden_size"], SMOLLM2["intermediate_size"], SMOLLM2["num_attention_heads"],
            SMOLLM2["num_key_value_heads"], SMOLLM2["vocab_size"]]
    assert "output.weight" not in {t.name for t in reader.tensors}  # the head is the embedding (tied)


def _rows() -> list[list[int]]:
    """2 distinct prompts (a shared prefix of 5 tokens, 3 and 6 own tokens) x 3 rollouts, and a third prompt once."""
    prefix = [11, 12, 13, 14, 15]
    a, b, c = prefix + [21, 22, 23], prefix + [31, 32, 33, 34, 35, 36], [41, 42, 43, 44]
    return [a, a, a, b, b, b, c]


@pytest.mark.parametrize("do_sample", [False, True])
def test_shared_prefill_generation_computes_what_it_counts(do_sample):
    model = _model()
    shape = model_shape(model)
    with torch.no_grad():
        model.lm_head.weight[EOS] *= 40  # tied: end-of-sequence likely, completions of different lengths
    torch.manual_seed(1)
    hooks = LinearFlops(model)
    out = generate(model, _rows(), Sampling(max_new_tokens=6, eos_token_ids=(EOS,), pad_token_id=0,
                                            do_sample=do_sample))
    hooks.close()
    got = out.positions
    lengths = [len(c) for c in out.completion_ids]
    assert len(set(lengths)) > 1  # rows finished at different steps
    assert got["decode"] == sum(lengths) - len(lengths)  # finished rows leave the batch: no padding decoded
    assert got["prefill"] < sum(map(len, _rows()))  # each distinct prompt once
    counts = _counts(prefill=got["prefill"], decode=got["decode"], generation_head=got["head"])
    assert computed_flops(shape, counts) == hooks.flops


def test_transformers_generate_computes_what_it_counts():
    """TRL's path without shared prefill: every row's padded prompt prefilled, every row decoded until the longest
    completion ends (`generate_positions`)."""
    model = _model()
    shape = model_shape(model)
    with torch.no_grad():
        model.lm_head.weight[EOS] *= 40
    rows = _rows()
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])  # (S, width) left-padded as TRL pads
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(r) for r in rows])[:, None]).long()
    config = GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=EOS, pad_token_id=0)
    hooks = LinearFlops(model)
    with torch.no_grad():
        completions = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, width:]
    hooks.close()
    lengths = [next((i + 1 for i, t in enumerate(row) if t == EOS), len(row)) for row in completions.tolist()]
    assert len(set(lengths)) > 1  # rows finished at different steps, and kept decoding
    got = generate_positions([len(r) for r in rows], lengths)
    counts = _counts(prefill=got["prefill"], decode=got["decode"], generation_head=got["head"])
    assert computed_flops(shape, counts) == hooks.flops


def test_the_generation_counts_by_hand():
    # prompts of 3 and 5 tokens padded to 8, completions of 2 and 4 tokens: 3 decoding steps for both rows
    assert generate_positions([3, 5], [2, 4], pad_to_multiple_of=4) == {"prefill": 2 * 8, "decode": 2 * 3,
                                                                       "head": 2 + 2 * 3}
    assert generate_positions([3, 5], [2, 4], last_logits_only=False) == {"prefill": 10, "decode": 6, "head": 16}
    assert unpadded_positions([3, 5], [2, 4]) == {"prefill": 8, "decode": 1 + 3, "head": 2 + 4}


def _batch(rows: int = 4, prompt: int = 9, completion: int = 7):
    g = torch.Generator().manual_seed(2)
    prompt_ids = torch.randint(50, 49152, (rows, prompt), generator=g)
    prompt_mask = torch.ones(rows, prompt, dtype=torch.long)
    prompt_mask[0, :3] = 0  # left padding
    completion_ids = torch.randint(50, 49152, (rows, completion), generator=g)
    completion_mask = (torch.arange(completion)[None] < torch.tensor([7, 5, 2, 6])[:, None]).long()  # (S, T)
    return prompt_ids, prompt_mask, completion_ids, completion_mask


_ACCELERATOR = types.SimpleNamespace(autocast=contextlib.nullcontext)


def test_a_training_forward_and_backward_compute_what_they_count():
    """The selective head: the body over the columns up to the last used one, forward and backward, the LM head
    with gradient at the kept tokens (its kernel recomputes the logits in the backward) and without at the
    values-only ones."""
    model = _model().train()
    shape = model_shape(model)
    add_selective_lm_head(model, temperature=1.0, cast_lm_head_to_fp32=False)
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    grad = torch.zeros_like(completion_mask, dtype=torch.bool)
    grad[0, [1, 4]] = grad[1, 2] = grad[3, 0] = True  # (S, T) the kept tokens: the forward stops at column 5
    values = completion_mask.bool() & (torch.arange(7) < 4)  # (S, T) read without gradient (GSPO's ratio, say)
    hooks, counter = LinearFlops(model), MatmulFlops()
    with counter:
        logps, _, _, computed = selective_forward(model, _ACCELERATOR, prompt_ids, prompt_mask, completion_ids,
                                                  completion_mask, grad_positions=grad, value_positions=values)
        logps.sum().backward()
    hooks.close()
    assert computed == {"body": 4 * (9 + 5), "head": 4, "head_no_grad": int((values & ~grad)[:, :5].sum())}
    assert hooks.flops == 2 * shape.n_body * computed["body"]  # the body's forward
    counts = _counts(trained=computed["body"], trained_head=computed["head"], no_grad_head=computed["head_no_grad"])
    assert computed_flops(shape, counts) == counter.flops


def test_a_scoring_pass_computes_what_it_counts():
    model = _model()
    shape = model_shape(model)
    add_selective_lm_head(model, temperature=1.0, cast_lm_head_to_fp32=False)
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    counter = MatmulFlops()
    with torch.no_grad(), counter:
        _, _, _, computed = selective_forward(model, _ACCELERATOR, prompt_ids, prompt_mask, completion_ids,
                                              completion_mask, grad_positions=None,
                                              value_positions=completion_mask.bool())
    assert computed == {"body": 4 * (9 + 7), "head": 0, "head_no_grad": int(completion_mask.sum())}
    counts = _counts(no_grad=computed["body"], no_grad_head=computed["head_no_grad"])
    assert computed_flops(shape, counts) == counter.flops


def test_trls_fused_head_scores_the_labelled_positions():
    """`labelled_positions` counts the labels TRL's `_get_per_token_logps_and_entropies` leaves (its fused head
    scores those where Triton runs)."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (S, P + T)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    logits_to_keep = completion_ids.size(1)
    labels = input_ids.masked_fill(attention_mask == 0, -100)  # as TRL builds them
    labels[:, :-logits_to_keep] = -100
    assert labelled_positions(attention_mask, logits_to_keep) == int((labels[:, 1:] != -100).sum()) \
        == int(completion_mask.sum())


def test_trls_own_passes_count_once_per_generation_batch(tmp_path):
    """Plain GRPO with two updates per generation and a reference: TRL scores the generation batch's 16 rows once
    with the old policy and once with the reference (CountedPasses), and trains on them twice (4 micro-batches of
    8): as many scoring positions as training ones, body and head. The generation of the tests' `rollout_func` is
    counted unpadded."""
    from trl_tiny import run_training, step_logs

    from d3s.integrations.trl import D3SConfig, D3SGRPOTrainer

    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, variant="grpo", beta=0.04, num_iterations=2, max_steps=2,
                       kl_log_every=0, per_device_train_batch_size=8, gradient_accumulation_steps=2)
    totals = run.d3s_positions.totals
    assert totals["no_grad"] == totals["trained"] > 0
    assert totals["no_grad_head"] == totals["trained_head"] > 0
    completions = 16 * step_logs(run)[0]["completions/mean_length"]
    assert totals["trained_head"] == pytest.approx(2 * completions)  # TRL's head: every completion token, twice
    assert totals["decode"] == pytest.approx(completions - 16) and totals["generation_head"] == totals["decode"] + 16
