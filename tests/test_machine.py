"""The machine record of a run (`d3s.app.machine`): read from /proc/cpuinfo or a saved `lscpu` output, and the one
rule that says when two runs' wall-clocks compare."""

import importlib.util
import json
import os
from pathlib import Path

from d3s.app import machine
from d3s.app.machine import (LOAD_MARGIN, all_quiet, cpu_from_cpuinfo, machine_description, machine_label,
                             machine_load, one_machine, quiet, same_machine)

_ZEN4 = {"cpu_vendor": "AuthenticAMD", "cpu": "AMD EPYC", "cpu_family": 25, "cpu_model": 17, "cpu_stepping": 1,
         "cpu_count": 2, "cpu_flags": ["avx2", "avx512f", "avx512_bf16"], "accelerator": None, "processes": 1,
         "torch": "2.13.0", "torch_threads": 2}
_ZEN5 = {**_ZEN4, "cpu_family": 26, "cpu_model": 2}
_OLD = {k: v for k, v in _ZEN4.items() if k not in ("cpu_vendor", "cpu_family", "cpu_model", "cpu_stepping")}

_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16 fma

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16 fma
"""

_LSCPU = """Architecture:                         x86_64
CPU(s):                               2
Vendor ID:                            AuthenticAMD
Model name:                           AMD EPYC
CPU family:                           25
Model:                                17
Thread(s) per core:                   1
Stepping:                             1
Flags:                                fpu sse2 avx avx2 avx512f avx512_bf16 fma
"""


def test_same_model_name_of_another_family_is_another_machine():
    assert same_machine(_ZEN4, {**_ZEN4, "torch": "2.14.0", "torch_threads": 1}) is True  # software: not the machine
    assert same_machine(_ZEN4, _ZEN5) is False  # both "AMD EPYC" with the same flags: two generations
    for field, value in (("cpu_stepping", 2), ("cpu_vendor", "GenuineIntel"), ("cpu_count", 4),
                         ("cpu_flags", ["avx2"]), ("processes", 2), ("accelerator", "NVIDIA H200")):
        assert same_machine(_ZEN4, {**_ZEN4, field: value}) is False, field


def test_a_record_without_family_model_stepping_is_unknown():
    assert same_machine(_OLD, _OLD) is None and same_machine(_OLD, _ZEN4) is None
    assert same_machine(_ZEN4, None) is None and same_machine(None, None) is None
    assert same_machine(_OLD, {**_OLD, "cpu_count": 4}) is False  # a difference both record is still one
    assert one_machine([_ZEN4, _ZEN4, {**_ZEN4, "torch": "2.14.0"}]) is True
    assert one_machine([_ZEN4, _OLD]) is None and one_machine([_ZEN4, _OLD, _ZEN5]) is False
    assert one_machine([]) is None


def test_record_from_proc_cpuinfo_text():
    assert cpu_from_cpuinfo(_CPUINFO) == {"cpu_vendor": "AuthenticAMD", "cpu": "AMD EPYC", "cpu_family": 26,
                                          "cpu_model": 2, "cpu_stepping": 1, "cpu_flags": ["avx2", "avx512f",
                                                                                           "avx512_bf16"]}
    arm = cpu_from_cpuinfo("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\nCPU part\t: 0xd0c\n")
    assert arm == {"cpu_vendor": None, "cpu": None, "cpu_family": None, "cpu_model": None, "cpu_stepping": None,
                   "cpu_flags": []}


def test_machine_description_reads_this_machine(monkeypatch):
    import torch

    monkeypatch.setenv("WORLD_SIZE", "3")
    m = machine_description("Some GPU")
    assert m["cpu_count"] == os.cpu_count() and m["processes"] == 3 and m["accelerator"] == "Some GPU"
    assert m["torch_threads"] == torch.get_num_threads()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():  # Linux: the first processor's fields
        expected = cpu_from_cpuinfo(cpuinfo.read_text())
        assert {k: m[k] for k in expected if k != "cpu"} == {k: v for k, v in expected.items() if k != "cpu"}
        if expected["cpu"]:
            assert m["cpu"] == expected["cpu"]


def _sample(one: float, cpus: int = 2) -> dict:
    return {"load_1min": one, "load_5min": 0.7, "cpu_count": cpus}


def test_a_run_is_quiet_when_its_load_stays_within_its_cpus_and_a_margin():
    # a training run on 2 CPUs loads them itself (about 2): quiet up to 2 + 0.5 at start and at end
    assert LOAD_MARGIN == 0.5
    assert quiet({"start": _sample(0.1), "end": _sample(2.5)}) is True
    assert quiet({"start": _sample(2.51), "end": _sample(2.0)}) is False  # another job at the start
    assert quiet({"start": _sample(1.0), "end": _sample(5.3)}) is False  # ... or at the end
    assert quiet({"start": _sample(5.3, cpus=8), "end": _sample(8.4, cpus=8)}) is True  # the margin is per machine
    # no record (a run made before runs recorded their load, or no load average on the platform): unknown
    assert quiet(None) is None and quiet({"start": None, "end": _sample(1.0)}) is None
    assert quiet({"start": _sample(1.0, cpus=None), "end": _sample(1.0, cpus=None)}) is None  # CPUs unknown
    assert all_quiet([True, True]) is True and all_quiet([True, None]) is None and all_quiet([None, False]) is False
    assert all_quiet([]) is None


def test_machine_load_reads_this_machine(monkeypatch):
    load = machine_load()
    if hasattr(os, "getloadavg"):
        assert set(load) == {"load_1min", "load_5min", "cpu_count"} and load["cpu_count"] == os.cpu_count()
    monkeypatch.setattr(os, "getloadavg", lambda: (_ for _ in ()).throw(OSError("no load average")))
    assert machine_load() is None


def test_machine_labels():
    assert machine_label(None) == "not recorded"
    assert machine_label({**_ZEN4, "processes": 2}) == "AMD EPYC (25/17/1), 2 CPUs, AVX-512 bf16, 2 processes"
    assert machine_label({**_OLD, "cpu_flags": ["avx2"]}) == "AMD EPYC, 2 CPUs, AVX2"
    assert machine_label({**_ZEN4, "accelerator": "NVIDIA H200"}) == "NVIDIA H200"


def _record_machine():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "record_machine.py"
    spec = importlib.util.spec_from_file_location("record_machine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_record_from_lscpu_text():
    module = _record_machine()
    assert module.CPU_FLAGS == machine.CPU_FLAGS
    m = module.machine_from_lscpu(_LSCPU, "x/lscpu.txt")
    assert m == {"cpu_vendor": "AuthenticAMD", "cpu": "AMD EPYC", "cpu_family": 25, "cpu_model": 17,
                 "cpu_stepping": 1, "cpu_count": 2, "cpu_flags": ["avx2", "avx512f", "avx512_bf16"],
                 "accelerator": None, "processes": 1, "torch": None,
                 "source": "lscpu output saved with the runs: x/lscpu.txt"}
    assert same_machine(m, _ZEN4) is True and same_machine(m, _ZEN5) is False
    bare = module.machine_from_lscpu("CPU(s): 2\nModel name: AMD EPYC\nFlags: avx2\n", "y")  # a short output
    assert bare["cpu_family"] is None and same_machine(bare, bare) is None


def test_record_machine_fills_runs_and_adds_what_older_records_lack(tmp_path, capsys):
    module = _record_machine()
    lscpu = tmp_path / "lscpu.txt"
    lscpu.write_text(_LSCPU)
    source = f"lscpu output saved with the runs: {lscpu}"
    runs = {name: tmp_path / name for name in ("none", "recorded", "from_file", "other_file", "other_cpu", "full",
                                               "bare")}
    for run in runs.values():
        run.mkdir()
    configs = {"none": {"trainer": {"seed": 1}}, "recorded": {"machine": _OLD},
               "from_file": {"machine": {**_OLD, "torch": None, "source": source}},
               "other_file": {"machine": {**_OLD, "source": "lscpu output saved with the runs: elsewhere"}},
               "other_cpu": {"machine": {**_OLD, "cpu": "Intel(R) Xeon(R) Processor"}},
               "full": {"machine": _ZEN5}}
    for name, config in configs.items():
        (runs[name] / "run_config.json").write_text(json.dumps(config))
    assert module.main([*map(str, runs.values()), "--lscpu", str(lscpu)]) == 0

    def saved(name):
        return json.loads((runs[name] / "run_config.json").read_text())

    assert saved("none")["trainer"] == {"seed": 1}
    assert saved("none")["machine"] == {**module.machine_from_lscpu(_LSCPU, str(lscpu))}
    added = {"cpu_vendor": "AuthenticAMD", "cpu_family": 25, "cpu_model": 17, "cpu_stepping": 1,
             "cpu_id_source": source}
    assert saved("recorded")["machine"] == {**_OLD, **added}  # recorded by d3s train, the same CPU
    assert saved("from_file")["machine"] == {**_OLD, "torch": None, "source": source, **added}
    assert same_machine(saved("recorded")["machine"], _ZEN4) is True
    for name in ("other_file", "other_cpu", "full"):  # another file's, another CPU, complete: left alone
        assert saved(name) == configs[name], name
    assert not (runs["bare"] / "run_config.json").exists()
    out = capsys.readouterr().out
    assert "none: machine added" in out and "recorded: cpu_vendor, cpu_family, cpu_model, cpu_stepping added" in out
    assert "came from another file" in out and "records another CPU" in out and "no run_config.json" in out
    lscpu.write_text("Architecture: x86_64\n")
    assert module.main([str(runs["none"]), "--lscpu", str(lscpu)]) == 2
    assert "no Model name, CPU(s), Flags line" in capsys.readouterr().err
