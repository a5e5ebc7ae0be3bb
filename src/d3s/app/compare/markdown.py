"""`compare.md`: the summary of `d3s compare` (`d3s.app.compare.summary`) as markdown tables, one section
per question: final accuracy, cost to reach the reference's accuracy (over seeds, then seed by seed), where a
step's time goes, what generation bought, the runs and the machines they were timed on; which FLOP convention
the numbers are in.

A wall-clock ratio is given only between runs timed on one machine of which none is known to have run on a
loaded machine (`d3s.app.machine.quiet`); where one did, the table says which and with what load. A ratio
between runs that recorded no load is given, marked unverified."""

from __future__ import annotations

from d3s.app.budget import FLOPS_CONVENTIONS
from d3s.app.compare.stats import shown
from d3s.app.machine import LOAD_MARGIN, machine_label, one_machine, wall_not_compared


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _points(x: float) -> str:
    return f"{x * 100:+.1f}"


def _ci(c, fmt=_pct) -> str:
    return "-" if c is None else f"[{fmt(c[0])}, {fmt(c[1])}]"


def _minutes(s: float | None) -> str:
    return "-" if s is None else f"{s / 60:.1f} min"


def _tokens(t: float | None) -> str:
    return "-" if t is None else f"{t:,.0f}"


def _times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _span(s, fmt) -> str:
    return "" if s is None or s[0] == s[1] else f" ({fmt(s[0])}-{fmt(s[1])})"


def _seconds(d: dict | None, key: str) -> str:
    return "-" if not d or d.get(key) is None else f"{d[key]:.1f}"


def _section(title: str, note: str, head: list[str], rows: list[list[str]]) -> list[str]:
    """A titled markdown table with a note under its title."""
    return [f"## {title}", "", note, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(row) + " |" for row in rows)]


def _p(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _accuracy(summary: dict) -> list[str]:
    ref = summary["reference"]
    rows = [[v, _pct(row["final_accuracy_mean"]), _ci(row["seed_ci95"]), _ci(row["pooled_ci95"]),
             ", ".join(_pct(a) for a in row["final_accuracy_per_seed"]),
             _points(row["diff_to_reference_mean"]) if v != ref else "-",
             _shown(row["diff_to_reference_ci95"], row.get("diff_to_reference_p_value_holm")) if v != ref else "-",
             _p(row.get("diff_to_reference_p_value_holm")),
             f"{100 * row['diff_to_reference_mdd']:.1f}" if v != ref and row.get("diff_to_reference_mdd") else "-",
             _pct(row["no_signal_share_mean"])]
            for v, row in summary["variants"].items()]
    return _section(
        "Final held-out accuracy",
        f"Mean over seeds with a 95% t-interval over seeds (needs 2 seeds) and the 95% Wilson interval of the "
        f"pooled answers; the difference to {ref} is paired by seed, in percentage points, with the exact "
        "sign-flip p-value of its mean Holm-corrected over the variants of this table ('not shown' unless the "
        "interval excludes zero and the corrected p is below 0.05), and the minimum detectable difference at this "
        "seed count (MDD: 80% power at the 5% level, from the paired SD; a true difference below it would usually "
        "be missed).",
        ["variant", "final acc (mean)", "95% CI over seeds", "pooled 95% CI", "per seed", f"vs {ref} (points)",
         "paired 95% CI", "p (Holm)", "MDD (points)", "steps with no signal"], rows)


UNVERIFIED = " (unverified: no load record)"


def _load(p: dict) -> float | None:
    """The higher of a run's two 1-minute load averages (start, end); None when it recorded none."""
    loads = [x for x in (p.get("load_start"), p.get("load_end")) if x is not None]
    return max(loads) if loads else None


def _withheld(runs: list[tuple[str, dict]]) -> str:
    """What a table says in place of a wall-clock ratio with runs (`(variant, per-seed row)`) that ran loaded."""
    loaded = [f"seed {p['seed']}'s {v} ran with load {_load(p):.1f}"
              + (f" on {p['machine']['cpu_count']} CPUs" if (p.get("machine") or {}).get("cpu_count") else "")
              for v, p in runs if p.get("quiet") is False]
    return "wall-clock withheld: " + ", ".join(loaded)


def _wall_ratio(summary: dict, v: str, text: str, say_why: bool = False) -> str:
    """`text` (a wall-clock ratio of variant `v` to the reference over all their runs), or why it is not given; a
    `text` of "-" (nothing to compare) stays, unless `say_why` (the summary left it out for a reason)."""
    row, ref = summary["variants"][v], summary["reference"]
    if text == "-" and not say_why:
        return text
    if row.get("one_machine_with_reference") is not True:
        return wall_not_compared(row.get("one_machine_with_reference"))
    if row.get("quiet_with_reference") is False:
        runs = [(name, p) for name in dict.fromkeys((v, ref)) for p in summary["variants"][name]["per_seed"]]
        return _withheld(runs)
    return text + (UNVERIFIED if row.get("quiet_with_reference") is None and text != "-" else "")


def _speedup_wall(summary: dict, v: str) -> str:
    return _wall_ratio(summary, v, _times(summary["variants"][v]["speedup_wall"]), say_why=True)


def _cost(summary: dict) -> list[str]:
    rows = [[v, f"{row['seeds_reaching_target']}/{len(summary['seeds'])}",
             _minutes(row["wall_s_to_target_mean"]) + _span(row["wall_s_to_target_spread"], _minutes),
             _tokens(row["computed_to_target_mean"]) + _span(row["computed_to_target_spread"], _tokens),
             _tokens(row["tokens_to_target_mean"]), _speedup_wall(summary, v), _times(row["speedup_computed"]),
             _minutes(row["train_wall_s_mean"]), _tokens(row["computed_tokens_mean"])]
            for v, row in summary["variants"].items()]
    return _section(
        f"Cost to reach {summary['reference']}'s final accuracy ({summary['target_accuracy']:.1%})",
        "At the first held-out evaluation after training began at or above the target; mean (range) over the "
        "seeds that reached it. Wall-clock counts training (generation included), not evaluation. Positions "
        "computed: what the training forward computes (the cost); tokens in the loss: what it trains on. Speedup "
        "(wall) only where every run of the variant and of the reference was timed on one machine and none ran "
        f"loaded (1-minute load average above its CPUs + {LOAD_MARGIN} at start or end; docs/compare.md).",
        ["variant", "reached", "wall-clock to target", "positions computed to target", "tokens in loss to target",
         "speedup (wall)", "speedup (computed)", "whole run: wall-clock", "whole run: positions computed"], rows)


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


_TIMED_ON = {True: "one machine", False: "**different machines**", None: "machine unknown"}


def _cost_per_seed(summary: dict) -> list[str]:
    ref = summary["reference"]
    ref_runs = {p["seed"]: p for p in summary["variants"][ref]["per_seed"]}
    rows = []
    for v, row in summary["variants"].items():
        if v == ref:
            continue
        for p in row["per_seed"]:
            hit, vs = p["to_target"], p.get("to_target_vs_reference")
            if hit is None:
                rows.append([v, str(p["seed"]), f"not reached ({_pct(p['final_accuracy'])} at the end)", "-", "-", "-",
                             "-", "-"])
                continue
            if not vs["same_machine"]:
                wall = wall_not_compared(vs["same_machine"])
            elif vs.get("quiet") is False:
                wall = _withheld([(v, p), (ref, ref_runs[p["seed"]])])
            else:
                wall = (f"{_share(vs['wall_share'])} of {_minutes(ref_runs[p['seed']]['train_wall_s'])}"
                        + (UNVERIFIED if vs.get("quiet") is None else ""))
            rows.append([v, str(p["seed"]), str(hit["step"]), _minutes(hit["wall_s"]), wall,
                         _share(vs["computed_share"]), _share(vs.get("flops_share")), _TIMED_ON[vs["same_machine"]]])
    if not rows:
        return []
    return _section(
        f"Cost to reach {ref}'s final accuracy, seed by seed",
        f"Each run's training wall-clock and positions computed to the target, as a share of the same seed's whole "
        f"{ref} run (FLOPs: {_flops_unit(summary)}, generation included; docs/compare.md). A wall-clock share "
        "compares two timings: it is given only when both runs were timed on one machine (as recorded with each run: "
        "CPU vendor, model, family, stepping, flags, logical CPUs) and neither ran loaded (its load average at start "
        "or end above its CPUs + 0.5); positions computed do not depend on the machine.",
        ["variant", "seed", "step reached", "wall-clock to target", f"share of {ref}'s training wall-clock",
         f"share of {ref}'s positions computed", f"share of {ref}'s FLOPs", "timed on"], rows)


def _step_time(summary: dict) -> list[str]:
    ref = summary["reference"]
    timed = [row["step_seconds_mean"] or {} for row in summary["variants"].values()]
    parts = list(dict.fromkeys(p for d in timed for p in d if p != "step"))  # as the runs timed and named them
    ref_step = (summary["variants"][ref]["step_seconds_mean"] or {}).get("step")
    rows = []
    for v, row in summary["variants"].items():
        d = row["step_seconds_mean"]
        ratio = _wall_ratio(summary, v, "-" if not d or not ref_step or d.get("step") is None
                            else f"{d['step'] / ref_step:.2f}")
        rows.append([v, _seconds(d, "step"), *(_seconds(d, p) for p in parts), ratio])
    return _section(
        "Where a training step's time goes",
        "Seconds per step, mean over steps and seeds: TRL's `step_time` (generation included, the optimizer update "
        "not) and, where the runs timed them, its parts (`d3s/time/*`: generation with reward scoring; selection "
        "with the kept rows' passes; the KL metric; the loss forward; the backward pass and the rest). The ratio to "
        f"{ref} only where every run of both was timed on one machine and none ran loaded.",
        ["variant", "step", *(p.replace("_", " ") for p in parts), f"step vs {ref}"], rows)


def _number(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _generation(summary: dict) -> list[str]:
    rows = []
    for v, row in summary["variants"].items():
        g = row.get("generation_mean") or {}
        rows.append([v, _number(g.get("groups_generated_per_step"), 1), _number(g.get("prompts_skipped_per_step"), 1),
                     _number(g.get("flat_groups_per_step"), 1), _number(g.get("generation_s_per_signal_group"), 3),
                     _pct(row["no_signal_share_mean"])])
    return _section(
        "What generation bought",
        "Per training step, mean over seeds: groups generated (refill rounds included), prompts skipped before "
        "generation (`prompt_skip`), groups generated whose rewards were all equal (no signal); the generation "
        "seconds (reward scoring included) per group with signal handed to training, over the whole run; the "
        "share of steps that trained on no signal at all. '-': not recorded, or the option is off.",
        ["variant", "groups generated", "prompts skipped", "flat groups generated", "generation s per group with signal",
         "steps with no signal"], rows)


def _load_text(p: dict) -> str:
    if p.get("load_start") is None or p.get("load_end") is None:
        return "not recorded"
    return f"{p['load_start']:.1f} / {p['load_end']:.1f}" + (" (loaded)" if p.get("quiet") is False else "")


def _zero_gradient(counts: dict | None, no_signal: float | None) -> str:
    """'12 of 64 (moved 12, skipped 0)': optimizer steps with a zero gradient, of which the weights still moved and of
    which the step was skipped; runs made before these were logged: the share of steps whose groups were all flat."""
    if counts is None:
        return "-" if no_signal is None else f"{_pct(no_signal)} (flat)"
    return f"{counts['zero_gradient']} of {counts['steps']} (moved {counts['moved']}, skipped {counts['skipped']})"


def _runs(summary: dict) -> list[str]:
    rows = [[f"{v} seed {p['seed']}", _pct(p["final_accuracy"]), _minutes(p["train_wall_s"]),
             _minutes(p["command_wall_s"]), _zero_gradient(p.get("zero_gradient_steps"), p["no_signal_steps"]),
             f"`{p['code_version']}`",
             machine_label(p.get("machine")), _load_text(p)]
            for v, row in summary["variants"].items() for p in row["per_seed"]]
    return _section(
        "Runs",
        "Training wall-clock, and the whole `d3s train` command that finished the run (model loading and held-out "
        "evaluations included; a resumed run: its last part). Steps without signal: optimizer steps whose gradient "
        "was exactly zero, of which the weights still moved (Adam's momentum) and of which the step was skipped "
        "(`skip_steps_without_signal`); runs made before these were counted give the share of steps whose groups "
        "were all flat. Load: the machine's 1-minute load average when the "
        f"command started and when it ended; 'loaded' above its CPUs + {LOAD_MARGIN} at either.",
        ["run", "final acc", "training wall-clock", "whole command", "steps without signal", "code version",
         "machine", "load (start / end)"], rows)


def _pairing(summary: dict) -> list[str]:
    """Whether each arm is paired in fact with the reference: the same prompts, and correlated outcomes."""
    ref, rows = summary["reference"], []
    for v, row in summary["variants"].items():
        if v == ref or "prompts_checked_seeds" not in row:  # a compare.json written before pairing was checked
            continue
        checked, same = row["prompts_checked_seeds"], row["same_prompts_seeds"]
        prompts = "not recorded" if not checked else f"{same} of {checked} seeds" + ("" if same == checked else " (!)")
        at_budget = (row.get("budget") or {}).get("correlation_with_reference")
        rows.append([v, prompts, _number(row["correlation_with_reference"]),
                     _number(at_budget) if summary.get("mode") == "budget" else "-"])
    if not rows:
        return []
    return _section(
        f"Pairing with {ref}",
        f"Whether each arm's run of a seed trained on the prompts of {ref}'s run of that seed, in the same order, over "
        "the steps both took (`prompt_hashes` of their metrics.jsonl; '(!)' where a seed did not), and the "
        f"correlation over seeds of its held-out accuracy with {ref}'s (Pearson's r; '-' with fewer than 3 seeds "
        "or where one side did not vary). A paired interval is narrower than an unpaired one only where r is above "
        "zero.",
        ["variant", "same prompts", "r, final accuracy", "r, accuracy at the budget"], rows)


def _flops_unit(summary: dict) -> str:
    """The convention of the comparison's FLOPs, by name (`d3s.app.budget.FLOPS_CONVENTIONS`)."""
    name = summary.get("flops_convention")
    return f"`{name}`" if name in FLOPS_CONVENTIONS else "in more than one convention, see below"


def _notes(summary: dict) -> list[str]:
    """The base model's accuracy, the FLOP convention, the code versions, the machines and their load, and runs whose
    recipe could not be
    checked."""
    lines = []
    base = next((r["base_accuracy"] for r in summary["variants"].values() if r["base_accuracy"] is not None), None)
    if base is not None:
        lines += ["", f"Base model (before training): {base:.1%} held-out accuracy."]
    name = summary.get("flops_convention")
    if name in FLOPS_CONVENTIONS:
        lines += ["", f"FLOPs are `{name}`: {FLOPS_CONVENTIONS[name]} (docs/compare.md)."]
    elif name is not None:
        lines += ["", "**The runs counted their FLOPs in different conventions** (docs/compare.md); a FLOP share is "
                      "given only between runs of one convention. Per run:", ""]
        for v, row in summary["variants"].items():
            lines.append(f"- {v}: " + ", ".join(f"seed {p['seed']} `{p['flops_convention']}`" for p in row["per_seed"]))
    versions = summary["code_versions"]
    lines += ["", "Code version of the runs: " + ", ".join(f"`{v}`" for v in versions) + "."]
    if len(versions) > 1:
        lines += ["**The runs were made by different code versions**; per run:", ""]
        for v, row in summary["variants"].items():
            lines.append(f"- {v}: " + ", ".join(f"seed {p['seed']} `{p['code_version']}`" for p in row["per_seed"]))
    if one_machine([p.get("machine") for row in summary["variants"].values() for p in row["per_seed"]]) is not True:
        lines += ["", "**The runs were not all timed on one machine** (or not all recorded theirs in full; see the "
                      "runs' table): wall-clock ratios are given only between runs timed on one machine. Accuracies "
                      "and positions computed do not depend on it."]
    runs = [(v, p) for v, row in summary["variants"].items() for p in row["per_seed"]]
    loaded = [f"{v} seed {p['seed']} ({_load(p):.1f})" for v, p in runs if p.get("quiet") is False]
    if loaded:
        lines += ["", f"**Some runs ran on a loaded machine** (1-minute load average above its CPUs + {LOAD_MARGIN} "
                      f"at start or end): {', '.join(loaded)}. Wall-clock ratios with them are withheld; accuracies "
                      "and positions computed do not depend on it."]
    unrecorded = [p for _, p in runs if p.get("quiet") is None]
    if unrecorded:
        lines += ["", f"{len(unrecorded)} of {len(runs)} runs recorded no load average (runs made before d3s "
                      "recorded it, or on a platform without one): wall-clock ratios with them are given, marked "
                      "unverified, since nothing shows whether other work shared the machine."]
    unchecked = [f"{v} seed {p['seed']}" for v, row in summary["variants"].items() for p in row["per_seed"]
                 if not p["recipe_checked"]]
    if unchecked:
        lines += ["", f"Recipe not recorded, so not checked against this command: {', '.join(unchecked)}."]
    return lines


def _shown(ci, p_holm: float | None, fmt=_points) -> str:
    """A paired interval, and "not shown" unless the difference is shown (`stats.shown`: the interval excludes
    zero and the Holm-corrected sign-flip p-value is below 0.05); the corrected p where only it disagrees."""
    if ci is None:
        return "-"
    if shown(ci, p_holm):
        return _ci(ci, fmt)
    if ci[0] <= 0 <= ci[1] or p_holm is None:
        return _ci(ci, fmt) + " (not shown)"
    return _ci(ci, fmt) + f" (not shown: corrected p = {_p(p_holm)})"


def _loo(r, fmt=_points) -> str:
    return "-" if r is None else f"{fmt(r[0])} to {fmt(r[1])}"


def _budget(summary: dict) -> list[str]:
    """The compute-matched race: accuracy at the reference's compute, area under the curve, compute to target."""
    ref = summary["reference"]
    if summary.get("mode") != "budget":
        return []
    rows, seeds = [], []
    for v, row in summary["variants"].items():
        b = row["budget"]
        per = b["per_seed"]
        accs = [p["accuracy_at_budget"] for p in per.values()]
        reached = f"{b['seeds_reaching_target']}/{len(per)} ({b['seeds_reaching_target_early']} by {b['early_share']:.1f})"
        mine = v != ref
        rows.append([v, _pct(sum(accs) / len(accs)), _points(b["diff_at_budget_mean"]) if mine else "-",
                     _shown(b["diff_at_budget_ci"], b["p_value_holm"]) if mine else "-",
                     _p(b["p_value"]), _p(b["p_value_holm"]), _loo(b["leave_one_out"]),
                     f"{100 * b['diff_at_budget_mdd']:.1f}" if mine and b["diff_at_budget_mdd"] is not None else "-",
                     _pct(b["probability_of_improvement"]) if mine else "-",
                     _points(b["auc_diff_mean"]) if mine and b["auc_diff_mean"] is not None else "-",
                     _shown(b["auc_diff_ci"], b["auc_p_value_holm"]) if mine else "-",
                     _p(b["auc_p_value"]), _p(b["auc_p_value_holm"]), reached,
                     _share(b["compute_to_target_median"])])
        for s, p in per.items():
            seeds.append([v, s, _pct(p["accuracy_at_budget"]), _pct(p["auc"]), _share(p["compute_to_target"]),
                          _share(p["share_spent"]), p["stopped_by"] or "-", _minutes(p["wall_s"])])
    n = len(summary["seeds"])
    table = _section(
        f"At {ref}'s compute (the headline)",
        f"Every variant trained on the FLOPs ({_flops_unit(summary)}) of the same seed's {ref} run "
        "(docs/compare.md), its "
        "learning rate and N/K schedule over the share of them spent, evaluated at the same compute shares. Paired "
        f"by seed against {ref}, in points: the mean difference with its 95% t-interval over {n} seeds, the exact "
        "sign-flip p-value of the mean (p) and that p Holm-corrected over the variants of this table (Holm p), "
        "the range of the mean with any one seed left out, the minimum detectable difference at this seed count "
        "(80% power), the share of seeds it beat the reference (ties half); the same for the area under accuracy "
        "against compute share (the mean accuracy over the budget; its own Holm family); and the seeds that "
        f"reached the same seed's {ref} final accuracy and stayed there, with how many did by the share in "
        "brackets, and the median compute share they needed. A difference is 'not shown' unless its interval "
        "excludes zero and its Holm p is below 0.05 (docs/compare.md, \"Statistics\"); with n seeds the "
        "sign-flip p is at least 2/2^n.",
        ["variant", "acc at budget", f"vs {ref}", "paired 95% CI", "p", "Holm p", "leave one out", "MDD",
         "P(better)", "AUC vs ref", "AUC 95% CI", "AUC p", "AUC Holm p", "reached and held",
         "median compute to target"], rows)
    per_seed = _section(
        f"At {ref}'s compute, seed by seed",
        f"Compute shares are of the same seed's {ref} run; 'spent' is where the run stopped (the step boundary "
        "nearest the budget), 'stopped by' what ended it (max_steps: the cap on steps came first).",
        ["variant", "seed", "acc at budget", "AUC", "compute to target", "spent", "stopped by", "training wall-clock"],
        seeds)
    return [*table, "", *per_seed]


def render_markdown(summary: dict, command: str) -> str:
    """`compare.md`: the sections above, under a title naming the seeds and the command."""
    seeds = summary["seeds"]
    lines = [
        f"# d3s compare ({len(seeds)} seed{'s' if len(seeds) != 1 else ''}: {', '.join(map(str, seeds))})",
        "",
        f"Command: `{command}`",
        "",
    ]
    budget = _budget(summary)
    lines += [*budget, ""] if budget else []
    lines += _accuracy(summary)
    for section in (_cost, _cost_per_seed, _step_time, _generation, _pairing, _runs):
        body = section(summary)
        if body:
            lines += ["", *body]
    return "\n".join(lines + _notes(summary)) + "\n"
