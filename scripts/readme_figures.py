"""The learning and speed figures that README.md and docs/*.md quote, computed from committed campaigns.

Every figure sits in a marked block of a page:

    <!-- figures:NAME -->
    ...generated text...
    <!-- /figures:NAME -->

and comes from `benchmarks/results/<folder>/compare.json` (what `d3s compare` wrote) or, for what that file
does not hold (the held-out curve of every run, the machine a run was timed on), the run folders beside it.
Each block names its source folders in its text. Three blocks come from the code instead: docs/trl.md's table of
`D3SConfig`'s fields (from the dataclass), its table of the private TRL names the glue relies on (from
`PRIVATE_TRL_API`), and the supported versions (from pyproject.toml). The pages
are README.md and docs/*.md (docs/results.md holds the results).

    python scripts/readme_figures.py           # rewrite every block from the data
    python scripts/readme_figures.py --check   # exit 1, naming each block whose text differs from the data

Intervals and tests are the repository's own (`d3s.app.intervals.mean_interval`: 95% Student t over seeds, paired
by seed; `d3s.app.compare.stats`: the exact sign-flip p-value, Holm-corrected over the arms of one table). A
difference is "not shown" unless both agree (`d3s.app.compare.stats.shown`): its interval excludes zero and its
corrected p-value is below 0.05. compare.json files written before the tests were stored get them computed here
from their per-seed values, the same way (`arm_tests`).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

from d3s.app.compare.stats import paired_tests, shown, sign_flip_p_value
from d3s.app.compare.summary import _reach, _run_machine, run_dir
from d3s.app.machine import all_quiet, machine_label, quiet, same_machine
from d3s.app.intervals import mean_interval
from d3s.app.runfiles import read_run_records

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results"
PAGES = ("README.md", "docs/*.md")
BLOCK = re.compile(r"(<!-- figures:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures:(?P=name) -->)", re.S)

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


# --- figures ------------------------------------------------------------------------------------------------

def same_seed_reach(root: Path, folder: str, variant: str, seeds: list[int]) -> int:
    """How many seeds' runs reached the SAME seed's GRPO final accuracy at some held-out evaluation."""
    grpo = {s: _evals(root, folder, "grpo", s)[-1]["accuracy"] for s in seeds}
    return sum(_reach(_evals(root, folder, variant, s), grpo[s]) is not None for s in seeds)


def curve_ahead(root: Path, folder: str, variant: str, seeds: list[int]) -> tuple[int, int]:
    """(evaluations after step 0 at which the variant's mean held-out accuracy over seeds is above GRPO's,
    evaluations compared): learning per step, both at the same steps."""
    def mean_curve(v: str) -> dict[int, float]:
        by_step: dict[int, list[float]] = {}
        for s in seeds:
            for r in _evals(root, folder, v, s):
                by_step.setdefault(r["step"], []).append(r["accuracy"])
        return {k: statistics.mean(x) for k, x in by_step.items() if k > 0 and len(x) == len(seeds)}
    mine, grpo = mean_curve(variant), mean_curve("grpo")
    steps = sorted(set(mine) & set(grpo))
    return sum(mine[k] > grpo[k] + 1e-12 for k in steps), len(steps)


def wall_shares(root: Path, folder: str, variant: str, seeds: list[int]) -> tuple[list[float], int, int, int, int]:
    """Training wall-clock to the same seed's GRPO final accuracy as a share of that GRPO run's whole training
    wall-clock, for pairs timed on one recorded machine with neither run loaded (`d3s.app.machine.quiet`); the
    numbers of reaching pairs left out because they were timed on different machines, because a run did not record
    its machine, and because a run ran loaded; and how many of the shares kept are between runs that recorded no
    load (unverified)."""
    base = root / RESULTS / folder
    shares, different, unrecorded, loaded, unverified = [], 0, 0, 0, 0
    for s in seeds:
        grpo_evals = _evals(root, folder, "grpo", s)
        hit = _reach(_evals(root, folder, variant, s), grpo_evals[-1]["accuracy"])
        if hit is None:
            continue
        same = same_machine(_run_machine(run_dir(base, variant, s)), _run_machine(run_dir(base, "grpo", s)))
        if not same:
            different += same is False
            unrecorded += same is None
            continue
        summaries = [json.loads((run_dir(base, v, s) / "summary.json").read_text()) for v in (variant, "grpo")]
        calm = all_quiet([quiet(x.get("load")) for x in summaries])
        if calm is False:
            loaded += 1
            continue
        unverified += calm is None
        shares.append(hit["wall_s"] / summaries[1]["train_wall_s"])
    return shares, different, unrecorded, loaded, unverified


def unverified_text(unverified: int, of: int) -> str:
    """What a wall-clock figure says of the pairs in it whose runs recorded no load average."""
    if unverified == of:
        return ("unverified: these runs recorded no load average, made before d3s recorded it, so nothing shows "
                "whether other work shared the machine")
    return f"{unverified} of these {of} pairs unverified: a run of each recorded no load average"


def load_note(c: dict) -> str:
    """The sentence under a table with wall-clock ratios about the runs' load records (compare.json's `quiet`)."""
    runs = [p for r in c["variants"].values() for p in r["per_seed"]]
    loaded = sum(p.get("quiet") is False for p in runs)
    missing = sum(p.get("quiet") is None for p in runs)
    said = []
    if loaded:
        said.append(f"{loaded} of {len(runs)} runs ran on a loaded machine; pairs with them are left out.")
    if missing == len(runs):
        said.append("No run here recorded its load average (they were made before d3s recorded it), so these "
                    "wall-clock ratios are unverified: nothing shows whether other work shared the machine.")
    elif missing:
        said.append(f"{missing} of {len(runs)} runs recorded no load average: ratios with them are unverified.")
    return " ".join(said)


def same_machine_ratio(c: dict, variant: str, value, reference: str = "grpo") -> tuple[float | None, int]:
    """Mean over seeds of `value(run)` for the variant over the same for the same seed's reference run, counting only
    pairs timed on one recorded machine of which neither ran loaded (`d3s.app.machine.quiet`; a run with no load
    record counts, unverified: `load_note`); and how many pairs that leaves out."""
    ref = {r["seed"]: r for r in c["variants"][reference]["per_seed"]}
    ratios, left_out = [], 0
    for r in c["variants"][variant]["per_seed"]:
        g = ref.get(r["seed"])
        if (g and same_machine(r.get("machine"), g.get("machine")) is True
                and all_quiet([r.get("quiet"), g.get("quiet")]) is not False):
            ratios.append(value(r) / value(g))
        else:
            left_out += 1
    return (statistics.mean(ratios) if ratios else None), left_out


def step_ratio(c: dict, variant: str) -> tuple[float | None, int]:
    """The variant's seconds per step over the same seed's GRPO run's (`same_machine_ratio`)."""
    return same_machine_ratio(c, variant, lambda r: r["step_seconds"]["step"])


def campaign_table(root: Path, folder: str, prefix: str = "") -> str:
    """Final accuracy, paired difference, work and when each variant reached GRPO's final accuracy."""
    c = _compare(root, folder)
    seeds, g = c["seeds"], c["variants"]["grpo"]
    lines = [f"| variant | final held-out acc, mean [95% CI over {len(seeds)} seeds] | vs GRPO, paired | "
             "positions computed (x GRPO) | step time (x GRPO) | reached the same seed's GRPO final | "
             "mean curve above GRPO's |",
             "|---|---|---|---|---|---|---|"]
    for v, r in c["variants"].items():
        lo, hi = r["seed_ci95"]
        work = r["computed_tokens_mean"] / g["computed_tokens_mean"]
        if v == "grpo":
            lines.append(f"| {LABELS.get(v, v)} | {pct(r['final_accuracy_mean'])} [{100 * lo:.1f}, {100 * hi:.1f}] "
                         f"| - | 1.00 | 1.00 | - | - |")
            continue
        ahead, total = curve_ahead(root, folder, v, seeds)
        ratio, left_out = step_ratio(c, v)
        step = ("not compared" if ratio is None else f"{ratio:.2f}" + (f" ({len(seeds) - left_out} of {len(seeds)} "
                "seeds)" if left_out else ""))
        lines.append(f"| {LABELS.get(v, v)} | {pct(r['final_accuracy_mean'])} [{100 * lo:.1f}, {100 * hi:.1f}] | "
                     f"{to_reference(c, v)} | {work:.2f} | {step} | "
                     f"{same_seed_reach(root, folder, v, seeds)} of {len(seeds)} seeds | "
                     f"{ahead} of {total} evaluations |")
    lines.append("")
    lines.append(f"Source: {_link(folder, prefix)} (`compare.json`; the last two columns from the runs' "
                 f"`metrics.jsonl`). {shown_rule(len(seeds))} All variants ran the same number of steps. Step time: "
                 "the mean over seeds of a run's seconds per step over the same seed's GRPO run's, only for pairs "
                 "timed on one recorded machine, neither run loaded (the seeds counted are named where some pairs "
                 f"are not). {load_note(c)}".rstrip())
    return "\n".join(lines)


def floor_vs_paper(root: Path, prefix: str = "") -> str:
    d, a = _compare(root, "campaign5-default"), _compare(root, "campaign5-arith2digit")
    fd, pdd = d["variants"][FLOOR]["final_accuracy_per_seed"], d["variants"]["d3s"]["final_accuracy_per_seed"]
    fa, pa = a["variants"][FLOOR]["final_accuracy_per_seed"], a["variants"]["d3s"]["final_accuracy_per_seed"]
    fresh = [i for i, s in enumerate(d["seeds"]) if s >= 3]
    return (f"The floor against the paper's D3S, paired by seed: on the default task "
            f"{paired_between(fd, pdd)} over seeds {d['seeds'][0]}-{d['seeds'][-1]}, but seeds 1-2 are the ones "
            f"the floor was chosen on; on seeds 3-{d['seeds'][-1]} alone "
            f"{paired_between([fd[i] for i in fresh], [pdd[i] for i in fresh])}. On arith-2digit "
            f"{paired_between(fa, pa)}. Sources: {_link('campaign5-default', prefix)}, "
            f"{_link('campaign5-arith2digit', prefix)}.")


def wall_clock_to_grpo(root: Path, prefix: str = "") -> str:
    parts = []
    different = unrecorded = loaded = unverified = kept = 0
    for folder, task in (("campaign5-default", "the default task"), ("campaign5-arith2digit", "arith-2digit")):
        c = _compare(root, folder)
        for v in ("d3s", FLOOR):
            shares, diff, unrec, load, unver = wall_shares(root, folder, v, c["seeds"])
            different, unrecorded, loaded = different + diff, unrecorded + unrec, loaded + load
            unverified, kept = unverified + unver, kept + len(shares)
            spread = ("no same-machine pair" if not shares else f"{shares[0]:.2f} (1 run)" if len(shares) == 1
                      else f"{min(shares):.2f}-{max(shares):.2f} ({len(shares)} runs)")
            parts.append(f"{LABELS[v]} on {task}: {spread}")
    shares_of_step = []
    for folder in ("campaign5-default", "campaign5-arith2digit"):
        parts_s = _compare(root, folder)["variants"]["grpo"]["step_seconds_mean"]
        shares_of_step.append(parts_s["generation"] / parts_s["step"])
    bounds = " and ".join(f"{x:.2f}" for x in shares_of_step) + " (default task and arith-2digit)"
    return ("Where a D3S run reached the same seed's GRPO final accuracy, the training wall-clock it took, as a "
            "share of that GRPO run's whole training wall-clock, counting only pairs timed on one recorded "
            f"machine ({different} reaching pairs timed on different machines"
            + (f", {loaded} with a run on a loaded machine" if loaded else "")
            + f" and {unrecorded} whose machine was not recorded are left out): " + "; ".join(parts)
            + (f" ({unverified_text(unverified, kept)})" if unverified else "")
            + ". That lead comes from cheaper steps (the step-time column above): at equal steps a D3S run also "
            "stops sooner, having spent less compute (the race above gives it GRPO's). Generation, which every variant does in full, "
            f"takes {bounds} of GRPO's step, so no variant's step can cost less than that here. Sources: {_link('campaign5-default', prefix)}, {_link('campaign5-arith2digit', prefix)}.")


def seed_spread(root: Path, prefix: str = "") -> str:
    c = _compare(root, "campaign5-default")
    sds = {v: statistics.stdev(r["final_accuracy_per_seed"]) for v, r in c["variants"].items()}
    text = ", ".join(f"{LABELS.get(v, v)} {100 * sd:.1f}" for v, sd in sds.items())
    return (f"The seed matters: the standard deviation over {len(c['seeds'])} seeds of the final held-out accuracy "
            f"is, in points, {text} ({_link('campaign5-default', prefix)}).")


def three_seed_history(root: Path, prefix: str = "") -> str:
    a3, a5 = _compare(root, "campaign-arith2digit"), _compare(root, "campaign5-arith2digit")
    d3, d5 = _compare(root, "campaign-default"), _compare(root, "campaign5-default")
    return (f"The paper's D3S against GRPO, paired, in the first 3-seed campaigns and in the 5-seed ones (the "
            f"3-seed runs used a cosine-decay recipe): default task {to_reference(d3, 'd3s')} "
            f"({_link('campaign-default', prefix)}), then {to_reference(d5, 'd3s')}; "
            f"arith-2digit {to_reference(a3, 'd3s')} "
            f"({_link('campaign-arith2digit', prefix)}), then {to_reference(a5, 'd3s')}. "
            "Three seeds turned the sign on arith-2digit; five did not confirm it.")


def keep_last(root: Path, prefix: str = "") -> str:
    out = []
    for folder, task in (("keep-last-arith2digit", "arith-2digit"), ("keep-last-default", "the default task")):
        c = _compare(root, folder)
        k, p = c["variants"]["d3s+keep_last_in_loss"], c["variants"]["d3s"]
        out.append(f"on {task} ({_link(folder, prefix)}) {pct(k['final_accuracy_mean'])} against "
                   f"{pct(p['final_accuracy_mean'])} without it "
                   f"({paired_between(k['final_accuracy_per_seed'], p['final_accuracy_per_seed'])}; against GRPO "
                   f"{to_reference(c, 'd3s+keep_last_in_loss')}), GRPO's "
                   f"final reached by the same seed in {same_seed_reach(root, folder, 'd3s+keep_last_in_loss', c['seeds'])} "
                   f"of {len(c['seeds'])} seeds")
    return "`--keep_last_in_loss true` on the paper's D3S, 5 seeds: " + "; ".join(out) + "."


# --- the race: every variant at the same seed's GRPO compute (`d3s compare --budget reference`) ------------------

RACE_TASKS = {"race-default": "the default task", "race-ablations": "the default task",
              "race-arith2digit": "arith-2digit"}
RACE_LABELS = {"grpo": "GRPO", "d3s+min_tokens_per_rollout=0": "paper's D3S", "d1s-c": "D1S-C",
               "d3s+min_tokens_per_rollout=4": "D3S + floor",
               "d3s+mask_truncated_completions": "D3S + floor + mask_truncated_completions",
               "d3s+max_grad_norm=0": "D3S + floor, no gradient clipping"}
RACE_SEEDS = {"race-default": 8, "race-ablations": 4, "race-arith2digit": 6}  # each campaign's seeds when finished
TARGET_SHARE, TARGET_SEEDS = 0.4, 0.75  # the target: GRPO's final reached and held within 0.4x, in >= 75% of seeds


def race_terms(root: Path, prefix: str = "") -> str:
    """The terms the race tables use, defined once, with the compute target's share and seed counts."""
    need = ", ".join(f"{math.ceil(TARGET_SEEDS * n - 1e-9)} of {n}" for n in sorted(set(RACE_SEEDS.values()),
                                                                                    reverse=True))
    return "\n".join([
        "- **Compute**: a run's estimated model FLOPs, generation included ([compare.md](compare.md)). **At GRPO's "
        "compute**: every other variant of a seed trained until it had spent the same seed's GRPO run's compute, "
        "with its learning rate and N/K schedule over the share spent, and was evaluated at the same compute shares.",
        "- **Paired, [95% interval]**: a difference is taken seed by seed; its interval is a Student t interval over "
        "seeds. **Not shown**: the interval includes zero, so the seeds do not tell the sign.",
        "- **MDD**: the smallest true difference this many seeds detect (80% power, 5% level).",
        "- **Area under acc-vs-compute**: the mean held-out accuracy over the budget.",
        "- **Reached and held**: the compute share at which a run's held-out accuracy reached the same seed's GRPO "
        "final and stayed at or above it to the end. It is read at an evaluation, and the run crossed between that "
        "evaluation and the one before, so a share is an upper bound; **can't tell**: those two evaluations lie on "
        f"either side of {TARGET_SHARE}.",
        f"- **The compute target**: reaching and holding the same seed's GRPO final within {TARGET_SHARE}x of "
        f"GRPO's compute in at least {TARGET_SEEDS:.0%} of a campaign's seeds ({need}).",
        "- **Wall-clock** ratios are given only between runs timed on one recorded machine.",
    ])


def race_label(folder: str, variant: str) -> str:
    """`d3s` is the recipe's D3S: the default recipe sets the floor of 4 tokens, arith-2digit's keeps the paper's cut."""
    if variant == "d3s":
        return "paper's D3S (its recipe's)" if folder == "race-arith2digit" else "D3S + floor"
    return RACE_LABELS.get(variant, variant)


def n_seeds(n: int) -> str:
    return f"{n} seed" + ("" if n == 1 else "s")


def seed_list(seeds: list[int]) -> str:
    """'11-14' for consecutive seeds, else '11, 13, 14'."""
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def race_has_data(root: Path, folder: str) -> bool:
    path = root / RESULTS / folder / "compare.json"
    return path.is_file() and json.loads(path.read_text()).get("mode") == "budget"


def _interval(values_ci: list[float] | None) -> str:
    return "-" if values_ci is None else f"[{100 * values_ci[0]:.1f}, {100 * values_ci[1]:.1f}]"


def verdict(diff: float | None, ci: list[float] | None, p_holm: float | None) -> str:
    """'higher' or 'lower' where the difference is shown (`d3s.app.compare.stats.shown`: the 95% interval excludes
    zero and the Holm-corrected sign-flip p-value is below 0.05), else 'not shown', with the corrected p where only
    the test disagrees: 'not shown (corrected p = 0.094)'."""
    if diff is None or ci is None or ci[0] <= 0 <= ci[1]:
        return "not shown"
    if not shown(ci, p_holm):
        return "not shown" + (f" (corrected p = {p_holm:.2g})" if p_holm is not None else "")
    return "higher" if ci[0] > 0 else "lower"


def wall_ratio_at_budget(c: dict, variant: str) -> tuple[float | None, int]:
    """The variant's training wall-clock over the same seed's reference run's (`same_machine_ratio`)."""
    return same_machine_ratio(c, variant, lambda r: r["train_wall_s"], c["reference"])


def by_target_share(p: dict) -> str:
    """Whether one run reached and held the same seed's GRPO final within `TARGET_SHARE` of its compute: "met",
    "not met", or "can't tell" when the crossing lies between two evaluations on either side of the share. The
    run was below the target at the evaluation before the one it held from, so it crossed in between."""
    held = p["compute_to_target"]
    if held is None:
        return "not met"
    if held <= TARGET_SHARE + 1e-9:
        return "met"
    before = max(x for x, _ in p["curve"] if x < held)
    return "not met" if before >= TARGET_SHARE - 1e-9 else "can't tell"


def target_counts(b: dict) -> tuple[int, int, int]:
    """(met, can't tell, not met) over the seeds of a variant's `budget` object (`by_target_share`)."""
    found = [by_target_share(p) for p in b["per_seed"].values()]
    return found.count("met"), found.count("can't tell"), found.count("not met")


def _target_text(b: dict) -> str:
    met, unknown, _ = target_counts(b)
    return f"{met}" + (f" (+{unknown} can't tell)" if unknown else "")


def race_table(root: Path, folder: str, prefix: str = "") -> str:
    """Accuracy at the same seed's GRPO compute, paired against GRPO, with the area under the accuracy-vs-compute
    curve and the compute needed to reach and hold the same seed's GRPO final accuracy."""
    c = _compare(root, folder)
    seeds, ref = c["seeds"], c["reference"]
    tests, auc_tests = arm_tests(c, "budget"), arm_tests(c, "auc")
    lines = [f"| variant | held-out acc at GRPO's compute, mean [95% CI over {n_seeds(len(seeds))}] | vs GRPO, paired "
             "[95% CI] | MDD | P(above GRPO) | area under acc-vs-compute, vs GRPO [95% CI] | reached and held the "
             f"same seed's GRPO final | of which by {TARGET_SHARE}x GRPO's compute | median compute to it (x GRPO) | "
             "steps | training wall-clock (x GRPO) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for v, r in c["variants"].items():
        b = r["budget"]
        steps = statistics.mean(p["steps"] for p in r["per_seed"])
        median = b["compute_to_target_median"]
        head = (f"| {race_label(folder, v)} | {pct(r['final_accuracy_mean'])} {_interval(r['seed_ci95'])} | ")
        reach = (f"{b['seeds_reaching_target']} of {len(seeds)} | {_target_text(b)} of {len(seeds)} | "
                 f"{'-' if median is None else f'{median:.2f}'} | {steps:.1f} |")
        if v == ref:
            lines.append(head + "- | - | - | - | " + reach + " 1.00 |")
            continue
        mdd = b["diff_at_budget_mdd"]
        auc = "-" if b["auc_diff_mean"] is None else paired(b["auc_diff_mean"], b["auc_diff_ci"],
                                                              auc_tests[v]["p_value_holm"])
        wall, left_out = wall_ratio_at_budget(c, v)
        wall_text = "not compared" if wall is None else f"{wall:.2f}" + (f" ({left_out} pairs left out)" if left_out else "")
        lines.append(head + f"{paired(b['diff_at_budget_mean'], b['diff_at_budget_ci'], tests[v]['p_value_holm'])} | "
                     f"{'-' if mdd is None else f'{100 * mdd:.1f} points'} | {100 * b['probability_of_improvement']:.0f}% | "
                     f"{auc} | " + reach + f" {wall_text} |")
    lines.append("")
    lines.append(f"{'Seeds' if len(seeds) > 1 else 'Seed'} {seed_list(seeds)}, paired. Source: {_link(folder, prefix)} "
                 f"(`compare.json`). The terms: [above](#terms). {shown_rule(len(seeds))} {load_note(c)}".rstrip())
    return "\n".join(lines)


def race_settings(root: Path, folder: str, prefix: str = "") -> str:
    """Each other non-reference arm against the recipe's D3S (`d3s`), paired by seed at the same compute (every
    arm spent the same seed's GRPO FLOPs): which D3S setting the evidence favours."""
    c = _compare(root, folder)
    base = c["variants"]["d3s"]["budget"]["per_seed"]
    pairs: dict[str, dict] = {"accuracy_at_budget": {}, "auc": {}}  # measure -> arm -> (arm's, d3s's), by seed
    for v, r in c["variants"].items():
        if v in (c["reference"], "d3s"):
            continue
        mine = r["budget"]["per_seed"]
        seeds = sorted(set(mine) & set(base), key=int)
        for key, family in pairs.items():
            family[v] = ([mine[s][key] for s in seeds], [base[s][key] for s in seeds])
    acc, auc = paired_family(pairs["accuracy_at_budget"]), paired_family(pairs["auc"])  # Holm over these arms
    said = [f"{race_label(folder, v)} {acc[v]} at the budget, {auc[v]} in area under the curve" for v in acc]
    return (f"Against {race_label(folder, 'd3s')}, paired by seed at the same compute ({n_seeds(len(base))}, "
            f"{_link(folder, prefix)}; Holm over the arms compared with it, per measure): " + "; ".join(said) + ".")


def _race_item(folder: str, c: dict, v: str) -> str:
    r, b = c["variants"][v], c["variants"][v]["budget"]
    return (f"  - {race_label(folder, v)}: {pct(r['final_accuracy_mean'])}, "
            f"{paired(b['diff_at_budget_mean'], b['diff_at_budget_ci'], arm_tests(c, 'budget')[v]['p_value_holm'])}; reached and held the same seed's GRPO "
            f"final in {b['seeds_reaching_target']} of {n_seeds(len(c['seeds']))}, {_target_text(b)} by "
            f"{TARGET_SHARE}x its compute")


def seeds_so_far(folder: str, n: int) -> str:
    """'8 seeds' for a finished campaign, '1 of 6 seeds so far' for one under way (`RACE_SEEDS`)."""
    planned = RACE_SEEDS[folder]
    return n_seeds(n) if n >= planned else f"{n} of {n_seeds(planned)} so far"


def race_headline(root: Path, prefix: str = "") -> str:
    """The compute-matched result on each race task that has data, and what is still to run."""
    lines, missing = [], []
    for folder in ("race-default", "race-arith2digit"):
        if not race_has_data(root, folder):
            missing.append(RACE_TASKS[folder])
            continue
        c = _compare(root, folder)
        g = c["variants"][c["reference"]]
        lines.append(f"- {RACE_TASKS[folder][0].upper()}{RACE_TASKS[folder][1:]}, "
                     f"{seeds_so_far(folder, len(c['seeds']))} ({seed_list(c['seeds'])}), paired: GRPO ended at "
                     f"{pct(g['final_accuracy_mean'])}; at the same compute ({_link(folder, prefix)}):")
        lines += [_race_item(folder, c, v) for v in c["variants"] if v != c["reference"]]
    if missing:
        lines.append("- Not run yet: " + " and ".join(missing) + ".")
    return "\n".join(lines)


def target_verdict(b: dict, planned: int) -> str:
    """'meets', 'misses' or 'may meet' the compute target over a campaign of `planned` seeds, of which `b` holds
    those finished: a seed not run yet, like a "can't tell", may go either way."""
    met, unknown, _ = target_counts(b)
    open_ = unknown + planned - len(b["per_seed"])
    return "meets" if met >= TARGET_SEEDS * planned else "misses" if met + open_ < TARGET_SEEDS * planned else "may meet"


def race_verdict(root: Path, prefix: str = "") -> str:
    """What the race shows so far on each task that has data: for each D3S-family variant, whether its accuracy at
    GRPO's compute is shown higher or lower, and whether the compute target holds."""
    tasks = []
    for folder in ("race-default", "race-arith2digit"):
        if not race_has_data(root, folder):
            continue
        c = _compare(root, folder)
        n = len(c["seeds"])
        said, tests = [], arm_tests(c, "budget")
        for v, r in c["variants"].items():
            if v == c["reference"]:
                continue
            b = r["budget"]
            said.append(f"{race_label(folder, v)}: "
                        f"{verdict(b['diff_at_budget_mean'], b['diff_at_budget_ci'], tests[v]['p_value_holm'])}, "
                        f"{target_verdict(b, max(n, RACE_SEEDS[folder]))} the compute target ({_target_text(b)} of {n})")
        tasks.append(f"At GRPO's compute on {RACE_TASKS[folder]} ({seeds_so_far(folder, n)}, "
                     f"{_link(folder, prefix)}), accuracy against GRPO, paired: " + "; ".join(said) + ".")
    return " ".join(tasks) + (f" The target: reaching and holding the same seed's GRPO final accuracy within "
                              f"{TARGET_SHARE}x of GRPO's compute in at least {TARGET_SEEDS:.0%} of seeds.")


DECIDED_ON = "race-arith2digit"  # the campaign the default recipe's variant was decided on, before it ran


def _d1s_and_floor(c: dict) -> tuple[list[float], list[float]]:
    """D1S-C's and D3S + floor's accuracies at the budget, seed by seed (the same seeds, in order)."""
    d1s, floor = (c["variants"][v]["budget"]["per_seed"] for v in ("d1s-c", FLOOR))
    seeds = sorted(d1s, key=int)
    return [d1s[s]["accuracy_at_budget"] for s in seeds], [floor[s]["accuracy_at_budget"] for s in seeds]


def race_decision_variant(root: Path) -> str | None:
    """The rule decided before the arith-2digit race: the default recipe's variant becomes `d1s-c` if there, over
    all its seeds, D1S-C ends at or above D3S with the floor at GRPO's compute (paired mean) and is not shown below
    GRPO; otherwise it stays `d3s` (with the floor). None while the campaign is under way.

    "Shown below" is read as the rule was fixed: the 95% interval of the paired difference lies below zero. The
    corrected sign-flip test added since (`verdict`) could only make "shown below" rarer, never change a "not
    shown below" that the interval gave."""
    c = _compare(root, DECIDED_ON)
    if len(c["seeds"]) < RACE_SEEDS[DECIDED_ON]:
        return None
    d1s, floor = _d1s_and_floor(c)
    above_floor = statistics.mean(d1s) >= statistics.mean(floor)  # the paired mean, over the same seeds
    b = c["variants"]["d1s-c"]["budget"]
    below_grpo = b["diff_at_budget_ci"] is not None and b["diff_at_budget_ci"][1] < 0
    return "d1s-c" if above_floor and not below_grpo else "d3s"


def race_decision(root: Path, prefix: str = "") -> str:
    """The rule decided before the arith-2digit race, the figures it reads, and what it decided."""
    c = _compare(root, DECIDED_ON)
    d1s, floor = _d1s_and_floor(c)
    b = c["variants"]["d1s-c"]["budget"]
    figures = (f"on arith-2digit ({seeds_so_far(DECIDED_ON, len(d1s))}, {_link(DECIDED_ON, prefix)}), at GRPO's "
               f"compute, D1S-C against D3S + floor {paired_between(d1s, floor)}, against GRPO "
               f"{paired(b['diff_at_budget_mean'], b['diff_at_budget_ci'], arm_tests(c, 'budget')['d1s-c']['p_value_holm'])}")
    planned = n_seeds(RACE_SEEDS[DECIDED_ON])
    rule = ("Decided before the arith-2digit runs, since the default task chose D1S-C for them: the default "
            f"recipe's variant becomes D1S-C if on arith-2digit, over its {planned}, D1S-C ends at or above D3S + floor "
            "(the default recipe's variant when the rule was fixed) at GRPO's compute in the paired mean and is not "
            "shown below GRPO (read as fixed: its 95% interval not below zero); otherwise the default recipe stays "
            "D3S + floor. ")
    decided = race_decision_variant(root)
    if decided is None:
        return rule + f"So far {figures}; decided when the {planned} are in."
    outcome = ("so the default recipe's variant is now D1S-C (`recipes/default.yaml`)." if decided == "d1s-c" else
               "so the default recipe stays D3S + floor (`recipes/default.yaml`).")
    return rule + f"The result: {figures}; " + outcome


def _step_means(run: Path) -> dict[str, float]:
    train = [r for r in read_run_records(run / "metrics.jsonl") if r.get("type") == "train"]
    keys = ("step_time", "d3s/time/generation", "d3s/time/forward", "d3s/time/backward")
    return {k: statistics.mean(r[k] for r in train if r.get(k) is not None) for k in keys}


def first_command(root: Path, prefix: str = "") -> str:
    """The README's first command from a clean clone: wall-clock, accuracy, and where a step's time went, beside the
    same command with transformers' `generate` on the same machine."""
    folder = root / RESULTS / "first-command"
    walls = dict(re.findall(r"(setup|d3s train|total) ([\d.]+) s", (folder / "wall-clock.txt").read_text()))
    summary = json.loads((folder / "summary.json").read_text())
    evals = [r for r in read_run_records(folder / "metrics.jsonl") if r.get("type") == "eval"]
    ours, theirs = _step_means(folder), _step_means(folder / "generate-path")
    other = json.loads((folder / "generate-path" / "summary.json").read_text())
    parts = f"generation {ours['d3s/time/generation']:.1f} s, forward {ours['d3s/time/forward']:.1f} s, " \
            f"backward {ours['d3s/time/backward']:.1f} s"
    trainer = json.loads((folder / "run_config.json").read_text())
    mixed = trainer["trainer"].get("mixed_precision", "no")
    return (f"Measured from a clean clone with empty caches on one machine ({machine_label(trainer.get('machine'))}; "
            f"{'fp32' if mixed == 'no' else mixed}), the default recipe ({trainer['trainer']['variant'].upper()}), "
            f"the whole first command, setup and the one-time model conversion included, took "
            f"{float(walls['total']) / 60:.1f} minutes (setup {float(walls['setup']) / 60:.1f}, `d3s train` "
            f"{float(walls['d3s train']) / 60:.1f}, of which {summary['train_wall_s'] / 60:.1f} training): held-out "
            f"accuracy {pct(evals[0]['accuracy'])} -> {pct(evals[-1]['accuracy'])} (200 problems, greedy) after "
            f"{summary['steps']} steps. A step took {ours['step_time']:.1f} s on average: {parts}. The same command "
            f"with transformers' `generate` (`--shared_prefill_generation false`), run next on the same machine, spent "
            f"{theirs['d3s/time/generation']:.1f} s of its {theirs['step_time']:.1f} s step generating (its sampled "
            f"rollouts, hence its run, differ: it ended at {pct(other['after']['accuracy'])}). "
            f"Source: {_link('first-command', prefix)}.")


def generation(root: Path, prefix: str = "") -> str:
    """The generation benchmark: a default step's generation seconds and the held-out evaluation, both paths."""
    data = json.loads((root / RESULTS / "generation" / "generation.json").read_text())
    mean = {name: statistics.mean(r["seconds"] for r in rounds) for name, rounds in data["step"].items()}
    held = data["heldout"]
    same = data["heldout_identical_greedy"]
    return (f"One default step's generation (2 prompts x 16 rollouts), side by side: {mean['shared-prefill']:.1f} s "
            f"with the shared-prefill path against {mean['generate']:.1f} s with `generate` "
            f"({mean['shared-prefill'] / mean['generate']:.2f}x); the held-out evaluation of 200 problems "
            f"{held['shared-prefill, 256 per call']['seconds']:.0f} s against "
            f"{held['generate, 64 per call']['seconds']:.0f} s, its greedy completions identical in {same['identical']} "
            f"of {same['of']}. Source: {_link('generation', prefix)}.")


FLOPS_STEP_LABELS = {"grpo": "grpo", "d1s-c": "d1s-c (the default)", "d3s": "d3s (with the floor)"}


def flops_step_table(folder: Path) -> str:
    """One default-recipe step of each variant counted in both conventions (`benchmarks/flops_step.py`'s runs):
    `estimate-v1` (`d3s.app.budget.estimated_flops`) and `computed-v2` (the run's own count) with its parts
    (`d3s.app.budget.flops_parts`), each a share of the step's `computed-v2` count."""
    from d3s.app.budget import RECORD_COUNTS, ModelShape, estimated_flops, flops_parts

    shapes = json.loads((folder / "shape.json").read_text())
    shape = ModelShape(n_body=shapes["n_body"], n_head=shapes["n_head"])
    rows, steps = [], {}
    for variant, label in FLOPS_STEP_LABELS.items():
        record = next(r for r in read_run_records(folder / variant / "metrics.jsonl") if r.get("type") == "train")
        counts = {name: record.get(field) or 0.0 for name, field in RECORD_COUNTS.items()}
        parts = flops_parts(shape, counts)
        v1, v2 = estimated_flops(shapes["n_legacy"], record), record["flops"]
        if not math.isclose(sum(parts.values()), v2, rel_tol=1e-9):
            raise SystemExit(f"{folder / variant}: its recorded FLOPs are not computed-v2 of its counts")
        steps[variant] = (v1, v2)
        share = {k: v / v2 for k, v in parts.items()}
        generation_body = share["prefill"] + share["decode"]
        training_body = share["no_grad"] + share["trained"]
        head = share["generation_head"] + share["training_head"]
        rows.append(f"| {label} | {v1 / 1e12:.3f} TFLOP | {v2 / 1e12:.3f} TFLOP | {v2 / v1:.2f} | "
                    f"{pct(generation_body)} | {pct(share['prefill'])} | {pct(training_body)} | "
                    f"{pct(head)} ({pct(share['generation_head'])} / {pct(share['training_head'])}) |")
    ratio = {v: (steps[v][0] / steps["grpo"][0], steps[v][1] / steps["grpo"][1]) for v in ("d1s-c", "d3s")}
    return "\n".join([
        "| variant | `estimate-v1` | `computed-v2` | v2 / v1 | generation body | of it prefill | training body "
        "| LM head (generation / training) |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Relative to GRPO's step: D1S-C's goes from {ratio['d1s-c'][0]:.2f} in `estimate-v1` to "
        f"{ratio['d1s-c'][1]:.2f} in `computed-v2`, D3S's from {ratio['d3s'][0]:.2f} to {ratio['d3s'][1]:.2f}. "
        f"Shares are of each step's `computed-v2` count. Source: `{folder.name}/` (`python benchmarks/flops_step.py`)."
    ])


def flops_step(root: Path, prefix: str = "") -> str:
    return flops_step_table(root / RESULTS / "flops-step").replace(
        "Source: `flops-step/`", f"Source: {_link('flops-step', prefix)}")


# --- the README's own blocks: the race in four rows, the GPU measurement, generation's share, the versions ------

RACE_ROWS = ("GRPO", "D1S-C", "D3S + floor", "paper's D3S")  # the README table's rows, in order


def _race_arm(folder: str, variant: str) -> str:
    """The README row of a race arm: arith-2digit's recipe's own D3S is the paper's."""
    label = race_label(folder, variant)
    return "paper's D3S" if label.startswith("paper's D3S") else label


def race_table_short(root: Path, prefix: str = "") -> str:
    """Accuracy at GRPO's compute on both race tasks, one row per arm, paired against GRPO: the README's table."""
    folders = [f for f in ("race-default", "race-arith2digit") if race_has_data(root, f)]
    cells: dict[str, list[str]] = {row: [] for row in RACE_ROWS}
    head = ["| variant"]
    for folder in folders:
        c = _compare(root, folder)
        task = RACE_TASKS[folder].removeprefix("the ")
        head.append(f" {task} ({n_seeds(len(c['seeds']))}) | vs GRPO, paired")
        tests = arm_tests(c, "budget")
        for v, r in c["variants"].items():
            b = r["budget"]
            diff = "-" if v == c["reference"] else paired(b["diff_at_budget_mean"], b["diff_at_budget_ci"],
                                                          tests[v]["p_value_holm"])
            cells[_race_arm(folder, v)] += [f"{pct(r['final_accuracy_mean'])} {_interval(r['seed_ci95'])}", diff]
    lines = [" |".join(head) + " |", "|---" * (1 + 2 * len(folders)) + "|"]
    lines += [f"| {row} | " + " | ".join(cells[row]) + " |" for row in RACE_ROWS if cells[row]]
    lines.append("")
    lines.append("Held-out accuracy once every variant has spent the same seed's GRPO compute (estimated model FLOPs, "
                 "generation included): mean [95% interval over seeds]; the difference to GRPO paired by seed, "
                 "\"not shown\" unless its interval excludes zero and its Holm-corrected sign-flip test agrees "
                 "([terms](docs/results.md#terms)). Sources: "
                 + ", ".join(_link(f, prefix) for f in folders) + ".")
    return "\n".join(lines)


# --- the controls' race (benchmarks/credit.sh; its rule: benchmarks/results/credit-rule.md) --------------------

CREDIT_RACES = {"credit-race-default": ("the default task", 8, 5), "credit-race-arith2digit": ("arith-2digit", 6, 4)}
"""Each race of the controls: its task, its seeds and its arms when finished."""
CREDIT_ROLES = {"grpo": "tuned GRPO", "d1s-c": "D1S-C", "random": "random selection",
                "small-g": "GRPO generating only what D1S-C trains on", "floor": "D3S + floor"}


def credit_roles(c: dict) -> dict[str, str]:
    """`{role: variant}` of a controls' race compare.json, the arms named as `benchmarks/credit.sh` names them."""
    roles = {}
    for v in c["variants"]:
        if v == c["reference"]:
            roles["grpo"] = v
        elif "sample_selection=random" in v:
            roles["random"] = v
        elif v.startswith("grpo+num_generations="):
            roles["small-g"] = v
        elif v.startswith("d1s-c"):
            roles["d1s-c"] = v
        elif v.startswith("d3s"):
            roles["floor"] = v
    return roles


def credit_finished(root: Path) -> bool:
    """Whether both races of the controls hold every arm of every seed."""
    for folder, (_, seeds, arms) in CREDIT_RACES.items():
        if not race_has_data(root, folder):
            return False
        c = _compare(root, folder)
        if len(c["seeds"]) < seeds or len(c["variants"]) < arms:
            return False
    return True


def _word(ci: list[float] | None, p: float | None) -> str:
    """'above', 'below' or 'not shown' (`d3s.app.compare.stats.shown`)."""
    if ci is None or not shown(ci, p):
        return "not shown"
    return "above" if ci[0] > 0 else "below"


def credit_against(c: dict, a: str, b: str) -> str:
    """Arm `a` against arm `b` of one race, paired by seed at the budget, one comparison (uncorrected p)."""
    per_a, per_b = c["variants"][a]["budget"]["per_seed"], c["variants"][b]["budget"]["per_seed"]
    diffs = [per_a[s]["accuracy_at_budget"] - per_b[s]["accuracy_at_budget"] for s in per_a if s in per_b]
    return _word(mean_interval(diffs), sign_flip_p_value(diffs))


def credit_summary(words: list[str]) -> str:
    """One verdict over the tasks: 'beat' (above on one, below on none), 'lost to', or 'was not shown to differ from'."""
    if "above" in words and "below" not in words:
        return "beat"
    if "below" in words and "above" not in words:
        return "lost to"
    return "was not shown to differ from"


def credit_below_start(root: Path, variant_prefix: str) -> list[str]:
    """The runs of an arm (folders starting with `variant_prefix`, random-selection runs aside) on arith-2digit and the
    flat-start task whose held-out accuracy fell below their own start."""
    found = []
    for folder in ("credit-race-arith2digit", "credit-flat"):
        for summary in sorted((root / RESULTS / folder).glob(f"{variant_prefix}*-seed*/summary.json")):
            if "sample_selection" in summary.parent.name or "skip_steps_without_signal=false" in summary.parent.name:
                continue
            if json.loads(summary.read_text()).get("below_start"):
                found.append(f"{folder}/{summary.parent.name}")
    return found


def credit_outcome(root: Path) -> dict:
    """The rule of benchmarks/results/credit-rule.md applied to the controls' races (both finished)."""
    vs_grpo: dict[str, list[str]] = {}
    selection, fewer = [], []
    for folder in CREDIT_RACES:
        c = _compare(root, folder)
        roles, tests = credit_roles(c), arm_tests(c, "budget")
        for role, v in roles.items():
            if role != "grpo":
                b = c["variants"][v]["budget"]
                vs_grpo.setdefault(role, []).append(_word(b["diff_at_budget_ci"], tests[v]["p_value_holm"]))
        selection.append(credit_against(c, roles["d1s-c"], roles["random"]))
        fewer.append(credit_against(c, roles["d1s-c"], roles["small-g"]))
    beats = {role: credit_summary(words) == "beat" for role, words in vs_grpo.items()}
    collapsed = credit_below_start(root, "d1s-c")
    ships = "d1s-c" if beats.get("d1s-c") and not collapsed else "grpo"
    return {"beats": beats, "selection": credit_summary(selection), "fewer": credit_summary(fewer), "ships": ships,
            "collapsed": collapsed, "d1s_c_beats": beats.get("d1s-c", False)}


def credit_verdict(root: Path, prefix: str = "") -> str:
    """The README's first word on what buys D1S-C's gain: the rule's outcome once the controls' races are in, what is
    running until then."""
    rule = f"[the rule fixed before they ran]({prefix}{RESULTS}/credit-rule.md)"
    if not credit_finished(root):
        return ("What buys D1S-C's gain is being tested: random selection of as many rollouts, GRPO generating only "
                "what D1S-C trains on, and every arm at its own tuned learning rate, at tuned GRPO's compute "
                f"(`bash benchmarks/credit.sh`, {rule}). Until they are in, the recipes' choice of D1S-C is "
                "provisional.")
    o = credit_outcome(root)
    winners = [CREDIT_ROLES[r] for r, won in o["beats"].items() if won]
    first = ("At tuned GRPO's compute, with every arm at its own tuned learning rate, "
             + (f"{' and '.join(winners)} beat tuned GRPO" if winners else "no arm beat tuned GRPO") + ". ")
    second = f"Max-variance selection {o['selection']} random selection of as many rollouts. "
    if o["ships"] == "d1s-c":
        third = f"So the recipes run D1S-C at its tuned rate ({rule})."
    elif o["d1s_c_beats"]:
        third = (f"The recipes run tuned GRPO ({rule}): D1S-C beat it but fell below its own start in "
                 + ", ".join(o["collapsed"]) + ".")
    else:
        third = f"So the recipes run tuned GRPO ({rule})."
    return first + second + third


GPU_FOLDER = "gpu-h200"


def gpu_training_phase(root: Path, prefix: str = "") -> str:
    """The one GPU measurement: D3S's training phase against TRL's GRPO early and late in the schedule, and the
    trainer tests on the same GPU."""
    folder = root / RESULTS / GPU_FOLDER
    data = json.loads((folder / "bench_trl_training_phase_qwen-0.5b_cuda.json").read_text())
    ratio = {r["name"].split(":")[0]: r["ratio_vs_grpo"] for r in data["results"]}
    batch = data["batch"]
    lo, hi = batch["completion_tokens"]
    tests = re.search(r"(\d+) failed, (\d+) passed", (folder / "tests3.log").read_text())
    failed, passed = int(tests.group(1)), int(tests.group(2))
    return (f"The one GPU measurement (one {data['device']}, a {data['model_parameters'] / 1e6:.0f}M-parameter "
            f"Qwen2.5-0.5B-shaped model with random weights, bf16, {batch['prompts']} prompts x "
            f"{batch['num_generations']} rollouts of {lo}-{hi} tokens): D3S's training phase, generation not "
            f"included, took {ratio['d3s early']:.2f}x GRPO's early in its schedule (N = 4 of 16 rollouts, K = 5% of "
            f"tokens) and {ratio['d3s late']:.2f}x late (N = 16 of 16, K = 20%); the trainer tests passed there, "
            f"{passed} of {passed + failed} (one missed its tolerance). Source: {_link(GPU_FOLDER, prefix)}.")


def generation_share(root: Path, prefix: str = "") -> str:
    """Generation's share of a GRPO step in the 5-seed campaigns: what no variant's step can go below."""
    shares = []
    for folder in ("campaign5-default", "campaign5-arith2digit"):
        parts = _compare(root, folder)["variants"]["grpo"]["step_seconds_mean"]
        shares.append(parts["generation"] / parts["step"])
    return (f"On the CPU campaigns generation took {shares[0]:.2f} (default task) and {shares[1]:.2f} (arith-2digit) "
            f"of a GRPO step ({_link('campaign5-default', prefix)}, {_link('campaign5-arith2digit', prefix)}), so "
            f"no variant's step cost less than that share there.")


def supported_versions(root: Path, prefix: str = "") -> str:
    """The versions `pyproject.toml` declares: Python, torch, and the TRL extra's pins."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
        import tomli as tomllib
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    pins = {re.split(r"[<>=!~ ]", d, maxsplit=1)[0]: d for d in project["dependencies"]
            + project["optional-dependencies"]["trl"]}
    shown = ", ".join(f"`{pins[name]}`" for name in ("torch", "trl", "transformers", "accelerate", "datasets"))
    return (f"Supported: Python `{project['requires-python']}`, {shown} (`pyproject.toml`; the TRL glue overrides "
            f"private TRL methods, so TRL and transformers are held to the versions measured: "
            f"[docs/compatibility.md]({prefix}docs/compatibility.md)).")


def trl_matrix(root: Path, prefix: str = "") -> str:
    """docs/compatibility.md's table: the rows `scripts/trl_matrix.sh` printed (`benchmarks/results/trl-matrix/
    table.md`), each TRL version marked against the ranges compat.py declares now, and the machine they ran on."""
    from d3s.integrations.trl.compat import TRANSFORMERS_VERSION_RANGE, TRL_VERSION_RANGE
    from packaging.version import Version

    folder = root / RESULTS / "trl-matrix"
    rows = [line for line in (folder / "table.md").read_text().splitlines() if line.startswith("| ")][1:]
    lines = ["| TRL | transformers | private-name mismatches | tests passed | tests failed | supported now | took |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if cells[0] == "TRL" or set(cells[0]) <= {"-"}:
            continue
        trl_v, tf_v = Version(cells[0]), Version(cells[1])
        inside = (TRL_VERSION_RANGE[0] <= trl_v < TRL_VERSION_RANGE[1]
                  and TRANSFORMERS_VERSION_RANGE[0] <= tf_v < TRANSFORMERS_VERSION_RANGE[1])
        lines.append("| " + " | ".join([*cells[:5], "yes" if inside else "no", cells[6]]) + " |")
    machine = (folder / "machine.txt").read_text().strip()
    return "\n".join(lines) + (f"\n\nMeasured on {machine}, beside other work: the durations (installing "
                               f"included) say nothing about speed. Source: {_link('trl-matrix', prefix)} (one "
                               f"log per row).")


def private_trl_names(root: Path, prefix: str = "") -> str:
    """docs/trl.md's table of `PRIVATE_TRL_API`: each private (or undocumented) TRL name the glue relies on, the TRL
    versions that have it, how the glue uses it and why no public API does instead, read from compat.py itself."""
    from d3s.integrations.trl.compat import PRIVATE_TRL_API, PRIVATE_TRL_API_REASONS

    lines = ["| TRL name | TRL versions | Use, and why not a public API |", "|---|---|---|"]
    for name, expected in PRIVATE_TRL_API.items():
        versions = ", ".join(f"`{spec}`" for spec in expected) if isinstance(expected, dict) else "all supported"
        lines.append(f"| `{name}` | {versions} | {PRIVATE_TRL_API_REASONS[name]} |")
    public = sum(PRIVATE_TRL_API_REASONS[name].startswith("Public") for name in PRIVATE_TRL_API)
    lines.append("")
    lines.append(f"{len(PRIVATE_TRL_API)} entries (`d3s.integrations.trl.compat.PRIVATE_TRL_API`): {public} public "
                 f"methods the trainer overrides, {len(PRIVATE_TRL_API) - public} private or undocumented names. "
                 "A test checks every entry against the installed TRL, and that the glue relies on no TRL name "
                 "the table does not list.")
    return "\n".join(lines)


def d3s_config_fields(root: Path, prefix: str = "") -> str:
    """docs/trl.md's table of the fields `D3SConfig` adds to TRL's `GRPOConfig`: name, default and help, read from
    the dataclass itself, so a field added there and not here fails `--check`."""
    import dataclasses

    from d3s.integrations.trl import D3SConfig
    from d3s.integrations.trl.compat import GRPOConfig

    trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    lines = ["| field | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(D3SConfig):
        if f.name in trl_fields or not f.init:
            continue
        default = "-" if f.default is dataclasses.MISSING else f"`{f.default!r}`"
        text = f.metadata.get("help", "").replace("|", "\\|")
        lines.append(f"| `{f.name}` | {default} | {text} |")
    return "\n".join(lines)


FIGURES = {
    "race-headline": race_headline,
    "race-terms": race_terms,
    "race-verdict": race_verdict,
    "race-default": lambda root, prefix="": race_table(root, "race-default", prefix),
    "race-default-settings": lambda root, prefix="": race_settings(root, "race-default", prefix),
    "race-ablations": lambda root, prefix="": race_table(root, "race-ablations", prefix),
    "race-arith2digit": lambda root, prefix="": race_table(root, "race-arith2digit", prefix),
    "race-arith2digit-settings": lambda root, prefix="": race_settings(root, "race-arith2digit", prefix),
    "race-decision": race_decision,
    "race-ablations-settings": lambda root, prefix="": race_settings(root, "race-ablations", prefix),
    "first-command": first_command,
    "generation": generation,
    "campaign5-default": lambda root, prefix="": campaign_table(root, "campaign5-default", prefix),
    "campaign5-arith2digit": lambda root, prefix="": campaign_table(root, "campaign5-arith2digit", prefix),
    "floor-vs-paper": floor_vs_paper,
    "wall-clock-to-grpo": wall_clock_to_grpo,
    "seed-spread": seed_spread,
    "three-seed-history": three_seed_history,
    "keep-last": keep_last,
    "d3s-config-fields": d3s_config_fields,
    "race-table-short": race_table_short,
    "gpu-training-phase": gpu_training_phase,
    "generation-share": generation_share,
    "supported-versions": supported_versions,
    "private-trl-names": private_trl_names,
    "credit-verdict": credit_verdict,
    "flops-step": flops_step,
    "trl-matrix": trl_matrix,
}


# --- the pages ----------------------------------------------------------------------------------------------

def pages(root: Path) -> list[Path]:
    return [p for pattern in PAGES for p in sorted(root.glob(pattern))]


def render(text: str, root: Path, prefix: str = "") -> tuple[str, list[str]]:
    """The page with every block regenerated, and the names of the blocks whose text changed."""
    changed: list[str] = []

    def fill(m: re.Match) -> str:
        name = m.group("name")
        if name not in FIGURES:
            raise SystemExit(f"unknown figures block {name!r}; known: {', '.join(FIGURES)}")
        body = FIGURES[name](root, prefix) + "\n"
        if body != m.group("body"):
            changed.append(name)
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(fill, text), changed


def run(root: Path, check: bool, files: list[Path] | None = None) -> list[str]:
    """Regenerate (or with `check`, only compare) the blocks of `files` (default: README.md and docs/*.md);
    returns 'file: block' for every block whose text differs from the data."""
    stale = []
    for page in files or pages(root):
        text = page.read_text(encoding="utf-8")
        prefix = "../" if page.parent.name == "docs" else ""
        new, changed = render(text, root, prefix)
        stale += [f"{page.name}: {name}" for name in changed]
        if not check and new != text:
            page.write_text(new, encoding="utf-8")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if any block differs from the data")
    args = parser.parse_args(argv)
    stale = run(ROOT, args.check)
    if args.check and stale:
        print("figures that differ from the committed data (run scripts/readme_figures.py):", *stale, sep="\n  ")
        return 1
    if not args.check:
        print(f"{len(stale)} block(s) rewritten" + (": " + ", ".join(stale) if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
