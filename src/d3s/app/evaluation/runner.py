"""`d3s eval`: sample, score, cache, aggregate (paper sec. 4.1; docs/method.md section 8).

I/O glue around the pure parts (`aggregate`, `scoring`, `benchmarks.extract_gold`); its settings are
`EvalConfig` (`d3s.app.evaluation.settings`). Output
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
import sys
import zlib
from concurrent.futures import Executor, ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Sequence

from d3s.app.errors import UsageError
from d3s.app.models import resolve_model
from d3s.app.runfiles import atomic_write_text
from d3s.app.runfolder import RunLock, holds_comparison, is_run_folder, lock_folder
from d3s.app.scoring import score_job

from .aggregate import average_metrics, benchmark_metrics
from .benchmarks import BENCHMARKS, Problem, load_benchmark
from .cache import CACHE_NAME, SampleCache
from .generation import ModelLoadError, Sampler, call_plan, make_sampler, problems_per_call
from .prompts import default_template, fill_template, render_prompt, uses_chat
from .report import RESULTS_FORMAT, render_report, write_json
from .settings import EvalConfig

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
