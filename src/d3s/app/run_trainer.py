"""The trainer and the callback of a `d3s train` run.

- `RunTrainer`: `D3SGRPOTrainer` with what a run needs from its checkpoints: atomic saves, and the
  resume point of the last finished step (see the class docstring);
- `RunCallback`: the run's records in `metrics.jsonl`, the progress bar and the periodic held-out
  evaluation; it records, it never steers training.

This module imports TRL and transformers at its top; `d3s.app.train` imports it only when a run starts,
so that `d3s --help` and the other jobs load neither.

`RunTrainer` overrides, reads and calls private methods and attributes of transformers' `Trainer`
(and TRL's `GRPOTrainer`), and `d3s.app.train` calls two more and one of torch: every one is listed in
`PRIVATE_API`, which a test checks against the installed versions (`d3s.integrations.private_api`).
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import rotate_checkpoints
from trl import GRPOTrainer

from d3s.app import below_start
from d3s.app.budget import RECORD_COUNTS, Budget, ModelShape, budget_lr_scheduler, budget_spent, computed_flops
from d3s.app.runfolder import STAGING_NAME, UnloadableCheckpoint, publish_folder
from d3s.integrations.private_api import ATTRIBUTE, NAME
from d3s.integrations.trl import D3SGRPOTrainer

PRIVATE_API = {
    # Overridden by RunTrainer (the parameters its overrides receive and pass on)
    "Trainer._get_output_dir": "(self, trial)",
    "GRPOTrainer._save_checkpoint": "(self, model, trial)",  # also called by d3s.app.train (a stop, the end)
    "Trainer._get_grad_norm": "(self, model, grad_norm=None)",
    "Trainer._get_learning_rate": "(self)",  # also called by RunTrainer.d3s_log_finished_step
    "Trainer._maybe_log_save_evaluate": "(self, tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, "
                                        "start_time, learning_rate=None)",
    # Read and set by RunTrainer.d3s_log_finished_step: the loss summed since the last log, and its step
    "Trainer._tr_loss": ATTRIBUTE,
    "Trainer._globalstep_last_logged": ATTRIBUTE,
    # Overridden by RunTrainer: a checkpoint that fails to load is unloadable (`_loading`); tied weights are not
    # missing. `_load_from_checkpoint` is also called by d3s.app.train: the weights of a checkpoint whose steps
    # are all trained
    "Trainer._load_from_checkpoint": "(self, resume_from_checkpoint, model=None)",
    "Trainer._load_optimizer_and_scheduler": "(self, checkpoint)",
    "Trainer._load_rng_state": "(self, checkpoint)",
    "Trainer._load_scaler": "(self, checkpoint)",
    "Trainer._issue_warnings_after_load": "(self, load_result)",
    # Overridden by RunTrainer under a compute budget (the learning rate follows the share of it spent)
    "Trainer.create_scheduler": "(self, num_training_steps, optimizer=None)",
    "Trainer._created_lr_scheduler": ATTRIBUTE,
    # Called by d3s.app.train: native bf16 kernels
    "torch.ops.mkldnn._is_mkldnn_bf16_supported": NAME,
}
"""Every private method, attribute or function of another library that a `d3s train` run relies on:
`"Owner.name"` -> its parameters, `ATTRIBUTE` or `NAME` (see `d3s.integrations.private_api`)."""

PRIVATE_API_OWNERS = {"Trainer": Trainer, "GRPOTrainer": GRPOTrainer, "torch.ops.mkldnn": torch.ops.mkldnn}
"""The classes and namespaces that `PRIVATE_API` names by their short names."""


def rng_states() -> dict:
    """The states of every random number generator a training step draws from."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.random.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if "cuda" in states:
        torch.cuda.random.set_rng_state_all(states["cuda"])


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def _weights_file(checkpoint: str) -> str:
    return next((name for name in WEIGHT_FILES if os.path.isfile(os.path.join(checkpoint, name))), "the weights")


def _short(err: BaseException) -> str:
    """`Type: first sentence` of an error, plus the line that names a refused pickle global (a safe
    `torch.load` says why it refused a file there, after a paragraph of advice)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):  # "Error(s) in loading state_dict for X:" and what they are
        lines[:2] = [f"{lines[0]} {lines[1]}"]
    text = lines[0].split(". ")[0].rstrip(".") if lines else ""
    text += "".join(f"; {line.rstrip('.')}" for line in lines[1:] if "GLOBAL" in line)[:200]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


STATE_FILES = ((torch.optim.Optimizer, "optimizer.pt"), (torch.optim.lr_scheduler.LRScheduler, "scheduler.pt"))
"""Which checkpoint file an object's `load_state_dict` reads."""


def _file_in(err: BaseException, checkpoint: str, method: str) -> str | None:
    """The file of `checkpoint` that the innermost call under `method` (a loading method, which names every file)
    was reading when `err` was raised (a path among its local variables: `torch.load`'s `f`, a JSON reader's
    file) or applying (the optimizer's or scheduler's `load_state_dict`), or None."""
    frames, tb = [], err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    below = max((i for i, frame in enumerate(frames) if frame.f_code.co_name == method), default=-1) + 1
    folder = os.path.realpath(checkpoint)

    def in_folder(value) -> bool:
        try:
            return os.path.dirname(os.path.realpath(value)) == folder
        except (TypeError, ValueError):  # not a path (a NUL byte in a string, a PathLike of bytes)
            return False

    for frame in reversed(frames[below:]):
        for name, value in frame.f_locals.items():
            if isinstance(value, (str, os.PathLike)) and in_folder(value):
                return os.path.basename(value)
            if name == "self":
                found = next((file for kind, file in STATE_FILES if isinstance(value, kind)), None)
                if found:
                    return found
    return None


class RunTrainer(D3SGRPOTrainer):
    """`D3SGRPOTrainer` with three things a run needs from its checkpoints:

    - atomic saves: a checkpoint is written into `.staging/checkpoint-N` and renamed into place when
      complete (then old ones are rotated), so a kill during a save leaves no half `checkpoint-N`;
    - the resume point of the last finished step: the RNG states and the token and FLOP counters right
      after the step was logged and (maybe) saved, which is what a regular checkpoint of that step
      holds. A checkpoint written on Ctrl-C restores them first: the half-finished next step has
      already drawn from the RNGs and counted its tokens;
    - loads that fail as one thing: any error while the run loads the checkpoint it resumes from (weights,
      optimizer, scheduler, scaler, RNG states; files a safe `torch.load` refuses, states of another model,
      weights missing from the file) raises `UnloadableCheckpoint` naming the file and the reason, and
      `d3s.app.train` continues from the previous checkpoint. A tied weight (the LM head that shares the
      embedding's tensor, saved once) is not missing.
    """

    _d3s_staging: str | None = None
    d3s_resume_point: dict | None = None
    d3s_saved_step: int | None = None
    # The compute (`d3s.app.budget`): the model's shape, the budget, and the FLOPs spent when the current step began
    d3s_budget: Budget | None = None
    d3s_shape: ModelShape | None = None
    d3s_step_start_flops: float = 0.0

    def d3s_flops(self) -> float:
        """Model FLOPs spent so far (`d3s.app.budget.computed_flops`), from the live position counts."""
        return computed_flops(self.d3s_shape, self.d3s_positions.totals)

    def d3s_progress(self) -> float:
        """Under a compute budget, the share of it spent before this step; otherwise the share of the steps."""
        if self.d3s_budget is None:
            return super().d3s_progress()
        return self.d3s_budget.progress(self.d3s_step_start_flops)

    def create_scheduler(self, num_training_steps, optimizer=None):
        if self.d3s_budget is None or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer=optimizer)
        budget = self.d3s_budget
        self.lr_scheduler = budget_lr_scheduler(self.args, optimizer or self.optimizer,
                                                lambda: budget.progress(self.d3s_flops()))
        self._created_lr_scheduler = True
        return self.lr_scheduler

    def _get_output_dir(self, trial):
        return self._d3s_staging if self._d3s_staging is not None else super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        run_dir = Path(super()._get_output_dir(trial))
        name = f"checkpoint-{self.state.global_step}"
        staging = run_dir / STAGING_NAME
        if self.args.should_save:
            shutil.rmtree(staging / name, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        self._d3s_staging = str(staging)
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._d3s_staging = None
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            publish_folder(staging / name, run_dir / name)
            try:
                staging.rmdir()
            except OSError:
                pass
            rotate_checkpoints(output_dir=str(run_dir), save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)
        self.accelerator.wait_for_everyone()
        self.d3s_saved_step = self.state.global_step

    # Loading the checkpoint a run resumes from
    @contextmanager
    def _d3s_loading(self, method: str, checkpoint: str | None, default_file: str):
        """Any error inside is `UnloadableCheckpoint(checkpoint, "<file> cannot be loaded (<error>)")`, while
        no step has finished in this process (later loads, if any, are not the resume's)."""
        if checkpoint is None or self.d3s_resume_point is not None:
            yield
            return
        try:
            yield
        except UnloadableCheckpoint as err:  # raised below, about `default_file`
            if err.checkpoint is None:
                err.checkpoint, err.reason = Path(checkpoint), f"{default_file} {err.reason}"
            raise
        except Exception as err:
            name = _file_in(err, checkpoint, method) or default_file
            raise UnloadableCheckpoint(Path(checkpoint), f"{name} cannot be loaded ({_short(err)})") from err

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        weights = _weights_file(resume_from_checkpoint)
        with self._d3s_loading("_load_from_checkpoint", resume_from_checkpoint, weights):
            super()._load_from_checkpoint(resume_from_checkpoint, model=model)

    def _load_optimizer_and_scheduler(self, checkpoint):
        with self._d3s_loading("_load_optimizer_and_scheduler", checkpoint, "optimizer.pt or scheduler.pt"):
            super()._load_optimizer_and_scheduler(checkpoint)

    def _load_scaler(self, checkpoint):
        with self._d3s_loading("_load_scaler", checkpoint, "scaler.pt"):
            super()._load_scaler(checkpoint)

    def _load_rng_state(self, checkpoint):
        name = f"rng_state_{self.args.process_index}.pth" if self.args.world_size > 1 else "rng_state.pth"
        with self._d3s_loading("_load_rng_state", checkpoint, name):
            super()._load_rng_state(checkpoint)

    def _issue_warnings_after_load(self, load_result):
        """A key is missing only if no other name of its tensor was loaded (tied weights are saved once)."""
        names = defaultdict(list)
        for name, param in self.model.named_parameters(remove_duplicate=False):
            names[id(param)].append(name)
        by_name = {name: group for group in names.values() for name in group}
        absent = set(load_result.missing_keys)
        missing = [k for k in load_result.missing_keys if all(n in absent for n in by_name.get(k, [k]))]
        if missing and self.d3s_resume_point is None:  # resuming: the checkpoint is incomplete
            shown = ", ".join(missing[:5]) + (f", and {len(missing) - 5} more" if len(missing) > 5 else "")
            count = f"{len(missing)} weight{'s' if len(missing) > 1 else ''}"
            raise UnloadableCheckpoint(None, f"lacks {count} of the model ({shown})")  # named by _d3s_loading
        if missing or load_result.unexpected_keys:
            super()._issue_warnings_after_load(type(load_result)(missing, load_result.unexpected_keys))

    # The step's grad norm and pre-update learning rate, for its record if a stop comes before it
    def _get_grad_norm(self, model, grad_norm=None):
        self.d3s_grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        return self.d3s_grad_norm

    def _get_learning_rate(self):
        self.d3s_learning_rate = super()._get_learning_rate()
        return self.d3s_learning_rate

    def d3s_log_finished_step(self) -> None:
        """The record `_maybe_log_save_evaluate` would have written for the step that just ended."""
        since = max(1, self.state.global_step - self._globalstep_last_logged)
        logs = {"loss": self._tr_loss.item() / since}
        grad_norm = getattr(self, "d3s_grad_norm", None)
        if grad_norm is not None:
            logs["grad_norm"] = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm
        lr = getattr(self, "d3s_learning_rate", None)
        logs["learning_rate"] = lr if lr is not None else self._get_learning_rate()
        self._globalstep_last_logged = self.state.global_step
        self.store_flos()
        self.log(logs)

    def _maybe_log_save_evaluate(self, *args, **kwargs):
        super()._maybe_log_save_evaluate(*args, **kwargs)
        self.d3s_resume_point = {
            "step": self.state.global_step,
            "rng": rng_states(),
            # counters the next step advances before it finishes
            "num_input_tokens_seen": self.state.num_input_tokens_seen,
            "total_flos": self.state.total_flos + self.current_flos,
            "positions": self.d3s_positions.snapshot(),
        }

    def d3s_rewind_to_resume_point(self) -> None:
        """Back to the state right after the last finished step (see the class docstring)."""
        point = self.d3s_resume_point
        set_rng_states(point["rng"])
        self.state.num_input_tokens_seen = point["num_input_tokens_seen"]
        self.state.total_flos, self.current_flos = point["total_flos"], 0
        self.d3s_positions.restore(point["positions"])


class RunCallback(TrainerCallback):
    """JSONL records (through `run_log`, a `d3s.app.runfiles.RunLog`), the progress bar and the held-out
    evaluation (`evaluate()`) every `eval_every` steps. Records only; no control."""

    def __init__(self, run_log: Any, evaluate: Callable[[], dict], eval_every: int, budget: Budget | None = None):
        self.run_log, self.evaluate, self.eval_every, self.budget = run_log, evaluate, eval_every, budget
        self.trainer: RunTrainer | None = None  # set once it exists: the FLOPs it has spent
        last = run_log.last("train")
        self.wall_offset = last["wall_s"] if last else 0.0
        self.trained_tokens = last["trained_tokens"] if last else 0.0
        self.generated_tokens = last["generated_tokens"] if last else 0.0
        self.computed_tokens = last.get("computed_tokens", 0.0) if last else 0.0
        self.no_grad_tokens = last.get("no_grad_tokens", 0.0) if last else 0.0
        self.eval_seconds = 0.0
        self.t0 = time.perf_counter()
        self.updating_from: int | None = None
        self.bar = None
        self.last_step = last["step"] if last else 0
        last_eval = run_log.last("eval")
        self.last_acc = last_eval["accuracy"] if last_eval else None
        self.below_start = bool(last_eval and last_eval.get("below_start"))
        self.main_process = int(os.environ.get("RANK", "0")) == 0

    def wall(self) -> float:
        return self.wall_offset + time.perf_counter() - self.t0 - self.eval_seconds

    def _eval_due(self, step: int, max_steps: int) -> bool:
        if self.budget is not None:  # at the shares of the budget (`Budget.evaluations`), not at its end
            flops = [r["flops"] for r in self.run_log.records if r["type"] == "train" and r["step"] <= step]
            due, _ = self.budget.evaluations(flops)
            return bool(flops) and len(flops) - 1 in due and not budget_spent(self.budget, flops)
        return bool(self.eval_every) and step % self.eval_every == 0 and step < max_steps

    def on_step_begin(self, args, state, control, **kwargs):
        if self.trainer is not None:
            self.trainer.d3s_step_start_flops = self.trainer.d3s_flops()

    def on_train_begin(self, args, state, control, **kwargs):
        self.t0 = time.perf_counter()
        if state.is_world_process_zero and self.budget is not None:  # its length is the budget; steps are a cap
            spent = self.trainer.d3s_flops() if self.trainer is not None else 0.0
            self.bar = tqdm(total=100, initial=round(100 * self.budget.progress(spent), 1), desc="d3s train",
                            dynamic_ncols=True, file=sys.stderr,
                            bar_format="{desc}: {n:.0f}% of the compute budget|{bar}| [{elapsed}<{remaining}{postfix}]")
        elif state.is_world_process_zero:
            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="d3s train", dynamic_ncols=True,
                            file=sys.stderr)
        # Resumed at a step whose held-out evaluation was cut off by the stop: the checkpoint holds
        # the weights it evaluates, so run it now (greedy decoding draws no random numbers).
        step = state.global_step
        if step and self._eval_due(step, state.max_steps) and not any(
                r["type"] == "eval" and r["step"] == step for r in self.run_log.records):
            self.run_eval(step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "loss" not in logs and "reward" not in logs:
            return
        steps = state.global_step - self.last_step
        self.last_step = state.global_step
        self.trained_tokens += logs.get("d3s/tokens_in_loss", 0.0) * steps
        ratio = logs.get("d3s/token_consumption_ratio")
        if ratio:
            self.generated_tokens += logs.get("d3s/tokens_in_loss", 0.0) / ratio * steps
        self.computed_tokens += logs.get("d3s/tokens_computed", 0.0) * steps
        self.no_grad_tokens += logs.get("d3s/tokens_no_grad", 0.0) * steps
        record = {"type": "train", "step": state.global_step, "wall_s": self.wall(),
                  "trained_tokens": self.trained_tokens, "generated_tokens": self.generated_tokens,
                  "computed_tokens": self.computed_tokens, "no_grad_tokens": self.no_grad_tokens,
                  **{k: v for k, v in logs.items() if isinstance(v, (int, float))}}
        if self.trainer is not None and self.trainer.d3s_shape is not None:
            record["flops"] = self.trainer.d3s_flops()
            totals = self.trainer.d3s_positions.totals  # the running counts the FLOPs are read from
            record.update({field: totals[name] for name, field in RECORD_COUNTS.items() if field not in record})
        if self.trainer is not None:
            record["prompt_hashes"] = list(self.trainer.d3s_prompt_hashes)  # the step's distinct prompts, in order
        self.run_log.add(record)
        if self.bar is not None:
            steps = {"step": state.global_step} if self.budget is not None else {}  # the bar counts the budget
            self.bar.set_postfix({**steps, **self._bar_fields(logs)}, refresh=False)
        # After the step's record (logs come after on_step_end), before its checkpoint is saved
        if self._eval_due(state.global_step, state.max_steps):
            self.run_eval(state.global_step)

    def _bar_fields(self, logs: dict) -> dict[str, str]:
        post = {"reward": f"{logs.get('reward', float('nan')):.2f}"}
        if "d3s/rollouts_kept" in logs and "d3s/rollout_ratio" in logs and logs["d3s/rollout_ratio"] > 0:
            total = logs["d3s/rollouts_kept"] / logs["d3s/rollout_ratio"]
            post["kept"] = f"{logs['d3s/rollouts_kept']:.0f}/{total:.0f}"
        if "d3s/tokens_in_loss" in logs:
            post["tokens"] = f"{logs['d3s/tokens_in_loss']:.0f}"
        if self.last_acc is not None:
            post["heldout"] = f"{self.last_acc:.1%}" + (" BELOW START" if self.below_start else "")
        return post

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.updating_from = state.global_step  # weights, optimizer and scheduler change until the step ends

    def on_step_end(self, args, state, control, **kwargs):
        self.updating_from = None
        if self.budget is not None and self.trainer is not None:  # every process decides alike: all-rank counts
            spent = self.trainer.d3s_flops()
            if self.budget.done(spent, spent - self.trainer.d3s_step_start_flops):
                control.should_training_stop = True
        if state.is_world_process_zero and self.bar is not None:
            if self.budget is not None and self.trainer is not None:
                self.bar.update(round(100 * self.budget.progress(self.trainer.d3s_flops()), 1) - self.bar.n)
            else:
                self.bar.update(state.global_step - self.bar.n)

    def run_eval(self, step: int) -> dict:
        t = time.perf_counter()
        result = self.evaluate()
        self.eval_seconds += time.perf_counter() - t
        self.last_acc = result["accuracy"]
        last = self.run_log.last("train")
        flops = {"flops": last["flops"]} if last is not None and last.get("flops") is not None else {}
        event = below_start.check(self.run_log.records, step, result)
        self.below_start = event is not None
        self.run_log.add({"type": "eval", "step": step, "wall_s": self.wall(), "trained_tokens": self.trained_tokens,
                          "generated_tokens": self.generated_tokens, "computed_tokens": self.computed_tokens,
                          **flops, **{k: v for k, v in result.items() if k != "examples"},
                          **({"below_start": event} if event else {})})
        if event is not None and self.main_process:
            tqdm.write(f"d3s train: warning: {below_start.message(event)}", file=sys.stderr)
        return result

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
