"""Sampling n completions per prompt: transformers (CPU / GPU) or vLLM (GPU, when installed).

Both samplers take rendered prompt texts and return `n` completion texts per prompt. The
transformers sampler repeats each prompt n times, left-pads, and generates in batches of at most
`batch_size` sequences; with `shared_prefill`, through `d3s.integrations.trl.decoding` instead: each
prompt (and the prefix all prompts of a call share) prefilled once, finished rows leaving the batch.
The random state is re-seeded before every call so a call's output depends only on its inputs and seed.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Sequence

from d3s.app.errors import ModelLoadError
from d3s.app.models import load_pretrained

from .prompts import has_chat_template

Backend = Literal["auto", "transformers", "vllm"]


@dataclass(frozen=True)
class SamplingSettings:
    """What is sampled; every field changes the completions (so it keys the resume cache)."""

    n: int
    """Completions per problem."""
    max_new_tokens: int
    temperature: float
    """0 means greedy decoding."""
    top_p: float
    top_k: int
    """0 disables top-k filtering."""


class Sampler(Protocol):
    tokenizer: object

    def sample(self, prompts: list[str], settings: SamplingSettings, seed: int) -> list[list[str]]:
        """`len(prompts)` lists of `settings.n` completion texts."""
        ...


def vllm_usable() -> bool:
    """vLLM is installed and a CUDA GPU is present."""
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        torch.device(device)
    except RuntimeError:
        raise ModelLoadError(f"--device {device!r} is not a device; valid: auto, cpu, cuda, cuda:1, ...") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"--device {device}, but no CUDA GPU is available; use cpu or auto")
    return device


def _resolve_dtype(dtype: str, device: str):
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in table:
        raise ModelLoadError(f"dtype={dtype!r}; valid: auto, {', '.join(table)}")
    return table[dtype]


class TransformersSampler:
    """`AutoModelForCausalLM.generate` on CPU or one GPU."""

    def __init__(
        self, model: str, *, device: str = "auto", dtype: str = "auto", batch_size: int = 32,
        shared_prefill: bool = False,
    ) -> None:
        self.device = _resolve_device(device)
        torch_dtype = _resolve_dtype(dtype, self.device)
        self.model, self.tokenizer = load_pretrained(model, dtype=torch_dtype)
        self.model.to(self.device).eval()
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self._setup(batch_size, shared_prefill)

    def _setup(self, batch_size: int, shared_prefill: bool) -> None:
        self.batch_size = batch_size
        self.shared_prefill = shared_prefill
        self.add_special_tokens = True
        self.context_length: int | None = getattr(self.model.config, "max_position_embeddings", None)
        """Most tokens (prompt + completion) the model handles; None when its config does not say."""

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, *, batch_size: int, shared_prefill: bool = False
                   ) -> TransformersSampler:
        """A sampler over a model already in memory (the one `d3s train` is training), on its device.

        The caller owns the model's train/eval mode and the tokenizer's padding side (left, for
        generation). As in `d3s eval`, special tokens are added to plain prompts only: a chat
        template already carries them."""
        self = cls.__new__(cls)
        self.model, self.tokenizer, self.device = model, tokenizer, str(model.device)
        self._setup(batch_size, shared_prefill)
        self.add_special_tokens = not has_chat_template(tokenizer)
        return self

    def sample(self, prompts: list[str], settings: SamplingSettings, seed: int) -> list[list[str]]:
        import torch

        flat = [p for p in prompts for _ in range(settings.n)]  # (P*n,) prompt i repeated n times
        texts: list[str] = []
        greedy = settings.temperature == 0
        gen_kwargs = dict(
            max_new_tokens=settings.max_new_tokens,
            do_sample=not greedy,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        if not greedy:
            gen_kwargs.update(
                temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k
            )
        else:  # silence sampling-only settings a model's generation_config may carry
            gen_kwargs.update(temperature=None, top_p=None, top_k=None)
        if not greedy:  # greedy decoding draws nothing: leave the caller's random state alone
            torch.manual_seed(seed)
        if self.shared_prefill:
            return self._sample_shared_prefill(prompts, settings)
        for start in range(0, len(flat), self.batch_size):
            chunk = flat[start : start + self.batch_size]
            enc = self.tokenizer(
                chunk,
                return_tensors="pt",
                padding=True,
                add_special_tokens=self.add_special_tokens,
            ).to(self.device)
            with torch.inference_mode():
                out = self.model.generate(**enc, **gen_kwargs)  # (b, T_prompt + T_new)
            new_tokens = out[:, enc["input_ids"].shape[1] :]  # (b, T_new)
            texts += self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        return [texts[i * settings.n : (i + 1) * settings.n] for i in range(len(prompts))]

    def _sample_shared_prefill(self, prompts: list[str], settings: SamplingSettings) -> list[list[str]]:
        from d3s.integrations.trl.decoding import Sampling, generate

        ids = self.tokenizer(prompts, add_special_tokens=self.add_special_tokens)["input_ids"]
        eos_ids = getattr(self.model.generation_config, "eos_token_id", None)  # what `generate` stops on
        eos_ids = self.tokenizer.eos_token_id if eos_ids is None else eos_ids
        eos_ids = tuple(eos_ids) if isinstance(eos_ids, (list, tuple)) else (eos_ids,)
        sampling = Sampling(
            max_new_tokens=settings.max_new_tokens, eos_token_ids=eos_ids,
            pad_token_id=self.tokenizer.pad_token_id, do_sample=settings.temperature > 0,
            temperature=settings.temperature or 1.0, top_p=settings.top_p, top_k=settings.top_k,
        )
        rows = [p for p in ids for _ in range(settings.n)]  # (P*n,) prompt i repeated n times
        out = generate(self.model, rows, sampling, max_rows=self.batch_size).completion_ids
        texts = self.tokenizer.batch_decode(out, skip_special_tokens=True)
        return [texts[i * settings.n : (i + 1) * settings.n] for i in range(len(prompts))]


class VLLMSampler:
    """vLLM offline generation (GPU); imported only when selected."""

    def __init__(self, model: str, *, dtype: str = "auto", gpu_memory_utilization: float = 0.85):
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError("--backend vllm needs vLLM: pip install vllm") from e
        self.llm = LLM(model=model, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization)
        self.tokenizer = self.llm.get_tokenizer()
        self.add_special_tokens = True
        try:
            self.context_length: int | None = self.llm.llm_engine.model_config.max_model_len
        except AttributeError:  # pragma: no cover - another vLLM layout
            self.context_length = None

    def sample(self, prompts: list[str], settings: SamplingSettings, seed: int) -> list[list[str]]:
        from vllm import SamplingParams

        params = SamplingParams(
            n=settings.n,
            temperature=settings.temperature,
            top_p=settings.top_p if settings.temperature > 0 else 1.0,
            top_k=settings.top_k if settings.top_k > 0 else -1,
            max_tokens=settings.max_new_tokens,
            seed=seed,
        )
        # Pre-tokenised so a chat-formatted prompt does not get a second BOS token.
        inputs = [
            {"prompt_token_ids": ids}
            for ids in self.tokenizer(prompts, add_special_tokens=self.add_special_tokens)[
                "input_ids"
            ]
        ]
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        return [[c.text for c in o.outputs] for o in outputs]


def make_sampler(
    backend: Backend, model: str, *, device: str = "auto", dtype: str = "auto", batch_size: int = 32,
    shared_prefill: bool = False,
) -> Sampler:
    """The sampler for `backend`; `auto` picks vLLM when it is installed and a GPU is present."""
    if backend == "auto":
        backend = "vllm" if vllm_usable() and device in ("auto", "cuda") else "transformers"
    if backend == "vllm":
        if not vllm_usable():
            raise ModelLoadError("--backend vllm needs vLLM installed and a CUDA GPU")
        return VLLMSampler(model, dtype=dtype)
    elif backend == "transformers":
        return TransformersSampler(model, device=device, dtype=dtype, batch_size=batch_size,
                                   shared_prefill=shared_prefill)
    else:
        raise ModelLoadError(f"backend={backend!r}; valid: auto, transformers, vllm")


def problems_per_call(n: int, batch_size: int) -> int:
    """How many problems one `sample` call takes: enough to fill a batch, at least one."""
    return max(1, math.floor(batch_size / n))


def call_plan(prompts: Sequence[str], per_call: int) -> list[list[int]]:
    """The `sample` calls for `prompts`: indices ordered by prompt length (stable), `per_call` per call.

    Prompts of similar length share a generate batch, so little of it is padding. `d3s eval` and the
    held-out evaluation of `d3s train` both sample through this plan: the same problems, prompts,
    batch size and model give the same batches, hence the same greedy completions.
    """
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    return [order[start : start + per_call] for start in range(0, len(order), per_call)]
