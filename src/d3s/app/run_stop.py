"""How `d3s train` stops early: SIGTERM taken like Ctrl-C (`StopSignals`), and after a stop (`stop_run`) the last
finished step kept (its record, a checkpoint with its RNG states), one line saying what is saved and how to
continue, and the exit status (`RunStopped`: 130 for SIGINT, 143 for SIGTERM, 1 for an exception)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from pathlib import Path

from d3s.app.errors import Terminated
from d3s.app.run_args import RunArgs
from d3s.app.runfiles import RunFileError, RunLog, write_failure
from d3s.app.runfolder import complete_checkpoints


def say(message: str) -> None:
    print(f"d3s train: {message}", file=sys.stderr, flush=True)


class RunStopped(Exception):
    """Training stopped early (Ctrl-C, SIGTERM, an exception); the user has been told what was saved.
    `code` is the exit status: 130 for SIGINT, 143 for SIGTERM, 1 for an exception."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class StopSignals:
    """While active, SIGTERM stops the run like Ctrl-C (Python's default for SIGTERM is to die at once). The first
    SIGTERM stops it; any later one is ignored to the end of the process, so that the run can save and say so: a
    parent's death reaches a run of `d3s compare` once per thread that inherited the request
    (`child_process.stop_with_parent`), and a second one would otherwise land after the handler is gone and kill
    the run mid-save without a word. `d3s train` holds one for the whole command, one more for training."""

    def __enter__(self):
        self.previous = self.handler = None
        if threading.current_thread() is threading.main_thread():
            def terminated(signum, frame):
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                raise Terminated()

            self.handler = terminated
            self.previous = signal.signal(signal.SIGTERM, terminated)
        return self

    def __exit__(self, *exc):
        # Once a SIGTERM came (here or in a nested stop), SIGTERM stays ignored until the process ends.
        if self.handler is not None and signal.getsignal(signal.SIGTERM) is self.handler:
            signal.signal(signal.SIGTERM, self.previous)
        return False


def _continue_hint(run: RunArgs) -> str:
    if os.environ.get("D3S_CONTINUE_HINT"):  # d3s compare runs this d3s train; its own command continues it
        return os.environ["D3S_CONTINUE_HINT"]
    return "run the same command again" if run.resume else "run the same command plus --resume true"


def stop_run(trainer, callback, run_log: RunLog, out: Path, run: RunArgs, err: BaseException, resume_step: int | None,
          unloadable: dict[str, str]) -> RunStopped:
    """After training stopped early: keep the last finished step (its record, a checkpoint with its
    RNG states), tell the user in one line what is saved and how to continue; the exit status."""
    if isinstance(err, Terminated):
        what, code = "terminated (SIGTERM)", 143
    elif isinstance(err, KeyboardInterrupt):
        what, code = "interrupted", 130
    elif isinstance(err, RunFileError):  # a full disk, a read-only folder: the user's to fix, no traceback
        what, code = f"stopped: {err.path} cannot be written ({err.reason})", 1
    elif write_failure(err):  # the same, while a checkpoint was written (torch and safetensors say it their way)
        what, code = f"stopped: a checkpoint cannot be written ({write_failure(err)})", 1
    else:
        traceback.print_exception(err)
        what, code = f"stopped by {type(err).__name__}", 1
    if callback.bar is not None:
        callback.bar.close()
    step = trainer.state.global_step
    note = ""
    if callback.updating_from is not None and callback.updating_from == step:
        note = f" inside the weight update of step {step + 1}, which cannot be saved;"
    elif step > 0 and step not in (resume_step, trainer.d3s_saved_step) and not (
            isinstance(err, RunFileError) or write_failure(err)):
        point = trainer.d3s_resume_point
        try:
            if point is not None and point["step"] == step:
                trainer.d3s_rewind_to_resume_point()
            else:  # stopped between the step's end and its record: write the record first
                last = run_log.last("train")
                if last is None or last["step"] < step:
                    trainer.d3s_log_finished_step()
            trainer._save_checkpoint(trainer.model, trial=None)
        except BaseException as save_err:  # a second Ctrl-C, a full disk: the older checkpoints are intact
            note = f" saving checkpoint-{step} failed ({type(save_err).__name__});"
    good, _ = complete_checkpoints(out, unloadable=unloadable)
    if good:
        where = (f"{good[0].name} holds step {good[0].name.split('-')[-1]}; to continue, {_continue_hint(run)}")
    else:
        where = "no step was saved; " + os.environ.get("D3S_CONTINUE_HINT", "run the same command again") + \
            " to start over"
    say(f"{what} after step {step};{note} {where}")
    return RunStopped(code)
