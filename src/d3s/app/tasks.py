"""The tasks of `d3s train`: what a problem is, how it is asked, and how an answer is scored.

Two tasks, one home, so that training and evaluation cannot drift apart:

- `arith` (the embedded default): reasoning-gym `basic_arithmetic` problems generated offline, its
  generator configuration, seeds, prompt and numeric reward; also `d3s eval`'s benchmark `arith`;
- `math`: `{question, answer}` rows of a dataset file or hub dataset, the last `heldout_size` rows held out,
  scored by math-verify; its config and the reading of its rows are `d3s.app.math_data`.

Each task is set by its own config (`ArithmeticTaskConfig`, `MathTaskConfig`; a recipe's `RunArgs`
makes one with `task_config()`), and `build_task` turns it into a `TaskData`: training rows, held-out
problems, prompt instruction, reward function and scorer. Answers are read and scored by
`d3s.app.scoring`, the scorers `d3s eval` uses.

Train / held-out disjointness. Held-out problems come from `heldout_seed`, training problems from
`train_seed`, and every training problem whose canonical form (`canonical_key`) equals a held-out
one is dropped. The canonical form sorts the operands of a chain of a single commutative operator,
so `3 + 4` and `4 + 3` are the same problem: a swapped-operand copy of a held-out problem is
never trained on.

Reward. `arith_reward` reads the answer in a completion as the content of its last `\\boxed{}`
when there is one, otherwise its last number, and compares it numerically with the gold answer
(`d3s.app.scoring.score_arith`). It is pure and returns 0.0 for anything it cannot read (empty, no
number).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from d3s.app.errors import RecipeError, SettingsError
from d3s.app.math_data import MathTaskConfig, split_math_rows
from d3s.app.scoring import completion_text, score_arith, score_math

ARITH_INSTRUCTION = "Answer with only the final number."


@dataclass(frozen=True)
class ArithmeticTaskConfig:
    """reasoning-gym `basic_arithmetic` settings, seeds and prompt of the embedded task.

    The defaults are the setting measured for the default `d3s train` run: 2 terms, 1 digit,
    `+ - *`, no brackets, no negation (11 x 11 x 3 = 363 expressions, 253 once swapped operands
    of `+` and `*` are identified).
    """

    min_terms: int = 2
    """Fewest terms in an expression."""
    max_terms: int = 2
    """Most terms in an expression."""
    min_digits: int = 1
    """Fewest digits per operand."""
    max_digits: int = 1
    """Most digits per operand."""
    operators: tuple[str, ...] = ("+", "-", "*")
    """Operators drawn from; a subset of `+ - * /`."""
    allow_parentheses: bool = False
    """Whether expressions may contain brackets."""
    allow_negation: bool = False
    """Whether operands may be negated."""
    train_seed: int = 1
    """Seed of the training problem stream."""
    heldout_seed: int = 10_000
    """Seed of the held-out problem stream; must differ from `train_seed`."""
    heldout_size: int = 200
    """Number of distinct held-out problems."""
    instruction: str = ARITH_INSTRUCTION
    """Appended to every question."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Further `basic_arithmetic` keyword arguments (e.g. `whitespace`, `format_style`)."""

    def __post_init__(self) -> None:
        if self.train_seed == self.heldout_seed:
            raise SettingsError("{train_seed} equals {heldout_seed}; they must differ so the streams are independent",
                                train_seed=self.train_seed, heldout_seed=self.heldout_seed)
        if self.heldout_size < 1:
            raise SettingsError("{heldout_size} must be >= 1", heldout_size=self.heldout_size)
        bad = [op for op in self.operators if op not in ("+", "-", "*", "/")]
        if not self.operators or bad:
            raise SettingsError("{operators}: each must be one of + - * /", operators=self.operators)
        if not 1 <= self.min_terms <= self.max_terms:
            raise SettingsError("{min_terms}, {max_terms}: need 1 <= min <= max", min_terms=self.min_terms,
                                max_terms=self.max_terms)
        if not 1 <= self.min_digits <= self.max_digits:
            raise SettingsError("{min_digits}, {max_digits}: need 1 <= min <= max", min_digits=self.min_digits,
                                max_digits=self.max_digits)

    def generator_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `reasoning_gym.create_dataset("basic_arithmetic", ...)`."""
        kw = asdict(self)
        for name in ("train_seed", "heldout_seed", "heldout_size", "instruction", "extra"):
            kw.pop(name)
        kw["operators"] = tuple(self.operators)
        kw.update(self.extra)
        return kw


def generate_problems(config: ArithmeticTaskConfig, seed: int, size: int) -> list[dict[str, str]]:
    """The first `size` problems of the reasoning-gym stream with this seed (duplicates kept).

    Returns dicts with `question` (the bare reasoning-gym question), `answer` (a number as text)
    and `expression` (e.g. `"4 - 1"`).
    """
    return list(iter_problems(config, seed, size))


def iter_problems(config: ArithmeticTaskConfig, seed: int, size: int):
    """`generate_problems`, one at a time: reasoning-gym makes each item when it is asked for."""
    try:
        import reasoning_gym
    except ImportError as e:
        raise ImportError(
            "the arithmetic task needs reasoning-gym: pip install reasoning-gym"
        ) from e
    ds = reasoning_gym.create_dataset(
        "basic_arithmetic", seed=seed, size=size, **config.generator_kwargs()
    )
    for i in range(size):
        item = ds[i]
        yield {
            "question": item["question"],
            "answer": str(item["answer"]),
            "expression": item["metadata"]["expression"],
        }


_TOKEN_RE = re.compile(r"\s*(\d+(?:\.\d+)?|[-+*/()])")


def canonical_key(expression: str) -> str:
    """A form equal for expressions that are the same problem up to swapped operands.

    A flat chain of one commutative operator (`a + b + c`, `a * b`) has its operands sorted;
    anything else (mixed operators, brackets, `-`, `/`) is only whitespace-normalised.
    """
    tokens = _TOKEN_RE.findall(expression)
    if "".join(tokens) != re.sub(r"\s+", "", expression):
        return re.sub(r"\s+", "", expression)  # not a plain expression: keep it as written
    operands, ops = tokens[0::2], set(tokens[1::2])
    is_chain = len(ops) == 1 and all(re.fullmatch(r"\d+(?:\.\d+)?", t) for t in operands)
    if is_chain and ops <= {"+", "*"}:
        (op,) = ops
        ordered = sorted(operands, key=lambda t: (float(t), t))
        return op.join(ordered)
    return "".join(tokens)


def _draw(config: ArithmeticTaskConfig, seed: int, want: int, max_draws: int,
          accept: Callable[[dict[str, str]], bool | None]) -> tuple[list[dict[str, str]], int]:
    """Problems of the seed's stream that `accept` takes, until `want` of them, `max_draws` draws, or
    `accept` returns None (give up). Returns the problems and the number of draws."""
    problems: list[dict[str, str]] = []
    draws = 0
    for problem in iter_problems(config, seed, max_draws):
        draws += 1
        verdict = accept(problem)
        if verdict is None:
            break
        if verdict:
            problems.append(problem)
            if len(problems) == want:
                break
    return problems, draws


def _distinct_problems(config: ArithmeticTaskConfig, seed: int, count: int, exclude: set[str]):
    """First `count` problems of the seed's stream with distinct keys not in `exclude`.

    Gives up (ValueError) after `100 * count` draws, or sooner when `max(2000, 20 * seen)` draws in a
    row bring nothing new: the task space is then (with probability about 1 - e^-20) used up, and
    drawing on would only take minutes to fail.
    """
    seen, stale = set(exclude), 0

    def new_key(problem: dict[str, str]) -> bool | None:
        nonlocal stale
        key = canonical_key(problem["expression"])
        if key not in seen:
            seen.add(key)
            stale = 0
            return True
        stale += 1
        return None if stale >= max(2000, 20 * len(seen)) else False

    problems, draws = _draw(config, seed, count, max(1000, 100 * count), new_key)
    if len(problems) < count:
        raise ValueError(
            f"only {len(problems)} distinct problems (of {count} asked) in {draws} draws with "
            f"seed={seed} for {config.generator_kwargs()}; make the task larger (more digits or "
            "terms) or ask for fewer problems"
        )
    return problems


def heldout_problems(config: ArithmeticTaskConfig) -> list[dict[str, str]]:
    """The `heldout_size` distinct held-out problems (fixed by `heldout_seed`)."""
    return _distinct_problems(config, config.heldout_seed, config.heldout_size, exclude=set())


def heldout_keys(config: ArithmeticTaskConfig) -> set[str]:
    """Canonical keys of the held-out problems: what training must never see."""
    return {canonical_key(p["expression"]) for p in heldout_problems(config)}


def train_problems(config: ArithmeticTaskConfig, size: int) -> list[dict[str, str]]:
    """`size` training problems from `train_seed`, none equal to a held-out one up to swaps.

    Repeats are kept (it is a training stream): the task space may be small. Raises ValueError
    when held-out problems cover the whole task space.
    """
    banned = heldout_keys(config)
    draws = max(1000, 50 * size)  # a small task space leaves few problems to training: the stream may run long
    out, _ = _draw(config, config.train_seed, size, draws, lambda p: canonical_key(p["expression"]) not in banned)
    if len(out) < size:
        raise ValueError(
            f"only {len(out)} of {draws} training draws avoid the {len(banned)} held-out problems "
            f"for {config.generator_kwargs()}; make the task larger or heldout_size smaller"
        )
    return out


def prompt_text(question: str, instruction: str = ARITH_INSTRUCTION) -> str:
    """The user message of a problem: the question, then the instruction."""
    return f"{question} {instruction}".strip()


def prompt_messages(question: str, instruction: str = ARITH_INSTRUCTION) -> list[dict[str, str]]:
    """The problem as a conversational prompt (TRL's `prompt` column format)."""
    return [{"role": "user", "content": prompt_text(question, instruction)}]


# ---------------------------------------------------------------------------------------------
# Reward
# ---------------------------------------------------------------------------------------------


def arith_reward(
    completions: Sequence[str | Sequence[dict[str, str]]], answer: Sequence[str], **_: Any
) -> list[float]:
    """TRL reward function of the task: `(completions, answer=...) -> [0.0 | 1.0]` per completion.

    `completions` are strings or conversational completions (lists of messages); `answer` is the
    dataset column of gold answers, aligned with `completions`.
    """
    if len(completions) != len(answer):
        raise ValueError(
            f"{len(completions)} completions but {len(answer)} answers; they must align"
        )
    return [score_arith(completion_text(c), a) for c, a in zip(completions, answer)]


# ---------------------------------------------------------------------------------------------
# The math-dataset task's reward, and building a task
# ---------------------------------------------------------------------------------------------

TaskConfig = ArithmeticTaskConfig | MathTaskConfig


@dataclass
class TaskData:
    """A task as the run needs it: training rows, held-out problems, reward and scorer."""

    name: str
    train: list[dict]  # {"question", "answer"}
    heldout: list[dict]  # {"question", "answer"}, disjoint from train
    instruction: str
    reward: Callable  # TRL reward function (completions, answer=..., **columns) -> list[float]
    score: Callable[[str, str], float]  # (completion, gold answer) -> 0.0 / 1.0
    key: dict  # what identifies the held-out set, for the cached base-model score
    notes: list[str] = field(default_factory=list)  # what the user should know of the data (rows left out, ...)


def math_reward(completions, answer, **_) -> list[float]:
    """math-verify reward: 1.0 when the completion's final answer equals the gold one, else 0.0."""
    return [score_math(completion_text(c), str(a)).value for c, a in zip(completions, answer)]


def score_math_answer(completion: str, gold: str) -> float:
    """The math task's scorer: 1.0 when math-verify finds the completion's answer equal to `gold`, else 0.0."""
    return score_math(completion, gold).value


def build_task(config: TaskConfig, n_train: int) -> TaskData:
    """The task of `config`: `n_train` training problems (arith: a stream, may repeat) and the held-out set."""
    if isinstance(config, ArithmeticTaskConfig):
        try:
            train, heldout = train_problems(config, n_train), heldout_problems(config)
        except ValueError as err:  # a task space too small for the held-out set
            raise RecipeError(f"arith task: {err}") from None
        return TaskData("arith", train, heldout, config.instruction, arith_reward, score_arith,
                        {"task": asdict(config)})
    train, heldout, notes = split_math_rows(config)
    return TaskData("math", train, heldout, config.instruction, math_reward, score_math_answer,
                    {"dataset": config.dataset, "split": config.split, "heldout": heldout}, notes)
