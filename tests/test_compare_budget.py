"""`d3s compare --budget reference`: every variant on the compute of the same seed's reference run. The budget
summary on synthetic runs against a hand computation; a real comparison end to end (budgets, evaluation shares,
tables, reuse); a committed campaign in the FLOP convention of its time, tabled as it is and unable to budget a new
run; and the inputs it refuses in one line."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from d3s import cli
from d3s.app.budget import FLOPS_CONVENTION, LEGACY_FLOPS_CONVENTION
from d3s.app.compare.budget import STEP_CAP, budget_argv, budget_summary, curve
from d3s.app.compare.command import refuse_mixed_machines
from d3s.app.compare.markdown import _budget
from d3s.app.compare.markdown import render_markdown
from d3s.app.compare.summary import summarize
from d3s.app.errors import RecipeError
from d3s.app.intervals import mean_interval
from d3s.app.machine import machine_description
from d3s.app.plots import curve_at

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"

# ---------------------------------------------------------------------------------------------
# The summary, by hand
# ---------------------------------------------------------------------------------------------


def _run(seed: int, flops: float, points: list[tuple[float, float]]) -> dict:
    """A run as `summary._load_run` gives it: evaluations at cumulative FLOPs `points` [(flops, accuracy)], the
    first at step 0, the last the final one."""
    records = [{"type": "eval", "step": i * 10, "flops": f, "accuracy": a} for i, (f, a) in enumerate(points)]
    return {"seed": seed, "records": records,
            "summary": {"after": {"accuracy": points[-1][1]}, "flops": flops, "train_wall_s": 60.0,
                        "budget": {"stopped_by": "budget"}}}


def test_budget_summary_by_hand():
    F = 100.0
    runs = {
        "grpo": [_run(1, F, [(0, 0.4), (50, 0.5), (F, 0.6)]), _run(2, F, [(0, 0.4), (50, 0.7), (F, 0.6)])],
        # seed 1: reaches 0.6 at 0.3 and stays; seed 2: touches 0.6 at 0.3, falls, holds only from 1.02
        "d3s": [_run(1, 98.0, [(0, 0.4), (30, 0.6), (60, 0.65), (98, 0.7)]),
                _run(2, 102.0, [(0, 0.4), (30, 0.6), (60, 0.5), (102, 0.62)])],
    }
    out = budget_summary(runs, "grpo")
    d3s = out["d3s"]
    seed1, seed2 = d3s["per_seed"]["1"], d3s["per_seed"]["2"]
    assert seed1["compute_to_target"] == pytest.approx(0.3)
    assert seed2["compute_to_target"] == pytest.approx(1.02)
    # areas: trapezoids over [0, 1]; seed 1 ends at 0.98 and stays flat to 1, seed 2 is cut at 1 (interpolated)
    auc1 = 0.3 * (0.4 + 0.6) / 2 + 0.3 * (0.6 + 0.65) / 2 + 0.38 * (0.65 + 0.7) / 2 + 0.02 * 0.7
    at1 = 0.5 + (0.62 - 0.5) * (1.0 - 0.6) / (1.02 - 0.6)
    auc2 = 0.3 * (0.4 + 0.6) / 2 + 0.3 * (0.6 + 0.5) / 2 + 0.4 * (0.5 + at1) / 2
    assert seed1["auc"] == pytest.approx(auc1) and seed2["auc"] == pytest.approx(auc2)
    ref_auc = [0.5 * (0.4 + 0.5) / 2 + 0.5 * (0.5 + 0.6) / 2, 0.5 * (0.4 + 0.7) / 2 + 0.5 * (0.7 + 0.6) / 2]
    diffs = [0.7 - 0.6, 0.62 - 0.6]
    assert d3s["diff_at_budget_mean"] == pytest.approx(statistics.mean(diffs))
    assert d3s["diff_at_budget_ci"] == pytest.approx(list(mean_interval(diffs)))
    assert d3s["auc_diff_mean"] == pytest.approx(statistics.mean([auc1 - ref_auc[0], auc2 - ref_auc[1]]))
    assert d3s["probability_of_improvement"] == 1.0
    assert (d3s["seeds_reaching_target"], d3s["seeds_reaching_target_early"]) == (2, 1)
    assert out["grpo"]["diff_at_budget_ci"] is None and out["grpo"]["per_seed"]["1"]["share_spent"] == 1.0
    # the sign-flip test of two differences, both positive: 2 of the 4 sign assignments are as far from zero
    assert d3s["p_value"] == 0.5 and d3s["p_value_holm"] == 0.5  # one arm: Holm leaves it
    assert d3s["leave_one_out"] == pytest.approx([0.02, 0.1])
    assert d3s["auc_leave_one_out"] == pytest.approx(sorted([auc1 - ref_auc[0], auc2 - ref_auc[1]]))
    for key in ("p_value", "p_value_holm", "leave_one_out", "auc_p_value", "auc_p_value_holm", "auc_leave_one_out"):
        assert out["grpo"][key] is None
    assert curve(runs["d3s"][0]["records"], F) == [(0.0, 0.4), (0.3, 0.6), (0.6, 0.65), (0.98, 0.7)]


def test_the_tests_are_corrected_over_the_arms_of_the_table():
    F = 100.0

    def arm(finals):
        return [_run(seed, F, [(0, 0.4), (F, a)]) for seed, a in enumerate(finals, 1)]
    runs = {"grpo": arm([0.5] * 6), "up": arm([0.6, 0.55, 0.57, 0.6, 0.62, 0.58]),
            "flat": arm([0.52, 0.48, 0.5, 0.51, 0.49, 0.53]), "down": arm([0.4, 0.45, 0.42, 0.5, 0.44, 0.41])}
    out = budget_summary(runs, "grpo")
    # up: six positive differences, p = 2/64; down: five negative and a zero, p = 4/64; flat: p well above
    assert out["up"]["p_value"] == 2 / 64 and out["down"]["p_value"] == 4 / 64
    assert out["up"]["p_value_holm"] == pytest.approx(3 * 2 / 64)
    assert out["down"]["p_value_holm"] == pytest.approx(2 * 4 / 64)
    assert out["flat"]["p_value_holm"] == pytest.approx(max(out["flat"]["p_value"], 2 * 4 / 64))
    # the interval of `up` excludes zero, but three arms at six seeds cannot show it: 3 x 2/64 > 0.05
    assert out["up"]["diff_at_budget_ci"][0] > 0 and out["up"]["p_value_holm"] > 0.05
    # the area is a second family, tested the same way (a two-point curve: the area is the mean of its ends)
    assert out["up"]["auc_p_value"] == 2 / 64 and out["up"]["auc_p_value_holm"] == pytest.approx(3 * 2 / 64)
    table = "\n".join(_budget({"mode": "budget", "reference": "grpo", "seeds": list(range(1, 7)),
                                "variants": {v: {"budget": b} for v, b in out.items()}}))
    assert ("| up | 58.7% | +8.7 | [+6.0, +11.3] (not shown: corrected p = 0.0938) | 0.0312 | 0.0938 | +8.0 to +9.4 |"
            in table)
    assert "| flat | 50.5% | +0.5 | [-1.5, +2.5] (not shown) | 0.688 | 0.688 |" in table
    # alone in its table, `up` is shown: its interval excludes zero and 2/64 < 0.05
    alone = budget_summary({"grpo": runs["grpo"], "up": runs["up"]}, "grpo")
    table = "\n".join(_budget({"mode": "budget", "reference": "grpo", "seeds": list(range(1, 7)),
                                "variants": {v: {"budget": b} for v, b in alone.items()}}))
    assert "| up | 58.7% | +8.7 | [+6.0, +11.3] | 0.0312 | 0.0312 |" in table


def test_wall_clock_ratios_from_different_machines_are_refused_in_one_line():
    here = machine_description(None)
    summary = {"reference": "grpo", "variants": {
        "grpo": {"per_seed": [{"seed": 1, "machine": here}]},
        "d3s": {"per_seed": [{"seed": 1, "machine": {**here, "cpu_model": -1}}]}}}
    with pytest.raises(RecipeError) as err:
        refuse_mixed_machines(summary)
    assert "d3s-seed1" in str(err.value) and "\n" not in str(err.value)
    summary["variants"]["d3s"]["per_seed"][0]["machine"] = here
    refuse_mixed_machines(summary)


def test_wall_clock_ratios_with_a_loaded_run_are_refused_naming_it():
    here = machine_description(None)
    summary = {"reference": "grpo", "variants": {
        "grpo": {"per_seed": [{"seed": 1, "machine": here, "quiet": True}]},
        "d3s": {"per_seed": [{"seed": 1, "machine": here, "quiet": False}, {"seed": 2, "machine": here}]}}}
    with pytest.raises(RecipeError) as err:
        refuse_mixed_machines(summary)
    assert "d3s-seed1 ran while something else loaded the machine" in str(err.value)
    assert "seed2" not in str(err.value)  # a run with no load record is not said to be loaded
    summary["variants"]["d3s"]["per_seed"][0]["quiet"] = True
    refuse_mixed_machines(summary)


# ---------------------------------------------------------------------------------------------
# A comparison end to end
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("D3S_CACHE", str(tmp_path / "cache"))


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_a_budgeted_comparison_trains_every_variant_on_the_reference_compute(tmp_path, _cache, capfd):
    pytest.importorskip("trl")
    root = tmp_path / "race"
    argv = ["compare", "--config", "smoke", "--variants", "d3s,grpo", "--seeds", "1", "--budget", "reference",
            "--budget_points", "4", "--output_dir", str(root), "--plots", "false"]
    assert cli.main(argv) == 0
    ref, run = root / "grpo-seed1", root / "d3s-seed1"
    ref_summary, summary = (json.loads((f / "summary.json").read_text()) for f in (ref, run))
    assert [r["step"] for r in _records(ref) if r["type"] == "eval"] == [0, 1, 2, 3, 4]  # every 4 // 4 steps
    config = json.loads((run / "run_config.json").read_text())
    assert config["run"]["compute_budget"] == ref_summary["flops"]
    assert config["trainer"]["max_steps"] == STEP_CAP * 4
    shares = [float(s) for s in config["run"]["budget_eval_shares"].split(",")]
    ref_evals = [r["flops"] / ref_summary["flops"] for r in _records(ref) if r["type"] == "eval" and 0 < r["step"] < 4]
    assert shares == pytest.approx(ref_evals, abs=1e-6)
    assert summary["budget"]["stopped_by"] == "budget" and abs(summary["budget"]["share"] - 1) < 0.5
    result = json.loads((root / "compare.json").read_text())
    assert result["mode"] == "budget" and result["reference"] == "grpo"
    b = result["variants"]["d3s"]["budget"]
    assert b["unit"] == "flops" and set(b["per_seed"]) == {"1"} and result["flops_convention"] == FLOPS_CONVENTION
    assert b["per_seed"]["1"]["flops"] == summary["flops"]
    assert b["per_seed"]["1"]["accuracy_at_budget"] == summary["after"]["accuracy"]
    for key in ("diff_at_budget_mean", "diff_at_budget_ci", "auc_diff_mean", "auc_diff_ci"):
        assert key in b
    assert "At grpo's compute (the headline)" in (root / "compare.md").read_text()
    assert (root / "compare-budget.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capfd.readouterr()
    assert cli.main(argv) == 0  # the same command again reuses every run
    err = capfd.readouterr().err
    assert err.count("reusing") == 2 and "running" not in err
    assert budget_argv(ref)[:2] == ["--compute_budget", repr(ref_summary["flops"])]


def test_a_committed_campaign_tables_in_its_convention_and_cannot_budget_a_new_run(tmp_path):
    """benchmarks/results/race-default was budgeted before FLOPs recorded a convention: its numbers are
    `estimate-v1`, tabled and plotted as they were, said so, and its references refuse to budget a run to train."""
    root = RESULTS / "race-default"
    saved = json.loads((root / "compare.json").read_text())
    summary = summarize(root, list(saved["variants"]), saved["seeds"], reference=saved["reference"], budget=True)
    assert summary["flops_convention"] == LEGACY_FLOPS_CONVENTION
    for v, row in saved["variants"].items():
        for seed, p in row["budget"]["per_seed"].items():
            mine = summary["variants"][v]["budget"]["per_seed"][seed]
            assert (mine["flops"], mine["share_spent"], mine["auc"]) == (p["flops"], p["share_spent"], p["auc"])
    md = render_markdown(summary, "d3s compare ...")
    assert f"FLOPs are `{LEGACY_FLOPS_CONVENTION}`: estimated model FLOPs" in md
    assert f"trained on the FLOPs (`{LEGACY_FLOPS_CONVENTION}`) of the same seed's grpo run" in md
    pytest.importorskip("matplotlib")
    from d3s.app.plots import plot_budget

    assert plot_budget(summary, tmp_path / "b.png", title="t").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ref = root / "grpo-seed11"
    flops = json.loads((ref / "summary.json").read_text())["flops"]
    assert budget_argv(ref, to_train=False)[:2] == ["--compute_budget", repr(float(flops))]  # a finished run reused
    with pytest.raises(RecipeError) as err:
        budget_argv(ref)
    message = str(err.value)
    assert LEGACY_FLOPS_CONVENTION in message and FLOPS_CONVENTION in message and "\n" not in message


@pytest.mark.parametrize("extra,named", [
    (["--budget", "equal"], "--budget 'equal'"),
    (["--budget", "reference", "--reference", "d1s-c"], "--reference 'd1s-c'"),
    (["--reference", "d1s-c"], "--reference 'd1s-c'"),
    (["--budget", "reference", "--budget_points", "0"], "--budget_points 0"),
    (["--budget", "reference", "--eval_every", "3"], "--eval_every"),
    (["--budget", "reference", "--compute_budget", "1e9"], "--compute_budget"),
    (["--compute_budget", "1e9"], "--compute_budget"),
    (["--budget", "reference", "--max_steps", "-1"], "max_steps >= 1"),
])
def test_a_budget_mode_that_cannot_run_is_refused_in_one_line(tmp_path, capsys, extra, named):
    argv = ["compare", "--config", "smoke", "--variants", "grpo,d3s", "--seeds", "1", "--output_dir",
            str(tmp_path / "c"), *extra]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "c").exists()


def test_a_max_steps_for_a_budgeted_variant_is_refused(tmp_path, capsys):
    argv = ["compare", "--config", "smoke", "--variants", "grpo,d3s+max_steps=9", "--seeds", "1", "--budget",
            "reference", "--output_dir", str(tmp_path / "c")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "d3s+max_steps=9" in err and "max_steps" in err and len(err.splitlines()) == 1


def test_a_budget_curve_is_read_between_and_beyond_its_evaluations():
    points = [(0.0, 0.4), (0.2, 0.6), (0.5, 0.3), (1.02, 0.5)]
    assert curve_at(points, 0.0) == 0.4
    assert curve_at(points, 0.1) == pytest.approx(0.5)
    assert curve_at(points, 0.2) == pytest.approx(0.6)
    assert curve_at(points, 0.4) == pytest.approx(0.4)  # two thirds of the way from 0.6 down to 0.3
    assert curve_at(points, 1.5) == 0.5 and curve_at([(0.0, 0.4), (0.9, 0.7)], 1.0) == 0.7  # the end holds
    assert curve_at([(0.0, 0.4), (0.3, 0.5), (0.3, 0.6)], 0.3) == 0.5  # two evaluations at one share: the first
