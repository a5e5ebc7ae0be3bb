"""The output folder of `d3s eval`: a full disk is one line and the same command finishes the evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from d3s.app.cli import main
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
