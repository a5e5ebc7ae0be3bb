"""What `prompt_skip` and `dynamic_sampling` bought in a comparison: each setting against a baseline, paired by seed.

    python benchmarks/prompt_options_report.py benchmarks/results/prompt-options-default \
        --baseline d3s+min_tokens_per_rollout=4 [--seeds 3,4,5] [--output report.md]

Reads the run folders `<setting>-seed<k>` of a `d3s compare` output folder (every setting that has all the
seeds; the report names the settings it leaves out and the seeds they lack) and prints markdown:

- per setting, mean over seeds: steps with no signal, groups generated, prompts skipped, flat groups generated
  and prompts left unfilled per step, generation seconds per step and per group with signal (all generation and
  reward-scoring seconds of the run / all groups with signal handed to training), groups generated per group
  with signal (the same ratio in generation work, which does not depend on the machine), final held-out
  accuracy;
- against the baseline, paired by seed: the generation seconds per group with signal as a ratio (baseline /
  setting: above 1 is cheaper), and the final accuracy difference in points with a 95% t-interval over seeds;
- per run: the same numbers, so a reader can see which seed did what;
- with a `grpo` run for every seed: the training wall-clock each setting takes to reach GRPO's final mean
  accuracy (at the first held-out evaluation after training began at or above it, as `d3s compare` counts),
  and its ratio to GRPO's whole training wall-clock of the same seed, given only where both runs recorded one
  machine (`d3s.app.machine.same_machine`, the rule `d3s compare` uses; "different machines" or "machine
  unknown" otherwise).

Seconds are wall-clock: compare runs timed on one machine with nothing else running.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

from d3s.app.compare.summary import _run_machine
from d3s.app.intervals import mean_interval
from d3s.app.machine import same_machine
from d3s.app.records import TIME_PREFIX
from d3s.app.runfiles import read_run_records, read_summary

COUNTS = ("d3s/groups_generated", "d3s/signal_groups", "d3s/flat_groups_generated", "d3s/prompts_skipped",
          "d3s/prompts_unfilled", "d3s/generation_rounds", "d3s/no_signal_step")


def run_numbers(folder: Path) -> dict:
    """One finished run: its final accuracy, training wall-clock, evaluations and generation totals."""
    summary, problem = read_summary(folder)
    if summary is None:
        raise SystemExit(f"{folder}: {problem}")
    records = read_run_records(folder / "metrics.jsonl")
    train = [r for r in records if r.get("type") == "train"]
    if not train or "d3s/signal_groups" not in train[0]:
        raise SystemExit(f"{folder}: its records have no generation metrics (d3s/signal_groups); rerun it")
    totals = {key: sum(r.get(key) or 0.0 for r in train) for key in COUNTS}
    seconds = sum(r.get(TIME_PREFIX + "generation") or 0.0 for r in train)
    signal = totals["d3s/signal_groups"]
    return {
        "final": summary["after"]["accuracy"],
        "train_wall_s": summary["train_wall_s"],
        "machine": _run_machine(folder),
        "evals": [r for r in records if r.get("type") == "eval" and r["step"] > 0],
        "steps": len(train),
        "no_signal": totals["d3s/no_signal_step"] / len(train),
        "generated": totals["d3s/groups_generated"] / len(train),
        "skipped": totals["d3s/prompts_skipped"] / len(train),
        "flat": totals["d3s/flat_groups_generated"] / len(train),
        "unfilled": totals["d3s/prompts_unfilled"] / len(train),
        "gen_s_step": seconds / len(train),
        "gen_s_signal": seconds / signal if signal else None,
        "generated_per_signal": totals["d3s/groups_generated"] / signal if signal else None,
    }


def settings_in(folder: Path, seeds: list[int] | None,
                baseline: str | None = None) -> tuple[dict[str, dict[int, dict]], list[int], dict[str, list[int]]]:
    """`{setting: {seed: numbers}}` for the settings that have every seed, the seeds (default: the baseline's,
    else those every setting has), and `{setting: seeds it lacks}` for the settings left out."""
    found: dict[str, dict[int, Path]] = {}
    for path in sorted(folder.iterdir()):
        match = re.fullmatch(r"(.+)-seed(\d+)", path.name)
        if match and (path / "summary.json").is_file():
            found.setdefault(match.group(1), {})[int(match.group(2))] = path
    if not found:
        raise SystemExit(f"{folder}: no finished run folder (<setting>-seed<k> with summary.json)")
    if seeds is None:
        seeds = sorted(found[baseline]) if baseline in found else sorted(set.intersection(*map(set, found.values())))
    complete = {name: runs for name, runs in found.items() if all(s in runs for s in seeds)}
    left_out = {name: [s for s in seeds if s not in runs] for name, runs in found.items() if name not in complete}
    return {name: {s: run_numbers(runs[s]) for s in seeds} for name, runs in complete.items()}, seeds, left_out


def _fmt(value, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def _ratio_mean(base: dict[int, dict], mine: dict[int, dict], key: str) -> float | None:
    """Geometric mean over seeds of baseline / setting (a ratio of costs: above 1, the setting is cheaper)."""
    ratios = [base[s][key] / mine[s][key] for s in base if base[s][key] and mine[s][key]]
    return statistics.geometric_mean(ratios) if ratios else None


def to_target(run: dict, target: float) -> float | None:
    hit = next((e for e in run["evals"] if e["accuracy"] >= target - 1e-12), None)
    return None if hit is None else hit["wall_s"]


def wall_ratio(run: dict, grpo: dict, wall: float) -> str:
    """`wall` as a share of the GRPO run's training wall-clock, only where both were timed on one machine."""
    same = same_machine(run["machine"], grpo["machine"])
    if same is None:
        return "machine unknown"
    return f"{wall / grpo['train_wall_s']:.2f}x" if same else "different machines"


def report(folder: Path, baseline: str, seeds: list[int] | None) -> str:
    table, seeds, left_out = settings_in(folder, seeds, baseline)
    if baseline not in table:
        raise SystemExit(f"--baseline {baseline!r} has no run for every seed {seeds} in {folder}; settings with "
                         f"all of them: {', '.join(table) or 'none'}")
    names = [baseline] + [n for n in table if n not in (baseline, "grpo")]
    base = table[baseline]
    out = [f"# What the prompt options bought ({folder.name}, seeds {', '.join(map(str, seeds))})", "",
           f"Baseline: `{baseline}`. Per training step, mean over seeds; ratios and differences paired by seed.", ""]
    if left_out:
        out += ["Left out, for want of a seed: " + "; ".join(
            f"`{name}` (no seed {', '.join(map(str, missing))})" for name, missing in left_out.items()) + ".", ""]
    out += ["| setting | steps with no signal | groups generated | prompts skipped | flat groups generated | "
            "prompts unfilled | generation s per step | generation s per group with signal | vs baseline "
            "(x cheaper) | groups generated per group with signal | final acc | vs baseline (points) | "
            "paired 95% CI |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        runs = table[name]
        diffs = [100 * (runs[s]["final"] - base[s]["final"]) for s in seeds]
        ci = mean_interval(diffs) if name != baseline else None
        row = [f"`{name}`", _fmt(_mean(r["no_signal"] for r in runs.values()) * 100, ".1f", "%"),
               _fmt(_mean(r["generated"] for r in runs.values()), ".2f"),
               _fmt(_mean(r["skipped"] for r in runs.values()), ".2f"),
               _fmt(_mean(r["flat"] for r in runs.values()), ".2f"),
               _fmt(_mean(r["unfilled"] for r in runs.values()), ".2f"),
               _fmt(_mean(r["gen_s_step"] for r in runs.values()), ".1f"),
               _fmt(_mean(r["gen_s_signal"] for r in runs.values()), ".2f"),
               "-" if name == baseline else _fmt(_ratio_mean(base, runs, "gen_s_signal"), ".2f", "x"),
               _fmt(_mean(r["generated_per_signal"] for r in runs.values()), ".2f"),
               _fmt(100 * statistics.mean(r["final"] for r in runs.values()), ".1f", "%"),
               "-" if name == baseline else f"{statistics.mean(diffs):+.1f}",
               "-" if ci is None else f"[{ci[0]:+.1f}, {ci[1]:+.1f}]"]
        out.append("| " + " | ".join(row) + " |")
    out += ["", "Per run:", "",
            "| setting | seed | steps with no signal | prompts skipped | flat groups | generation s per group with "
            "signal | groups generated per group with signal | training wall-clock | final acc |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        for s in seeds:
            r = table[name][s]
            out.append(f"| `{name}` | {s} | {100 * r['no_signal']:.0f}% | {r['skipped'] * r['steps']:.0f} | "
                       f"{r['flat'] * r['steps']:.0f} | {_fmt(r['gen_s_signal'], '.2f')} | "
                       f"{_fmt(r['generated_per_signal'], '.2f')} | {r['train_wall_s'] / 60:.1f} min | "
                       f"{100 * r['final']:.1f}% |")
    if "grpo" in table:
        grpo = table["grpo"]
        target = statistics.mean(r["final"] for r in grpo.values())
        out += ["", f"Training wall-clock to GRPO's final mean accuracy ({100 * target:.1f}%), and its ratio to GRPO's "
                "whole training wall-clock of the same seed ('-': not reached):", "",
                "| setting | " + " | ".join(f"seed {s}" for s in seeds) + " | reached |",
                "|---|" + "---|" * (len(seeds) + 1)]
        for name in ["grpo"] + names:
            cells, reached = [], 0
            for s in seeds:
                wall = to_target(table[name][s], target)
                reached += wall is not None
                cells.append("-" if wall is None else f"{wall / 60:.1f} min ({wall_ratio(table[name][s], grpo[s], wall)})")
            out.append(f"| `{name}` | " + " | ".join(cells) + f" | {reached}/{len(seeds)} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a d3s compare output folder")
    parser.add_argument("--baseline", required=True, help="the setting the others are paired against, e.g. d3s")
    parser.add_argument("--seeds", default=None,
                        help="comma-separated seeds (default: the baseline's)")
    parser.add_argument("--output", type=Path, default=None, help="also write the report to this file")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        parser.error(f"{args.folder} is not a folder")
    seeds = None if args.seeds is None else [int(s) for s in args.seeds.split(",")]
    text = report(args.folder, args.baseline, seeds)
    sys.stdout.write(text)
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
