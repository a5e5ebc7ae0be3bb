#!/usr/bin/env python
"""Run TRL's own GRPOTrainer tests against D3SGRPOTrainer, offline, and print where the outcome differs from TRL's.

The repository does not carry TRL's tests: pass the path of a copy of TRL's `tests/test_grpo_trainer.py`
(or of its `tests/` folder), taken from the TRL repository at the version you test against. Next to it
the script uses TRL's `testing_utils.py`, `testing_constants.py`, `conftest.py`, `__init__.py` and
`data/` when they are there. Nothing is fetched: the tiny hub models and the `trl-internal-testing/zen`
datasets the tests load are built in code (scripts/trl_suite_conftest.py); tests needing anything else
(VLMs, vLLM, liger, GPUs, ...) skip or fail alike in every mode.

Modes, one pytest run each (in a subprocess, in a temporary copy of the tests):
    trl   TRL's GRPOTrainer/GRPOConfig, unchanged (the reference)
    off   GRPOTrainer/GRPOConfig replaced by D3SGRPOTrainer/D3SConfig, D3S off (must equal TRL)
    d3s   the same with variant="d3s" wherever a config sets no variant

Usage:
    PYTHONPATH=src HF_HUB_OFFLINE=1 python scripts/trl_suite.py /path/to/trl/tests/test_grpo_trainer.py \\
        [--modes trl,off,d3s] [-k EXPR] [--timeout 1800] [--test-timeout 300] [--max-steps N]
        [--vocab compact|real] [--threads 1] [--parallel] [--output DIR] [--keep]

Prints a table of the tests whose outcome in `off` or `d3s` differs from `trl`, each classified: in `off` a
defect (D3S off must equal TRL); in `d3s` a refusal (ValueError/NotImplementedError naming D3S, an option
D3S does not support while down-sampling) or "check" (anything else). Tests failing in `trl` too but with
another first error line are listed apart. Writes results.json and results.md to --output. Exit status 1
when a defect or a "check" is found, 0 otherwise (refusals alone), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODES = ("trl", "off", "d3s")
SUPPORT_FILES = ("testing_utils.py", "testing_constants.py", "conftest.py", "__init__.py")
NOT_RUN = "not run"
_RUNNING: list[subprocess.Popen] = []  # pytest processes to take down if the script is interrupted


def _kill_running() -> None:
    for proc in _RUNNING:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def fail(message: str) -> None:
    print(f"trl_suite: error: {message}", file=sys.stderr)
    sys.exit(2)


def resolve_tests(path: str) -> tuple[Path, list[Path]]:
    """The TRL tests folder and the test files to copy from it."""
    p = Path(path).expanduser()
    if not p.exists():
        fail(f"{p} does not exist; pass TRL's tests/test_grpo_trainer.py (or its tests/ folder) from a TRL checkout")
    if p.is_dir():
        files = sorted(p.glob("test_grpo_trainer*.py"))
        if not files:
            fail(f"{p} holds no test_grpo_trainer*.py; pass TRL's tests/ folder or the test file itself")
        return p, files
    if p.suffix != ".py" or not p.name.startswith("test_"):
        fail(f"{p} is not a pytest test file (test_*.py)")
    return p.parent, [p]


def source_info(folder: Path) -> dict:
    """Where the tests came from: the git commit of the folder's repository, or a COMMIT file next to it."""
    info: dict = {"tests_folder": str(folder)}
    try:
        out = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        if out.returncode == 0:
            info["commit"] = out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    for candidate in (folder / "COMMIT", folder.parent / "COMMIT"):
        if "commit" not in info and candidate.is_file():
            info["commit"] = candidate.read_text().strip()
    for candidate in (folder / "VERSION", folder.parent / "VERSION"):
        if candidate.is_file():
            info["version"] = candidate.read_text().strip()
    return info


def stage(folder: Path, files: list[Path], dest: Path) -> Path:
    """Copy the tests into dest/tests (a package, as in TRL) with our conftest at dest/."""
    pkg = dest / "tests"
    pkg.mkdir(parents=True)
    for name in SUPPORT_FILES:
        if (folder / name).is_file():
            shutil.copy2(folder / name, pkg / name)
    (pkg / "__init__.py").touch()
    if (folder / "data").is_dir():
        shutil.copytree(folder / "data", pkg / "data")
    for f in files:
        shutil.copy2(f, pkg / f.name)
    shutil.copy2(HERE / "trl_suite_conftest.py", dest / "conftest.py")
    return pkg


def collapse(records: list[dict]) -> dict[str, dict]:
    """Per test: one outcome (passed, failed, error, skipped, xfailed, xpassed) and the first error line."""
    tests: dict[str, dict] = {}
    for r in records:
        if r.get("event") == "collect":
            tests[r["nodeid"] or "<collection>"] = {"outcome": "error", "message": "collection: " + r["message"]}
            continue
        if r.get("event") != "test":
            continue
        t = tests.setdefault(r["nodeid"], {"outcome": NOT_RUN, "message": "", "duration": 0.0})
        t["duration"] = round(t.get("duration", 0.0) + r.get("duration", 0.0), 3)
        when, outcome = r["when"], r["outcome"]
        if when == "setup":
            if outcome == "failed":
                t.update(outcome="error", message=r["message"])
            elif outcome in ("skipped", "xfailed"):
                t.update(outcome=outcome, message=r["message"])
        elif when == "call":
            t.update(outcome=outcome, message=r["message"])
        elif when == "teardown" and outcome == "failed" and t["outcome"] in ("passed", NOT_RUN):
            t.update(outcome="error", message="teardown: " + r["message"])
    return tests


def short_id(nodeid: str) -> str:
    return nodeid.split("/", 1)[1] if nodeid.startswith("tests/") else nodeid


def run_mode(mode: str, work: Path, pkg: Path, files: list[Path], args, cache: Path) -> dict:
    report = work / f"report-{mode}.jsonl"
    report.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(
        D3S_SUITE_MODE=mode,
        D3S_SUITE_REPORT=str(report),
        D3S_SUITE_TEST_TIMEOUT=str(args.test_timeout),
        HF_HOME=str(work / "hf-home"),
        HF_HUB_CACHE=str(cache),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        WANDB_DISABLED="true",
        WANDB_MODE="disabled",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS=str(args.threads),
        MKL_NUM_THREADS=str(args.threads),
        D3S_SUITE_VOCAB=args.vocab,
        D3S_SUITE_MAX_STEPS=str(args.max_steps or 0),
        PYTHONDONTWRITEBYTECODE="1",
    )
    src = str(REPO / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN", "--tb=line",
           f"--rootdir={work / 'stage'}", f"--basetemp={work / ('tmp-' + mode)}", "-o", "addopts=",
           "--import-mode=prepend"]
    if args.k:
        cmd += ["-k", args.k]
    cmd += [str(pkg / f.name) for f in files]
    log = work / f"pytest-{mode}.log"
    print(f"[{mode}] running ({'-k ' + repr(args.k) if args.k else 'all tests'}), log: {log}", flush=True)
    start = time.monotonic()
    timed_out = False
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=work / "stage", env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        _RUNNING.append(proc)
        try:
            rc = proc.wait(timeout=args.timeout or None)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
    wall = time.monotonic() - start
    records = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    tests = collapse(records)
    counts = Counter(t["outcome"] for t in tests.values())
    print(f"[{mode}] {dict(sorted(counts.items()))} in {wall:.0f} s (exit {rc}{', TIMED OUT' if timed_out else ''})",
          flush=True)
    if not tests:
        tail = log.read_text()[-2000:] if log.exists() else ""
        print(f"[{mode}] no test ran; end of the pytest log:\n{tail}", file=sys.stderr)
    return {"tests": {short_id(k): v for k, v in tests.items()}, "wall_s": round(wall, 1), "exit_code": rc,
            "timed_out": timed_out, "counts": dict(sorted(counts.items()))}


def normalized(message: str) -> str:
    """An error line with D3S's class names read as TRL's (`'D3SGRPOTrainer' object has no attribute` is the same
    failure as TRL's)."""
    return message.replace("D3SGRPOTrainer", "GRPOTrainer").replace("D3SConfig", "GRPOConfig")


def classify(row: dict, modes: list[str]) -> str:
    """What a row's differences from trl are: in `off` always a defect (D3S off must equal TRL); in `d3s` a refusal
    when D3S raised ValueError/NotImplementedError naming D3S (the documented refusals of options D3S does not
    support while down-sampling), otherwise something to look at."""
    kinds = []
    for m in modes:
        if m == "trl" or (row[m] == row["trl"] and normalized(row[f"{m}_message"]) == normalized(row["trl_message"])):
            continue
        message = row[f"{m}_message"]
        if m == "off":
            kinds.append("off: defect (D3S off must equal TRL)")
        elif message.startswith(("ValueError:", "NotImplementedError:")) and "D3S" in message:
            kinds.append("d3s: refusal")
        else:
            kinds.append("d3s: check (not a D3S refusal)")
    return "; ".join(kinds)


def differences(results: dict, modes: list[str]) -> tuple[list[dict], list[dict]]:
    """Tests whose outcome differs from mode trl, and tests failing in trl and another mode with other errors."""
    if "trl" not in results:
        return [], []
    others = [m for m in modes if m != "trl"]
    ids = sorted(set().union(*(results[m]["tests"] for m in modes)))
    diff, other_error = [], []
    for test in ids:
        row = {"test": test}
        for m in modes:
            t = results[m]["tests"].get(test, {"outcome": NOT_RUN, "message": ""})
            row[m] = t["outcome"]
            row[f"{m}_message"] = t["message"]
        if any(row[m] == NOT_RUN for m in modes):
            continue  # a mode stopped (--timeout) before this test: not compared, counted as "not run"
        if any(row[m] != row["trl"] for m in others):
            diff.append(dict(row, classification=classify(row, modes)))
        elif row["trl"] in ("failed", "error") and any(
                normalized(row[f"{m}_message"]) != normalized(row["trl_message"]) for m in others):
            other_error.append(dict(row, classification=classify(row, modes)))
    return diff, other_error


def first_error(row: dict, modes: list[str]) -> str:
    """The first line of the error of the first non-trl mode that differs (or of trl when it failed alone)."""
    for m in modes:
        if m != "trl" and row[m] in ("failed", "error") and row[f"{m}_message"] and (
                row[m] != row["trl"] or normalized(row[f"{m}_message"]) != normalized(row["trl_message"])):
            return f"{m}: {row[f'{m}_message']}"
    return f"trl: {row['trl_message']}" if row["trl_message"] else ""


def table(rows: list[dict], modes: list[str], width: int | None = 160) -> list[str]:
    head = ["test", *modes, "classification", "first error line"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        msg = first_error(row, modes).replace("|", "\\|")
        if width:
            msg = msg[:width]
        lines.append("| " + " | ".join([f"`{row['test']}`", *(row[m] for m in modes), row.get("classification", ""),
                                        msg]) + " |")
    return lines


def versions() -> dict:
    out = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()}
    for name in ("trl", "transformers", "torch", "datasets", "accelerate", "peft"):
        try:
            from importlib.metadata import version

            out[name] = version(name)
        except Exception:  # noqa: BLE001
            out[name] = None
    try:
        out["d3s_commit"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                                           text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        out["load_average_at_start"] = list(os.getloadavg())
    except OSError:
        pass
    return out


def write_outputs(output: Path, summary: dict, diff: list[dict], other_error: list[dict], modes: list[str]) -> None:
    output.mkdir(parents=True, exist_ok=True)
    data = dict(summary, differences=diff, same_outcome_other_error=other_error)
    (output / "results.json").write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    md = ["# TRL GRPOTrainer tests against D3SGRPOTrainer", ""]
    md += [f"- command: `{summary['command']}`", f"- tests: {json.dumps(summary['source'])}",
           f"- options: {json.dumps(summary['options'])}", f"- versions: {json.dumps(summary['versions'])}", ""]
    md += ["| mode | " + " | ".join(["passed", "failed", "error", "skipped", "xfailed", "xpassed", NOT_RUN,
                                      "wall s"]) + " |", "|" + "---|" * 9]
    for m in modes:
        c = summary["modes"][m]["counts"]
        cells = [str(c.get(k, 0)) for k in ("passed", "failed", "error", "skipped", "xfailed", "xpassed", NOT_RUN)]
        timed = " (timed out)" if summary["modes"][m]["timed_out"] else ""
        md.append(f"| {m} | " + " | ".join(cells) + f" | {summary['modes'][m]['wall_s']}{timed} |")
    md += ["", f"## Outcome differs from `trl` ({len(diff)})", ""]
    md += table(diff, modes, width=None) if diff else ["None."]
    md += ["", f"## Same outcome as `trl` (failed/error) with another first error line ({len(other_error)})", ""]
    md += table(other_error, modes, width=None) if other_error else ["None."]
    (output / "results.md").write_text("\n".join(md) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests", help="TRL's tests/test_grpo_trainer.py, or TRL's tests/ folder")
    parser.add_argument("--modes", default="trl,off,d3s", help="comma-separated subset of trl,off,d3s")
    parser.add_argument("-k", default=None, help="pytest -k expression selecting tests")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per mode (0: none); default 1800")
    parser.add_argument("--test-timeout", type=int, default=300, help="seconds per test (0: none); default 300")
    parser.add_argument("--max-steps", type=int, default=0,
                        help="cap every config's max_steps (same in every mode; 0: the tests' own, the default)")
    parser.add_argument("--vocab", choices=("compact", "real"), default="compact",
                        help="stand-in vocabularies: compact (2048 tokens + specials, default) or real sizes/ids")
    parser.add_argument("--parallel", action="store_true",
                        help="run the modes at the same time (one pytest process each) instead of one after another")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per pytest run (default 1)")
    parser.add_argument("--output", default=None, help="folder for results.json and results.md")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, reports)")
    args = parser.parse_args(argv)

    def terminate(signum, frame):
        _kill_running()  # the pytest process groups first: worker threads wait on them
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        fail(f"--modes {args.modes!r}: unknown {bad}; valid: {', '.join(MODES)}")
    modes = [m for m in MODES if m in modes]
    folder, files = resolve_tests(args.tests)
    try:
        import d3s.integrations.trl  # noqa: F401
    except ImportError as e:
        fail(f"cannot import d3s.integrations.trl ({e}); run from the repository with PYTHONPATH=src")

    work = Path(tempfile.mkdtemp(prefix="d3s-trl-suite-"))
    try:
        pkg = stage(folder, files, work / "stage")
        cache = work / "hub"
        summary = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
                   "source": dict(source_info(folder), files=[f.name for f in files]), "versions": versions(),
                   "options": {"k": args.k, "max_steps": args.max_steps or None, "vocab": args.vocab,
                               "threads": args.threads, "timeout_s": args.timeout,
                               "test_timeout_s": args.test_timeout},
                   "modes": {}}
        if args.parallel and len(modes) > 1:
            from concurrent.futures import ThreadPoolExecutor

            from trl_suite_conftest import build_standins  # once, before the modes share the cache

            os.environ["D3S_SUITE_VOCAB"] = args.vocab
            build_standins(cache)
            with ThreadPoolExecutor(len(modes)) as pool:
                futures = {m: pool.submit(run_mode, m, work, pkg, files, args, cache) for m in modes}
                try:
                    for m in modes:
                        summary["modes"][m] = futures[m].result()
                except BaseException:  # Ctrl-C: end the pytest runs so the worker threads return
                    _kill_running()
                    raise
        else:
            for mode in modes:
                summary["modes"][mode] = run_mode(mode, work, pkg, files, args, cache)
        results = {m: summary["modes"][m] for m in modes}
        diff, other_error = differences(results, modes)
        print()
        if "trl" not in modes:
            print("mode trl not run: no differences computed")
        elif not diff:
            print(f"no test's outcome differs from trl ({len(results['trl']['tests'])} tests)")
        else:
            print(f"{len(diff)} tests whose outcome differs from trl:")
            print("\n".join(table(diff, modes)))
            kinds = Counter(k.strip() for row in diff for k in row["classification"].split(";") if k.strip())
            print("classification: " + ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())))
        if other_error:
            print(f"\n{len(other_error)} tests failing in trl and another mode with another first error line:")
            print("\n".join(table(other_error, modes)))
        if args.output:
            write_outputs(Path(args.output), summary, diff, other_error, modes)
            print(f"\nwrote {Path(args.output) / 'results.json'} and results.md")
        if args.keep:
            print(f"kept {work}")
    finally:
        _kill_running()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    # exit 1 on a defect of D3S off or a d3s difference that is not a refusal; refusals alone exit 0
    return 1 if any("defect" in row["classification"] or "check" in row["classification"] for row in diff) else 0


if __name__ == "__main__":
    sys.exit(main())
