"""A budgeted run (`d3s train --compute_budget`) shows its budget, not its cap on steps: the first line says until
how many FLOPs it trains, and the progress bar counts the share of the budget spent."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("trl")

from run_helpers import _sigint_raises, _use_cache, cache, train  # noqa: E402,F401  (fixtures)


def test_a_budgeted_run_shows_its_budget_not_its_step_cap(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(out, "--compute_budget", "3e8", "--max_steps", "32", "--eval_every", "0", "--plots", "false") == 0
    err = capsys.readouterr().err.replace("\r", "\n")
    first = next(line for line in err.splitlines() if line.startswith("d3s train: d3s on arith"))
    assert "2 prompts x 4 rollouts a step until 3e+08 estimated FLOPs are spent (at most 32 steps)" in first, first
    bars = [line for line in err.splitlines() if "d3s train: " in line and "|" in line]
    assert bars and all("% of the compute budget|" in line for line in bars), bars[-3:]
    assert not any(re.search(r"\| \d+/32 \[", line) for line in bars)  # never the cap as the bar's length
    # at its end: (about) all of the budget spent, with the steps it took beside
    assert re.match(r"d3s train: (9\d|100)% of the compute budget\|.*step=\d", bars[-1]), bars[-1]
