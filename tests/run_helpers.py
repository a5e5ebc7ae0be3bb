"""Helpers of the run tests (`test_run_reliability.py`, `test_run_lifecycle.py`): run `d3s train` as a user
does, read what a user would read, compare a run with an uninterrupted one, kill a run at a chosen point."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from d3s import cli
from d3s.app.runfolder import LOCK_NAME

TIMING_KEYS = ("wall_s", "step_time", "d3s/generation_s_per_signal_group")  # with d3s/time/*, the only fields
# allowed to differ between two runs
SUMMARY_TIMING_KEYS = ("train_wall_s", "command_wall_s", "step_seconds", "generation_s_per_signal_group",
                       "load")  # summary: the machine's load around the run differs between any two runs too


def train(out: Path, *extra: str) -> int:
    return cli.main(["train", "--config", "smoke", "--output_dir", str(out), *extra])


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def comparable(out: Path) -> dict[tuple[str, int], dict]:
    return {(r["type"], r["step"]): {k: v for k, v in r.items()
                                     if k not in TIMING_KEYS and not k.startswith("d3s/time/")} for r in records(out)}


def comparable_summary(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    return {k: v for k, v in summary.items() if k not in SUMMARY_TIMING_KEYS}


def assert_same_run(out: Path, reference: Path) -> None:
    """Every record of `out` equals the reference's, every metric exactly (timings aside), one record per
    step and kind, wall-clock never going backwards; so does `summary.json`."""
    recs = records(out)
    keys = [(r["type"], r["step"]) for r in recs]
    assert len(keys) == len(set(keys)), f"records repeated: {keys}"
    walls = [r["wall_s"] for r in recs]
    assert walls == sorted(walls), f"wall_s goes backwards: {walls}"
    got, want = comparable(out), comparable(reference)
    assert sorted(got) == sorted(want)
    diffs = {key: {k: (got[key].get(k), want[key].get(k)) for k in set(got[key]) | set(want[key])
                   if got[key].get(k) != want[key].get(k)} for key in want}
    assert not any(diffs.values()), {k: v for k, v in diffs.items() if v}
    got, want = comparable_summary(out), comparable_summary(reference)
    assert got == want, {k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)}


def full_disk(mp, *names: str) -> None:
    """Opening a file whose name holds one of `names` for writing fails as on a full disk (ENOSPC), also through
    `Path.open` and `Path.write_text`."""
    real = builtins.open

    def opening(file, mode="r", *args, **kwargs):
        if not isinstance(file, int) and set(mode) & set("wax+"):
            name = os.path.basename(os.fsdecode(file))
            if any(n in name for n in names):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fsdecode(file))
        return real(file, mode, *args, **kwargs)

    mp.setattr(builtins, "open", opening)
    mp.setattr(io, "open", opening)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def copy_run(full_run: Path, dest: Path) -> Path:
    shutil.copytree(full_run, dest, ignore=shutil.ignore_patterns(LOCK_NAME))
    return dest


# ---------------------------------------------------------------------------------------------
# Fixtures (imported by the test modules)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("d3s-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("D3S_CACHE", str(path))
        yield path


@pytest.fixture(autouse=True)
def _use_cache(cache, monkeypatch):
    monkeypatch.setenv("D3S_CACHE", str(cache))


@pytest.fixture(autouse=True)
def _sigint_raises():
    """SIGINT raises KeyboardInterrupt, as at a terminal, also when the suite runs as a background job of a
    non-interactive shell (which starts it with SIGINT ignored, so a simulated Ctrl-C would do nothing)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, cache) -> Path:
    """One uninterrupted smoke run: the reference for every resumed one."""
    out = tmp_path_factory.mktemp("full") / "run"
    assert train(out) == 0
    return out


# ---------------------------------------------------------------------------------------------
# A run in its own process, killed with SIGKILL at a chosen point
# ---------------------------------------------------------------------------------------------

KILLING_TRAIN = """
import functools, os, signal, sys
from transformers import Trainer
from d3s import cli
from d3s.app import run_trainer, train
point, at = sys.argv[1], int(sys.argv[2])

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if point == "step":  # during this process's at-th training step (its reward call: generation is done)
    build, calls = train.build_task, [0]
    def build_dying(*args, **kwargs):
        task = build(*args, **kwargs)
        reward = task.reward
        @functools.wraps(reward)  # its name is in the records
        def dying_reward(*a, **kw):
            calls[0] += 1
            if calls[0] == at:
                die()
            return reward(*a, **kw)
        task.reward = dying_reward
        return task
    train.build_task = build_dying
elif point == "eval":  # inside the held-out evaluation of step `at` (the last step's: the final one)
    run_eval = run_trainer.RunCallback.run_eval
    def dying_eval(self, step):
        if step == at:
            die()
        return run_eval(self, step)
    run_trainer.RunCallback.run_eval = dying_eval
elif point in ("save_model", "save_optimizer", "save_rng"):  # while checkpoint-`at` is being written:
    # after its weights, before its optimizer and scheduler, before its RNG states
    name = {"save_model": "save_model", "save_optimizer": "_save_optimizer_and_scheduler",
            "save_rng": "_save_rng_state"}[point]
    save = getattr(Trainer, name)
    def dying_save(self, *args, **kwargs):
        if self.state.global_step == at and point != "save_model":
            die()
        done = save(self, *args, **kwargs)
        if self.state.global_step == at:
            die()
        return done
    setattr(Trainer, name, dying_save)
elif point == "publish":  # checkpoint-`at` written in full in .staging, not yet renamed into place
    publish = run_trainer.publish_folder
    def dying_publish(staged, final):
        if final.name == f"checkpoint-{at}":
            die()
        return publish(staged, final)
    run_trainer.publish_folder = dying_publish
elif point != "none":
    raise SystemExit(f"unknown kill point {point}")
sys.exit(cli.main(["train", "--config", "smoke", *sys.argv[3:]]))
"""


def train_killed_at(out: Path, point: str, at: int, *extra: str) -> subprocess.CompletedProcess:
    """`d3s train` in a child process that SIGKILLs itself at `point` (see `KILLING_TRAIN`); returns it done."""
    return subprocess.run([sys.executable, "-c", KILLING_TRAIN, point, str(at), "--output_dir", str(out), *extra],
                          capture_output=True, text=True)


def killed(done: subprocess.CompletedProcess) -> bool:
    return done.returncode == -signal.SIGKILL
