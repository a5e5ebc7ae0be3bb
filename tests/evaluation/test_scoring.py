"""math-verify scoring: equivalent forms, sets, malformed / empty output, the failure guard."""

from __future__ import annotations

import time

import pytest

from d3s.app import scoring
from d3s.app.scoring import Score, score_completion, score_math


@pytest.mark.parametrize(
    "gold, completion",
    [
        ("\\frac{1}{2}", "So the answer is \\boxed{\\frac{1}{2}}."),
        ("\\frac{1}{2}", "Thus $\\boxed{0.5}$"),
        ("\\frac{1}{2}", "\\boxed{1/2}"),
        ("0.5", "\\boxed{\\dfrac{1}{2}}"),
        ("\\frac{14}{3}", "\\boxed{\\frac{28}{6}}"),
        ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}"),
        ("\\{1,2\\}", "\\boxed{\\{2, 1\\}}"),
        ("1, 3", "The solutions are \\boxed{3, 1}"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\boxed{(3, \\pi/2)}"),
        ("x^2+1", "\\boxed{1 + x^2}"),
        ("025", "\\boxed{25}"),
        ("1080", "\\boxed{1,080}"),
        ("72", "Natalia sold 72 clips. The final answer is 72."),
    ],
)
def test_equivalent_forms_score_one(gold, completion):
    assert score_math(completion, gold) == Score(1.0)


@pytest.mark.parametrize(
    "gold, completion",
    [
        ("\\frac{1}{2}", "\\boxed{\\frac{1}{3}}"),
        ("\\{1,2\\}", "\\boxed{\\{1, 2, 3\\}}"),
        ("72", "\\boxed{27}"),
        ("72", ""),  # empty output
        ("72", "   \n"),
        ("72", "I am not sure."),  # no answer at all
        ("72", "\\boxed{72"),  # unclosed box: no answer extracted
        ("72", "\\boxed{}"),
        ("72", "}}}{{{ \\frac{ $$ \\left("),  # malformed LaTeX
    ],
)
def test_wrong_or_malformed_scores_zero_without_failure(gold, completion):
    assert score_math(completion, gold) == Score(0.0)


def test_several_boxed_answers_are_read_together():
    """math-verify joins all boxed answers: hedging between two values is not the answer."""
    assert score_math("first \\boxed{3}, corrected: \\boxed{4}", "4").value == 0.0
    assert score_math("\\boxed{1} and \\boxed{3}", "1, 3").value == 1.0


def test_require_boxed():
    completion = "The final answer is 72."
    assert score_math(completion, "72").value == 1.0
    assert score_math(completion, "72", require_boxed=True).value == 0.0
    assert score_math("\\boxed{72}", "72", require_boxed=True).value == 1.0


def test_numeric_scorer_for_arith():
    assert score_completion("5 - 9 = -4", "-4", "numeric") == Score(1.0)
    assert score_completion("\\boxed{12} (not 13)", "12", "numeric") == Score(1.0)
    assert score_completion("The answer is 13", "12", "numeric") == Score(0.0)
    assert score_completion("", "12", "numeric") == Score(0.0)
    with pytest.raises(ValueError, match="unknown scorer"):
        score_completion("1", "1", "exact")  # type: ignore[arg-type]


def test_verifier_exception_scores_zero_and_is_reported(monkeypatch):
    import math_verify

    def broken_verify(*args, **kwargs):
        raise RecursionError("sympy blew up")

    monkeypatch.setattr(math_verify, "verify", broken_verify)
    score = score_math("\\boxed{1}", "1")
    assert score.value == 0.0
    assert score.failure is not None and "RecursionError" in score.failure


def test_hanging_verification_times_out(monkeypatch):
    """A comparison that never returns is cut by math-verify's timeout, scored 0, reported."""
    import math_verify.grader as grader

    def hang(*args, **kwargs):
        time.sleep(30)
        return True

    monkeypatch.setattr(grader, "sympy_expr_eq", hang)
    scoring._parse_gold.cache_clear()
    start = time.monotonic()
    score = score_math("\\boxed{x+1}", "x+1", timeout_s=1)
    assert time.monotonic() - start < 5
    assert score.value == 0.0
    assert score.failure is not None and "timeout" in score.failure
