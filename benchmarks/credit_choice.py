"""Each arm's tuned learning rate, from the tuning runs of `benchmarks/credit.sh tuning` (seeds 1-3, never reported
as results): the rate with the best mean held-out accuracy at the budget over the seeds (GRPO: after its 20 steps;
D1S-C: at the same seed's GRPO compute); a tie goes to the lower rate. Writes `credit-tuning/choice.json` and
`credit-tuning/choice.md`; trains nothing.

    python benchmarks/credit_choice.py [--results benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

RECIPE_RATE = 3e-05
ARMS = {"grpo": "credit-tuning-grpo", "d1s-c": "credit-tuning"}
MULTIPLES = (1, 2, 4)
SEEDS = (1, 2, 3)


def folder_name(arm: str, rate: float) -> str:
    return arm if rate == RECIPE_RATE else f"{arm}+learning_rate={rate!r}"


def choose(results: Path) -> dict:
    choice = {}
    for arm, campaign in ARMS.items():
        rows = []
        for multiple in MULTIPLES:
            rate = RECIPE_RATE * multiple
            accuracies = []
            for seed in SEEDS:
                summary = results / campaign / f"{folder_name(arm, rate)}-seed{seed}" / "summary.json"
                if not summary.is_file():
                    raise SystemExit(f"credit_choice: {summary} is missing: run `bash benchmarks/credit.sh tuning` first")
                accuracies.append(json.loads(summary.read_text())["after"]["accuracy"])
            rows.append({"multiple": multiple, "learning_rate": rate, "accuracies": accuracies,
                         "mean": statistics.mean(accuracies)})
        best = max(rows, key=lambda r: (round(r["mean"], 12), -r["learning_rate"]))
        choice[arm] = {"learning_rate": best["learning_rate"], "multiple": best["multiple"], "rates": rows}
    return choice


def markdown(choice: dict) -> str:
    lines = ["# Tuned learning rates (seeds 1-3; never reported as results)", "",
             "Written by `python benchmarks/credit_choice.py` from the tuning runs of `bash benchmarks/credit.sh tuning`: "
             "each arm takes the rate with the best mean held-out accuracy at the budget over seeds 1-3 (a tie: the "
             "lower rate). GRPO runs its 20 steps; D1S-C runs at the same seed's GRPO (1x) compute.", "",
             "| arm | rate | seeds 1, 2, 3 | mean | chosen |", "|---|---|---|---|---|"]
    for arm, c in choice.items():
        for r in c["rates"]:
            seeds = ", ".join(f"{a:.1%}" for a in r["accuracies"])
            chosen = "yes" if r["learning_rate"] == c["learning_rate"] else ""
            lines.append(f"| {arm} | {r['learning_rate']:g} ({r['multiple']}x) | {seeds} | {r['mean']:.1%} | {chosen} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="benchmarks/results", type=Path)
    args = parser.parse_args(argv)
    choice = choose(args.results)
    out = args.results / "credit-tuning"
    (out / "choice.json").write_text(json.dumps(choice, indent=2) + "\n")
    (out / "choice.md").write_text(markdown(choice))
    print(markdown(choice), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
