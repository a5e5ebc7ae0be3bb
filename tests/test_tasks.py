"""The embedded arithmetic task: disjoint train / held-out problems, prompt, reward."""

from __future__ import annotations

import pytest

from d3s.app import tasks
from d3s.app.scoring import extract_final_number
from d3s.app.tasks import ArithmeticTaskConfig, arith_reward, canonical_key

SMALL = ArithmeticTaskConfig(heldout_size=50)


def test_canonical_key_identifies_swapped_operands_only():
    assert canonical_key("3 + 4") == canonical_key("4 + 3") == canonical_key("4+3")
    assert canonical_key("2 * 10") == canonical_key("10 * 2")
    assert canonical_key("1 + 2 + 3") == canonical_key("3 + 1 + 2")
    assert canonical_key("4 - 3") != canonical_key("3 - 4")
    assert canonical_key("8 / 2") != canonical_key("2 / 8")
    assert canonical_key("1 + 2 * 3") != canonical_key("2 * 3 + 1")  # mixed: kept as written


def test_heldout_is_fixed_distinct_and_sized():
    a = tasks.heldout_problems(SMALL)
    assert a == tasks.heldout_problems(SMALL)  # deterministic
    keys = [canonical_key(p["expression"]) for p in a]
    assert len(a) == 50 and len(set(keys)) == 50
    for p in a:  # the gold answer is the expression's value
        assert float(p["answer"]) == eval(p["expression"])  # noqa: S307 - digits and + - * only


def test_train_never_contains_a_heldout_problem_or_its_swap():
    heldout = tasks.heldout_keys(SMALL)
    train = tasks.train_problems(SMALL, 300)
    assert len(train) == 300
    assert not {canonical_key(p["expression"]) for p in train} & heldout
    # The raw train stream does hit held-out problems; the filter is what removes them.
    raw = tasks.generate_problems(SMALL, SMALL.train_seed, 300)
    assert {canonical_key(p["expression"]) for p in raw} & heldout


def test_default_task_space_and_too_large_heldout():
    # 253 distinct problems once swaps are identified: 200 held out leaves 53 to train on.
    default = ArithmeticTaskConfig()
    train = tasks.train_problems(default, 200)
    assert len({canonical_key(p["expression"]) for p in train}) <= 53
    with pytest.raises(ValueError, match="distinct problems"):
        tasks.heldout_problems(ArithmeticTaskConfig(heldout_size=300))


def test_a_long_training_stream_of_the_default_task_extends_the_short_one():
    """A run capped at many steps (a compute budget) needs a long stream of the 53 problems training may use;
    its start is the stream a shorter run draws."""
    default = ArithmeticTaskConfig()
    long, short = tasks.train_problems(default, 20 * 16 + 64), tasks.train_problems(default, 104)
    assert len(long) == 384 and long[:104] == short


def test_config_validation_names_values():
    with pytest.raises(ValueError, match="train_seed=5 equals heldout_seed=5"):
        ArithmeticTaskConfig(train_seed=5, heldout_seed=5)
    with pytest.raises(ValueError, match=r"operators=\('\^',\)"):
        ArithmeticTaskConfig(operators=("^",))
    with pytest.raises(ValueError, match="min_digits=2, max_digits=1"):
        ArithmeticTaskConfig(min_digits=2)


def test_prompt_messages():
    assert tasks.prompt_messages("Calculate 4 - 1.") == [
        {"role": "user", "content": "Calculate 4 - 1. Answer with only the final number."}
    ]


@pytest.mark.parametrize(
    "text, value",
    [
        ("7", 7.0),
        ("The answer is -4.", -4.0),
        ("3 - 1 = 2", 2.0),
        ("\\boxed{12} since 3 * 4", 12.0),
        ("1,024", 1024.0),
        ("2.50", 2.5),
        ("no number", None),
        ("", None),
    ],
)
def test_extract_final_number(text, value):
    assert extract_final_number(text) == value


def test_reward_is_pure_and_handles_bad_output():
    completions = ["7", "The answer is 8", "", [{"role": "assistant", "content": "-4"}], "abc"]
    answers = ["7", "7", "7", "-4", "3"]
    assert arith_reward(completions, answer=answers) == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert arith_reward(["7"], answer=["not a number"]) == [0.0]
    with pytest.raises(ValueError, match="must align"):
        arith_reward(["7", "8"], answer=["7"])
