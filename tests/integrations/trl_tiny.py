"""Tiny, fully local TRL setup for the D3S integration tests: no downloads, CPU, seconds per run.

- `tiny_tokenizer()`: a word-level tokenizer over "t0".."t60" built in code.
- `tiny_model(seed)`: a 2-layer Llama with hidden size 32, initialised from `seed`.
- `make_rollout_func(...)`: a deterministic stand-in for generation (TRL's `rollout_func` hook): the
  completion of a row depends only on (prompt, its index in the group, the generation round), so a
  run on one process and a run on two see exactly the same data. Lengths vary; some completions end
  with EOS, some hit the length limit, optionally some are empty.
- `length_reward`: a pure reward function.
"""

from __future__ import annotations

import os
import random
import zlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

VOCAB = 64
PAD, EOS = 0, 1


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": PAD, "<eos>": EOS, "<unk>": 2}
    for i in range(VOCAB - 3):
        vocab[f"t{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.padding_side = "left"
    return fast


def tiny_model(seed: int = 0, hidden_size: int = 32, num_hidden_layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).float()


def prompt_dataset(n: int = 32, prompt_len: int = 3) -> Dataset:
    """Prompts of `prompt_len` words each (equal token length: no left padding differences)."""
    return Dataset.from_dict({"prompt": [" ".join(f"t{(i + j) % 50}" for j in range(prompt_len)) for i in range(n)]})


def length_reward(completions, **kwargs) -> list[float]:
    """Pure: 1 point per 't5'..'t9' word plus 0.1 per word."""
    return [sum(w in {"t5", "t6", "t7", "t8", "t9"} for w in c.split()) + 0.1 * len(c.split()) for c in completions]


def make_rollout_func(max_len: int, num_generations: int, *, empty_every: int = 0, full_every: int = 5):
    """A deterministic `rollout_func(prompts, trainer)` for TRL (see module docstring).

    Row g of a group in generation round r gets a completion drawn from a RNG seeded by
    (prompt, g, r): length in [1, max_len - 1] ending with EOS, or exactly `max_len` words without EOS
    for every `full_every`-th row (truncated), or no token at all for every `empty_every`-th row.
    """

    def rollout_func(prompts, trainer):
        tok = trainer.processing_class
        rank = trainer.accelerator.process_index
        rnd = trainer._step // (trainer.args.steps_per_generation * trainer.num_iterations)
        prompt_ids, completion_ids = [], []
        for i, prompt in enumerate(prompts):
            row = rank * len(prompts) + i
            g = row % num_generations
            rng = random.Random(zlib.crc32(f"{prompt}|{g}|{rnd}".encode()))
            prompt_ids.append(tok(prompt, add_special_tokens=False)["input_ids"])
            if empty_every and row % empty_every == 0:
                ids = []
            elif full_every and row % full_every == 0:
                ids = [rng.randrange(3, VOCAB) for _ in range(max_len)]
            else:
                ids = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, max_len))] + [EOS]
            completion_ids.append(ids)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout_func
