"""The package layout: the core loads no application module, the error types share one base, the entry
points work, and no docstring or page points at a file the repository does not have."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_importing_the_core_loads_no_application_module():
    code = "import sys, d3s; print(sorted(m for m in sys.modules if m.startswith(('d3s.app', 'transformers', 'trl'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("command", [[], ["compare", "--help"], ["eval", "--help"], ["eval-table", "--help"]])
def test_the_command_line_loads_the_frameworks_only_when_a_job_needs_them(command):
    """`d3s --help` and the help of the jobs other than `d3s train` load neither transformers nor TRL (nor scipy,
    which the intervals import when they compute one)."""
    code = ("import sys; from d3s.app.cli import main; main(sys.argv[1:]); "
            "print(sorted({m.split('.')[0] for m in sys.modules}"
            " & {'transformers', 'trl', 'datasets', 'matplotlib', 'scipy'}))")
    out = subprocess.run([sys.executable, "-c", code, *command], capture_output=True, text=True, check=True).stdout
    heavy = out.strip().splitlines()[-1]
    assert heavy == "[]", heavy


def test_usage_errors_share_one_base():
    from d3s.app.errors import RecipeError, UsageError
    from d3s.app.evaluation.benchmarks import BenchmarkError
    from d3s.app.evaluation.generation import ModelLoadError
    from d3s.app.runfolder import RunFolderError

    for error in (RecipeError, BenchmarkError, ModelLoadError, RunFolderError):
        assert issubclass(error, UsageError) and issubclass(error, ValueError)


@pytest.mark.parametrize("module", ["d3s.cli", "d3s.app"])
def test_python_dash_m_runs_the_command(module):
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "usage: d3s COMMAND" in done.stdout


def test_the_console_script_and_the_launcher_are_one_function():
    from d3s.app.cli import main
    from d3s.cli import main as launcher

    assert launcher is main


_PATH = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.(?:py|md|yaml))`")
_OUTPUTS = {"results.md", "compare.md"}  # files the commands write, not files of the repository


def _sources():
    yield from (ROOT / "src").rglob("*.py")
    yield from (ROOT / "docs").glob("*.md")
    yield ROOT / "README.md"


def test_every_file_a_docstring_or_page_names_exists():
    places = [ROOT, ROOT / "src", ROOT / "src" / "d3s", ROOT / "src" / "d3s" / "app", ROOT / "docs"]
    missing = []
    for source in _sources():
        text = source.read_text(encoding="utf-8")
        for match in _PATH.finditer(text):
            name = match.group(1)
            if "*" in name or name.startswith(("<", ".")) or name in _OUTPUTS:
                continue
            candidates = [source.parent / name, *(place / name for place in places)]
            if "/" not in name:  # a bare file name: anywhere in the repository
                candidates += list(ROOT.glob(f"src/**/{name}")) + list(ROOT.glob(f"*/{name}"))
                candidates += list(ROOT.glob(f"tests/**/{name}")) + list(ROOT.glob(f"benchmarks/**/{name}"))
            if not any(c.exists() for c in candidates):
                missing.append(f"{source.relative_to(ROOT)}: {name}")
    assert not missing, missing
    assert not re.search(r"\bMETHOD\b", "".join(p.read_text() for p in (ROOT / "src").rglob("*.py")))
