"""`d3s compare --budget reference`: every variant on the compute of the same seed's reference run.

The reference variant (`--reference`, grpo by default) runs its recipe, with `--budget_points` held-out
evaluations spread evenly over its steps. Every other variant, same seed, then trains until it has spent the
reference run's model FLOPs (`d3s train --compute_budget`, `d3s.app.budget`), with its learning rate
and N/K schedule over the share of that budget spent, and is evaluated where the reference was: at the same
shares of the compute. Its steps are capped at `STEP_CAP` times the reference's (a run that hits the cap first
says so: `stopped_by: max_steps`). A reference whose FLOPs are in another convention than this d3s counts
(`d3s.app.budget.flops_convention`) cannot budget a run still to train; finished runs are tabled as they are.

The summary (`budget_summary`, the `budget` object of each variant in `compare.json`) is per seed: held-out
accuracy at the budget, the area under accuracy against the compute share (the mean accuracy over the budget),
and the compute share at which the run reached the same seed's reference final accuracy and stayed there; then,
paired by seed against the reference, the mean differences with their 95% intervals, the exact sign-flip
p-values (raw, and Holm-corrected over the non-reference arms of this table, one family per measure), the range
of the mean difference with any one seed left out, the probability of improvement and the minimum detectable
difference at this seed count (`d3s.app.compare.stats`), and the correlation over seeds of the accuracies at the
budget with the reference's (`d3s.app.compare.pairing`).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Sequence

from d3s.app.budget import FLOPS_CONVENTION, flops_convention
from d3s.app.compare.pairing import correlation
from d3s.app.compare.stats import (area_under_curve, minimum_detectable_difference, paired_interval,
                                   paired_tests, probability_of_improvement, reached_and_held)
from d3s.app.errors import RecipeError
from d3s.app.runfiles import finished_summary, read_run_records

STEP_CAP = 16
"""A budgeted run's cap on steps, in multiples of the reference run's steps. With steps whose gradient is zero skipped
(`skip_steps_without_signal`) such a step costs little more than its generation, and at 8 a D1S-C run stopped at the
cap having spent 0.92 of GRPO's compute."""

SET_BY_BUDGET = ("compute_budget", "budget_eval_shares", "max_steps", "eval_every")
"""The `d3s train` fields that `--budget reference` sets for every run other than the reference."""


def _given(name: str, argv: Sequence[str]) -> bool:
    """Whether `--name` is among the `d3s train` options `argv` (as `--name value` or `--name=value`)."""
    return any(a == f"--{name}" or a.startswith(f"--{name}=") for a in argv)


def check_budget_command(budget: str | None, reference: str, variants: Sequence[str], train_argv: Sequence[str],
                         points: int) -> None:
    """Refuse, in one line, a budget mode that cannot run."""
    if budget is None:
        for name in ("compute_budget", "budget_eval_shares"):
            if _given(name, train_argv):
                raise RecipeError(f"--{name} is per run; give --budget reference to train every variant on the "
                                  "compute of the same seed's reference run")
        return
    if budget != "reference":
        raise RecipeError(f"--budget {budget!r}; valid: 'reference' (every variant on the compute of the same seed's "
                          "reference run)")
    if reference not in variants:
        raise RecipeError(f"--reference {reference!r} is not among --variants ({','.join(variants)}); the budget is "
                          "its compute, so list it")
    if points < 1:
        raise RecipeError(f"--budget_points {points} must be >= 1 (held-out evaluations over the budget, the end "
                          "included)")
    for name in SET_BY_BUDGET:
        if name != "max_steps" and _given(name, train_argv):
            raise RecipeError(f"--{name} is set by d3s compare --budget for each run; remove it")
    for v in variants:
        for part in v.split("+")[1:]:
            name = part.split("=", 1)[0]
            if v == reference and name == "eval_every":  # the reference's evaluations are the budget's points
                raise RecipeError(f"run setting {v!r} sets eval_every, which --budget reference sets for the "
                                  f"reference from --budget_points (an evaluation every max_steps // budget_points "
                                  "steps); remove it and give --budget_points")
            if v != reference and name in SET_BY_BUDGET:
                raise RecipeError(f"run setting {v!r} sets {name}, which --budget reference sets for every run other "
                                  f"than the reference ({reference}); remove it")


def reference_argv(max_steps: int, points: int) -> list[str]:
    """The reference run's evaluations: every `max_steps // points` steps (at least 1), the end always."""
    return ["--eval_every", str(max(1, max_steps // points))]


def budget_argv(reference_run: Path, to_train: bool = True) -> list[str]:
    """The `d3s train` options of a run on the compute of the finished `reference_run`: its FLOPs as the budget,
    evaluations at the compute shares where it was evaluated, a cap of `STEP_CAP` times its steps. `to_train`: the
    run is still to train (not a finished one reused, whose options are only compared with its recipe), so the
    reference's FLOPs must be in this d3s's convention."""
    summary = finished_summary(reference_run)
    flops = summary.get("flops")
    if not flops:
        raise RecipeError(f"{reference_run} records no FLOPs (a run made before they were counted); run the "
                          "reference again in another --output_dir")
    counted = flops_convention(summary)
    if to_train and counted != FLOPS_CONVENTION:
        raise RecipeError(f"{reference_run} counted its FLOPs as {counted} and this d3s counts {FLOPS_CONVENTION} "
                          "(docs/compare.md), so its compute cannot budget a new run; run the reference again in "
                          "another --output_dir")
    steps = summary["steps"]
    evals = [r for r in _records(reference_run) if r["type"] == "eval" and 0 < r["step"] < steps]
    shares = sorted({round(r["flops"] / flops, 6) for r in evals if r.get("flops") is not None} - {0.0, 1.0})
    return ["--compute_budget", repr(float(flops)), "--budget_eval_shares", ",".join(map(str, shares)),
            "--max_steps", str(STEP_CAP * steps), "--eval_every", "0"]


def _records(folder: Path) -> list[dict]:
    return read_run_records(folder / "metrics.jsonl")


# ---------------------------------------------------------------------------------------------
# The summary
# ---------------------------------------------------------------------------------------------


def curve(records: list[dict], budget: float) -> list[tuple[float, float]]:
    """`[(share of budget spent, held-out accuracy), ...]` of a run's evaluations (step 0 at share 0)."""
    points = {}
    for r in records:
        if r.get("type") == "eval" and (r["step"] == 0 or r.get("flops") is not None):
            points[r["step"]] = (0.0 if r["step"] == 0 else r["flops"] / budget, r["accuracy"])
    return [points[s] for s in sorted(points)]


def _seed_budget(run: dict, ref_run: dict) -> dict:
    """One run's line against the same seed's reference run (`run` and `ref_run` as `summary._load_run` gives)."""
    budget = ref_run["summary"].get("flops")
    points = curve(run["records"], budget) if budget else []
    target = ref_run["summary"]["after"]["accuracy"]
    return {"accuracy_at_budget": run["summary"]["after"]["accuracy"],
            "auc": area_under_curve(points) if len(points) > 1 else None,
            "compute_to_target": reached_and_held(points, target) if points else None,
            "flops": run["summary"].get("flops"),
            "wall_s": run["summary"].get("train_wall_s"),
            "share_spent": run["summary"]["flops"] / budget if budget and run["summary"].get("flops") else None,
            "stopped_by": (run["summary"].get("budget") or {}).get("stopped_by"),
            "curve": points}


def _paired(values: dict[str, float | None], ref: dict[str, float | None]) -> tuple[list[float], bool]:
    """The paired differences over the seeds where both are known, and whether every seed had both."""
    diffs = [values[s] - ref[s] for s in values if values[s] is not None and ref.get(s) is not None]
    return diffs, len(diffs) == len(values)


MEASURES = {"diff_at_budget": ("accuracy_at_budget", ""), "auc_diff": ("auc", "auc_")}
"""Each paired measure of the `budget` object: its name, the per-seed key it differences, the prefix of its tests'
keys (`p_value`, `p_value_holm`, `leave_one_out` for the accuracy at the budget; `auc_p_value`, ... for the area)."""


def budget_summary(runs: dict[str, list[dict]], reference: str, early: float = 0.4) -> dict[str, dict]:
    """The `budget` object of each variant (see the module docstring); `early`: the compute share the
    "reached early" count is taken at."""
    ref_runs = {str(r["seed"]): r for r in runs[reference]}
    out = {}
    diffs_of: dict[str, dict[str, list[float]]] = {name: {} for name in MEASURES}  # measure -> arm -> diffs
    for v, items in runs.items():
        per_seed = {str(r["seed"]): _seed_budget(r, ref_runs[str(r["seed"])]) for r in items}
        ref_rows = {s: _seed_budget(ref_runs[s], ref_runs[s]) for s in per_seed}
        row: dict = {"unit": "flops", "per_seed": per_seed}
        for name, (key, _) in MEASURES.items():
            diffs, complete = _paired({s: p[key] for s, p in per_seed.items()}, {s: p[key] for s, p in ref_rows.items()})
            if v != reference:
                diffs_of[name][v] = diffs
            row[f"{name}_mean"] = statistics.mean(diffs) if diffs else None
            row[f"{name}_ci"] = list(paired_interval(diffs)) if v != reference and paired_interval(diffs) else None
            row[f"{name}_sd"] = statistics.stdev(diffs) if len(diffs) > 1 else None
            row[f"{name}_mdd"] = (minimum_detectable_difference(row[f"{name}_sd"], len(diffs))
                                  if row[f"{name}_sd"] is not None else None)
            row[f"{name}_complete"] = complete
        paired = [(p["accuracy_at_budget"], ref_rows[s]["accuracy_at_budget"]) for s, p in per_seed.items()
                  if p["accuracy_at_budget"] is not None and ref_rows[s]["accuracy_at_budget"] is not None]
        row["correlation_with_reference"] = correlation(*zip(*paired)) if v != reference and paired else None
        row["probability_of_improvement"] = (probability_of_improvement(
            _paired({s: p["accuracy_at_budget"] for s, p in per_seed.items()},
                    {s: p["accuracy_at_budget"] for s, p in ref_rows.items()})[0]) if v != reference else None)
        reached = [p["compute_to_target"] for p in per_seed.values() if p["compute_to_target"] is not None]
        row["seeds_reaching_target"] = len(reached)
        row["seeds_reaching_target_early"] = sum(c <= early for c in reached)
        row["early_share"] = early
        row["compute_to_target_median"] = statistics.median(reached) if reached else None
        out[v] = row
    for name, (_, prefix) in MEASURES.items():  # one Holm family per measure: the non-reference arms
        tests = paired_tests(diffs_of[name])
        for v, row in out.items():
            for test in ("p_value", "p_value_holm", "leave_one_out"):
                row[prefix + test] = tests[v][test] if v in tests else None
    return out
