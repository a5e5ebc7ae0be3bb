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

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from d3s.app import train as train_mod  # noqa: E402
from d3s.app.errors import RecipeError  # noqa: E402
from d3s.app.runfolder import (  # noqa: E402
    LOCK_NAME,
    RunFolderError,
    claim_folder,
    complete_checkpoints,
    prune_checkpoints,
)
from run_helpers import _sigint_raises, _use_cache, cache, full_run  # noqa: E402,F401  (fixtures)
from run_helpers import assert_same_run, copy_run, snapshot, train  # noqa: E402


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


def test_a_run_refused_the_instant_another_takes_the_folder_names_it(tmp_path, capsys, monkeypatch):
    """The holder writes its pid just after it takes the lock: a run refused in between waits for the pid."""
    out = tmp_path / "run"
    lock = claim_folder(out)
    pread, reads = os.pread, []

    def pread_as_in_the_instant(fd, n, offset):  # the first look finds the lock file still empty
        reads.append(fd)
        return b"" if len(reads) == 1 else pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", pread_as_in_the_instant)
    try:
        assert train(out) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is in use by another d3s train (pid {os.getpid()} on" in err[0], err
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


def test_a_folder_with_another_program_s_run_config_is_refused_untouched(tmp_path, capsys):
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "run_config.json").write_text('{"lr": 0.1}\n')  # not a d3s run's: no run and trainer settings
    assert train(out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not empty (1 entry: run_config.json) and holds no d3s run (its run_config.json: " \
        "not a run config: it lacks the run and trainer settings)" in err[0], err
    assert snapshot(out) == {"run_config.json": b'{"lr": 0.1}\n'}


def test_a_copied_run_whose_run_config_is_damaged_is_refused_naming_the_file(tmp_path, capsys):
    out = tmp_path / "copied"
    out.mkdir()
    (out / "metrics.jsonl").write_text("")
    (out / "run_config.json").write_text('{"run": {"model": "embedded"')  # cut short, no lock file beside it
    assert train(out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no d3s run (its run_config.json: " in err[0] and "JSON" in err[0], err


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
    "in_final_eval",
])
def test_stop_during_a_step_then_resume_is_exact(full_run, tmp_path, monkeypatch, capsys, how):
    stop, code, message = STOPS.get(how, (None, 130, "interrupted after step 3"))
    cut = tmp_path / "cut"
    last = {"in_eval": 2, "in_final_eval": 4}.get(how, 3)
    with monkeypatch.context() as mp:
        if how == "step_end":
            stopping_at_step_end(mp, 3)
        elif how in ("in_eval", "in_final_eval"):  # step 3 is not an evaluation step: the cut is at step 2 or 4
            message = f"interrupted after step {last}"
            stopping_in_eval(mp, last)
        else:
            stopping_at(mp, 4, stop)  # during step 4; step 3 is not a regular checkpoint (save_steps 2)
        assert train(cut) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"d3s train: {message}; checkpoint-{last} holds step {last}; to continue, run the same "
                       "command plus --resume true"), err[-1]
    assert not any("rerun the same command" in line for line in err)  # one message, not two that disagree
    saved = [4, 2] if how == "in_final_eval" else range(last, 1, -1)  # the stop's own checkpoint, the regular ones
    assert [p.name for p in complete_checkpoints(cut)[0]] == [f"checkpoint-{s}" for s in saved]
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


@pytest.mark.parametrize("extra,names", [
    (["--max_steps", "6", "--variant", "grpo"],
     ["max_steps: 4 -> 6", "variant: 'd3s' -> 'grpo'", "sample_selection: 'cross' -> 'none'"]),
    (["--max_steps", "2"], ["max_steps: 4 -> 2"]),
    (["--learning_rate", "0.5"], ["learning_rate: 0.001 -> 0.5"]),
])
def test_a_finished_run_asked_to_change_training_is_refused(full_run, tmp_path, capsys, extra, names):
    out = copy_run(full_run, tmp_path / "run")
    before = snapshot(out)
    assert train(out, "--resume", "true", *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a finished run (4 steps); --resume true with a recipe that changes " \
        "training" in err[0], err
    for name in names:
        assert name in err[0], err[0]
    after = snapshot(out)
    after.pop(LOCK_NAME)
    assert after == before


def test_a_finished_run_resumed_with_free_changes_has_nothing_to_do(full_run, tmp_path, capsys):
    out = copy_run(full_run, tmp_path / "run")
    before = snapshot(out)
    assert train(out, "--resume", "true", "--eval_every", "1", "--plots", "false") == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"d3s train: {out} is a finished run (4 steps, summary.json); nothing to do"], err
    after = snapshot(out)
    after.pop(LOCK_NAME)
    assert after == before


@pytest.mark.parametrize("damage,keep", [("{broken", "all"), ("", "all"), ("[1, 2]", "all"), ("{broken", "model")])
def test_a_finished_run_with_a_damaged_summary_is_evaluated_again(full_run, tmp_path, capsys, damage, keep):
    """The final evaluation runs again from the last checkpoint (its weights are all it needs, so a
    checkpoint pruned by `d3s compare` serves); its record replaces the old one."""
    out = copy_run(full_run, tmp_path / "run")
    prune_checkpoints(out, keep)
    (out / "summary.json").write_text(damage)
    assert train(out, "--resume", "true") == 0
    err = capsys.readouterr().err
    assert f"{out / 'summary.json'} is damaged (not valid JSON" in err or "not a run summary" in err, err
    assert "resuming from checkpoint-4" in err and "every step is trained: running the final evaluation" in err
    assert_same_run(out, full_run)  # one step-4 evaluation record, wall_s never going backwards


def test_a_finished_run_with_a_damaged_summary_and_no_checkpoint_is_refused(full_run, tmp_path, capsys):
    out = copy_run(full_run, tmp_path / "run")
    prune_checkpoints(out, "none")
    (out / "summary.json").write_text("{broken")
    before = snapshot(out)
    assert train(out, "--resume", "true") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "summary.json is damaged (not valid JSON" in err[0] and "no checkpoint" in err[0], err
    after = snapshot(out)
    after.pop(LOCK_NAME)
    assert after == before  # the records of the finished run are kept


def test_a_resumed_run_s_summary_equals_an_uninterrupted_run_s(full_run, tmp_path):
    out = unfinished(full_run, tmp_path / "run")
    assert train(out, "--resume", "true") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["before"] == json.loads((full_run / "summary.json").read_text())["before"]
    assert_same_run(out, full_run)


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


def make_checkpoint_3(out: Path) -> Path:
    """A checkpoint-3 next to checkpoint-2 (its copy, saying step 3), to be damaged: a resume must skip it."""
    bad = out / "checkpoint-3"
    shutil.copytree(out / "checkpoint-2", bad)
    state = json.loads((bad / "trainer_state.json").read_text())
    state["global_step"] = 3
    (bad / "trainer_state.json").write_text(json.dumps(state))
    return bad


@pytest.mark.parametrize("damage,reason", [
    ("truncate_weights", "skipping checkpoint-3: model.safetensors is truncated"),
    ("no_trainer_state", "skipping checkpoint-3: trainer_state.json is missing"),
    ("truncate_optimizer", "skipping checkpoint-3: optimizer.pt is truncated or not a torch file"),
])
def test_resume_falls_back_to_the_newest_complete_checkpoint(full_run, tmp_path, capsys, damage, reason):
    out = cut_at_step_4(full_run, tmp_path / "run")
    bad = make_checkpoint_3(out)  # a checkpoint-3 that a crash damaged
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


def hostile(path: Path, marker: Path) -> None:
    """A well-formed torch file whose unpickling would create the folder `marker`."""

    class Hostile:
        def __reduce__(self):
            return os.mkdir, (str(marker),)

    torch.save({"state": Hostile()}, path)


def damage_checkpoint(ckpt: Path, damage: str, marker: Path) -> None:
    """Damage `ckpt` so that its files pass the quick checks (sizes, archives) but cannot be loaded."""
    if damage.startswith("hostile_"):
        hostile(ckpt / {"hostile_rng": "rng_state.pth", "hostile_optimizer": "optimizer.pt",
                        "hostile_scheduler": "scheduler.pt"}[damage], marker)
    elif damage == "rng_of_nothing":
        torch.save({}, ckpt / "rng_state.pth")
    elif damage == "optimizer_of_another_model":
        torch.save({"state": {}, "param_groups": []}, ckpt / "optimizer.pt")
    elif damage in ("weight_missing", "weight_of_another_shape"):
        weights = load_file(ckpt / "model.safetensors")
        if damage == "weight_missing":
            del weights["model.norm.weight"]
        else:
            weights["model.norm.weight"] = torch.zeros(3)
        save_file(weights, ckpt / "model.safetensors", metadata={"format": "pt"})
    elif damage == "config_not_json":
        (ckpt / "config.json").write_text("{broken")
    else:
        raise AssertionError(damage)


SLOW = pytest.mark.slow


@pytest.mark.parametrize("damage,reason", [pytest.param(case[0], case[1], marks=case[2:], id=case[0]) for case in [
    ("hostile_rng", "rng_state.pth cannot be loaded (UnpicklingError: Weights only load failed"),
    ("hostile_optimizer", "optimizer.pt cannot be loaded (UnpicklingError: Weights only load failed"),
    ("hostile_scheduler", "scheduler.pt cannot be loaded (UnpicklingError: Weights only load failed"),
    ("weight_missing", "model.safetensors lacks 1 weight of the model (model.norm.weight)"),
    ("rng_of_nothing", "rng_state.pth cannot be loaded (KeyError: 'python')", SLOW),
    ("optimizer_of_another_model", "optimizer.pt cannot be loaded (ValueError: loaded state dict has a different "
     "number of parameter groups)", SLOW),
    ("weight_of_another_shape", "model.safetensors cannot be loaded (RuntimeError: Error(s) in loading state_dict "
     "for LlamaForCausalLM: size mismatch for model.norm.weight", SLOW),
    ("config_not_json", "config.json cannot be loaded (JSONDecodeError: ", SLOW),
]])
def test_a_checkpoint_that_cannot_be_loaded_is_skipped(full_run, tmp_path, capsys, damage, reason):
    """Files that pass the quick checks but fail to load (a pickle that a safe load refuses, states of
    another model): the run says so in one line and resumes from the previous checkpoint, exactly."""
    out = cut_at_step_4(full_run, tmp_path / "run")
    bad = make_checkpoint_3(out)
    marker = tmp_path / "executed"
    damage_checkpoint(bad, damage, marker)
    assert train(out, "--resume", "true") == 0
    err = capsys.readouterr().err
    assert f"skipping checkpoint-3: {reason}" in err, err
    assert "resuming from checkpoint-2" in err and "Traceback" not in err
    assert not marker.exists()  # nothing in the file ran
    assert_same_run(out, full_run)


def test_a_run_with_no_loadable_checkpoint_starts_over_and_says_so(full_run, tmp_path, capsys):
    out = cut_at_step_4(full_run, tmp_path / "run")
    hostile(out / "checkpoint-2" / "rng_state.pth", tmp_path / "executed")
    assert train(out, "--resume", "true") == 0
    err = capsys.readouterr().err
    assert "skipping checkpoint-2: rng_state.pth cannot be loaded (UnpicklingError" in err, err
    assert f"no loadable checkpoint in {out}; starting from the beginning" in err
    assert not (tmp_path / "executed").exists()
    assert_same_run(out, full_run)


@pytest.mark.parametrize("loss", ["deleted", "after_step_1"])
def test_a_checkpoint_whose_records_are_lost_is_skipped(full_run, tmp_path, capsys, loss):
    """A checkpoint without its step's record in metrics.jsonl cannot continue the cumulative counts
    (tokens, wall-clock): the run goes back to a checkpoint whose records it has, here the beginning."""
    out = cut_at_step_4(full_run, tmp_path / "run")
    metrics = out / "metrics.jsonl"
    if loss == "deleted":
        metrics.unlink()
    else:
        metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:2]))  # eval 0, train 1
    assert train(out, "--resume", "true") == 0
    err = capsys.readouterr().err
    assert "skipping checkpoint-2: metrics.jsonl has no record of step 2" in err, err
    assert f"no complete checkpoint in {out}; starting from the beginning" in err
    assert_same_run(out, full_run)


def test_a_resume_does_not_report_tied_weights_as_missing(full_run, tmp_path, capsys, caplog):
    """The LM head shares the embedding's weights (saved once): not a missing key. A weight that is
    really missing is named (`weight_missing` above)."""
    out = cut_at_step_4(full_run, tmp_path / "run")
    assert train(out, "--resume", "true") == 0
    assert "missing keys" not in caplog.text + capsys.readouterr().err
    assert_same_run(out, full_run)


# ---------------------------------------------------------------------------------------------
# 5. A finished run's checkpoints are pruned, an unfinished run's never
# ---------------------------------------------------------------------------------------------


FINISHED = {"steps": 20, "before": {}, "after": {"accuracy": 0.5, "correct": 8, "n": 16}, "train_wall_s": 1.0,
            "trained_tokens": 10.0}  # the fields of a valid summary.json (`d3s.app.runfiles.SUMMARY_FIELDS`)


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
    (out / "summary.json").write_text(json.dumps(FINISHED))
    assert prune_checkpoints(out, keep) == freed
    assert {p.name: len(list(p.iterdir())) for p in out.glob("checkpoint-*")} == left
    if keep == "model":
        assert sorted(p.name for p in (out / "checkpoint-20").iterdir()) == ["config.json", "model.safetensors"]


def test_an_unfinished_run_s_checkpoints_are_never_pruned(tmp_path):
    out = tmp_path / "run"
    _fake_checkpoints(out)
    with pytest.raises(RunFolderError, match="no valid summary.json: its checkpoints are what it resumes from"):
        prune_checkpoints(out, "none")
    (out / "summary.json").write_text("{broken")  # damaged: its final evaluation runs again from them
    with pytest.raises(RunFolderError, match="no valid summary.json: its checkpoints are what it resumes from"):
        prune_checkpoints(out, "none")
    assert len(list(out.rglob("*"))) == 15
    with pytest.raises(RecipeError, match="keep_checkpoints 'some' is not one of all, model, none"):
        prune_checkpoints(out, "some")
