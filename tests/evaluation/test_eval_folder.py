"""The output folder of `d3s eval`: its own (never a run's, a comparison's or another program's), held with a lock
while it runs; a full disk is one line and the same command finishes the evaluation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from d3s.app.cli import main
from d3s.app.evaluation.runner import claim_eval_folder
from run_helpers import full_disk  # noqa: E402  (tests/, beside the run tests)


def evaluate(tiny_model, out: Path, *extra: str) -> int:
    return main(["eval", "--model", str(tiny_model), "--benchmarks", "arith", "--n", "2", "--ks", "1", "--limit", "3",
                 "--max_new_tokens", "4", "--score_workers", "1", "--output_dir", str(out), "--no_progress", *extra])


def error_line(capfd) -> str:
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()
           and not line.startswith("Loading weights")]
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.parametrize("name", ["samples.jsonl", "results.json", "results.md"])
def test_a_full_disk_is_one_line_and_the_same_command_finishes(tiny_model, tmp_path, monkeypatch, capfd, name):
    out = tmp_path / "ev"
    with monkeypatch.context() as mp:
        full_disk(mp, name)
        assert evaluate(tiny_model, out) == 2
    assert error_line(capfd) == (f"d3s eval: error: {out / name} cannot be written (No space left on device); what "
                                 "was saved before is intact")
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name]  # no temporary file left
    assert evaluate(tiny_model, out) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["benchmarks"]["arith"]["num_problems"] == 3
    assert (out / "results.md").read_text().strip()


# ---------------------------------------------------------------------------------------------
# The folder is the evaluation's own: never a run's, a comparison's or anyone else's
# ---------------------------------------------------------------------------------------------


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _train_run(out: Path) -> None:
    out.mkdir()
    (out / "run_config.json").write_text(json.dumps({"run": {}, "trainer": {}}))
    (out / "metrics.jsonl").write_text('{"type": "train", "step": 1}\n')


def _comparison(out: Path) -> None:
    out.mkdir()
    (out / "compare.json").write_text("{}")


def _foreign(out: Path) -> None:
    out.mkdir()
    (out / "notes.txt").write_text("mine")


@pytest.mark.parametrize("make,whose", [
    (_train_run, "holds a d3s train run"),
    (_comparison, "holds a d3s compare"),
    (_foreign, "is not empty (1 entry: notes.txt)"),
])
def test_a_folder_that_is_not_an_evaluation_s_is_refused_untouched(tiny_model, tmp_path, capfd, make, whose):
    out = tmp_path / "folder"
    make(out)
    before = snapshot(out)
    assert evaluate(tiny_model, out) == 2
    assert error_line(capfd) == (f"d3s eval: error: --output_dir {str(out)!r} {whose}; d3s eval writes only into a "
                                 "new or empty folder or a d3s eval's own: pick another --output_dir")
    assert snapshot(out) == before and sorted(p.name for p in out.iterdir()) == sorted(before)


def test_a_folder_in_use_by_another_evaluation_is_refused(tiny_model, tmp_path, capfd):
    out = tmp_path / "ev"
    assert evaluate(tiny_model, out) == 0  # its own folder: the same command again reuses it
    assert evaluate(tiny_model, out) == 0
    capfd.readouterr()
    held = claim_eval_folder(out)  # a live d3s eval holds it
    try:
        before = snapshot(out)
        assert evaluate(tiny_model, out, "--overwrite") == 2
        line = error_line(capfd)
        assert line.startswith(f"d3s eval: error: output_dir {str(out)!r} is in use by another d3s eval (pid "
                               f"{os.getpid()} on"), line
        assert snapshot(out) == before
    finally:
        held.release()
