"""The figures of the controls (`benchmarks/credit.sh`): the rule of `benchmarks/results/credit-rule.md` applied to
their races, and the course of the runs that fell below their start (`scripts/readme_figures.py`)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from d3s.app.compare.stats import ALPHA, shown, sign_flip_p_value
from d3s.app.compare.summary import run_dir
from d3s.app.intervals import mean_interval
from d3s.app.runfiles import read_run_records
from figures_common import RESULTS, _compare, _link, arm_tests, paired, paired_between, pct, to_reference
from figures_race import _interval, race_has_data

# --- the controls' race (benchmarks/credit.sh; its rule: benchmarks/results/credit-rule.md) --------------------

CREDIT_RACES = {"credit-race-default": ("the default task", 8, 4), "credit-race-arith2digit": ("arith-2digit", 5, 4)}
"""Each race of the controls: its task, its seeds and its arms when finished (the plan's cuts, `benchmarks/credit.sh`:
D3S + floor is not among the arms, arith-2digit runs 5 seeds of the 6 planned)."""
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


CREDIT_STAGES = {"credit-race-default": "race", "credit-race-arith2digit": "arith2digit"}
STEPS_FOLDER, STEPS_SEEDS = "credit-steps-default", 8


def credit_race_finished(root: Path, folder: str) -> bool:
    """Whether one race of the controls holds every arm of every seed."""
    _, seeds, arms = CREDIT_RACES[folder]
    if not race_has_data(root, folder):
        return False
    c = _compare(root, folder)
    return len(c["seeds"]) >= seeds and len(c["variants"]) >= arms


def credit_finished(root: Path) -> bool:
    """Whether both races of the controls hold every arm of every seed, and the flat-start task every run (the rule
    reads both)."""
    flat = len(list((root / RESULTS / "credit-flat").glob("*-seed*/summary.json")))
    return all(credit_race_finished(root, folder) for folder in CREDIT_RACES) and flat >= FLAT_RUNS


def _at_budget(c: dict, v: str) -> list[float]:
    """An arm's accuracy at the budget, seed by seed in the order of `c["seeds"]`."""
    per = c["variants"][v]["budget"]["per_seed"]
    return [per[str(s)]["accuracy_at_budget"] for s in c["seeds"]]


def accuracy_cell(accs: list[float]) -> str:
    """An arm's mean accuracy over seeds with its 95% interval: '69.9% [65.4, 74.3]'."""
    return f"{pct(statistics.mean(accs))} {_interval(mean_interval(accs, bounds=(0.0, 1.0)))}"


def _prompts(row: dict) -> str:
    if not row.get("prompts_checked_seeds"):
        return "-"
    return f"{row['same_prompts_seeds']} of {row['prompts_checked_seeds']}"


def credit_table(root: Path, folder: str, prefix: str = "") -> str:
    """One race of the controls: every arm at tuned GRPO's compute against it (Holm over the arms), then D1S-C
    against its two controls, each one comparison (the rule's tests 2 and 3)."""
    task, n, arms = CREDIT_RACES[folder]
    if not credit_race_finished(root, folder):
        return (f"Not in yet: {task}, {n} seeds x {arms} arms (`bash benchmarks/credit.sh {CREDIT_STAGES[folder]}`); "
                "this table is filled from them when every run is.")
    c = _compare(root, folder)
    roles, tests = credit_roles(c), arm_tests(c, "budget")
    lines = ["| arm | run setting | held-out acc at tuned GRPO's compute [95% CI] | vs tuned GRPO, paired [95% CI] "
             "| sign-flip p (Holm) | mean without one seed | steps (mean) | same prompts as GRPO |",
             "|---|---|---|---|---|---|---|---|"]
    for role, label in CREDIT_ROLES.items():
        if role not in roles:
            continue
        v = roles[role]
        r, b = c["variants"][v], c["variants"][v]["budget"]
        head = f"| {label} | `{v}` | {accuracy_cell(_at_budget(c, v))} | "
        steps = f"{statistics.mean(p['steps'] for p in r['per_seed']):.0f}"
        if role == "grpo":
            lines.append(head + f"- | - | - | {steps} | - |")
            continue
        t = tests[v]
        loo = b.get("leave_one_out")
        loo_text = "-" if loo is None else f"{100 * loo[0]:+.1f} to {100 * loo[1]:+.1f}"
        lines.append(head + f"{paired(b['diff_at_budget_mean'], b['diff_at_budget_ci'], t['p_value_holm'])} | "
                     f"{t['p_value']:.3g} ({t['p_value_holm']:.3g}) | {loo_text} | {steps} | {_prompts(r)} |")
    d1s_c = _at_budget(c, roles["d1s-c"])
    lines += ["",
              f"D1S-C against random selection of as many rollouts (the same N and rate), paired, one comparison: "
              f"{paired_between(d1s_c, _at_budget(c, roles['random']))}. D1S-C against GRPO generating only what "
              f"D1S-C trains on: {paired_between(d1s_c, _at_budget(c, roles['small-g']))}.",
              "",
              f"Seeds {', '.join(map(str, c['seeds']))}; every arm trained on the FLOPs of the same seed's tuned GRPO "
              f"run. Source: {_link(folder, prefix)} (`compare.json`, `compare.md`)."]
    return "\n".join(lines)


def credit_steps(root: Path, prefix: str = "") -> str:
    """The equal-steps control: D1S-C and random selection for tuned GRPO's 20 steps, final accuracy paired."""
    folder = root / RESULTS / STEPS_FOLDER
    if not (folder / "compare.json").is_file() or len(_compare(root, STEPS_FOLDER)["seeds"]) < STEPS_SEEDS:
        return (f"Not in yet: {STEPS_SEEDS} seeds (`bash benchmarks/credit.sh steps`); this table is filled from them "
                "when every run is.")
    c = _compare(root, STEPS_FOLDER)
    roles = credit_roles(c)
    lines = ["| arm | run setting | final held-out acc [95% CI] | vs tuned GRPO, paired [95% CI] |", "|---|---|---|---|"]
    for role in ("grpo", "d1s-c", "random"):
        v = roles[role]
        r = c["variants"][v]
        lines.append(f"| {CREDIT_ROLES[role]} | `{v}` | {pct(r['final_accuracy_mean'])} {_interval(r['seed_ci95'])} | "
                     + ("-" if role == "grpo" else to_reference(c, v)) + " |")
    per = {role: c["variants"][roles[role]]["final_accuracy_per_seed"] for role in ("d1s-c", "random")}
    lines += ["", f"D1S-C against random selection, paired, one comparison: {paired_between(per['d1s-c'], per['random'])}."
              f" Seeds {', '.join(map(str, c['seeds']))}, every arm 20 steps. Source: {_link(STEPS_FOLDER, prefix)}."]
    return "\n".join(lines)


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


CONTROL_SETTINGS = ("sample_selection", "skip_steps_without_signal=false", "num_generations")
"""What names a control's run rather than an arm as the recipes would ship it."""


def credit_below_start(root: Path, variant_prefix: str) -> list[str]:
    """The runs of an arm (folders starting with `variant_prefix`, the controls' runs aside) on arith-2digit and the
    flat-start task whose held-out accuracy fell below their own start."""
    found = []
    for folder in ("credit-race-arith2digit", "credit-flat"):
        for summary in sorted((root / RESULTS / folder).glob(f"{variant_prefix}*-seed*/summary.json")):
            if any(setting in summary.parent.name for setting in CONTROL_SETTINGS):
                continue
            if json.loads(summary.read_text()).get("below_start"):
                found.append(f"{folder}/{summary.parent.name}")
    return found


def seeds_in(root: Path, folder: str) -> int:
    """How many of an unfinished race's seeds hold a finished run (`summary.json`) of every arm: the arms its last
    per-seed compare named (`benchmarks/credit.sh` compares each seed once its runs are in); 0 before the first."""
    if not race_has_data(root, folder):
        return 0
    variants = _compare(root, folder)["variants"]
    if len(variants) < CREDIT_RACES[folder][2]:
        return 0
    seeds = {s.parent.name.rsplit("-seed", 1)[1] for s in (root / RESULTS / folder).glob("*-seed*/summary.json")}
    return sum(all((root / RESULTS / folder / f"{v}-seed{s}" / "summary.json").is_file() for v in variants)
               for s in seeds)


def still_to_run(root: Path, folder: str) -> str:
    """An unfinished race, said as 'is still to run' or 'has 2 of its 5 seeds in'."""
    n, planned = seeds_in(root, folder), CREDIT_RACES[folder][1]
    return "is still to run" if n == 0 else f"has {n} of its {planned} seeds in"


def cannot_be_shown(folder: str) -> bool:
    """Whether a race's planned seeds are too few for any of its differences to be shown, whatever its runs say: the
    exact sign-flip p-value of n seeds is at least 2/2^n, and "shown" needs it (Holm-corrected or not) below ALPHA
    (arith-2digit's 5 seeds: 2/32 = 0.0625)."""
    return 2 / 2 ** CREDIT_RACES[folder][1] >= ALPHA


def credit_outcome(root: Path) -> dict | None:
    """The rule of benchmarks/results/credit-rule.md applied to the controls' races, once no run still to come can
    change it: every race finished, or the unfinished ones unable to show any difference at their planned seeds
    (their comparisons are then all "not shown") while no arm beat tuned GRPO on the finished ones (a winner's
    runs on arith-2digit and the flat-start task must all be in, to see whether it fell below its start). None until
    then. `pending`: the races and runs still to come."""
    vs_grpo: dict[str, list[str]] = {}
    selection, fewer, pending = [], [], []
    for folder in CREDIT_RACES:
        if not credit_race_finished(root, folder):
            if not cannot_be_shown(folder):
                return None
            pending.append(folder)
            for words in (selection, fewer, *vs_grpo.values()):
                words.append("not shown")
            continue
        c = _compare(root, folder)
        roles, tests = credit_roles(c), arm_tests(c, "budget")
        for role, v in roles.items():
            if role != "grpo":
                b = c["variants"][v]["budget"]
                vs_grpo.setdefault(role, ["not shown"] * len(pending)).append(
                    _word(b["diff_at_budget_ci"], tests[v]["p_value_holm"]))
        selection.append(credit_against(c, roles["d1s-c"], roles["random"]))
        fewer.append(credit_against(c, roles["d1s-c"], roles["small-g"]))
    if not vs_grpo:
        return None
    beats = {role: credit_summary(words) == "beat" for role, words in vs_grpo.items()}
    finished = credit_finished(root)
    if not finished and beats.get("d1s-c"):
        return None
    collapsed = credit_below_start(root, "d1s-c") if finished else []
    ships = "d1s-c" if beats.get("d1s-c") and not collapsed else "grpo"
    return {"beats": beats, "selection": credit_summary(selection), "fewer": credit_summary(fewer), "ships": ships,
            "collapsed": collapsed, "d1s_c_beats": beats.get("d1s-c", False),
            # the shipped arm's fall is said as soon as a run shows it, not only once every run is in
            "grpo_collapsed": credit_below_start(root, "grpo"), "pending": pending}


def credit_shipped_setting(root: Path) -> dict | None:
    """What the recipes run by the rule, once no run still to come can change it (`credit_outcome`):
    `{"variant", "learning_rate"}` (the arm's tuned rate, `credit-tuning/choice.json`); None until then."""
    o = credit_outcome(root)
    if o is None:
        return None
    arm = o["ships"]
    choice = json.loads((root / RESULTS / "credit-tuning" / "choice.json").read_text())
    return {"variant": arm, "learning_rate": choice[arm]["learning_rate"]}


def credit_verdict(root: Path, prefix: str = "") -> str:
    """The README's first word on what buys D1S-C's gain: the rule's outcome once the controls' races are in, what is
    running until then."""
    rule = f"[the rule fixed before they ran]({prefix}{RESULTS}/credit-rule.md)"
    o = credit_outcome(root)
    if o is None:
        return ("What buys D1S-C's gain is being tested: random selection of as many rollouts, GRPO generating only "
                "what D1S-C trains on, and every arm at its own tuned learning rate, at tuned GRPO's compute "
                f"(`bash benchmarks/credit.sh`, {rule}). Until they are in, the recipes' choice of D1S-C is "
                "provisional.")
    winners = [CREDIT_ROLES[r] for r, won in o["beats"].items() if won]
    first = ("On a 135M model learning arithmetic, at the compute of a GRPO whose learning rate was tuned (every arm "
             "at its own tuned rate), "
             + (f"{' and '.join(winners)} beat tuned GRPO" if winners else "no arm beat tuned GRPO") + ". ")
    second = f"Max-variance selection {o['selection']} random selection of as many rollouts. "
    if o["ships"] == "d1s-c":
        third = f"So the recipes run D1S-C at its tuned rate ({rule})."
    elif o["d1s_c_beats"]:
        third = (f"The recipes run tuned GRPO ({rule}): D1S-C beat it but fell below its own start in "
                 + ", ".join(o["collapsed"]) + ".")
    else:
        third = f"So the recipes run tuned GRPO ({rule})."
    if o["ships"] == "grpo" and o["grpo_collapsed"]:
        third += " Tuned GRPO too fell below its own start in " + ", ".join(o["grpo_collapsed"]) + "."
    if o["pending"]:
        third += "".join(f" The {CREDIT_RACES[f][0]} race ({CREDIT_RACES[f][1]} seeds) {still_to_run(root, f)}; with "
                         "so few seeds no difference there can be shown, so it cannot change this." for f in o["pending"])
    return first + second + third


def _run_dynamics(run: Path) -> dict:
    """What a run's train records say about its course: steps, summed learning rate, the share of steps whose
    gradient was clipped or had no signal, truncation and completion length over its first and last 5 steps, and
    its held-out accuracy at the start, at its lowest and at the end."""
    records = read_run_records(run / "metrics.jsonl")
    train = [r for r in records if r.get("type") == "train"]
    evals = [r["accuracy"] for r in records if r.get("type") == "eval"]
    max_norm = json.loads((run / "run_config.json").read_text())["trainer"]["max_grad_norm"]

    def mean(key: str, rows: list[dict]) -> float:
        return statistics.fmean(r[key] for r in rows)

    summary = json.loads((run / "summary.json").read_text())
    return {"steps": len(train), "summed_rate": sum(r["learning_rate"] for r in train),
            "clipped": statistics.fmean(r["grad_norm"] > max_norm for r in train),
            "no_signal": mean("d3s/no_signal_step", train),
            "moved_without_signal": statistics.fmean(bool(r["d3s/no_signal_step"] and r.get("d3s/weights_moved"))
                                                     for r in train),
            "truncated": (mean("completions/clipped_ratio", train[:5]), mean("completions/clipped_ratio", train[-5:])),
            "length": (mean("completions/mean_length", train[:5]), mean("completions/mean_length", train[-5:])),
            "start": evals[0], "lowest": min(evals), "final": evals[-1],
            "below_start": bool(summary.get("below_start")),
            "first_below_start": (summary.get("below_start") or [None])[0], "budget": summary.get("budget")}


def dynamics_table(groups: list[tuple[str, list[Path]]], unit: float, moved: bool = False) -> str:
    """One row per group of runs (a label and its seeds' run folders): how each moved, the summed learning rate in
    `unit`s (the summed rate of the recipe's GRPO run); with `moved`, the share of steps without signal on which the
    optimizer still moved the weights, counted over all steps."""
    rows = []
    for label, runs in groups:
        d = [_run_dynamics(r) for r in runs]
        first_last = lambda key, fmt: (f"{fmt(statistics.fmean(x[key][0] for x in d))} -> "
                                       f"{fmt(statistics.fmean(x[key][1] for x in d))}")
        rows.append(
            f"| {label} | {' / '.join(str(x['steps']) for x in d)} | "
            f"{statistics.fmean(x['summed_rate'] for x in d) / unit:.1f}x | "
            f"{pct(statistics.fmean(x['clipped'] for x in d))} | {pct(statistics.fmean(x['no_signal'] for x in d))} | "
            + (f"{pct(statistics.fmean(x['moved_without_signal'] for x in d))} | " if moved else "") +
            f"{first_last('truncated', pct)} | {first_last('length', lambda v: f'{v:.0f}')} | "
            f"{' / '.join(pct(x['final']) for x in d)} | {' / '.join(pct(x['lowest']) for x in d)} | "
            f"{sum(x['below_start'] for x in d)} of {len(d)} |")
    return "\n".join([
        "| arm, rate | steps (per seed) | summed rate | steps clipped | steps without signal | "
        + ("steps without signal that moved the weights | " if moved else "") +
        "truncated (first 5 -> last 5 steps) | completion tokens (first 5 -> last 5) | held-out final | held-out "
        "lowest | fell below start |",
        "|---|---|---|---|---|" + ("---|" if moved else "") + "---|---|---|---|---|", *rows])


TUNING_RATES = {"1x": 1.0, "2x": 2.0, "4x": 4.0}


def collapse_tuning(root: Path, prefix: str = "") -> str:
    """docs/method.md's table of the tuning runs' course (seeds 1-3 of `benchmarks/credit.sh tuning`, which chose the
    learning rates and are not results): which runs fell below their start, against their summed learning rate,
    their clipped and signal-free steps, and their completions' truncation and length."""
    if not (root / RESULTS / "credit-tuning" / "choice.json").is_file():
        return ("The tuning runs (`bash benchmarks/credit.sh tuning`) are not all in yet; this table is filled from them "
                "once they are and the rates are chosen (`credit-tuning/choice.json`).")
    base = {}
    groups = []
    for folder, arm, label in (("credit-tuning-grpo", "grpo", "GRPO"), ("credit-tuning", "d1s-c", "D1S-C")):
        runs = sorted((root / RESULTS / folder).glob(f"{arm}*-seed*/summary.json"))
        by_rate: dict[float, list[Path]] = {}
        for summary in runs:
            config = json.loads((summary.parent / "run_config.json").read_text())
            by_rate.setdefault(config["trainer"]["learning_rate"], []).append(summary.parent)
        base.setdefault("rate", min(by_rate))
        for rate, folders in sorted(by_rate.items()):
            groups.append((f"{label}, {rate / base['rate']:g}x", sorted(folders, key=lambda p: p.name)))
    grpo = groups[0][1]
    unit = statistics.fmean(_run_dynamics(r)["summed_rate"] for r in grpo)
    seeds = sorted({int(p.name.rsplit("-seed", 1)[1]) for _, runs in groups for p in runs})
    return (dynamics_table(groups, unit) + "\n\n"
            f"Tuning runs of the default task (seeds {', '.join(map(str, seeds))}; they chose the learning rates and "
            f"are not results), 1x = the recipe's {base['rate']:g}. Every run skipped its optimizer steps without "
            "signal. Summed rate: the learning rate summed over the run's steps, in units of GRPO's 20 steps at 1x. "
            "Steps clipped: gradient norm above `max_grad_norm`. Held-out accuracy per seed; every run started at "
            f"{pct(_run_dynamics(grpo[0])['start'])}. Source: {_link('credit-tuning-grpo', prefix)}, "
            f"{_link('credit-tuning', prefix)}.")


FLAT_RUNS = 9
"""The flat-start campaign when finished: 3 seeds of GRPO, D1S-C and D1S-C without the recipes' step skip."""


def collapse_flat(root: Path, prefix: str = "") -> str:
    """docs/method.md's table of the flat-start task's runs (`benchmarks/credit.sh flat`): D1S-C with the recipes' step
    skip against GRPO at its compute and without skipping the steps without signal, how each moved; a sentence until
    all are in."""
    folder = root / RESULTS / "credit-flat"
    runs = sorted(p.parent for p in folder.glob("*-seed*/summary.json"))
    if len(runs) < FLAT_RUNS:
        return ("The flat-start runs (`bash benchmarks/credit.sh flat`: 3 seeds of GRPO, of D1S-C with the recipes' step "
                "skip and of D1S-C without the step skip, at GRPO's compute) are not all in yet; this table is filled "
                "from them when they are.")
    c = json.loads((folder / "compare.json").read_text())
    label = {c["reference"]: "GRPO (the reference)"}
    groups, at_budget, short, falls, starts = [], [], [], [], set()
    for v in c["variants"]:
        name = label.get(v) or ("D1S-C without the step skip" if "skip_steps_without_signal=false" in v
                                else "D1S-C with the recipes' step skip")
        runs = [run_dir(folder, v, s) for s in c["seeds"]]
        groups.append((name, runs))
        b = c["variants"][v]["budget"]
        mean = pct(statistics.fmean(_at_budget(c, v)))
        if v == c["reference"]:
            at_budget.append(mean)
        else:
            at_budget.append(f"{name} {mean} "
                             f"({paired(b['diff_at_budget_mean'], b['diff_at_budget_ci'], b.get('p_value_holm'))})")
        for seed, run in zip(c["seeds"], runs):
            d = _run_dynamics(run)
            starts.add(pct(d["start"]))
            if d["budget"] and d["budget"].get("stopped_by") == "max_steps":  # the step cap came before the budget
                short.append(f"{name} seed {seed} reached its step cap ({d['steps']} steps) after "
                             f"{pct(d['budget']['share'])} of GRPO's compute")
            if d["first_below_start"]:  # what the run's report said it had seen at its first fall
                f = d["first_below_start"]
                falls.append(f"{name} seed {seed} at step {f['step']} ({pct(f['accuracy'])}; until then "
                             f"{pct(f['no_signal_share'])} of its steps without signal, {pct(f['truncation_rate'])} of "
                             f"completions truncated, {f['completion_length']:.0f} tokens a completion)")
    unit = statistics.fmean(_run_dynamics(r)["summed_rate"] for r in groups[0][1])
    return (dynamics_table(groups, unit, moved=True) + "\n\n"
            f"The flat-start task (3 terms of 1 digit), seeds {', '.join(map(str, c['seeds']))}, every arm at GRPO's "
            f"compute; every run started at {' or '.join(sorted(starts))} held-out accuracy"
            + (f" ({'; '.join(short)})" if short else "") + ". Summed rate in units of the GRPO runs'. Steps "
            "without signal that moved the weights: over all steps (0 where they are skipped). "
            + (f"First below its start: {'; '.join(falls)}. " if falls else "No run fell below its start. ")
            + f"At GRPO's compute, paired by seed (Holm over the arms): GRPO {at_budget[0]}; "
            + "; ".join(at_budget[1:]) + ". Source: " + _link("credit-flat", prefix) + ".")
