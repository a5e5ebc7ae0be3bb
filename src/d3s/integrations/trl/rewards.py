"""The reward functions handed to `D3SGRPOTrainer`, checked before TRL uses them.

TRL turns a reward function's list into a tensor with `torch.tensor(output)`: a list of strings fails deep
inside TRL (`too many dimensions 'str'`), and a list of bools or of one-element lists passes silently. TRL
also takes a string as a reward model's name and loads it from the hub, so a mistyped name offline is a
connection error. `checked_reward_funcs` resolves both before training: every callable is wrapped so that
each of its outputs is checked (one number, or None, per completion; the error names the function), and a
string must name a model that can be found.
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any, Callable

RETURNS = "a list with one number (int or float), or None, per completion"

FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: TRL turns rewards into a float32 tensor, where a larger number overflows to inf."""


def check_reward_output(name: str, output: Any, expected: int) -> list[float | None]:
    """`output` as a list of floats or None, or a ValueError naming the reward function `name` and what it must return."""
    if isinstance(output, (str, bytes, dict)) or not hasattr(output, "__len__") or not hasattr(output, "__iter__"):
        raise ValueError(f"reward function {name!r} returned {type(output).__name__} {_short(output)}; it must return "
                         f"{RETURNS} ({expected} here)")
    values = list(output)
    if len(values) != expected:
        raise ValueError(f"reward function {name!r} returned {len(values)} rewards for {expected} completions; it must "
                         f"return {RETURNS}")
    out: list[float | None] = []
    for i, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        if hasattr(value, "ndim") and getattr(value, "ndim") == 0 and hasattr(value, "item"):
            value = value.item()  # a 0-d tensor or NumPy scalar
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"reward function {name!r} returned {type(value).__name__} {_short(value)} for completion "
                             f"{i}; it must return {RETURNS}")
        value = float(value)
        if math.isfinite(value) and abs(value) > FLOAT32_MAX:
            raise ValueError(f"reward function {name!r} returned {value!r} for completion {i}, beyond float32's range "
                             f"(+-{FLOAT32_MAX:.4g}) in which TRL keeps rewards, where it would be inf; it must return "
                             f"{RETURNS}, each within that range")
        out.append(value)
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _name(func: Callable) -> str:
    from trl.trainer.utils import get_callable_name

    return get_callable_name(func)


class CheckedReward:
    """A synchronous reward function whose every output goes through `check_reward_output`; TRL sees its name."""

    def __init__(self, func: Callable) -> None:
        self.func, self.__name__ = func, _name(func)

    def __call__(self, prompts=None, completions=None, **kwargs):
        output = self.func(prompts=prompts, completions=completions, **kwargs)
        return check_reward_output(self.__name__, output, len(completions))


class CheckedAsyncReward(CheckedReward):
    """`CheckedReward` for a reward function that TRL awaits."""

    async def __call__(self, prompts=None, completions=None, **kwargs):
        output = await self.func(prompts=prompts, completions=completions, **kwargs)
        return check_reward_output(self.__name__, output, len(completions))


def _check_model_name(index: int, name: str) -> None:
    """A one-line ValueError when the reward model `name` cannot be found (locally, or offline in the cache)."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"reward_funcs[{index}]={name!r}: a string is taken as a reward model's name (a folder or a "
                         f"hub name, loaded with AutoModelForSequenceClassification) and {name!r} was not found "
                         f"locally ({reason}); give a model that exists, or a callable (completions, **columns) -> "
                         f"{RETURNS}") from None


def _is_async(func: Callable) -> bool:
    """Whether calling `func` returns a coroutine: TRL's `is_async_callable` (TRL >= 1.14), else the same test."""
    try:
        from trl.trainer.utils import is_async_callable
    except ImportError:  # TRL < 1.14
        return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))
    return is_async_callable(func)


def _checked_async(func: Callable) -> Callable:
    """A `CheckedAsyncReward`; before TRL 1.14, which awaits only coroutine functions
    (`inspect.iscoroutinefunction`), the same check inside an `async def`."""
    checked = CheckedAsyncReward(func)
    try:
        from trl.trainer.utils import is_async_callable  # noqa: F401  TRL >= 1.14 awaits any async callable
    except ImportError:
        async def reward(prompts=None, completions=None, **kwargs):
            return await checked(prompts=prompts, completions=completions, **kwargs)

        reward.__name__, reward.d3s_checked = checked.__name__, True
        return reward
    return checked


def checked_reward_funcs(reward_funcs: Any) -> Any:
    """`reward_funcs` as TRL takes them (one, a list, or None), each callable wrapped in a `CheckedReward` and each
    string checked to name a reward model that can be found; anything else is a ValueError naming it."""
    if reward_funcs is None:
        return None
    funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    out = []
    for i, func in enumerate(funcs):
        if isinstance(func, str):
            _check_model_name(i, func)
            out.append(func)
        elif isinstance(func, CheckedReward) or getattr(func, "d3s_checked", False) or hasattr(func, "config"):
            out.append(func)  # already checked, or a reward model
        elif callable(func):
            out.append(_checked_async(func) if _is_async(func) else CheckedReward(func))
        else:
            raise ValueError(f"reward_funcs[{i}]={_short(func)} is a {type(func).__name__}; give a callable "
                             f"(completions, **columns) -> {RETURNS}, or a reward model (name or module)")
    return out if isinstance(reward_funcs, list) else out[0]
