"""Argument checks shared by the core functions: every error names the argument, its value and what
is valid. A number may be a Python, NumPy or 0-d torch scalar; a bool is never a number here.

Shape and dtype checks cost nothing; value checks (finite, 0/1) read the tensor, so the core runs
them only where a wrong value would otherwise give a silently wrong result.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch


def _scalar(name: str, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dim() > 1:
            raise ValueError(f"{name} must be a number, got a tensor of shape {tuple(value.shape)}")
        if value.dtype == torch.bool:
            raise ValueError(f"{name} must be a number, got a bool tensor")
        return value.item()
    if isinstance(value, bool) or type(value).__name__ == "bool_":  # Python or NumPy bool
        raise ValueError(f"{name}={value!r} must be a number, not a bool")
    if hasattr(value, "item") and not isinstance(value, numbers.Number):  # a 0-d NumPy array
        try:
            value = value.item()
        except (TypeError, ValueError):
            raise ValueError(f"{name}={value!r} must be a number") from None
    return value


def as_int(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """`value` as a Python int; ValueError unless it is an integer (not a float, even 2.0) in [low, high]."""
    v = _scalar(name, value)
    if not isinstance(v, numbers.Integral):
        raise ValueError(f"{name}={value!r} must be an integer{_range(low, high)}")
    v = int(v)
    if (low is not None and v < low) or (high is not None and v > high):
        raise ValueError(f"{name}={v} must be an integer{_range(low, high)}")
    return v


def as_float(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> float:
    """`value` as a finite Python float in [low, high] (or (low, high] with `low_open`)."""
    v = _scalar(name, value)
    if not isinstance(v, numbers.Real):
        raise ValueError(f"{name}={value!r} must be a finite number{_range(low, high, low_open)}")
    v = float(v)
    bad = not math.isfinite(v) or (low is not None and (v <= low if low_open else v < low))
    bad = bad or (high is not None and v > high)
    if bad:
        raise ValueError(f"{name}={v} must be a finite number{_range(low, high, low_open)}")
    return v


def _range(low, high, low_open: bool = False) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low}, {high}]"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    if high is not None:
        return f" <= {high}"
    return ""


def tensor(name: str, value: Any, *, dims: tuple[int, ...] | None = None, kind: str = "number") -> torch.Tensor:
    """`value` if it is a torch tensor with one of `dims` dimensions and a dtype of `kind`:
    `"number"` (bool, integer or float), `"float"`, or `"bool"`."""
    if not isinstance(value, torch.Tensor):
        convertible = hasattr(value, "__array__") or isinstance(value, (list, tuple))  # NumPy, list
        hint = " (convert it with torch.as_tensor)" if convertible else ""
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}{hint}")
    if dims is not None and value.dim() not in dims:
        want = " or ".join(f"{d}-D" for d in dims)
        raise ValueError(f"{name} must be {want}, got shape {tuple(value.shape)}")
    if value.is_complex() or (kind == "float" and not value.is_floating_point()):
        raise ValueError(f"{name} must be a {'float' if kind == 'float' else 'real'} tensor, got {value.dtype}")
    if kind == "bool" and value.dtype != torch.bool:
        raise ValueError(f"{name} must be a bool tensor, got {value.dtype}")
    return value


def no_inf(name: str, value: torch.Tensor, what: str) -> None:
    """ValueError naming the first +-inf entry of `value` (NaN is allowed: `what` says what it means)."""
    if value.is_floating_point():
        bad = torch.isinf(value)
        if bad.any():
            index = tuple(bad.nonzero()[0].tolist())
            raise ValueError(f"{name} must be finite or NaN ({what}); found {value[index].item()} at index "
                             f"{index if len(index) > 1 else index[0]}")
