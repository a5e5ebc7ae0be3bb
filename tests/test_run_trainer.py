"""The private API of transformers, TRL and torch that a `d3s train` run relies on: pinned in one table
(`d3s.app.run_trainer.PRIVATE_API`), the table checked against the installed versions and against the code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytest.importorskip("trl")

from d3s.app import run_trainer, train  # noqa: E402
from d3s.app.run_trainer import PRIVATE_API, PRIVATE_API_OWNERS, RunTrainer  # noqa: E402
from d3s.integrations.private_api import mismatches  # noqa: E402
from d3s.integrations.trl import D3SGRPOTrainer  # noqa: E402


def test_the_installed_libraries_match_the_table():
    found = mismatches(PRIVATE_API, PRIVATE_API_OWNERS)
    assert found == {}, "transformers, TRL or torch changed what a d3s train run relies on:\n" + "\n".join(
        f"  {name}: expected {expected}, found {got}" for name, (expected, got) in found.items())


def _pinned_names() -> set[str]:
    return {entry.rpartition(".")[2] for entry in PRIVATE_API}


def test_every_private_method_run_trainer_overrides_is_pinned():
    overridden = {name for name in vars(RunTrainer)
                  if name.startswith("_") and not name.startswith("__") and hasattr(D3SGRPOTrainer, name)}
    assert overridden and overridden <= _pinned_names(), overridden - _pinned_names()


def _own_names(tree: ast.Module) -> set[str]:
    """The functions, classes and methods the module defines (an override of a base method: see the test above)."""
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


@pytest.mark.parametrize("module", [run_trainer, train], ids=lambda m: m.__name__)
def test_every_private_name_the_run_code_touches_is_pinned(module):
    """Every `x._name` in the code of a run (not its own helpers, not a `_d3s` attribute it sets) is in the table."""
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    own = _own_names(tree)
    touched = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
               and node.attr.startswith("_") and not node.attr.startswith(("__", "_d3s")) and node.attr not in own}
    assert touched <= _pinned_names(), touched - _pinned_names()
