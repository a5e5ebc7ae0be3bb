"""What `d3s compare` is handed: run settings that would name a folder outside `--output_dir`, budget options that
cannot be honoured, and settings a run would refuse only once the reference has trained. Each is refused in one
line before any run starts, or (the folder names) made safe; none trains a run, except the reused one copied in."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from d3s import cli
from d3s.app.compare import command
from d3s.app.compare.summary import NAME_BYTES, SAFE_NAME_CHARACTERS, run_dir, run_folder_name
from d3s.app.recipe import parse_train_args
from run_helpers import _sigint_raises, _use_cache, cache, full_run  # noqa: E402,F401  (fixtures)
from run_helpers import copy_run  # noqa: E402

# ---------------------------------------------------------------------------------------------
# 1. Every run folder lies inside --output_dir, whatever a run setting holds
# ---------------------------------------------------------------------------------------------

NASTY = ["/", "..", ".", "\x00", "%", "%2F", "%-", "-seed1", "~", " ", "\\", "\n", "d3s", "+", "=", "é", "😀",
         "\udcff"]
settings_text = st.one_of(
    st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=4)), max_size=40).map("".join),
    st.text(min_size=100, max_size=400),  # past the longest name a file system allows
    st.text(alphabet=sorted(SAFE_NAME_CHARACTERS), max_size=60),
)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


@settings(max_examples=300, deadline=None)
@given(setting=settings_text, seed=seeds)
def test_every_run_folder_lies_inside_the_output_dir(tmp_path_factory, setting, seed):
    root = tmp_path_factory.getbasetemp() / "cmp"
    root.mkdir(exist_ok=True)
    name = run_folder_name(setting, seed)
    assert "/" not in name and "\x00" not in name and not name.startswith(".")
    assert len(name.encode("utf-8")) <= NAME_BYTES <= 255
    folder = run_dir(root, setting, seed)
    assert folder.parent == root
    folder.mkdir()  # the file system takes it, and it is where it says
    try:
        assert folder.resolve().parent == root.resolve()
    finally:
        folder.rmdir()


@settings(max_examples=300, deadline=None)
@given(a=settings_text, b=settings_text, seed_a=seeds, seed_b=seeds)
def test_two_runs_never_share_a_folder(a, b, seed_a, seed_b):
    if (a, seed_a) != (b, seed_b):
        assert run_folder_name(a, seed_a) != run_folder_name(b, seed_b)


@settings(max_examples=100, deadline=None)
@given(setting=st.text(alphabet=sorted(SAFE_NAME_CHARACTERS), min_size=1, max_size=60).filter(
    lambda s: not s.startswith(".")), seed=seeds)
def test_a_plain_setting_keeps_its_folder(setting, seed):
    """The folders of committed comparisons (`d3s+token_cut=sign-seed1`) keep their names: they are reused."""
    assert run_folder_name(setting, seed) == f"{setting}-seed{seed}"


def test_a_setting_with_a_path_runs_inside_the_output_dir(tmp_path, monkeypatch, capsys):
    """The setting a user wrote (`/../../escaped`): the run is started in a folder inside --output_dir, named in
    compare.json; nothing is made outside it."""
    started = []

    def child(cmd, env):
        started.append(Path(cmd[cmd.index("--output_dir") + 1]))
        return 1  # stop there: no run is trained

    monkeypatch.setattr(command, "run_child", child)
    root = tmp_path / "s" / "cmp6" / "inner"
    assert cli.main(["compare", "--config", "smoke", "--variants", "d3s+instruction=/../../escaped", "--seeds", "1",
                     "--max_steps", "1", "--output_dir", str(root)]) == 2
    assert started == [root / "d3s+instruction=%2F..%2F..%2Fescaped-seed1"]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "s", os.path.join("s", "cmp6"), os.path.join("s", "cmp6", "inner")]


# ---------------------------------------------------------------------------------------------
# 2. Budget options that cannot be honoured, settings a run would refuse: one line, before any run
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra,line", [
    (["--variants", "grpo,d3s", "--max_steps", "1", "--budget_points", "10"],
     "--budget_points 10 is for --budget reference (held-out evaluations over the reference's compute); without "
     "--budget every run evaluates every eval_every steps (a d3s train field)"),
    (["--variants", "grpo,d3s", "--budget", "reference", "--max_steps", "4", "--budget_points", "10"],
     "--budget_points 10: the reference's 4 steps cannot hold 10 evenly spaced held-out evaluations (one every 1 step "
     "gives 4); give one of 1, 2, 4 (a divisor of max_steps)"),
    (["--variants", "grpo,d3s", "--budget", "reference", "--max_steps", "4", "--budget_points", "1000000"],
     "--budget_points 1000000: the reference's 4 steps cannot hold 1000000 evenly spaced held-out evaluations (one "
     "every 1 step gives 4); give one of 1, 2, 4 (a divisor of max_steps)"),
    (["--variants", "grpo,d3s", "--budget", "reference", "--max_steps", "4", "--budget_points", "3"],
     "--budget_points 3: the reference's 4 steps cannot hold 3 evenly spaced held-out evaluations (one every 1 step "
     "gives 4); give one of 1, 2, 4 (a divisor of max_steps)"),
    (["--variants", "grpo,d3s", "--budget", "reference", "--max_steps", "2", "--budget_points", "2",
      "--warmup_steps", "1"],
     "run setting 'd3s' on grpo's compute (--budget reference): warmup_steps=1.0 counts steps, which a compute budget "
     "does not fix; give the warmup as a share of the budget: warmup_steps below 1 (e.g. 0.1, the first tenth)"),
    (["--variants", "grpo,d3s+schedule_clock=learning_rate", "--budget", "reference", "--max_steps", "2",
      "--budget_points", "2"],
     "run setting 'd3s+schedule_clock=learning_rate' on grpo's compute (--budget reference): "
     "schedule_clock='learning_rate' with compute_budget: the schedule then follows the share of the budget spent; "
     "leave schedule_clock at 'steps'"),
    (["--variants", "grpo+eval_every=1,d3s", "--budget", "reference", "--max_steps", "2", "--budget_points", "2"],
     "run setting 'grpo+eval_every=1' sets eval_every, which --budget reference sets for the reference from "
     "--budget_points (an evaluation every max_steps // budget_points steps); remove it and give --budget_points"),
], ids=["points-without-budget", "more-points-than-steps", "a-million-points", "uneven-points", "warmup-steps",
        "schedule-clock", "reference-eval-every"])
def test_a_comparison_that_cannot_run_as_asked_is_refused_before_any_run(tmp_path, capsys, extra, line):
    root = tmp_path / "c"
    assert cli.main(["compare", "--config", "smoke", "--seeds", "1", "--output_dir", str(root), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"d3s compare: error: {line}"], err
    assert not root.exists()  # nothing trained, nothing written


def test_the_warmup_the_refusal_advises_is_accepted():
    """The advice names an option that exists (`warmup_ratio` is not a field of this transformers)."""
    run, config, _ = parse_train_args(["--config", "smoke", "--compute_budget", "1e9", "--max_steps", "8",
                                       "--eval_every", "0", "--warmup_steps", "0.1"])
    assert config.warmup_steps == 0.1 and run.compute_budget == 1e9


def test_the_default_budget_points_say_what_the_steps_give(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(command, "run_child", lambda cmd, env: 1)  # stop at the first run
    assert cli.main(["compare", "--config", "smoke", "--variants", "grpo,d3s", "--seeds", "1", "--budget",
                     "reference", "--output_dir", str(tmp_path / "c")]) == 2
    assert ("d3s compare: note: the reference's 4 steps give 4 held-out evaluations over the budget (one every 1 "
            "step), not the default 5; --budget_points sets them") in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# 3. A reused reference evaluated elsewhere than this command asks
# ---------------------------------------------------------------------------------------------


def _without_evaluations(run: Path) -> None:
    """`run` as trained with eval_every 0: held-out evaluations at its start and end only."""
    path = run / "metrics.jsonl"
    kept = [line for line in path.read_text().splitlines(keepends=True)
            if not ('"type": "eval"' in line and json.loads(line)["step"] not in (0, 4))]
    path.write_text("".join(kept))


@pytest.mark.parametrize("points,evaluated,wanted", [
    ("4", "2", "1, 2, 3"),  # the reference was run with --budget_points 2; this command asks for 4
    ("2", None, "2"),  # a reference without evaluations before its end (d3s train with eval_every 0)
], ids=["other-points", "no-evaluations"])
def test_a_reused_reference_evaluated_elsewhere_is_refused_before_any_run(full_run, tmp_path, capsys, points,
                                                                          evaluated, wanted):
    root = tmp_path / "cmp"
    ref = copy_run(full_run, root / "d3s-seed0")  # the smoke recipe's d3s run, seed 0: evaluated at step 2
    if evaluated is None:
        _without_evaluations(ref)
    argv = ["compare", "--config", "smoke", "--variants", "d3s,grpo", "--reference", "d3s", "--seeds", "0",
            "--budget", "reference", "--budget_points", points, "--output_dir", str(root)]
    assert cli.main(argv) == 2
    every = 4 // int(points)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"d3s compare: error: {ref}, the reference run of this folder, was evaluated at steps "
                   f"{evaluated or 'none before its end'} before its end, but --budget_points {points} asks for one "
                   f"every {every} step{'s' * (every > 1)} ({wanted}): the budgeted runs are evaluated where it was, "
                   "so its curve would not be this command's; give the --budget_points it was run with, or use "
                   "another --output_dir"], err
    assert sorted(p.name for p in root.iterdir()) == ["d3s-seed0"]  # nothing trained
