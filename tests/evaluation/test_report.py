"""Table-1 rendering from hand-built results files."""

from __future__ import annotations

import json

import pytest

from d3s.app.evaluation.benchmarks import BenchmarkError
from d3s.app.evaluation.report import RESULTS_FORMAT, load_results, render_details, render_table


def result(label: str, n: int, counts: dict[str, list[int]]) -> dict:
    return {
        "format": RESULTS_FORMAT,
        "label": label,
        "model": f"/models/{label}",
        "ks": [1, 2],
        "settings": {},
        "benchmarks": {
            name: {"n": n, "n_correct": c, "verify_failures": 1 if name == "gsm8k" else 0}
            for name, c in counts.items()
        },
    }


def test_rows_columns_and_average():
    base = result("base", 2, {"gsm8k": [0, 2], "aime24": [0, 0], "math500": [1, 1]})
    tuned = result("d3s", 2, {"gsm8k": [2, 2], "aime24": [1, 0]})
    table = render_table([base, tuned], ks=(1, 2))
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    # Paper column order (AIME24 before GSM8k before MATH), whatever the file order.
    assert rows[0] == "| Model | AIME24 | GSM8k | MATH | Average |"
    # base: aime24 0/0; gsm8k pass@1 .5, pass@2 .5; math500 pass@1 .5, pass@2 1 (c=1 of n=2).
    assert rows[1] == "| base | 0.0/0.0 | 50.0/50.0 | 50.0/100.0 | 33.3/50.0 |"
    # d3s has no MATH: '-' and an average over its two benchmarks.
    assert rows[2] == "| d3s | 25.0/50.0 | 100.0/100.0 | - | 62.5/75.0 |"
    assert "Average is over the benchmarks each row has" in table
    assert table.startswith("Pass@1/Pass@2 (%), from n=2 samples per problem.")


def test_labels_and_k_checks():
    base = result("base", 2, {"gsm8k": [0, 2]})
    assert "| Base |" in render_table([base], labels=["Base"], ks=(1,))
    with pytest.raises(BenchmarkError, match="2 labels for 1 results"):
        render_table([base], labels=["a", "b"])
    with pytest.raises(BenchmarkError, match=r"k=\[4\] > n=2"):
        render_table([base], ks=(1, 4))


def test_details_table_counts_failures():
    details = render_details(result("base", 2, {"gsm8k": [0, 2], "math500": [1, 1]}))
    assert "| GSM8k | 2 | 2 | 50.0 | 50.0 | 50.0 | 1 |" in details
    assert "| Average |  |  | 50.0 | 75.0 | 50.0 |  |" in details


def test_load_results_rejects_other_files(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(result("x", 2, {"gsm8k": [1]})))
    assert load_results(tmp_path)["label"] == "x"  # a folder means its results.json
    (tmp_path / "other.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(BenchmarkError, match="not a d3s eval results file"):
        load_results(tmp_path / "other.json")
    with pytest.raises(BenchmarkError, match="does not exist"):
        load_results(tmp_path / "missing.json")
