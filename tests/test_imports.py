"""Imports between d3s modules go one way: no cycles, function bodies and `if TYPE_CHECKING` included.

Every `import` / `from ... import` node of every module under `src/d3s` is an edge, wherever it stands: an
import moved into a function to dodge a cycle is still a cycle (docs/architecture.md, "Import order").
Relative imports are resolved, and `from pkg import name` is an edge to the submodule `pkg.name` when
there is one, else to `pkg`. Importing a submodule also runs its packages' `__init__`; those implicit
edges are left out, since a package that re-exports its submodules would otherwise be a cycle with each.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# The import order inside `d3s.app`, lowest first (docs/architecture.md draws it): a module imports only
# from its own layer or lower ones, and within a layer without cycles.
APP_LAYERS = {
    "errors": ["d3s.app.errors"],
    "shared": ["d3s.app.datafiles", "d3s.app.scoring", "d3s.app.intervals", "d3s.app.options", "d3s.app.runfiles",
               "d3s.app.records", "d3s.app.recipe_changes", "d3s.app.runfolder", "d3s.app.child_process",
               "d3s.app.machine", "d3s.app.budget",
               "d3s.app.below_start", "d3s.app.models", "d3s.app.plots"],
    "tasks": ["d3s.app.tasks", "d3s.app.math_data"],
    "recipe": ["d3s.app.recipe", "d3s.app.run_args"],
    "evaluation": ["d3s.app.evaluation.aggregate", "d3s.app.evaluation.benchmarks",
                   "d3s.app.evaluation.prompts", "d3s.app.evaluation.generation", "d3s.app.evaluation.report",
                   "d3s.app.evaluation.heldout", "d3s.app.evaluation.cache", "d3s.app.evaluation.settings"],
    "jobs": ["d3s.app.evaluation.runner", "d3s.app.evaluation", "d3s.app.run_trainer", "d3s.app.run_stop", "d3s.app.resume",
             "d3s.app.train", "d3s.app.compare.summary",
             "d3s.app.compare.markdown", "d3s.app.compare.stats", "d3s.app.compare.pairing", "d3s.app.compare.budget", "d3s.app.compare.command", "d3s.app.compare"],
    "cli": ["d3s.app.cli", "d3s.app.__main__", "d3s.app"],
}


def module_names(src: Path) -> dict[str, Path]:
    """`{dotted name: file}` of every module under `src` (a package is its `__init__.py`)."""
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The module `name` refers to: itself, else its longest prefix that is a module (a name inside it)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: dict[str, Path], root: str) -> set[str]:
    """The modules under package `root` that `module` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                full = f"{base}.{node.module}" if node.module else base
            else:
                full = node.module or ""
            names = [f"{full}.{alias.name}" if f"{full}.{alias.name}" in modules else full for alias in node.names]
        else:
            continue
        for name in names:
            if name == root or name.startswith(root + "."):
                target = _target(name, modules)
                if target is not None and target != module:
                    out.add(target)
    return out


def import_graph(src: Path = SRC, root: str = "d3s") -> dict[str, set[str]]:
    modules = module_names(src)
    return {m: imports_of(m, p, modules, root) for m, p in modules.items() if m == root or m.startswith(root + ".")}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle `[a, b, ..., a]`, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_walker_sees_imports_inside_functions(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import g\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.b\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.b"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _is_core(module: str) -> bool:
    """`d3s` and its flat modules; `d3s.cli` is the launcher of the application, not core."""
    return module == "d3s" or module.count(".") == 1 and module not in ("d3s.cli", "d3s.app", "d3s.integrations")


def test_the_core_and_the_integrations_never_import_the_application():
    graph = import_graph()
    for module, targets in graph.items():
        if _is_core(module):
            assert not {t for t in targets if not _is_core(t)}, module  # the core: torch and itself only
        if module.startswith("d3s.integrations"):
            assert not {t for t in targets if t.startswith("d3s.app")}, module


def test_the_application_imports_follow_its_layers():
    graph = import_graph()
    app = sorted(m for m in graph if m == "d3s.app" or m.startswith("d3s.app."))
    rank = {m: i for i, layer in enumerate(APP_LAYERS.values()) for m in layer}
    assert sorted(rank) == app, "a module of d3s.app is missing from APP_LAYERS (or one listed is gone)"
    upward = [f"{m} -> {t}" for m in app for t in graph[m] if t in rank and rank[t] > rank[m]]
    assert not upward, upward


LAZY_APP_MODULES = {"d3s.app.run_trainer"}  # imports TRL: `d3s.app.train` imports it when a run starts


def test_application_modules_are_imported_at_the_top():
    """Inside `d3s.app`, an import in a function body is for a heavy framework, not for another app module:
    only the module that imports TRL is imported late."""
    modules = module_names(SRC)
    late = []
    for module, path in modules.items():
        if not module.startswith("d3s.app"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.ImportFrom) and inner.level:
                        late.append(f"{module}: from {'.' * inner.level}{inner.module or ''}")
                    elif isinstance(inner, (ast.Import, ast.ImportFrom)):
                        names = [a.name for a in inner.names] if isinstance(inner, ast.Import) else [inner.module or ""]
                        late += [f"{module}: {n}" for n in names
                                 if n.startswith("d3s.app") and _target(n, modules) not in LAZY_APP_MODULES]
    assert not late, late


@pytest.mark.parametrize("doc", ["docs/architecture.md"])
def test_the_documented_import_order_is_the_code(doc):
    """The diagram in the architecture page names the same layers, lowest last, with the same modules."""
    text = (SRC.parent / doc).read_text(encoding="utf-8")
    block = text.split("<!-- app-layers -->", 2)[1]
    drawn = {}
    for line in block.strip().strip("`").strip().splitlines():
        if line.strip() and not set(line.strip()) <= set("|v^ "):
            layer, _, modules = line.partition(":")
            drawn[layer.strip()] = sorted(f"d3s.app.{m.strip()}".replace(".__init__", "") for m in modules.split(","))
    expected = {layer: sorted(modules) for layer, modules in reversed(list(APP_LAYERS.items()))}
    assert list(drawn) == list(expected) and drawn == expected
