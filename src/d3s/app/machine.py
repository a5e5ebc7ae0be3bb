"""The machine a run was timed on (`run_config.json`'s `machine`), and when two runs were timed on one machine.

A record names the CPU by its vendor, model name, family, model number and stepping (the model name alone does
not: "AMD EPYC" names CPUs of several generations), with its logical CPUs and the flags that decide how fast it
trains; then the accelerator, the processes, the torch version and its threads.

The same-machine rule (`same_machine`), the one place `d3s compare` asks: two records are one machine when their
CPU vendor, model name, family, model, stepping, flags and logical CPUs agree, and so do their accelerator and
processes (the torch version and threads are software: not compared). A record without family, model or stepping
(a run made before they were recorded, and not backfilled from an `lscpu` output saved with it) is unknown: it
is one machine with nothing, so its wall-clock is compared with no other run's.

The quiet rule (`quiet`), the one place `d3s compare` asks whether a run's wall-clock was its own: every run
records the machine's load average and CPU count when it starts (`run_config.json`'s `load_start`) and, with that,
when it ends (`summary.json`'s `load`: `start` and `end`). A run is quiet when its 1-minute load average was at
most its CPU count + `LOAD_MARGIN` at both. The reason: the load average counts the threads running or waiting
to run, averaged over the last minute; a training run keeps about one thread per CPU busy (torch's threads), so
a machine running only it, or the run before it in a `d3s compare`, sits near its CPU count; more than half a
CPU above that means other work shared the CPUs for much of the minute. Two samples, not a trace: a job that
came and went in the middle of a run is not seen. The load average is the whole machine's (in a container, the
host's, as is the CPU count recorded with it).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

# CPU features that decide how fast a CPU trains (bf16 and wide vectors); the rest of the flags are not recorded
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")

# What names the CPU: all must be recorded for a machine to be known, and all must agree for two to be one
CPU_IDENTITY = ("cpu_vendor", "cpu", "cpu_family", "cpu_model", "cpu_stepping")
SAME_MACHINE_FIELDS = (*CPU_IDENTITY, "cpu_flags", "cpu_count", "accelerator", "processes")


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def cpu_from_cpuinfo(text: str) -> dict[str, Any]:
    """The CPU fields of a record from the text of /proc/cpuinfo (its first processor): `vendor_id`, `model
    name`, `cpu family`, `model`, `stepping`, and which of `CPU_FLAGS` its `flags` list. A field the text lacks
    (an ARM cpuinfo has no `model name`) is None."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())  # the first processor's
    flags = set(fields.get("flags", "").split())
    return {"cpu_vendor": fields.get("vendor_id") or None, "cpu": fields.get("model name") or None,
            "cpu_family": _int(fields.get("cpu family")), "cpu_model": _int(fields.get("model")),
            "cpu_stepping": _int(fields.get("stepping")), "cpu_flags": [f for f in CPU_FLAGS if f in flags]}


def _this_cpu() -> dict[str, Any]:
    """This CPU's fields, from /proc/cpuinfo (Linux); elsewhere the platform's processor name and None."""
    try:
        cpu = cpu_from_cpuinfo(Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        cpu = {"cpu_vendor": None, "cpu": None, "cpu_family": None, "cpu_model": None, "cpu_stepping": None,
               "cpu_flags": []}
    cpu["cpu"] = cpu["cpu"] or platform.processor() or None
    return cpu


def machine_description(accelerator: str | None = None) -> dict[str, Any]:
    """What a run is timed on, recorded with it: the CPU (`cpu_from_cpuinfo`), its logical CPUs, the accelerator
    that trains (`accelerator`: its name, None on a CPU), the number of processes, torch's version and threads."""
    import torch

    return {**_this_cpu(), "cpu_count": os.cpu_count(), "accelerator": accelerator,
            "processes": int(os.environ.get("WORLD_SIZE", "1")), "torch": torch.__version__.split("+")[0],
            "torch_threads": torch.get_num_threads()}


LOAD_MARGIN = 0.5
"""How far above its CPU count a quiet run's 1-minute load average may be (see the module docstring)."""


def machine_load() -> dict[str, Any] | None:
    """The machine's load now: `{"load_1min", "load_5min", "cpu_count"}` (`os.getloadavg()`, `os.cpu_count()`);
    None where the platform has no load average."""
    try:
        one, five, _ = os.getloadavg()
    except (AttributeError, OSError):
        return None
    return {"load_1min": round(one, 2), "load_5min": round(five, 2), "cpu_count": os.cpu_count()}


def quiet(load: dict | None) -> bool | None:
    """Whether a run was quiet (the rule in the module docstring), from its summary's `load` (`{"start": ...,
    "end": ...}`, each a `machine_load()`): True when the 1-minute load average at start and at end was at most
    the CPU count + `LOAD_MARGIN`, False when one was above, None when the run recorded no load (made before
    runs recorded it, or on a platform without one)."""
    samples = [(load or {}).get(k) for k in ("start", "end")]
    if not all(samples) or any(s.get("cpu_count") is None for s in samples):
        return None
    return all(s["load_1min"] <= s["cpu_count"] + LOAD_MARGIN for s in samples)


def all_quiet(verdicts: list[bool | None]) -> bool | None:
    """`quiet` over runs: False when one was loaded, True when every one was quiet, else None (no record)."""
    if False in verdicts:
        return False
    return True if verdicts and all(v is True for v in verdicts) else None


def machine_known(machine: dict | None) -> bool:
    """Whether a record names its CPU fully (`CPU_IDENTITY`); older records lack family, model and stepping."""
    return bool(machine) and all(machine.get(k) is not None for k in CPU_IDENTITY)


def same_machine(a: dict | None, b: dict | None) -> bool | None:
    """Whether two runs were timed on one machine (the rule in the module docstring): True when both records are
    known and agree on `SAME_MACHINE_FIELDS`; False when they differ in a field both record; None (unknown)
    otherwise. Only True allows comparing their wall-clocks."""
    if not a or not b:
        return None
    # family, model and stepping may be missing (unknown); the other fields every record has (None: no accelerator)
    if any(a.get(k) is not None and b.get(k) is not None and a[k] != b[k] for k in CPU_IDENTITY) or any(
            a.get(k) != b.get(k) for k in SAME_MACHINE_FIELDS if k not in CPU_IDENTITY):
        return False
    return True if machine_known(a) and machine_known(b) else None


def one_machine(machines: list[dict | None]) -> bool | None:
    """`same_machine` over a list: True when every record is one machine with the first, False when one is known
    to differ, else None. An empty list is None."""
    if not machines:
        return None
    verdicts = [same_machine(machines[0], m) for m in machines]
    if False in verdicts:
        return False
    return True if all(v is True for v in verdicts) else None


def machine_label(machine: dict | None) -> str:
    """A short name for a recorded machine, e.g. "Intel(R) Xeon(R) Processor (6/207/2), 2 CPUs, AVX-512 bf16":
    the model name, then family/model/stepping when recorded; "not recorded" for runs that recorded none."""
    if not machine:
        return "not recorded"
    if machine.get("accelerator"):
        label = machine["accelerator"]
    else:
        flags = set(machine.get("cpu_flags") or [])
        isa = ("AVX-512 bf16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags
               else "AVX2" if "avx2" in flags else None)
        name = machine.get("cpu") or "unknown CPU"
        if machine_known(machine):
            name += f" ({machine['cpu_family']}/{machine['cpu_model']}/{machine['cpu_stepping']})"
        label = ", ".join(x for x in (name, f"{machine.get('cpu_count')} CPUs", isa) if x)
    processes = machine.get("processes") or 1
    return label + (f", {processes} processes" if processes > 1 else "")


def wall_not_compared(verdict: bool | None) -> str:
    """What a table says in place of a wall-clock ratio between runs not known to be on one machine."""
    return "not compared: " + ("different machines" if verdict is False else "machine unknown")
