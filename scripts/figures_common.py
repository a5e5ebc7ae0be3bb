"""What every figures module reads and writes with: the results folder, a campaign's compare.json and runs, the
arms' tests, and the formatting of percentages, differences and intervals (`scripts/readme_figures.py`)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from d3s.app.compare.stats import paired_tests, shown, sign_flip_p_value
from d3s.app.compare.summary import run_dir
from d3s.app.intervals import mean_interval
from d3s.app.runfiles import read_run_records

RESULTS = "benchmarks/results"


FLOOR = "d3s+min_tokens_per_rollout=4"
LABELS = {"grpo": "GRPO", "d3s": "paper's D3S", FLOOR: "D3S + floor", "d1s-c": "D1S-C",
          "d3s+keep_last_in_loss": "paper's D3S + keep_last_in_loss"}


# --- reading ------------------------------------------------------------------------------------------------

def _compare(root: Path, folder: str) -> dict:
    return json.loads((root / RESULTS / folder / "compare.json").read_text())


def _evals(root: Path, folder: str, variant: str, seed: int) -> list[dict]:
    records = read_run_records(run_dir(root / RESULTS / folder, variant, seed) / "metrics.jsonl")
    return [r for r in records if r.get("type") == "eval"]


def arm_tests(c: dict, measure: str) -> dict[str, dict]:
    """Each non-reference arm's `p_value` and `p_value_holm` (Holm over the non-reference arms of the table) for
    `measure`: "final" (final accuracy), "budget" (accuracy at the budget) or "auc" (area under the budget curve).
    Read from compare.json where it holds them; where it was written before they were stored, computed as
    `d3s compare` computes them (`paired_tests`) from the per-seed values it holds."""
    ref = c["reference"]
    prefix, inner = {"final": ("diff_to_reference_", None), "budget": ("", "budget"), "auc": ("auc_", "budget")}[measure]
    rows = {v: r[inner] if inner else r for v, r in c["variants"].items()}
    arms = [v for v in rows if v != ref]
    if all(prefix + "p_value_holm" in rows[v] for v in arms):
        return {v: {"p_value": rows[v][prefix + "p_value"], "p_value_holm": rows[v][prefix + "p_value_holm"]}
                for v in arms}
    if measure == "final":
        values = {v: dict(zip(c["seeds"], r["final_accuracy_per_seed"])) for v, r in rows.items()}
    else:
        key = "accuracy_at_budget" if measure == "budget" else "auc"
        values = {v: {s: p[key] for s, p in r["per_seed"].items()} for v, r in rows.items()}
    return paired_tests({v: [x - values[ref][s] for s, x in values[v].items()
                             if x is not None and values[ref].get(s) is not None] for v in arms})


def shown_rule(n: int) -> str:
    """The sentence under a table that says when a paired difference is shown, with the floor of the exact test."""
    return ("A paired difference is shown only where its 95% interval excludes zero and its exact sign-flip p-value, "
            "Holm-corrected over the table's arms against GRPO (each measure apart), is below 0.05 (the corrected p is given where the "
            f"interval excludes zero); with {n_seeds(n)} that p-value is at least {2 / 2 ** n:.2g} before correction.")


def _link(folder: str, prefix: str = "") -> str:
    return f"[`{RESULTS}/{folder}/`]({prefix}{RESULTS}/{folder}/)"


# --- formatting ---------------------------------------------------------------------------------------------

def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def points(x: float) -> str:
    return f"{100 * x:+.1f}"


def paired(diff: float, ci: list[float] | tuple[float, float] | None, p: float | None, corrected: bool = True) -> str:
    """A paired difference with its 95% interval, and what it shows (`d3s.app.compare.stats.shown`, with `p` the
    Holm-corrected sign-flip p-value; `corrected` False for a comparison alone in its family, `p` then the test's
    own): '+2.2 points [-10.5, +14.9], not shown' (the interval contains zero); '+9.0 points [+1.6, +16.4], not
    shown (corrected p = 0.19)' (the interval excludes zero, the test does not agree); '+10.6 points [+4.5,
    +16.7], corrected p = 0.023' (shown)."""
    if ci is None:
        return f"{points(diff)} points (one seed, no interval)"
    lo, hi = ci
    text = f"{points(diff)} points [{points(lo)}, {points(hi)}]"
    if lo <= 0 <= hi:
        return text + ", not shown"
    said = f"{'corrected ' if corrected else ''}p = {p:.2g}" if p is not None else "no test"
    return text + (f", {said}" if shown(ci, p) else f", not shown ({said})")


def paired_between(a: list[float], b: list[float]) -> str:
    """A comparison alone in its family, paired by position: its sign-flip p-value is not corrected."""
    diffs = [x - y for x, y in zip(a, b)]
    return paired(statistics.mean(diffs), mean_interval(diffs), sign_flip_p_value(diffs), corrected=False)


def paired_family(pairs: dict[str, tuple[list[float], list[float]]]) -> dict[str, str]:
    """`paired` for each comparison of a family (each name's two lists paired by position), the sign-flip
    p-values Holm-corrected over the family."""
    diffs = {name: [x - y for x, y in zip(a, b)] for name, (a, b) in pairs.items()}
    tests = paired_tests(diffs)
    return {name: paired(statistics.mean(d), mean_interval(d), tests[name]["p_value_holm"], corrected=len(diffs) > 1)
            for name, d in diffs.items()}


def to_reference(c: dict, v: str) -> str:
    """A variant's final accuracy against the reference of its compare.json (`paired`, Holm over its arms)."""
    r = c["variants"][v]
    return paired(r["diff_to_reference_mean"], r["diff_to_reference_ci95"], arm_tests(c, "final")[v]["p_value_holm"])



def n_seeds(n: int) -> str:
    return f"{n} seed" + ("" if n == 1 else "s")
