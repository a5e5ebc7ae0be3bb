"""Shared-prefill decoding: one prefill per distinct prompt, no work on finished rollouts.

`generate(model, prompt_ids, sampling)` returns what transformers' `generate` returns for the same
prompts and settings (the completion tokens up to and including the first end-of-sequence token),
with two savings that do not change any row's computation:

1. **One prefill per distinct prompt.** A GRPO batch holds each prompt G times. The distinct prompts
   are prefilled once (left-padded, one batch) and their key/value cache is copied to the G rows
   that share it (`Cache.batch_select_indices` with repeated indices). The first token of every row
   is drawn from its prompt's prefill logits.
2. **Finished rows leave the batch.** After each token, the rows that produced an end-of-sequence
   token (or reached `max_new_tokens`) are dropped from the decode batch and from the cache, so a
   decoding step computes only the rows still generating.

Every row still attends to exactly its own prompt and its own tokens at the same positions, through
the same model call as `generate`, so greedy completions are the same up to float rounding of the
different batch shapes (measured: benchmarks/results/generation/), and sampled completions have the
same distribution (the random draws differ: fewer rows draw per step). The logits are processed as
`generate` does with `do_sample`: float32, then temperature, top-k, top-p, min-p (transformers'
own warpers, in `generate`'s order) and softmax; the token is drawn from those probabilities by
inverse-CDF sampling (`sample_tokens`: the distribution of `generate`'s `torch.multinomial`, at a
twentieth of its cost on a CPU); greedy is the arg-max.
Any other generation setting is refused by `check_generation_settings` (docs/trl.md).

Imports torch and transformers only.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field

import torch

SUPPORTED_SETTINGS = frozenset({
    "max_new_tokens", "do_sample", "pad_token_id", "bos_token_id", "temperature", "top_p",
    "top_k", "min_p", "repetition_penalty", "cache_implementation", "disable_compile",
})
"""The `generation_kwargs` keys the shared-prefill path honours (with `repetition_penalty` 1 and no
`cache_implementation`: it keeps its own cache); any other key is refused. `eos_token_id` among them: the path
stops every completion at the trainer's end-of-sequence tokens (TRL's `eos_token_ids`, where TRL cuts and marks a
completion), while TRL's `generate` would stop at the given ones and pad the rest of the row."""


@dataclass(frozen=True)
class Sampling:
    """What to generate: the settings of transformers' `GenerationConfig` that this path honours."""

    max_new_tokens: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    do_sample: bool = True
    temperature: float = 1.0
    top_k: int | None = None
    """None or 0: no top-k filtering."""
    top_p: float | None = None
    """None or 1.0: no nucleus filtering."""
    min_p: float | None = None


def check_generation_settings(settings: dict) -> None:
    """Refuse, in one line naming the setting, a generation setting the shared-prefill path cannot honour."""
    if "eos_token_id" in settings:
        raise ValueError(
            f"generation_kwargs eos_token_id={settings['eos_token_id']!r} is not honoured by "
            "shared_prefill_generation: it stops every completion at the trainer's end-of-sequence tokens (the "
            "tokenizer's and the model's, where TRL cuts a completion); remove it or set "
            "shared_prefill_generation=False"
        )
    for key, value in settings.items():
        if key not in SUPPORTED_SETTINGS:
            raise ValueError(
                f"generation_kwargs {key}={value!r} is not honoured by shared_prefill_generation; remove it or set "
                f"shared_prefill_generation=False (supported: {', '.join(sorted(SUPPORTED_SETTINGS))})"
            )
    if settings.get("repetition_penalty") not in (None, 1.0):
        raise ValueError(
            f"repetition_penalty={settings['repetition_penalty']!r} is not honoured by shared_prefill_generation "
            "(it reads every earlier token of a row); set it to 1.0 or set shared_prefill_generation=False"
        )
    if settings.get("cache_implementation") is not None:
        raise ValueError(
            f"cache_implementation={settings['cache_implementation']!r}: shared_prefill_generation keeps its own "
            "cache; set cache_implementation=None or shared_prefill_generation=False"
        )


def sampling_from_generation_config(config, max_new_tokens: int | None = None) -> Sampling:
    """The `Sampling` of a transformers `GenerationConfig` (checked with `check_generation_settings` first)."""
    eos = config.eos_token_id
    eos = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
    return Sampling(
        max_new_tokens=config.max_new_tokens if max_new_tokens is None else max_new_tokens,
        eos_token_ids=eos,
        pad_token_id=config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else 0),
        do_sample=bool(config.do_sample),
        temperature=1.0 if config.temperature is None else float(config.temperature),
        top_k=config.top_k,
        top_p=config.top_p,
        min_p=config.min_p,
    )


def _warpers(sampling: Sampling) -> list:
    """transformers' logits warpers for `sampling`, in the order `generate` applies them."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    if not sampling.do_sample:
        return []
    out = []
    if sampling.temperature != 1.0:
        out.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_k:
        out.append(TopKLogitsWarper(top_k=sampling.top_k))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        out.append(TopPLogitsWarper(top_p=sampling.top_p))
    if sampling.min_p is not None:
        out.append(MinPLogitsWarper(min_p=sampling.min_p))
    return out


@dataclass
class Generation:
    """The result of `generate`."""

    completion_ids: list[list[int]]
    """Per input row, the generated tokens up to and including the first end-of-sequence token."""
    step_entropies: list[torch.Tensor] | None = None
    """With `entropy_temperature`: one `(rows,)` entropy per decoding step, 0 for rows already finished,
    as `GenerationEntropy` records them from `generate`."""
    positions: dict = field(default_factory=dict)
    """Positions computed: `{"prefill": ..., "decode": ..., "head": ...}`: rows x columns the model's body ran on
    in the prefill and decoding calls (left padding included), and the positions the LM head ran at (the last
    position of each prefill call with `logits_to_keep`, every prefill position without it, every decode
    position)."""


def sample_tokens(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of `probs` `(A, V)`, drawn by inverse-CDF sampling: one uniform u per row and the first
    token whose cumulative probability (float64) exceeds u times the row's total.

    The distribution of `torch.multinomial(probs, 1)`; on a CPU over a 49k vocabulary about 20x cheaper (38 ms
    against under 2 ms for 32 rows, benchmarks/results/generation/). A token of probability 0 is never drawn.
    """
    cdf = probs.double().cumsum(dim=-1)  # (A, V)
    u = torch.rand(probs.size(0), 1, dtype=torch.float64, device=probs.device) * cdf[:, -1:]  # (A, 1) in [0, total)
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=probs.size(1) - 1)  # (A,)


def distinct_rows(prompt_ids: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """`(distinct prompts in first-seen order, index of each row's distinct prompt)`."""
    seen: dict[tuple[int, ...], int] = {}
    owner = []
    for ids in prompt_ids:
        owner.append(seen.setdefault(tuple(ids), len(seen)))
    return [list(key) for key in seen], owner


def _left_pad(prompts: list[list[int]], pad_token_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)  # (U, L), (U, L)


@torch.no_grad()
def generate(model, prompt_ids: list[list[int]], sampling: Sampling, *, entropy_temperature: float | None = None,
             max_rows: int | None = None) -> Generation:
    """Generate one completion per row of `prompt_ids`, prefilling each distinct prompt once.

    Args:
        model: a transformers causal LM (already unwrapped for generation, in eval or train mode).
        prompt_ids: the rows' prompt token ids; equal prompts share one prefill.
        sampling: what to generate.
        entropy_temperature: also return each generated token's policy entropy (`d3s.entropy.token_entropy`
            of the float32 logits over this temperature), one `(rows,)` tensor per step.
        max_rows: at most this many rows decode at once (whole groups of distinct prompts go together);
            None: all rows at once.
    """
    if not prompt_ids:
        return Generation([], [] if entropy_temperature is not None else None, {"prefill": 0, "decode": 0, "head": 0})
    if max_rows is None or max_rows >= len(prompt_ids):
        return _generate_chunk(model, prompt_ids, sampling, entropy_temperature)
    distinct, owner = distinct_rows(prompt_ids)
    rows_of = [[] for _ in distinct]
    for row, u in enumerate(owner):
        rows_of[u].append(row)
    chunks, current = [], []
    for rows in rows_of:  # whole groups per chunk, so a prompt's prefill is shared by all its rows
        if current and len(current) + len(rows) > max_rows:
            chunks.append(current)
            current = []
        current = current + rows
    chunks.append(current)
    out = Generation([[] for _ in prompt_ids], [] if entropy_temperature is not None else None,
                     {"prefill": 0, "decode": 0, "head": 0})
    for chunk in chunks:
        part = _generate_chunk(model, [prompt_ids[r] for r in chunk], sampling, entropy_temperature)
        for r, ids in zip(chunk, part.completion_ids):
            out.completion_ids[r] = ids
        for key in out.positions:
            out.positions[key] += part.positions[key]
        if out.step_entropies is not None:
            index = torch.tensor(chunk)
            for t, step in enumerate(part.step_entropies):
                if t == len(out.step_entropies):
                    out.step_entropies.append(torch.zeros(len(prompt_ids), device=step.device))
                out.step_entropies[t][index.to(step.device)] = step
    return out


def common_prefix_length(prompts: list[list[int]]) -> int:
    """Tokens that every prompt starts with, leaving each prompt at least one token of its own."""
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        n = next((i for i in range(n) if p[i] != first[i]), n)
    return max(n, 0)


def _prefill(model, distinct: list[list[int]], pad_token_id: int, cache, device):
    """Prefill the distinct prompts: their common prefix once, then every prompt's own tokens beside it.

    Returns `(last logits (U, V) float32, attention mask (U, C), next position (U,), positions computed)`, the last
    as `{"prefill": body positions, "head": LM-head positions}`.
    A row's keys/values sit at columns [prefix | left padding | its own tokens] with positions 0, 1, ... over
    its real tokens, as `generate` numbers them; the padding columns are masked out.
    """
    U = len(distinct)
    window = getattr(model.config.get_text_config(), "sliding_window", None)
    # a sliding window counts cache columns, and the padding between prefix and own tokens would shift them
    shareable = U > 1 and (not window or window >= max(map(len, distinct)) + 1)
    c = common_prefix_length(distinct) if shareable else 0
    last_only = keeps_last_logits_only(model)
    computed = {"prefill": c, "head": (1 if last_only else c) if c else 0}
    prefix_mask = torch.ones(U, c, dtype=torch.long, device=device)  # (U, c)
    if c:
        prefix = torch.tensor([distinct[0][:c]], device=device)  # (1, c)
        model(input_ids=prefix, attention_mask=prefix_mask[:1], position_ids=torch.arange(c, device=device)[None],
              **_cache(model, cache), use_cache=True, **_last_logits_only(model))
        cache.batch_select_indices(torch.zeros(U, dtype=torch.long, device=device))  # (U, ...) shared prefix
    ids, own_mask = _left_pad([p[c:] for p in distinct], pad_token_id, device)  # (U, L), (U, L)
    positions = (c + own_mask.cumsum(dim=1) - 1).masked_fill(own_mask == 0, 1)  # (U, L) as `generate` sets them
    mask = torch.cat([prefix_mask, own_mask], dim=1)  # (U, c + L)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, **_cache(model, cache), use_cache=True,
                **_last_logits_only(model))
    computed["prefill"] += ids.numel()
    computed["head"] += U if last_only else ids.numel()
    return out.logits[:, -1].to(dtype=torch.float32), mask, positions[:, -1] + 1, computed


def _generate_chunk(model, prompt_ids, sampling: Sampling, entropy_temperature: float | None) -> Generation:
    from d3s.entropy import token_entropy

    device = next(model.parameters()).device
    S = len(prompt_ids)
    distinct, owner = distinct_rows(prompt_ids)
    cache = _preallocated_cache(model, max(len(p) for p in distinct) + sampling.max_new_tokens)
    logits, mask, next_position, prefilled = _prefill(model, distinct, sampling.pad_token_id, cache, device)
    owner_t = torch.tensor(owner, device=device)  # (S,)
    cache.batch_select_indices(owner_t)  # (S, ...) every row its prompt's keys/values
    logits, mask, next_position = logits[owner_t], mask[owner_t], next_position[owner_t]  # (S, V), (S, C), (S,)

    warpers = _warpers(sampling)
    eos = torch.tensor(sampling.eos_token_ids, device=device, dtype=torch.long)
    completions = [[] for _ in range(S)]
    steps: list[torch.Tensor] | None = [] if entropy_temperature is not None else None
    active = torch.arange(S, device=device)  # (A,) original row of each decode-batch row
    counts = {"prefill": prefilled["prefill"], "decode": 0, "head": prefilled["head"]}
    for t in range(sampling.max_new_tokens):
        if steps is not None:
            step = torch.zeros(S, device=device)
            step[active] = token_entropy(logits / entropy_temperature)
            steps.append(step)  # (S,)
        if sampling.do_sample:
            scores = logits
            for warp in warpers:
                scores = warp(None, scores)
            tokens = sample_tokens(torch.softmax(scores, dim=-1))  # (A,)
        else:
            tokens = logits.argmax(dim=-1)  # (A,)
        for row, token in zip(active.tolist(), tokens.tolist()):
            completions[row].append(token)
        going = ~torch.isin(tokens, eos)  # (A,)
        if t + 1 == sampling.max_new_tokens or not bool(going.any()):
            break
        if not bool(going.all()):  # finished rows leave the batch and the cache
            keep = going.nonzero().squeeze(1)  # (A',)
            cache.batch_select_indices(keep)
            active, tokens, mask, next_position = active[keep], tokens[keep], mask[keep], next_position[keep]
        mask = torch.cat([mask, mask.new_ones(mask.size(0), 1)], dim=1)  # (A, C + t + 1)
        out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=next_position[:, None],
                    **_cache(model, cache), use_cache=True)
        counts["decode"] += tokens.numel()
        counts["head"] += tokens.numel()  # one position per row: the head runs at it
        logits = out.logits[:, -1].to(dtype=torch.float32)  # (A, V)
        next_position = next_position + 1
    return Generation(completions, steps, counts)


def _forward_parameters(model) -> frozenset[str]:
    """The keyword names of the (PEFT-unwrapped) model's forward, read once per model class: decoding asks at
    every token."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _parameters_of(type(base))


@functools.lru_cache(maxsize=None)
def _parameters_of(cls) -> frozenset[str]:
    return frozenset(inspect.signature(cls.forward).parameters)


def _cache(model, cache) -> dict:
    """The keyword a model's forward takes its cache by: `cache` (transformers >= 5.x models) or `past_key_values`."""
    return {"cache": cache} if "cache" in _forward_parameters(model) else {"past_key_values": cache}


def keeps_last_logits_only(model) -> bool:
    """Whether the model's forward takes `logits_to_keep` (transformers' `generate` then sets it to 1 for the prefill,
    as `_prefill` does here: the LM head runs at the last position only)."""
    return "logits_to_keep" in _forward_parameters(model)


def _last_logits_only(model) -> dict:
    """`logits_to_keep=1` where the model's forward takes it (the LM head at the last position only)."""
    return {"logits_to_keep": 1} if keeps_last_logits_only(model) else {}


def _preallocated_cache(model, capacity: int):
    """A `DynamicCache` whose layers write into buffers of `capacity` positions instead of growing by `torch.cat`
    (which copies the whole cache at every decoding step); layers of another kind are kept as they are."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                B, H, _, D = key_states.shape
                self.key_buffer = key_states.new_empty(B, H, capacity, D)
                self.value_buffer = value_states.new_empty(B, H, capacity, value_states.size(-1))
                self.filled = 0
            n = self.filled + key_states.size(-2)
            self.key_buffer[:, :, self.filled : n] = key_states
            self.value_buffer[:, :, self.filled : n] = value_states
            self.filled = n
            self.keys, self.values = self.key_buffer[:, :, :n], self.value_buffer[:, :, :n]  # views: (B, H, n, D)
            return self.keys, self.values

        def batch_select_indices(self, indices):
            if self.is_initialized:
                self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
                self.keys, self.values = self.key_buffer[:, :, : self.filled], self.value_buffer[:, :, : self.filled]

    cache = DynamicCache(config=model.config)
    cache.layers = [PreallocatedLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
