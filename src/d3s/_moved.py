"""Old module names that keep working: `import d3s.sampling` gives `d3s.rollout_selection`, with a
DeprecationWarning naming the new spelling.

The application (the `d3s` command) moved from the package root into `d3s.app`, and two core
modules were renamed after what they do. The alias is the same module object, so classes and
functions imported either way are identical.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

MOVED = {
    "d3s.sampling": "d3s.rollout_selection",
    "d3s.tokens": "d3s.token_selection",
    "d3s.train": "d3s.app.train",
    "d3s.compare": "d3s.app.compare",
    "d3s.recipe": "d3s.app.recipe",
    "d3s.tasks": "d3s.app.tasks",
    "d3s.models": "d3s.app.models",
    "d3s.plots": "d3s.app.plots",
    "d3s.runfolder": "d3s.app.runfolder",
    "d3s.evaluation": "d3s.app.evaluation",
}


def new_name(old: str) -> str | None:
    """The current name of module `old` (submodules of a moved package too), or None if it did not move."""
    for before, after in MOVED.items():
        if old == before or old.startswith(before + "."):
            return after + old[len(before):]
    return None


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if new_name(fullname) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        target = new_name(spec.name)
        warnings.warn(f"{spec.name} is now {target}; the old name will be removed", DeprecationWarning,
                      stacklevel=2)
        return importlib.import_module(target)  # the module itself, not a copy

    def exec_module(self, module):
        pass  # already executed under its new name


def install() -> None:
    """First on `sys.meta_path`: otherwise the path finder would load `d3s.evaluation.scoring` from the
    moved package's folder a second time, as a different module."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
