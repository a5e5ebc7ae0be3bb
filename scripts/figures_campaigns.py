"""The figures of the fixed-step campaigns: accuracy tables, step-time and wall-clock ratios, seed spreads
(`scripts/readme_figures.py`)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from d3s.app.compare.summary import _reach, _run_machine, run_dir
from d3s.app.machine import all_quiet, quiet, same_machine
from figures_common import FLOOR, LABELS, RESULTS, _compare, _evals, _link, paired_between, pct, shown_rule, to_reference

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
