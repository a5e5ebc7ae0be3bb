"""scripts/trl_suite.py without TRL's tests: per-test outcomes, differences, classification, usage errors."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import trl_suite  # noqa: E402


def _rec(nodeid, when, outcome, message=""):
    return {"event": "test", "nodeid": nodeid, "when": when, "outcome": outcome, "message": message, "duration": 0.1}


def test_collapse_outcomes():
    records = [
        _rec("tests/t.py::a", "setup", "passed"), _rec("tests/t.py::a", "call", "passed"),
        _rec("tests/t.py::a", "teardown", "passed"),
        _rec("tests/t.py::b", "setup", "skipped", "Skipped: needs vllm"), _rec("tests/t.py::b", "teardown", "passed"),
        _rec("tests/t.py::c", "setup", "failed", "OSError: offline"), _rec("tests/t.py::c", "teardown", "passed"),
        _rec("tests/t.py::d", "setup", "passed"), _rec("tests/t.py::d", "call", "passed"),
        _rec("tests/t.py::d", "teardown", "failed", "RuntimeError: x"),
        _rec("tests/t.py::e", "setup", "passed"),  # the mode stopped during e
        {"event": "collect", "nodeid": "tests/u.py", "outcome": "error", "message": "ImportError: y"},
    ]
    tests = trl_suite.collapse(records)
    assert {k: v["outcome"] for k, v in tests.items()} == {
        "tests/t.py::a": "passed", "tests/t.py::b": "skipped", "tests/t.py::c": "error", "tests/t.py::d": "error",
        "tests/t.py::e": trl_suite.NOT_RUN, "tests/u.py": "error"}


def _results(**per_mode):
    return {m: {"tests": {t: {"outcome": o, "message": msg} for t, (o, msg) in tests.items()}}
            for m, tests in per_mode.items()}


def test_differences_and_classification():
    modes = ["trl", "off", "d3s"]
    refusal = "ValueError: loss_type='cispo' is not supported with D3S down-sampling on (variant='d3s')"
    results = _results(
        trl={"same": ("passed", ""), "refused": ("passed", ""), "broken_off": ("passed", ""),
             "crash": ("passed", ""), "renamed": ("failed", "AttributeError: 'GRPOTrainer' object has no x"),
             "unfinished": ("passed", "")},
        off={"same": ("passed", ""), "refused": ("passed", ""), "broken_off": ("failed", "AssertionError"),
             "crash": ("passed", ""), "renamed": ("failed", "AttributeError: 'D3SGRPOTrainer' object has no x"),
             "unfinished": ("passed", "")},
        d3s={"same": ("passed", ""), "refused": ("failed", refusal), "broken_off": ("passed", ""),
             "crash": ("failed", "RuntimeError: shape mismatch"),
             "renamed": ("failed", "AttributeError: 'D3SGRPOTrainer' object has no x")},
    )
    diff, other = trl_suite.differences(results, modes)
    kinds = {row["test"]: row["classification"] for row in diff}
    assert kinds == {"refused": "d3s: refusal", "broken_off": "off: defect (D3S off must equal TRL)",
                     "crash": "d3s: check (not a D3S refusal)"}
    assert other == []  # the class name alone is no difference; "unfinished" (not run in d3s) is not compared


@pytest.mark.parametrize("arg, words", [("/nonexistent/test_grpo_trainer.py", "does not exist"),
                                        (__file__.replace("test_trl_suite_script", "conftest"), "not a pytest")])
def test_usage_errors(arg, words):
    out = subprocess.run([sys.executable, str(SCRIPTS / "trl_suite.py"), arg], capture_output=True, text=True)
    assert out.returncode == 2
    assert words in out.stderr and out.stderr.count("\n") == 1
