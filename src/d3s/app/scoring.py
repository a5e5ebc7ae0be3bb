"""Answers and their scores: what a completion answers, and whether it equals the gold answer.

The one home of scoring, shared by the training rewards (`d3s.app.tasks`) and the evaluator
(`d3s.app.evaluation`), so that a reward and an evaluation of the same completion agree:

- `numeric` (the arithmetic task): the completion's last `\\boxed{}` if any, else its last number,
  equal to the gold number within a relative tolerance (`score_arith`);
- `math_verify` (math datasets and benchmarks, paper sec. 4.1): math-verify equivalence (`score_math`).

Nothing here raises on model output: empty output, no answer, unparseable LaTeX all score 0.0. A
math-verify check that raises or runs past its timeout also scores 0.0, and is reported through
`Score.failure` so the caller can count it. Timeouts use math-verify's own SIGALRM guard, which only
works in the main thread; elsewhere verification runs without a timeout.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Sequence

Scorer = Literal["math_verify", "numeric"]


@dataclass(frozen=True)
class Score:
    """Outcome of checking one completion."""

    value: float
    """1.0 correct, 0.0 otherwise."""
    failure: str | None = None
    """Why verification itself failed (exception / timeout); None when it ran normally."""


# ---------------------------------------------------------------------------------------------
# Reading an answer
# ---------------------------------------------------------------------------------------------

_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` or `\\fbox{...}` with balanced braces, or None."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i, depth = text.index("{", start) + 1, 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None  # unbalanced: no answer


def extract_final_number(text: str) -> float | None:
    """The number a completion answers: in its last `\\boxed{}` if any, else its last number."""
    boxed = last_boxed(text)
    source = boxed if boxed is not None else text
    matches = _NUMBER_RE.findall(source.replace(",", ""))
    if not matches:
        return None
    value = float(matches[-1])
    return value if math.isfinite(value) else None


def numbers_equal(predicted: float | None, gold: float, rel_tol: float = 1e-6) -> bool:
    """Numeric equality with a relative tolerance (absolute near zero)."""
    if predicted is None:
        return False
    return abs(predicted - gold) <= rel_tol * max(1.0, abs(gold))


def completion_text(completion: str | Sequence[dict[str, str]]) -> str:
    """Text of a completion: a plain string, or the last message of a conversational one."""
    if isinstance(completion, str):
        return completion
    if completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return ""


# ---------------------------------------------------------------------------------------------
# Scorers
# ---------------------------------------------------------------------------------------------


def score_arith(completion: str, answer: str) -> float:
    """1.0 if the completion's final number equals `answer` numerically, else 0.0."""
    try:
        gold = float(str(answer).replace(",", ""))
    except ValueError:
        return 0.0
    return 1.0 if numbers_equal(extract_final_number(completion), gold) else 0.0


def _math_verify():
    try:
        import math_verify
        from math_verify.errors import TimeoutException
    except ImportError as e:
        raise ImportError(
            "scoring math benchmarks needs math-verify: pip install 'd3s[eval]' "
            "(or pip install math-verify==0.9.0)"
        ) from e
    return math_verify, TimeoutException


def _timeout(timeout_s: int) -> int | None:
    # math-verify's SIGALRM timeout raises ValueError outside the main thread.
    return timeout_s if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout_s: int) -> tuple[Any, ...]:
    """Gold answers are plain LaTeX/numbers; boxing them makes math-verify read them whole."""
    math_verify, _ = _math_verify()
    return tuple(
        math_verify.parse(
            "\\boxed{" + gold + "}", parsing_timeout=_timeout(timeout_s), raise_on_error=True
        )
    )


def gold_problem(gold: str, *, timeout_s: int = 5) -> str | None:
    """Why math-verify cannot read the gold answer `gold` (one short phrase), or None when it can: it parses to
    an expression, not only to its text (`\\frac{` parses to nothing but the string, which a completion's answer
    equals only where it repeats that broken text: its problem scores 0 for nearly every completion)."""
    _, timeout_exc = _math_verify()
    try:
        parsed = _parse_gold(gold, timeout_s)
    except timeout_exc:
        return f"parsing timed out after {timeout_s}s"
    except Exception as e:  # noqa: BLE001 - sympy/latex2sympy raise anything on odd input
        return f"{type(e).__name__}"
    if not any(not isinstance(p, str) for p in parsed):
        return "no expression in it"
    return None


def score_math(
    completion: str, gold: str, *, timeout_s: int = 5, require_boxed: bool = False
) -> Score:
    """math-verify equivalence of the completion's answer and `gold`.

    With `require_boxed`, a completion without `\\boxed{` scores 0.0; otherwise math-verify's own
    extraction applies (last `\\boxed{}` first, then "final answer is ...", then the last
    LaTeX/plain expression).
    """
    if not completion.strip():
        return Score(0.0)
    if require_boxed and "\\boxed" not in completion:
        return Score(0.0)
    math_verify, timeout_exc = _math_verify()
    try:
        gold_parsed = list(_parse_gold(gold, timeout_s))
        if not gold_parsed:
            return Score(0.0, failure=f"gold answer {gold!r:.60} could not be parsed")
        pred = math_verify.parse(
            completion, parsing_timeout=_timeout(timeout_s), raise_on_error=True
        )
        if not pred:
            return Score(0.0)  # no answer found: a wrong answer, not a verifier failure
        ok = math_verify.verify(
            gold_parsed, pred, timeout_seconds=_timeout(timeout_s), raise_on_error=True
        )
    except timeout_exc:
        return Score(0.0, failure=f"timeout after {timeout_s}s")
    except Exception as e:  # noqa: BLE001 - sympy/latex2sympy raise anything on odd input
        return Score(0.0, failure=f"{type(e).__name__}: {str(e)[:120]}")
    return Score(1.0 if ok else 0.0)


def score_completion(
    completion: str,
    gold: str,
    scorer: Scorer,
    *,
    timeout_s: int = 5,
    require_boxed: bool = False,
) -> Score:
    """Score one completion with a benchmark's scorer."""
    if scorer == "math_verify":
        return score_math(completion, gold, timeout_s=timeout_s, require_boxed=require_boxed)
    elif scorer == "numeric":
        return Score(score_arith(completion, gold))
    else:
        raise ValueError(f"unknown scorer {scorer!r}; valid: math_verify, numeric")


def score_job(job: tuple[str, str, Scorer, int, bool]) -> Score:
    """`score_completion(completion, gold, scorer, timeout_s=..., require_boxed=...)` from one
    tuple: the picklable unit of work of a scoring process pool."""
    completion, gold, scorer, timeout_s, require_boxed = job
    return score_completion(
        completion, gold, scorer, timeout_s=timeout_s, require_boxed=require_boxed
    )
