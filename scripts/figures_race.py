"""The figures of the races at GRPO's compute (`d3s compare --budget reference`), the FLOP table of one step, and
the README's race rows (`scripts/readme_figures.py`)."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import yaml

from d3s.app.compare.stats import shown
from d3s.app.machine import machine_label
from d3s.app.recipe import RECIPES_DIR
from d3s.app.runfiles import read_run_records
from figures_common import FLOOR, RESULTS, _compare, _link, arm_tests, n_seeds, paired, paired_between, paired_family, pct, shown_rule
from figures_campaigns import load_note, same_machine_ratio

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
    from figures_credit import credit_shipped_setting  # (figures_credit imports this module)

    if credit_shipped_setting(root) is not None:  # a later rule, the controls', has decided since
        outcome = (("so the default recipe's variant became D1S-C" if decided == "d1s-c" else
                    "so the default recipe stayed D3S + floor") + "; the controls' rule (below) has decided since.")
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
    ran, now = trainer["trainer"]["variant"], yaml.safe_load((RECIPES_DIR / "default.yaml").read_text())["variant"]
    recipe = f"the default recipe ({ran.upper()})" if ran == now else \
        f"the default recipe as it was then ({ran.upper()}; it now runs {now.upper()})"
    return (f"Measured from a clean clone with empty caches on one machine ({machine_label(trainer.get('machine'))}; "
            f"{'fp32' if mixed == 'no' else mixed}), {recipe}, "
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
