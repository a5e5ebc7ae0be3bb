"""Where a `d3s train` run continues from: a finished run (nothing to do), the newest complete checkpoint, or
the start; and what it refuses to continue.

- A run is finished when its `summary.json` is valid (`d3s.app.runfiles.read_summary`); `--resume true` on
  it trains nothing. A damaged `summary.json` (not JSON, or without its fields) is written again: the run
  continues from its last checkpoint, which only evaluates.
- A resume compares this recipe with the run's `run_config.json` (`d3s.app.recipe_changes.training_changes`) and
  refuses one that changes training, also of a finished run. A `run_config.json` that is damaged cannot be
  compared: the resume is refused, naming it. (A finished run recorded before `run_config.json` existed is
  finished as it is.) A run whose records count FLOPs in another convention than this d3s
  (`d3s.app.budget.flops_convention`) is not continued from a checkpoint.
- A checkpoint is used only when complete (`d3s.app.runfolder.complete_checkpoints`) and recorded in
  `metrics.jsonl`; the others are skipped, each with its reason.

`settle_resume` is the step of `d3s.app.train` that decides; what the user should know is said through `say`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

from d3s.app.budget import flops_convention
from d3s.app.run_args import RunArgs
from d3s.app.recipe_changes import training_changes
from d3s.app.runfiles import read_run_config, read_run_records, read_summary
from d3s.app.runfolder import STAGING_NAME, RunFolderError, checkpoint_step, complete_checkpoints


def settle_resume(run: RunArgs, config, out: Path, main_process: bool, run_config: dict,
                  unloadable: dict[str, str], said: set[str], say: Callable[[str], None]):
    """`(checkpoint or None, finished summary or None)` of the folder, checked against this run's recipe
    (`run_config`: what it records); what the user should know about it is said (once: `said` holds what
    was). `unloadable`: the checkpoints that failed to load, with why."""
    notes: list[str] = []
    checkpoint, finished = _resume_point(run, config, out, main_process, run_config, unloadable, notes)
    if checkpoint is not None:
        _check_same_training(out, run_config, notes)
    for note in notes:
        if note not in said:
            said.add(note)
            say(note)
    return checkpoint, finished


def _resume_point(run: RunArgs, config, out: Path, main_process: bool, run_config: dict,
                  unloadable: dict[str, str], notes: list[str]):
    """`(checkpoint or None, finished summary or None)`; refuses what cannot continue this folder: a
    recipe that changes training, also of a finished run. What the user should know about the choice is
    appended to `notes`."""
    if main_process:  # leftovers of a run killed while saving; this run holds the folder's lock
        shutil.rmtree(out / STAGING_NAME, ignore_errors=True)
        for tmp in out.glob(".*.tmp-*"):
            tmp.unlink(missing_ok=True)
    summary_file = out / "summary.json"
    summary, damaged = read_summary(out)
    final_step = config.max_steps if config.max_steps > 0 else None
    good, bad = complete_checkpoints(out, final_step, {**_unrecorded(out), **unloadable})
    if not run.resume:
        if summary_file.is_file() or good or bad:
            state = "a finished run" if summary is not None else "a run with checkpoints" if good or bad else \
                f"a run whose summary.json is damaged ({damaged})"
            raise RunFolderError(f"output_dir {str(out)!r} already holds {state}; pass --resume true to continue it, "
                                 "or pick another --output_dir")
        return None, None
    if summary is not None:
        _check_finished_run(out, run_config, summary, notes)
        return None, summary
    if damaged:
        if not good:
            raise RunFolderError(f"{summary_file} is damaged ({damaged}) and no checkpoint can continue the run to "
                                 f"write it again (checkpoints: {', '.join(f'{n}: {p}' for n, p in bad) or 'none'}); "
                                 "restore summary.json from a copy, or start a new run in another --output_dir")
        notes.append(f"{summary_file} is damaged ({damaged}); the run continues from its last checkpoint and "
                     "writes it again")
    for name, problem in bad:
        if not good or int(name.split("-")[-1]) > int(good[0].name.split("-")[-1]):
            notes.append(f"skipping {name}: {problem}")
    if good:
        notes.append(f"resuming from {good[0].name}")
        return good[0], None
    notes.append(f"no {'loadable' if unloadable else 'complete'} checkpoint in {out}; starting from the beginning")
    return None, None


def _check_finished_run(out: Path, run_config: dict, summary: dict, notes: list[str]) -> None:
    """A finished run is not continued or changed: refuse a recipe that changes training, or one that cannot be
    compared (a damaged `run_config.json`); else note that there is nothing to do."""
    path = out / "run_config.json"
    if path.is_file():
        changed, _ = _training_changes(out, run_config)
        if changed:
            raise RunFolderError(f"output_dir {str(out)!r} holds a finished run ({summary['steps']} steps); "
                                 f"--resume true with a recipe that changes training ({'; '.join(changed)}): a "
                                 "finished run is not continued or changed; start a new run in another --output_dir")
    notes.append(f"{out} is a finished run ({summary['steps']} steps, summary.json); nothing to do")


def _unrecorded(out: Path) -> dict[str, str]:
    """The checkpoints whose step has no record in `metrics.jsonl` (lost or deleted), with why: the run's
    cumulative counts cannot continue from them, so they are incomplete."""
    path = out / "metrics.jsonl"
    recorded = {r["step"] for r in read_run_records(path) if r["type"] == "train"} if path.is_file() else set()
    return {p.name: f"{path.name} has no record of step {checkpoint_step(p)}" for p in out.glob("checkpoint-*")
            if checkpoint_step(p) is not None and checkpoint_step(p) not in recorded}


def _training_changes(out: Path, now: dict) -> tuple[list[str], list[str]]:
    """`(changes that alter training, free changes)` of this recipe against the run's `run_config.json`; a
    missing or damaged one is refused, naming it: the recipe cannot be checked."""
    path = out / "run_config.json"
    saved, damaged = read_run_config(out)
    if saved is None:
        why = f"is damaged ({damaged})" if damaged else "is missing"
        raise RunFolderError(f"{path} {why}, so the resumed recipe cannot be checked against the run's; restore it "
                             "or start a new run in another --output_dir")
    return training_changes(saved, now)


def _check_same_training(out: Path, now: dict, notes: list[str]) -> None:
    """On resume: refuse a recipe that changes training; name the free changes."""
    changed, free = _training_changes(out, now)
    if changed:
        raise RunFolderError(
            f"--resume true with a recipe that changes training ({'; '.join(changed)}); resume with the run's own "
            f"recipe (in {out / 'run_config.json'}) or start a new run in another --output_dir. Free to change: "
            "eval_every, plots, logging, saving and hub settings"
        )
    counted, counts = flops_convention(read_run_config(out)[0]), flops_convention(now)
    if counted != counts:
        raise RunFolderError(
            f"{out} counted its FLOPs as {counted} and this d3s counts them as {counts} (docs/compare.md); a run's "
            "records hold one convention: finish it with the d3s that started it, or start a new run in another "
            "--output_dir"
        )
    if free:
        notes.append(f"resuming with changed settings that do not change training: {'; '.join(free)}")
