"""The settings of one `d3s eval` run (`EvalConfig`): every option with its help, validated once in `__post_init__`
with errors that name the value and what would be valid, and the fingerprint of those that change completions or
scores (the resume cache's first line, `d3s.app.evaluation.runner`)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from d3s.app.errors import UsageError

from .benchmarks import BENCHMARKS, PAPER_BENCHMARKS, resolve_name
from .generation import Backend, SamplingSettings
from .prompts import ChatMode

DType = Literal["auto", "float32", "bfloat16", "float16"]


@dataclass
class EvalConfig:
    """Settings of one `d3s eval` run (validated once, in `__post_init__`).

    The fields are also the command's options (`--max_new_tokens 48`, `d3s.app.options`), each with the
    help in its metadata.
    """

    model: str = field(metadata={"help": "Local checkpoint folder or hub model name; `embedded`: the base model of "
                                 "the default `d3s train` run (SmolLM2-135M-Instruct), `tiny`: a random 2-layer model "
                                 "for smoke runs."})
    benchmarks: tuple[str, ...] = field(default=PAPER_BENCHMARKS, metadata={
        "help": "Benchmark names, comma-separated; `name=PATH` reads that benchmark from a local file or folder. "
                f"Valid names: {', '.join(BENCHMARKS)}."})
    n: int = field(default=32, metadata={"help": "Completions sampled per problem (the paper: 32)."})
    ks: tuple[int, ...] = field(default=(1, 8, 16), metadata={
        "help": "k values of pass@k, comma-separated (the paper: 1, 8, 16); each <= n."})
    output_dir: str | None = field(default=None, metadata={
        "help": "Output folder (cache and results); default `eval_results/<model name>`."})
    max_new_tokens: int = field(default=2048, metadata={"help": "Completion length limit in tokens."})
    temperature: float = field(default=1.0, metadata={
        "help": "Sampling temperature (paper Table 4: 1.0 for Qwen2.5-Math, 0.6 for Llama3.1); 0 = greedy."})
    top_p: float = field(default=0.9, metadata={"help": "Nucleus sampling threshold (paper Table 4: 0.9)."})
    top_k: int = field(default=0, metadata={"help": "Top-k filtering; 0 = off."})
    seed: int = field(default=0, metadata={"help": "Base random seed."})
    data_dir: str | None = field(default=None, metadata={
        "help": "Folder with local benchmark copies; when set, the hub is not used."})
    limit: int | None = field(default=None, metadata={
        "help": "Evaluate only the first `limit` problems of each benchmark."})
    batch_size: int = field(default=32, metadata={"help": "Most sequences per generate call (transformers backend)."})
    shared_prefill: bool = field(default=True, metadata={
        "help": "transformers backend: prefill each prompt once for its n samples (and the prefix all prompts of a "
                "call share once), finished samples leaving the batch; false: transformers' generate."})
    backend: Backend = field(default="auto", metadata={
        "help": "`auto` (vLLM if installed and a GPU is present, else transformers), `transformers`, `vllm`."})
    device: str = field(default="auto", metadata={"help": "`auto`, `cpu`, `cuda`, `cuda:1`, ..."})
    dtype: DType = field(default="auto", metadata={
        "help": "`auto` (bfloat16 on GPU, float32 on CPU), `float32`, `bfloat16`, `float16`."})
    prompt_template: str | None = field(default=None, metadata={
        "help": "User message with a `{question}` placeholder; default: the benchmark's own (a \"put the final "
                "answer within \\boxed{}\" instruction; the task's prompt for `arith`)."})
    chat: ChatMode = field(default="auto", metadata={
        "help": "Use the model's chat template: `auto` (when it has one), `on`, `off`."})
    system_prompt: str | None = field(default=None, metadata={"help": "Optional system message."})
    require_boxed: bool = field(default=False, metadata={
        "help": "Score 0 for completions without `\\boxed{}`; when false, math-verify's own extraction finds the "
                "answer."})
    verify_timeout: int = field(default=5, metadata={
        "help": "Seconds math-verify may spend on one parse / comparison before it scores 0."})
    label: str | None = field(default=None, metadata={"help": "Row label in tables; default: the model name."})
    overwrite: bool = field(default=False, metadata={
        "help": "Discard an existing cache in the output folder instead of resuming it."})
    score_workers: int | None = field(default=None, metadata={
        "help": "Processes scoring completions in parallel (math-verify takes ~0.05-0.1 s per completion); default: "
                "half the CPU cores, at most 8; 1 scores in the main process."})
    benchmark_paths: dict[str, str] = field(default_factory=dict, init=False)
    """Filled from `name=PATH` entries of `benchmarks`."""

    def __post_init__(self) -> None:
        if not self.model.strip():
            raise UsageError("--model is empty; give a checkpoint folder, a hub model name, `embedded` or `tiny`")
        if isinstance(self.benchmarks, str):
            self.benchmarks = tuple(b for b in self.benchmarks.split(",") if b.strip())
        if not self.benchmarks:
            raise UsageError(f"no benchmarks given; valid: {', '.join(BENCHMARKS)}")
        names = []
        for entry in self.benchmarks:
            name, sep, path = entry.partition("=")
            name = resolve_name(name)
            if sep:
                if not path.strip():
                    raise UsageError(f"benchmark {entry!r} names no file; write {name}=PATH")
                if not Path(path).exists():
                    raise UsageError(f"benchmark file {path!r} (for {name}) does not exist")
                self.benchmark_paths[name] = path
            if name not in names:
                names.append(name)
        self.benchmarks = tuple(names)
        if self.n < 1:
            raise UsageError(f"n={self.n} must be >= 1")
        self.ks = tuple(sorted(set(int(k) for k in self.ks)))
        bad = [k for k in self.ks if not 1 <= k <= self.n]
        if not self.ks or bad:
            raise UsageError(f"k={bad or '(none)'} invalid: every k must be in [1, n={self.n}]")
        if self.max_new_tokens < 1:
            raise UsageError(f"max_new_tokens={self.max_new_tokens} must be >= 1")
        if not self.temperature >= 0 or math.isinf(self.temperature):
            raise UsageError(f"temperature={self.temperature} must be a finite number >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise UsageError(f"top_k={self.top_k} must be >= 0 (0 = off)")
        if self.limit is not None and self.limit < 1:
            raise UsageError(f"limit={self.limit} must be >= 1")
        if self.batch_size < 1:
            raise UsageError(f"batch_size={self.batch_size} must be >= 1")
        if self.score_workers is None:
            self.score_workers = max(1, min(8, (os.cpu_count() or 1) // 2))
        if self.score_workers < 1:
            raise UsageError(f"score_workers={self.score_workers} must be >= 1")
        if self.verify_timeout < 1:
            raise UsageError(f"verify_timeout={self.verify_timeout} must be >= 1 second")
        if self.backend not in ("auto", "transformers", "vllm"):
            raise UsageError(f"backend={self.backend!r}; valid: auto, transformers, vllm")
        if self.chat not in ("auto", "on", "off"):
            raise UsageError(f"chat={self.chat!r}; valid: auto, on, off")
        if self.dtype not in get_args(DType):
            raise UsageError(f"dtype={self.dtype!r}; valid: {', '.join(get_args(DType))}")
        if self.prompt_template is not None and "{question}" not in self.prompt_template:
            raise UsageError(
                f"prompt_template {self.prompt_template!r:.60} has no {{question}} placeholder"
            )
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise UsageError(f"--data_dir {self.data_dir} is not a folder")
        if self.output_dir is None:
            slug = re.sub(r"[^A-Za-z0-9._-]+", "_", self.model.rstrip("/").split("/")[-1])
            self.output_dir = str(Path("eval_results") / (slug or "model"))
        if not self.output_dir.strip():
            raise UsageError("--output_dir is empty; give a folder (default: eval_results/<model name>)")
        out = Path(self.output_dir).expanduser()
        file = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
        if file is not None:
            where = "is a file" if file == out else f"is inside {str(file)!r}, a file"
            raise UsageError(f"--output_dir {self.output_dir!r} {where}; give a folder (new, or a d3s eval's own)")
        if self.label is None:
            self.label = self.model.rstrip("/").split("/")[-1] or self.model

    def sampling(self) -> SamplingSettings:
        return SamplingSettings(
            self.n, self.max_new_tokens, self.temperature, self.top_p, self.top_k
        )

    def fingerprint(self) -> dict[str, Any]:
        """Settings that change completions or scores: a cache is only reused when they match."""
        return {
            "model": self.model,
            **asdict(self.sampling()),
            "seed": self.seed,
            **({"shared_prefill": True} if self.shared_prefill else {}),  # other random draws, same distribution
            "prompt_template": self.prompt_template,
            "chat": self.chat,
            "system_prompt": self.system_prompt,
            "require_boxed": self.require_boxed,
            "verify_timeout": self.verify_timeout,
        }
