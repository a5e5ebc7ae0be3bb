"""`d3s eval`: sample, score, cache, aggregate (paper sec. 4.1; docs/method.md section 8).

I/O glue around the pure parts (`aggregate`, `scoring`, `benchmarks.extract_gold`). Output
folder layout:

    OUTPUT/samples.jsonl   one line per finished problem (completions, scores): the resume cache
    OUTPUT/results.json    settings + per-benchmark correct counts and metrics
    OUTPUT/results.md      Table-1-style row + all metrics

The folder is the evaluation's own (`claim_eval_folder`): a new or empty folder or an earlier d3s eval's, held
with a lock while it runs; a `d3s train` run, a `d3s compare` folder or another non-empty folder is refused.
Every file is written through `d3s.app.runfiles` (atomically, a full disk one line).

Resuming: the cache's first line records the settings that change completions or scores; a rerun
with the same settings skips every cached problem, with different ones it stops with an error
(use --overwrite or another --output_dir). A line cut off by an interrupt is dropped.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import zlib
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Literal, Sequence, get_args

from d3s.app.errors import UsageError
from d3s.app.models import resolve_model
from d3s.app.runfiles import atomic_write_text
from d3s.app.runfolder import RunLock, holds_comparison, is_run_folder, lock_folder
from d3s.app.scoring import score_job

from .aggregate import average_metrics, benchmark_metrics
from .benchmarks import BENCHMARKS, PAPER_BENCHMARKS, Problem, load_benchmark, resolve_name
from .cache import CACHE_NAME, SampleCache
from .generation import (
    Backend,
    ModelLoadError,
    Sampler,
    SamplingSettings,
    call_plan,
    make_sampler,
    problems_per_call,
)
from .prompts import ChatMode, default_template, fill_template, render_prompt, uses_chat
from .report import RESULTS_FORMAT, render_report, write_json

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


# ---------------------------------------------------------------------------------------------
# Run
# ---------------------------------------------------------------------------------------------


def _call_seed(seed: int, problem: Problem) -> int:
    """Seed of the sampling call that starts at `problem` (independent of what ran before)."""
    return (seed * 1_000_003 + zlib.crc32(f"{problem.benchmark}/{problem.problem_id}".encode())) % (
        2**31
    )


def model_path(model: str) -> str:
    """`embedded` / `tiny`: the models of `d3s train` (see `d3s.app.models`); anything else as is."""
    if model in ("embedded", "tiny"):
        try:
            return resolve_model(model)
        except FileNotFoundError as e:  # the package holding the embedded model is missing
            raise ModelLoadError(str(e)) from e
    return model


def load_problems(config: EvalConfig) -> dict[str, list[Problem]]:
    """All benchmarks' problems (first `limit` of each), loaded before any model work."""
    out = {}
    for name in config.benchmarks:
        problems = load_benchmark(name, config.data_dir, config.benchmark_paths.get(name))
        if not problems:
            raise UsageError(f"{name}: the dataset holds no problems")
        out[name] = problems[: config.limit] if config.limit else problems
    return out


def score_problem(
    problem: Problem, completions: Sequence[str], config: EvalConfig, pool: Executor | None = None
) -> dict[str, Any]:
    """Cache record of one problem: its completions, their scores and any verifier failures."""
    scorer = BENCHMARKS[problem.benchmark].scorer
    jobs = [
        (c, problem.gold, scorer, config.verify_timeout, config.require_boxed) for c in completions
    ]
    results = list(pool.map(score_job, jobs, chunksize=4) if pool else map(score_job, jobs))
    scores = [s.value for s in results]
    failures = [s.failure for s in results if s.failure]
    return {
        "type": "problem",
        "benchmark": problem.benchmark,
        "problem_id": problem.problem_id,
        "digest": problem.digest,
        "gold": problem.gold,
        "completions": list(completions),
        "scores": scores,
        "n_correct": int(sum(v == 1.0 for v in scores)),
        "verify_failures": failures,
    }


def _prompt(config: EvalConfig, sampler: Sampler, name: str, problem: Problem) -> str:
    template = config.prompt_template or default_template(name)
    return render_prompt(
        sampler.tokenizer, fill_template(template, problem.question), config.chat, config.system_prompt
    )


def check_context(config: EvalConfig, sampler: Sampler, todo: dict[str, list[Problem]]) -> None:
    """Refuse, before any sampling, a prompt whose tokens plus `max_new_tokens` exceed the model's
    context (`sampler.context_length`, when the sampler knows it): generating past it gives garbage."""
    limit = getattr(sampler, "context_length", None)
    if not limit:
        return
    for name, pending in todo.items():
        if not pending:
            continue
        prompts = [_prompt(config, sampler, name, p) for p in pending]
        ids = sampler.tokenizer(prompts, add_special_tokens=sampler.add_special_tokens)["input_ids"]
        longest = max(range(len(ids)), key=lambda i: len(ids[i]))
        length = len(ids[longest])
        if length + config.max_new_tokens > limit:
            room = limit - length
            fix = f"--max_new_tokens {room} or less" if room > 0 else "a shorter --prompt_template"
            raise UsageError(
                f"{name} problem {pending[longest].problem_id}: the prompt is {length} tokens and "
                f"--max_new_tokens {config.max_new_tokens} more would pass the model's context of "
                f"{limit} tokens; use {fix} (or --limit / another benchmark)"
            )


def _sample_and_score(
    config: EvalConfig,
    problems: dict[str, list[Problem]],
    sampler: Sampler,
    pool: Executor | None,
    cache: SampleCache,
    bar: Any,
    step: int,
) -> None:
    """Sample `step` problems per call, score them, append each finished problem to the cache.

    The calls are a fixed partition of each benchmark's full problem list (`call_plan`: ordered by
    prompt length, as `d3s train`'s held-out evaluation does), seeded by their first problem: a
    resumed run makes exactly the calls an uninterrupted one makes. A call whose problems are all
    cached is skipped; one cut short (some cached) is sampled again in full, so that every
    completion comes from the same call, seed and batch as without the interruption.
    """
    for name, every in problems.items():
        all_prompts = [_prompt(config, sampler, name, p) for p in every]
        for call in call_plan(all_prompts, step):
            chunk = [every[i] for i in call]
            missing = [cache.get(p) is None for p in chunk]
            if not any(missing):
                continue
            bar.set_postfix_str(name)
            prompts = [all_prompts[i] for i in call]
            seed = _call_seed(config.seed, chunk[0])
            outputs = sampler.sample(prompts, config.sampling(), seed)
            if len(outputs) != len(chunk) or any(len(o) != config.n for o in outputs):
                raise RuntimeError(
                    f"sampler returned {[len(o) for o in outputs]} completions for "
                    f"{len(chunk)} prompts x n={config.n}"
                )
            for problem, completions, todo in zip(chunk, outputs, missing):
                if todo:
                    cache.put(score_problem(problem, completions, config, pool))
            bar.update(sum(missing))


def run_eval(
    config: EvalConfig,
    sampler_factory: Callable[[EvalConfig], Sampler] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate, resuming from the output folder's cache; write and return the results dict."""
    problems = load_problems(config)
    out_dir = Path(config.output_dir).expanduser()
    lock = claim_eval_folder(out_dir)
    try:
        return _evaluate(config, problems, out_dir, sampler_factory, progress)
    finally:
        lock.release()


EVAL_LOCK = ".d3s-eval.lock"
"""Held (`flock`) by the `d3s eval` that writes the folder, as `.d3s-run.lock` by a `d3s train`."""


def _is_eval_folder(out: Path) -> bool:
    """Whether `out` holds a d3s eval's output: its lock file, a `samples.jsonl` that starts with a d3s eval header,
    or a `results.json` of the format `d3s eval` writes."""
    if (out / EVAL_LOCK).is_file():
        return True
    try:
        with open(out / CACHE_NAME, "rb") as f:
            first = json.loads(f.readline() or b"null")
        if isinstance(first, dict) and first.get("type") == "header" and isinstance(first.get("fingerprint"), dict):
            return True
    except (OSError, ValueError):
        pass
    try:
        results = json.loads((out / "results.json").read_bytes())
        return isinstance(results, dict) and results.get("format") == RESULTS_FORMAT
    except (OSError, ValueError):
        return False


def claim_eval_folder(out: Path) -> RunLock:
    """Take `out` for this evaluation, as `d3s train` takes its folder: a new or empty folder, or a d3s eval's own
    (`_is_eval_folder`); a `d3s train` run, a `d3s compare` folder or any other non-empty folder is refused before a
    file in it is touched. While the evaluation lives it holds the folder's `flock`, so that a second `d3s eval`
    into it is refused in one line."""
    where = f"--output_dir {str(out)!r}"
    if out.is_dir():
        try:
            entries = sorted(p.name for p in out.iterdir() if p.name != ".DS_Store")
        except OSError as err:
            raise UsageError(f"{where} cannot be read ({err.strerror})") from None
        if entries and not _is_eval_folder(out):
            if is_run_folder(out):
                whose = "holds a d3s train run"
            elif holds_comparison(out):
                whose = "holds a d3s compare"
            else:
                shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
                whose = f"is not empty ({len(entries)} entr{'y' if len(entries) == 1 else 'ies'}: {shown})"
            raise UsageError(f"{where} {whose}; d3s eval writes only into a new or empty folder or a d3s eval's own: "
                             "pick another --output_dir")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{where} cannot be made ({err.strerror})") from None
    return lock_folder(out, EVAL_LOCK, "d3s eval")


def _evaluate(config: EvalConfig, problems: dict[str, list[Problem]], out_dir: Path,
              sampler_factory: Callable[[EvalConfig], Sampler] | None, progress: bool) -> dict[str, Any]:
    """`run_eval` in the folder it holds."""
    cache = SampleCache(out_dir / CACHE_NAME, config.fingerprint(), config.overwrite)

    todo = {b: [p for p in ps if cache.get(p) is None] for b, ps in problems.items()}
    total = sum(len(ps) for ps in problems.values())
    remaining = sum(len(ps) for ps in todo.values())
    if remaining:
        factory = sampler_factory or (
            lambda c: make_sampler(
                c.backend,
                model_path(c.model),
                device=c.device,
                dtype=c.dtype,
                batch_size=c.batch_size,
                shared_prefill=c.shared_prefill,
            )
        )
        sampler = factory(config)
        chat = uses_chat(sampler.tokenizer, config.chat)
        sampler.add_special_tokens = not chat  # a chat template already carries BOS
        try:
            from tqdm.auto import tqdm
        except ImportError as e:
            raise ImportError("d3s eval needs tqdm: pip install 'd3s[eval]'") from e
        bar = tqdm(total=total, initial=total - remaining, unit="problem", disable=not progress,
                   desc="d3s eval")
        step = problems_per_call(config.n, config.batch_size)
        check_context(config, sampler, todo)
        pool = None
        if config.score_workers > 1:  # spawn: workers never inherit the model or torch threads
            pool = ProcessPoolExecutor(config.score_workers, mp_context=get_context("spawn"))
        try:
            _sample_and_score(config, problems, sampler, pool, cache, bar, step)
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
        bar.close()

    results = assemble_results(config, problems, cache)
    for name, bench in results["benchmarks"].items():
        if bench["verify_failures"]:
            print(
                f"d3s eval: warning: {name}: {bench['verify_failures']} completion(s) scored 0 "
                f"because verification failed or timed out (details in {cache.path})",
                file=sys.stderr,
            )
    write_json(out_dir / "results.json", results)
    atomic_write_text(out_dir / "results.md", render_report(results))
    return results


def assemble_results(
    config: EvalConfig, problems: dict[str, list[Problem]], cache: SampleCache
) -> dict[str, Any]:
    """The results dict: settings, per-benchmark correct counts and metrics, average."""
    benchmarks = {}
    for name, ps in problems.items():
        records = [cache.get(p) for p in ps]
        n_correct = [r["n_correct"] for r in records]
        benchmarks[name] = {
            "title": BENCHMARKS[name].title,
            "n": config.n,
            "num_problems": len(ps),
            "metrics": benchmark_metrics(n_correct, config.n, config.ks),
            "verify_failures": sum(len(r["verify_failures"]) for r in records),
            "n_correct": n_correct,
        }
    return {
        "format": RESULTS_FORMAT,
        "label": config.label,
        "model": config.model,
        "ks": list(config.ks),
        "settings": {**config.fingerprint(), "limit": config.limit, "backend": config.backend},
        "benchmarks": benchmarks,
        "average": average_metrics({b: v["metrics"] for b, v in benchmarks.items()}),
    }
