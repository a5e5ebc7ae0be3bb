"""Pins on another library's private API: what the glue overrides, calls or reads, checked against what is installed.

A trainer subclass that overrides private methods of TRL or transformers breaks silently when a new
release renames or re-signs them. Each integration lists every such name in one table, and a test
checks the table against the pinned version with `mismatches`:

    {"GRPOTrainer._compute_loss": "(self, model, inputs)",     # a method: its parameters, defaults kept
     "GRPOTrainer._step": ATTRIBUTE,                            # an attribute the class sets on `self`
     "trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE": NAME,    # a module-level name
     "GRPOTrainer.eos_token_ids": {">=1.14": ATTRIBUTE}}       # per version: specifier -> any of the above

An entry whose supported versions differ maps version specifiers (PEP 440, `packaging`) to what each has; a
version that no specifier matches does not rely on the name. `expected_for` picks the installed version's.

Imports the standard library, and `packaging` for versioned entries.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re

ATTRIBUTE = "attribute"
"""The entry is an attribute: the class (or a base) assigns `self.<name>` in its source, or defines it."""

NAME = "name"
"""The entry is a module-level name that must exist in that module."""


def parameters(function) -> str:
    """A callable's parameters with defaults, without annotations: "(self, model, inputs)"."""
    params = [p.replace(annotation=inspect.Parameter.empty) for p in inspect.signature(function).parameters.values()]
    return str(inspect.Signature(params))


@functools.lru_cache(maxsize=None)
def _source(klass: type) -> str:
    """A class's source, read once: a big trainer's takes a while and each attribute entry reads it."""
    try:
        return inspect.getsource(klass)
    except (OSError, TypeError):  # builtins, classes defined without a source file
        return ""


def _assigns(cls: type, name: str) -> bool:
    pattern = re.compile(rf"\bself\.{re.escape(name)}\s*(?::[^=\n]*)?(?:=(?!=)|\+=|-=)")
    for klass in cls.__mro__:
        if name in vars(klass) or pattern.search(_source(klass)):
            return True
    return False


def _resolve(owners: dict[str, object], dotted: str) -> tuple[object, str]:
    """(`owner`, `name`) for "Owner.name" (an entry of `owners`) or "package.module.name" (imported)."""
    head, _, name = dotted.rpartition(".")
    if head in owners:
        return owners[head], name
    return importlib.import_module(head), name


def expected_for(table: dict, version) -> dict[str, str]:
    """`table` at `version`: each versioned entry (a dict of specifiers) replaced by what its matching specifier
    says, and dropped where none matches; `version` None keeps only the unversioned entries."""
    from packaging.specifiers import SpecifierSet

    out = {}
    for dotted, expected in table.items():
        if not isinstance(expected, dict):
            out[dotted] = expected
            continue
        matching = [value for spec, value in expected.items()
                    if version is not None and SpecifierSet(spec).contains(version, prereleases=True)]
        if len(matching) > 1:
            raise ValueError(f"{dotted}: more than one specifier of {sorted(expected)} matches {version}")
        if matching:
            out[dotted] = matching[0]
    return out


def mismatches(table: dict, owners: dict[str, object] | None = None, version=None) -> dict[str, tuple[str, str]]:
    """`{entry: (expected, found)}` for every entry of `table` that the installed library no longer matches.

    `owners` maps the short owner names used in `table` ("GRPOTrainer") to the class or module;
    any other owner is a module path and is imported. `version` (the installed library's) picks what the
    versioned entries expect (`expected_for`).
    """
    owners = owners or {}
    out = {}
    for dotted, expected in expected_for(table, version).items():
        try:
            owner, name = _resolve(owners, dotted)
        except ImportError as err:
            out[dotted] = (expected, f"<cannot import: {err}>")
            continue
        if expected == NAME:
            found = NAME if hasattr(owner, name) else "<missing>"
        elif expected == ATTRIBUTE:
            found = ATTRIBUTE if isinstance(owner, type) and _assigns(owner, name) else "<missing>"
        else:
            member = getattr(owner, name, None)
            found = "<missing>" if member is None else parameters(member)
        if found != expected:
            out[dotted] = (expected, found)
    return out
