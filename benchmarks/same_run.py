"""Are two `d3s train` runs the same run? Every field of `summary.json` and of every `metrics.jsonl` record
must be equal, except wall-clock and timings (they differ between any two runs).

    python benchmarks/same_run.py RUN_A RUN_B     # exit 0 when equal; lists each differing record otherwise
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TIMING = {"wall_s", "train_wall_s", "command_wall_s", "step_seconds", "code_version", "step_time", "train_runtime",
          "d3s/generation_s_per_signal_group", "generation_s_per_signal_group",
          "train_samples_per_second", "train_steps_per_second", "load", "load_start"}


def without_timing(value):
    if isinstance(value, dict):
        return {k: without_timing(v) for k, v in value.items() if k not in TIMING and not k.startswith("d3s/time/")}
    if isinstance(value, list):
        return [without_timing(v) for v in value]
    return value


def main(a: Path, b: Path) -> int:
    sa, sb = (without_timing(json.loads((run / "summary.json").read_text())) for run in (a, b))
    ma, mb = ([without_timing(json.loads(line)) for line in (run / "metrics.jsonl").read_text().splitlines()]
              for run in (a, b))
    summary_diff = sorted(k for k in set(sa) | set(sb) if sa.get(k) != sb.get(k))
    records_diff = [(i, sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))) for i, (x, y) in enumerate(zip(ma, mb))]
    records_diff = [(i, keys) for i, keys in records_diff if keys]
    print(f"summary.json fields that differ: {summary_diff or 'none'}")
    print(f"metrics.jsonl: {len(ma)} and {len(mb)} records, {sum(len(r) for r in ma)} values compared")
    for i, keys in records_diff:
        print(f"  record {i} (step {ma[i].get('step')}, {ma[i].get('type')}): {keys}")
    same = not summary_diff and not records_diff and len(ma) == len(mb)
    print("the same run" if same else "NOT the same run")
    return 0 if same else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
