"""A run owns its folder, resumes exactly after any stop, refuses what would change it, survives bad files.

Every test here runs `d3s train` the way a user does (through `cli.main`) on the smoke recipe (tiny
random model, 4 steps, checkpoints at steps 2 and 4) and checks the files a user would look at.
Exact resume is checked against one uninterrupted run: every metric of every step, bit for bit.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

from d3s import cli  # noqa: E402
from d3s.app import train as train_mod  # noqa: E402
from d3s.app.errors import RecipeError  # noqa: E402
from d3s.app.runfolder import LOCK_NAME, RunFolderError, claim_folder, complete_checkpoints, prune_checkpoints  # noqa: E402,E501

TIMING_KEYS = ("wall_s", "step_time")  # with d3s/time/*, the only fields allowed to differ between two runs


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


def train(out: Path, *extra: str) -> int:
    return cli.main(["train", "--config", "smoke", "--output_dir", str(out), *extra])


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def comparable(out: Path) -> dict[tuple[str, int], dict]:
    return {(r["type"], r["step"]): {k: v for k, v in r.items()
                                         if k not in TIMING_KEYS and not k.startswith("d3s/time/")} for r in records(out)}


def assert_same_run(out: Path, reference: Path) -> None:
    """Every record of `out` equals the reference's, every metric exactly (timings aside)."""
    got, want = comparable(out), comparable(reference)
    assert sorted(got) == sorted(want)
    diffs = {key: {k: (got[key].get(k), want[key].get(k)) for k in set(got[key]) | set(want[key])
                   if got[key].get(k) != want[key].get(k)} for key in want}
    assert not any(diffs.values()), {k: v for k, v in diffs.items() if v}


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, cache) -> Path:
    """One uninterrupted smoke run: the reference for every resumed one."""
    out = tmp_path_factory.mktemp("full") / "run"
    assert train(out) == 0
    return out


def copy_run(full_run: Path, dest: Path) -> Path:
    shutil.copytree(full_run, dest, ignore=shutil.ignore_patterns(LOCK_NAME))
    return dest


# ---------------------------------------------------------------------------------------------
# 1. The run owns its folder
# ---------------------------------------------------------------------------------------------


def test_a_folder_in_use_by_a_live_run_is_refused_untouched(tmp_path, capsys):
    out = tmp_path / "run"
    lock = claim_folder(out)  # a live run holding the folder
    try:
        before = snapshot(out)
        assert train(out) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is in use by another d3s train (pid" in err[0], err
        assert snapshot(out) == before
    finally:
        lock.release()


def test_a_killed_run_does_not_leave_its_folder_locked(tmp_path):
    out = tmp_path / "run"
    code = ("import os, signal, sys; from d3s.app.runfolder import claim_folder; claim_folder(sys.argv[1]); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    done = subprocess.run([sys.executable, "-c", code, str(out)])
    assert done.returncode == -signal.SIGKILL and (out / LOCK_NAME).is_file()
    claim_folder(out).release()  # the OS dropped the dead process's lock


def test_a_folder_that_is_not_a_run_is_refused_untouched(tmp_path, capsys):
    repo = tmp_path / "clone"
    repo.mkdir()
    (repo / "README.md").write_text("# my project\n")
    (repo / "src").mkdir()
    (repo / "src" / "code.py").write_text("print('hi')\n")
    before = snapshot(repo)
    mtimes = {p: p.stat().st_mtime_ns for p in repo.rglob("*")}
    assert train(repo) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not empty (2 entries: README.md, src) and holds no d3s run" in err[0], err
    assert snapshot(repo) == before and sorted(p.name for p in repo.iterdir()) == ["README.md", "src"]
    assert {p: p.stat().st_mtime_ns for p in repo.rglob("*")} == mtimes


@pytest.mark.parametrize("make", ["file", "under_a_file"])
def test_an_output_dir_that_cannot_be_written_is_one_line(tmp_path, capsys, make):
    blocker = tmp_path / "plain.txt"
    blocker.write_text("x")
    out = blocker if make == "file" else blocker / "run"
    assert train(out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("d3s train: error: output_dir"), err
    assert ("is a file" if make == "file" else "cannot be written (Not a directory)") in err[0]


def test_a_finished_run_is_finished(full_run, tmp_path, capsys):
    out = copy_run(full_run, tmp_path / "run")
    before = snapshot(out)
    assert train(out) == 2  # without --resume: refused, nothing overwritten
    assert "already holds a finished run; pass --resume true" in capsys.readouterr().err
    assert train(out, "--resume", "true") == 0  # with it: nothing to train
    assert "is a finished run (4 steps, summary.json); nothing to do" in capsys.readouterr().err
    after = snapshot(out)
    after.pop(LOCK_NAME)  # the only file a resume writes before it knows there is nothing to do
    assert after == before


# ---------------------------------------------------------------------------------------------
# 2. Exact resume after SIGINT, SIGTERM and an exception
# ---------------------------------------------------------------------------------------------


def stopping_at(monkeypatch, call: int, stop):
    """Make the reward function `stop()` on its `call`-th call: step `call`'s generation has drawn from
    the RNGs by then, the step is half finished."""
    build = train_mod.build_task

    def build_stopping(*args, **kwargs):
        task = build(*args, **kwargs)
        calls = {"n": 0}
        reward = task.reward

        @functools.wraps(reward)
        def stopping_reward(*a, **kw):
            calls["n"] += 1
            if calls["n"] == call:
                stop()
            return reward(*a, **kw)

        task.reward = stopping_reward
        return task

    monkeypatch.setattr(train_mod, "build_task", build_stopping)


def _raise():
    raise RuntimeError("the reward server went away")


def stopping_at_step_end(monkeypatch, step: int):
    """Ctrl-C right after step `step` ends, before its record is written: the run must write it."""
    make = train_mod._make_callback

    def interrupting(*args, **kwargs):
        cb = make(*args, **kwargs)
        on_step_end = cb.on_step_end

        def stop_there(args_, state, control, **kw):
            on_step_end(args_, state, control, **kw)
            if state.global_step == step:
                raise KeyboardInterrupt

        cb.on_step_end = stop_there
        return cb

    monkeypatch.setattr(train_mod, "_make_callback", interrupting)


def stopping_in_eval(monkeypatch, step: int):
    """Ctrl-C inside the held-out evaluation of step `step` (after its record, before its checkpoint)."""
    make = train_mod._make_callback

    def interrupting(*args, **kwargs):
        cb = make(*args, **kwargs)
        run_eval = cb.run_eval

        def stop_there(at):
            if at == step:
                raise KeyboardInterrupt
            return run_eval(at)

        cb.run_eval = stop_there
        return cb

    monkeypatch.setattr(train_mod, "_make_callback", interrupting)


STOPS = {
    "sigint": (lambda: os.kill(os.getpid(), signal.SIGINT), 130, "interrupted after step 3"),
    "sigterm": (lambda: os.kill(os.getpid(), signal.SIGTERM), 143, "terminated (SIGTERM) after step 3"),
    "exception": (_raise, 1, "stopped by RuntimeError after step 3"),
}


@pytest.mark.parametrize("how", [
    "sigint",
    pytest.param("sigterm", marks=pytest.mark.slow),
    pytest.param("exception", marks=pytest.mark.slow),
    pytest.param("step_end", marks=pytest.mark.slow),
    pytest.param("in_eval", marks=pytest.mark.slow),
])
def test_stop_during_a_step_then_resume_is_exact(full_run, tmp_path, monkeypatch, capsys, how):
    stop, code, message = STOPS.get(how, (None, 130, "interrupted after step 3"))
    cut = tmp_path / "cut"
    with monkeypatch.context() as mp:
        if how == "step_end":
            stopping_at_step_end(mp, 3)
        elif how == "in_eval":  # step 3 is not an evaluation step: the cut is at the one of step 2
            message = "interrupted after step 2"
            stopping_in_eval(mp, 2)
        else:
            stopping_at(mp, 4, stop)  # during step 4; step 3 is not a regular checkpoint (save_steps 2)
        assert train(cut) == code
    err = capsys.readouterr().err.strip().splitlines()
    last = 2 if how == "in_eval" else 3
    assert err[-1] == (f"d3s train: {message}; checkpoint-{last} holds step {last}; to continue, run the same "
                       "command plus --resume true"), err[-1]
    assert not any("rerun the same command" in line for line in err)  # one message, not two that disagree
    assert [p.name for p in complete_checkpoints(cut)[0]] == [f"checkpoint-{s}" for s in range(last, 1, -1)]
    assert train(cut, "--resume", "true") == 0
    assert f"resuming from checkpoint-{last}" in capsys.readouterr().err
    assert_same_run(cut, full_run)


def test_a_stop_before_any_step_says_nothing_was_saved(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    with monkeypatch.context() as mp:
        stopping_at(mp, 1, lambda: os.kill(os.getpid(), signal.SIGINT))
        assert train(out) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "d3s train: interrupted after step 0; no step was saved; run the same command again to start over"
    assert not list(out.glob("checkpoint-*"))


# ---------------------------------------------------------------------------------------------
# 3. Resume refuses a recipe that changes training; a finished run is finished
# ---------------------------------------------------------------------------------------------


def unfinished(full_run: Path, dest: Path) -> Path:
    """The full run as if killed during its final evaluation: all steps saved, no summary.json."""
    out = copy_run(full_run, dest)
    (out / "summary.json").unlink()
    return out


@pytest.mark.parametrize("extra,names", [
    (["--variant", "grpo"], ["variant: 'd3s' -> 'grpo'", "sample_selection: 'cross' -> 'none'"]),
    (["--num_generations", "8"], ["num_generations: 4 -> 8"]),
    (["--max_steps", "6"], ["max_steps: 4 -> 6"]),
    (["--task_max_digits", "2"], ["task_max_digits: 1 -> 2"]),
])
def test_resume_refuses_a_recipe_that_changes_training(full_run, tmp_path, capsys, extra, names):
    out = unfinished(full_run, tmp_path / "run")
    before = snapshot(out)
    assert train(out, "--resume", "true", *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resume true with a recipe that changes training" in err[0], err
    for name in names:
        assert name in err[0], err[0]
    assert "Free to change: eval_every" in err[0]
    after = snapshot(out)
    after.pop(LOCK_NAME)
    assert after == before


def test_resume_allows_settings_that_do_not_change_training(full_run, tmp_path, capsys):
    out = unfinished(full_run, tmp_path / "run")
    assert train(out, "--resume", "true", "--eval_every", "1", "--save_steps", "3") == 0
    err = capsys.readouterr().err
    assert "changed settings that do not change training: eval_every: 2 -> 1" in err and "save_steps: 2 -> 3" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and not (out / "checkpoint-5").exists()  # no step past the end
    full = json.loads((full_run / "summary.json").read_text())
    assert summary["after"] == full["after"]  # the final evaluation of the same weights


@pytest.mark.parametrize("steps", ["0", "-2"])
def test_max_steps_below_one_is_refused(tmp_path, capsys, steps):
    assert train(tmp_path / "run", "--max_steps", steps) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"max_steps={steps}" in err[0] and ">= 1" in err[0], err
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# 4. Bad checkpoints and records do not stop a resume
# ---------------------------------------------------------------------------------------------


def cut_at_step_4(full_run: Path, dest: Path) -> Path:
    """The full run as if stopped during step 4's save, with checkpoint-2 the last good one: its
    records after step 2 and the step-4 evaluation are dropped on resume, so the resumed run must redo
    steps 3 and 4 and reproduce them exactly."""
    out = unfinished(full_run, dest)
    shutil.rmtree(out / "checkpoint-4")
    return out


@pytest.mark.parametrize("damage,reason", [
    ("truncate_weights", "skipping checkpoint-3: model.safetensors is truncated"),
    ("no_trainer_state", "skipping checkpoint-3: trainer_state.json is missing"),
    ("truncate_optimizer", "skipping checkpoint-3: optimizer.pt is truncated or not a torch file"),
])
def test_resume_falls_back_to_the_newest_complete_checkpoint(full_run, tmp_path, capsys, damage, reason):
    out = cut_at_step_4(full_run, tmp_path / "run")
    bad = out / "checkpoint-3"
    shutil.copytree(out / "checkpoint-2", bad)  # a checkpoint-3 that a crash damaged
    state = json.loads((bad / "trainer_state.json").read_text())
    state["global_step"] = 3
    (bad / "trainer_state.json").write_text(json.dumps(state))
    if damage == "truncate_weights":
        data = (bad / "model.safetensors").read_bytes()
        (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "no_trainer_state":
        (bad / "trainer_state.json").unlink()
    else:
        data = (bad / "optimizer.pt").read_bytes()
        (bad / "optimizer.pt").write_bytes(data[: len(data) - 100])
    lines = len((out / "metrics.jsonl").read_text().splitlines())
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"type": "train", "step": 5, "wall_')  # a record cut off by the kill
    assert train(out, "--resume", "true") == 0
    err = capsys.readouterr().err
    assert reason in err and "resuming from checkpoint-2" in err
    assert f"metrics.jsonl line {lines + 1} is cut off" in err
    assert_same_run(out, full_run)


@pytest.mark.slow
def test_a_kill_during_a_save_leaves_no_half_checkpoint(full_run, tmp_path):
    out = tmp_path / "run"
    code = (
        "import os, signal, sys\n"
        "from transformers import Trainer\n"
        "from d3s import cli\n"
        "save = Trainer._save_rng_state\n"
        "def dying(self, output_dir):\n"
        "    if self.state.global_step == 4: os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return save(self, output_dir)\n"
        "Trainer._save_rng_state = dying\n"
        "sys.exit(cli.main(['train', '--config', 'smoke', '--output_dir', sys.argv[1]]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]  # no half checkpoint-4
    assert (out / ".staging" / "checkpoint-4").is_dir()  # where it was being written
    assert train(out, "--resume", "true") == 0
    assert not (out / ".staging").exists()
    assert_same_run(out, full_run)


# ---------------------------------------------------------------------------------------------
# 5. A finished run's checkpoints are pruned, an unfinished run's never
# ---------------------------------------------------------------------------------------------


def _fake_checkpoints(out: Path, steps=(10, 20)) -> None:
    for step in steps:
        ckpt = out / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        for name, size in (("model.safetensors", 300), ("optimizer.pt", 600), ("scheduler.pt", 10),
                           ("rng_state.pth", 20), ("rng_state_1.pth", 20), ("config.json", 5)):
            (ckpt / name).write_bytes(b"x" * size)


@pytest.mark.parametrize("keep,left,freed", [
    ("all", {"checkpoint-10": 6, "checkpoint-20": 6}, 0),
    ("model", {"checkpoint-20": 2}, 955 + 650),  # checkpoint-10 whole, checkpoint-20's resume state
    ("none", {}, 2 * 955),
])
def test_a_finished_run_keeps_what_keep_checkpoints_says(tmp_path, keep, left, freed):
    out = tmp_path / "run"
    _fake_checkpoints(out)
    (out / "summary.json").write_text("{}")
    assert prune_checkpoints(out, keep) == freed
    assert {p.name: len(list(p.iterdir())) for p in out.glob("checkpoint-*")} == left
    if keep == "model":
        assert sorted(p.name for p in (out / "checkpoint-20").iterdir()) == ["config.json", "model.safetensors"]


def test_an_unfinished_run_s_checkpoints_are_never_pruned(tmp_path):
    out = tmp_path / "run"
    _fake_checkpoints(out)
    with pytest.raises(RunFolderError, match="no summary.json: its checkpoints are what it resumes from"):
        prune_checkpoints(out, "none")
    assert len(list(out.rglob("*"))) == 14
    with pytest.raises(RecipeError, match="keep_checkpoints 'some' is not one of all, model, none"):
        prune_checkpoints(out, "some")
