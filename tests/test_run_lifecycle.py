"""A run killed at any point (SIGKILL: nothing runs after it), killed again and again, raced by a second run
into the same folder, or run by a `d3s compare` that is killed: every case ends in the run an uninterrupted
`d3s train` makes, record for record (`run_helpers.assert_same_run`).

The runs that get killed run in their own process (`run_helpers.train_killed_at`); the smoke recipe (tiny
random model, 4 steps, checkpoints at steps 2 and 4, held-out evaluations at steps 0, 2 and 4).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("trl")

from run_helpers import _sigint_raises, _use_cache, cache, full_run  # noqa: E402,F401  (fixtures)
from run_helpers import assert_same_run, killed, train, train_killed_at  # noqa: E402


def checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("checkpoint-*"))


# ---------------------------------------------------------------------------------------------
# SIGKILL at one point, then resume
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("point,at,left", [
    ("step", 3, ["checkpoint-2"]),  # mid-step: generation done, no update yet
    ("eval", 2, []),  # the step-2 evaluation runs before checkpoint-2 is saved: nothing to resume from
    ("eval", 4, ["checkpoint-2", "checkpoint-4"]),  # the final evaluation: every step saved
    ("save_model", 2, []),  # checkpoint-2's weights written, nothing else
    ("save_optimizer", 4, ["checkpoint-2"]),  # checkpoint-4's weights written, its optimizer not
    ("save_rng", 4, ["checkpoint-2"]),  # all but its RNG states
    ("publish", 4, ["checkpoint-2"]),  # written in full, not yet renamed into place
])
def test_a_kill_at_any_point_then_resume_is_exact(full_run, tmp_path, point, at, left):
    out = tmp_path / "run"
    done = train_killed_at(out, point, at)
    assert killed(done), done.stderr[-3000:]
    assert checkpoints(out) == left  # never a half checkpoint-N
    assert not (out / "summary.json").exists()
    if point.startswith(("save", "publish")):
        assert (out / ".staging" / f"checkpoint-{at}").is_dir()  # where it was being written
    assert train(out, "--resume", "true") == 0
    assert not (out / ".staging").exists()
    assert_same_run(out, full_run)


@pytest.mark.slow
def test_repeated_kills_of_one_run_end_in_the_uninterrupted_run(full_run, tmp_path, capfd):
    """Four kills at different points, each resumed by the same command, then a resume that finishes."""
    out = tmp_path / "run"
    kills = [
        ("step", 3, [], ["checkpoint-2"]),  # during step 3
        ("step", 1, ["--resume", "true"], ["checkpoint-2"]),  # resumed from 2: during step 3 again
        ("save_rng", 4, ["--resume", "true"], ["checkpoint-2"]),  # steps 3 and 4 done, checkpoint-4 half written
        ("eval", 4, ["--resume", "true"], ["checkpoint-2", "checkpoint-4"]),  # the final evaluation
    ]
    for point, at, extra, left in kills:
        done = train_killed_at(out, point, at, *extra)
        assert killed(done), (point, at, done.stderr[-3000:])
        assert checkpoints(out) == left, (point, at)
    capfd.readouterr()
    assert train(out, "--resume", "true") == 0
    err = capfd.readouterr().err
    assert "resuming from checkpoint-4" in err and "every step is trained: running the final evaluation" in err
    assert_same_run(out, full_run)


# ---------------------------------------------------------------------------------------------
# Two runs into one folder at the same moment
# ---------------------------------------------------------------------------------------------

RACING_TRAIN = """
import sys, time
from pathlib import Path
from d3s import cli
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
ready.touch()
while not go.exists():
    time.sleep(0.002)
sys.exit(cli.main(["train", "--config", "smoke", *sys.argv[3:]]))
"""


def race(tmp_path: Path, *argv: str) -> list[subprocess.CompletedProcess]:
    """Two `d3s train ARGV` started at the same moment (both imported and waiting, then released together)."""
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", RACING_TRAIN, str(r), str(go), *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in ready]
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=600), *p.communicate()) for p in procs]


@pytest.mark.slow
@pytest.mark.parametrize("start", ["new", "resume"])
def test_two_runs_into_one_folder_at_the_same_moment(full_run, tmp_path, start):
    """One is refused in one line and changes nothing; the other makes the uninterrupted run."""
    out = tmp_path / "run"
    extra = []
    if start == "resume":  # both continue the same interrupted run
        assert killed(train_killed_at(out, "step", 3))
        extra = ["--resume", "true"]
    runs = race(tmp_path, "--output_dir", str(out), *extra)
    assert sorted(r.returncode for r in runs) == [0, 2], [r.stderr[-2000:] for r in runs]
    loser = next(r for r in runs if r.returncode == 2)
    lines = loser.stderr.strip().splitlines()
    assert len(lines) == 1 and "is in use by another d3s train (pid" in lines[0], lines
    assert_same_run(out, full_run)


# ---------------------------------------------------------------------------------------------
# d3s compare killed mid-run, then run again
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "sigint"])
def test_a_killed_compare_run_again_finishes_with_exact_runs(full_run, tmp_path, sig):
    """`d3s compare` and the `d3s train` it runs killed together (SIGKILL: the machine went down; SIGINT: Ctrl-C
    at the terminal) while its first run trains; the same command again finishes every run exactly."""
    grpo = tmp_path / "grpo"
    assert train(grpo, "--variant", "grpo") == 0  # the reference of the comparison's other run
    root = tmp_path / "cmp"
    command = [sys.executable, "-m", "d3s.cli", "compare", "--config", "smoke", "--variants", "grpo,d3s", "--seeds",
               "0", "--output_dir", str(root)]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    deadline = time.monotonic() + 300
    while not (root / "grpo-seed0" / "checkpoint-2").is_dir() and first.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(first.pid, sig)
    _, err = first.communicate(timeout=300)
    assert first.returncode != 0, err[-3000:]
    assert not (root / "compare.json").exists() and not (root / "d3s-seed0" / "summary.json").exists()
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (root / "compare.json").is_file() and (root / "compare.md").is_file()
    assert_same_run(root / "grpo-seed0", grpo)
    assert_same_run(root / "d3s-seed0", full_run)
