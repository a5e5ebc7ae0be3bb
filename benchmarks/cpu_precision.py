"""Does bf16 autocast pay on this CPU? The same short `d3s train` (default recipe, held-out evaluation off) in
fp32 and in bf16, alternated, each repeated; prints the step time and its parts per precision, and the ratio.

    python benchmarks/cpu_precision.py [--variant grpo] [--steps 3] [--repeats 2] [--out DIR]

Run it with nothing else on the machine; record `lscpu` flags with the figures. The first step of every run
is left out of the medians (it pays one-off costs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PARTS = ("generation", "forward", "backward")


def one_run(out: Path, precision: str, variant: str, steps: int) -> list[dict]:
    cmd = [sys.executable, "-m", "d3s.cli", "train", "--variant", variant, "--max_steps", str(steps),
           "--eval_every", "0", "--plots", "false", "--precision", precision, "--output_dir", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", **os.environ})
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["type"] == "train"][1:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", default="grpo")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="write the per-step figures here as JSON")
    args = ap.parse_args()
    steps: dict[str, list[dict]] = {"fp32": [], "bf16": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for precision in ("fp32", "bf16"):
                got = one_run(Path(tmp) / f"{precision}-{i}", precision, args.variant, args.steps)
                steps[precision] += got
                print(f"run {i + 1}/{args.repeats} {precision}: step times "
                      f"{[round(r['step_time'], 1) for r in got]} s", flush=True)
    table = {p: {"step": statistics.median(r["step_time"] for r in rs),
                 **{part: statistics.median(r[f"d3s/time/{part}"] for r in rs) for part in PARTS}}
             for p, rs in steps.items()}
    print(f"\nmedian seconds per step ({args.variant}, {len(steps['fp32'])} steps each, first step of a run left out)")
    print(f"{'':6}" + "".join(f"{k:>12}" for k in ("step", *PARTS)))
    for p, row in table.items():
        print(f"{p:6}" + "".join(f"{row[k]:12.2f}" for k in ("step", *PARTS)))
    print("bf16/fp32" + "".join(f"{table['bf16'][k] / table['fp32'][k]:12.2f}" for k in ("step", *PARTS))[3:])
    if args.out:
        args.out.write_text(json.dumps({"variant": args.variant, "medians": table, "steps": steps}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
