"""Add the machine to runs made before `d3s train` recorded it, from an `lscpu` output saved when they ran.

    python benchmarks/record_machine.py benchmarks/results/campaign5-arith2digit/grpo-seed1 \
        --lscpu benchmarks/results/campaign-arith2digit/lscpu.txt

Each run folder's `run_config.json` gets a `machine` entry like the one `d3s train` records (CPU model, logical
CPUs, the speed-relevant flags; no accelerator, one process, torch not known), marked with where it came from:
`"source": "lscpu output saved with the runs: <file>"`. A run that already records its machine is left as it
is, and so is a folder without `run_config.json`. `d3s compare` then pairs wall-clocks by machine (its seed by
seed table says whether two runs were timed on one machine).

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# as `d3s.app.runfolder._CPU_FLAGS` (tests/test_compare_summary.py checks they agree)
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")


def machine_from_lscpu(text: str, source: str) -> dict:
    """The `machine` entry of a CPU run from `lscpu`'s output (its "Model name", "CPU(s)" and "Flags" lines)."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    missing = [k for k in ("Model name", "CPU(s)", "Flags") if k not in fields]
    if missing:
        raise ValueError(f"{source}: no {', '.join(missing)} line; give the output of `lscpu`")
    flags = set(fields["Flags"].split())
    return {"cpu": fields["Model name"], "cpu_count": int(fields["CPU(s)"]),
            "cpu_flags": [f for f in CPU_FLAGS if f in flags], "accelerator": None, "processes": 1, "torch": None,
            "source": f"lscpu output saved with the runs: {source}"}


def record(run: Path, machine: dict) -> str:
    """Add `machine` to the run's `run_config.json` unless it records one; says what it did."""
    path = run / "run_config.json"
    if not path.is_file():
        return f"{run}: no run_config.json, left as it is"
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("machine"):
        return f"{run}: records its machine already, left as it is"
    config["machine"] = machine
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return f"{run}: machine added"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (each with run_config.json)")
    parser.add_argument("--lscpu", type=Path, required=True, help="the lscpu output saved when the runs ran")
    args = parser.parse_args(argv)
    try:
        machine = machine_from_lscpu(args.lscpu.read_text(encoding="utf-8"), str(args.lscpu))
    except (OSError, ValueError) as err:
        print(f"record_machine: {err}", file=sys.stderr)
        return 2
    for run in args.runs:
        print(record(run, machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
