"""Add the machine to runs made before `d3s train` recorded it, from an `lscpu` output saved when they ran.

    python benchmarks/record_machine.py benchmarks/results/campaign5-arith2digit/grpo-seed1 \
        --lscpu benchmarks/results/campaign-arith2digit/lscpu.txt

Each run folder's `run_config.json` gets a `machine` entry like the one `d3s train` records (CPU vendor, model
name, family, model, stepping, logical CPUs, the speed-relevant flags; no accelerator, one process, torch not
known), marked with where it came from: `"source": "lscpu output saved with the runs: <file>"`.

A run that records its machine already gets only the CPU fields it lacks (`cpu_vendor`, `cpu_family`,
`cpu_model`, `cpu_stepping`: runs made before `d3s train` recorded them), with `"cpu_id_source"` naming the
file, when its entry came from this same file, or was recorded by `d3s train` and names the same CPU (model
name, logical CPUs, flags); an entry from another file or naming another CPU is left as it is, and so is a
folder without `run_config.json`. Give only runs the file is known to belong to (the results folder's README
says they ran on that machine): `d3s compare` pairs wall-clocks only between runs whose records name one
machine (`d3s.app.machine.same_machine`), and a record without family, model and stepping is unknown, paired
with nothing.

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# as `d3s.app.machine.CPU_FLAGS` (tests/test_machine.py checks they agree)
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")


def machine_from_lscpu(text: str, source: str) -> dict:
    """The `machine` entry of a CPU run from `lscpu`'s output: its "Vendor ID", "Model name", "CPU family", "Model",
    "Stepping", "CPU(s)" and "Flags" lines (an output without family, model or stepping records them as None)."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    missing = [k for k in ("Model name", "CPU(s)", "Flags") if k not in fields]
    if missing:
        raise ValueError(f"{source}: no {', '.join(missing)} line; give the output of `lscpu`")
    flags = set(fields["Flags"].split())

    def number(key: str) -> int | None:
        return int(fields[key]) if fields.get(key, "").isdigit() else None

    return {"cpu_vendor": fields.get("Vendor ID") or None, "cpu": fields["Model name"],
            "cpu_family": number("CPU family"), "cpu_model": number("Model"), "cpu_stepping": number("Stepping"),
            "cpu_count": int(fields["CPU(s)"]),
            "cpu_flags": [f for f in CPU_FLAGS if f in flags], "accelerator": None, "processes": 1, "torch": None,
            "source": f"lscpu output saved with the runs: {source}"}


CPU_ID = ("cpu_vendor", "cpu_family", "cpu_model", "cpu_stepping")


def record(run: Path, machine: dict) -> str:
    """Add `machine` to the run's `run_config.json`, or the CPU fields its recorded machine lacks (see the module
    docstring); says what it did."""
    path = run / "run_config.json"
    if not path.is_file():
        return f"{run}: no run_config.json, left as it is"
    config = json.loads(path.read_text(encoding="utf-8"))
    saved = config.get("machine")
    if not saved:
        config["machine"] = machine
        done = "machine added"
    else:
        missing = [k for k in CPU_ID if saved.get(k) is None and machine.get(k) is not None]
        if not missing:
            return f"{run}: records its machine already, left as it is"
        from_this_file = saved.get("source") == machine["source"]
        same_cpu = all(saved.get(k) == machine[k] for k in ("cpu", "cpu_count", "cpu_flags"))
        if saved.get("source") and not from_this_file:
            return f"{run}: its machine came from another file ({saved['source']}), left as it is"
        if not (from_this_file or same_cpu):
            return f"{run}: records another CPU ({saved.get('cpu')}, {saved.get('cpu_flags')}), left as it is"
        saved.update({k: machine[k] for k in missing})
        saved["cpu_id_source"] = machine["source"]
        done = f"{', '.join(missing)} added"
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return f"{run}: {done}"


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
