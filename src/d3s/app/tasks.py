"""The tasks of `d3s train`: what a problem is, how it is asked, and how an answer is scored.

Two tasks, one home, so that training and evaluation cannot drift apart:

- `arith` (the embedded default): reasoning-gym `basic_arithmetic` problems generated offline, its
  generator configuration, seeds, prompt and numeric reward; also `d3s eval`'s benchmark `arith`;
- `math`: `{question, answer}` rows of a dataset file or hub dataset (`load_math_rows`), the last
  `heldout_size` rows held out, scored by math-verify.

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

import hashlib
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from d3s.app.datafiles import BadJsonLine, DataFileError, NotUtf8, cell_text, read_rows
from d3s.app.errors import RecipeError, SettingsError
from d3s.app.scoring import completion_text, gold_problem, score_arith, score_math

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
# The math-dataset task, and building a task
# ---------------------------------------------------------------------------------------------

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class MathTaskConfig:
    """The math task: `{question, answer}` rows of a dataset, the last `heldout_size` rows held out."""

    dataset: str
    """A hub dataset name or a local .json/.jsonl/.parquet file."""
    split: str = "train"
    """The split of a hub dataset."""
    question_field: str = "problem"
    """The column holding the question."""
    answer_field: str = "answer"
    """The column holding the gold answer."""
    heldout_size: int = 200
    """Rows held out (the last ones)."""
    instruction: str = MATH_INSTRUCTION
    """Appended to every question."""


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


Where = Callable[[int, int], str]  # (line, index) of a row -> where it is, for a message


def _file_rows(path: Path) -> tuple[list[tuple[int, Any]], Where]:
    """The `(line, row)` of a local dataset file, and where a row is, for messages (`d3s.app.datafiles`)."""
    if path.suffix not in (".json", ".jsonl", ".parquet"):
        raise RecipeError(f"dataset file {path} must be .json, .jsonl or .parquet, not {path.suffix or 'no suffix'!r}")
    try:
        numbered = read_rows(path)
    except NotUtf8 as err:
        raise RecipeError(str(err)) from None
    except BadJsonLine as err:
        raise RecipeError(f"dataset {path} {err}") from None
    except DataFileError as err:
        raise RecipeError(f"dataset {path}: {err}") from None
    if path.suffix == ".parquet":
        return numbered, lambda n, i: f"dataset {path} row {i}"
    return numbered, lambda n, i: f"dataset {path} line {n}" if n else f"dataset {path} item {i}"


def _hub_rows(config: MathTaskConfig, fields: dict[str, str]) -> tuple[list[tuple[int, Any]], Where]:
    """The rows of a hub dataset (or its local cache), and where a row is, for messages."""
    from datasets import load_dataset

    try:
        ds = load_dataset(config.dataset, split=config.split)
    except (OSError, ConnectionError) as err:
        if Path(config.dataset).expanduser().is_dir():
            raise RecipeError(f"dataset folder {config.dataset!r} holds no data file that can be read "
                              f"({type(err).__name__}); give a .json/.jsonl/.parquet file") from None
        raise FileNotFoundError(
            f"could not load dataset {config.dataset!r} ({type(err).__name__}); without hub access pass a local "
            ".json/.jsonl/.parquet file"
        ) from None
    except ValueError as err:  # e.g. an unknown split
        raise RecipeError(f"dataset {config.dataset!r}: {str(err).splitlines()[0]}") from None
    missing = [f for f in fields.values() if f not in ds.column_names]
    if missing:
        name = next(k for k, v in fields.items() if v == missing[0])
        raise RecipeError(f"dataset {config.dataset!r} has no column {missing[0]!r} ({name}); columns: "
                          f"{', '.join(ds.column_names)}")
    return [(0, row) for row in ds], lambda n, i: f"dataset {config.dataset!r} row {i}"


def dataset_digest(dataset: str) -> str | None:
    """The SHA-256 of a local dataset's bytes (a file; a folder: every file in it, with its path), or None for a
    hub dataset (its content is not read here). Recorded with a run (`run_config.json`), so that a resumed or
    reused run never continues on data that changed under the same name."""
    path = Path(dataset).expanduser() if dataset else None
    if path is None or not path.exists():
        return None
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file())
    for f in files:
        digest.update(f"{f.relative_to(path) if f != path else f.name}\0".encode())
        with open(f, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def load_math_rows(config: MathTaskConfig) -> list[dict]:
    """The `{question, answer}` rows of a math dataset; a bad file, row or column is a one-line error
    naming the file, the line and the column."""
    return [row for row, _ in _math_rows(config)]


def _math_rows(config: MathTaskConfig) -> list[tuple[dict, str]]:
    """`load_math_rows`, each row with where it is (`dataset d.jsonl line 3`), for messages."""
    fields = {"question_field": config.question_field, "answer_field": config.answer_field}
    path = Path(config.dataset).expanduser()
    if path.suffix in (".json", ".jsonl", ".parquet") or path.is_file():
        if path.is_dir():
            raise RecipeError(f"dataset {str(path)!r} is a folder, not a file; give the .json/.jsonl/.parquet file "
                              "itself")
        if not path.is_file():
            raise FileNotFoundError(f"dataset file {str(path)!r} does not exist")
        numbered, where = _file_rows(path)
    else:
        numbered, where = _hub_rows(config, fields)
    rows = []
    for i, (number, row) in enumerate(numbered):
        if not isinstance(row, dict):
            raise RecipeError(f"{where(number, i)}: a row is a JSON object, got {type(row).__name__}")
        values = {}
        for name, column in fields.items():
            if column not in row:
                raise RecipeError(f"{where(number, i)}: no column {column!r} ({name}); the row has "
                                  f"{', '.join(map(str, row)) or 'no columns'}")
            value = row[column]
            if isinstance(value, (bytes, bytearray)):  # a binary column of a hub dataset
                try:
                    value = cell_text(value, f"column {column!r}")
                except DataFileError as err:
                    raise RecipeError(f"{where(number, i)}: {err}") from None
            if value is None or isinstance(value, (bool, list, dict)) or not str(value).strip():
                raise RecipeError(f"{where(number, i)}: column {column!r} is {value!r}; expected a non-empty "
                                  "string or number")
            values[name] = str(value)
        rows.append(({"question": values["question_field"], "answer": values["answer_field"]}, where(number, i)))
    return rows


def build_task(config: TaskConfig, n_train: int) -> TaskData:
    """The task of `config`: `n_train` training problems (arith: a stream, may repeat) and the held-out set."""
    if isinstance(config, ArithmeticTaskConfig):
        try:
            train, heldout = train_problems(config, n_train), heldout_problems(config)
        except ValueError as err:  # a task space too small for the held-out set
            raise RecipeError(f"arith task: {err}") from None
        return TaskData("arith", train, heldout, config.instruction, arith_reward, score_arith,
                        {"task": asdict(config)})
    rows = _math_rows(config)
    if len(rows) <= config.heldout_size:
        raise RecipeError(f"dataset {config.dataset!r} has {len(rows)} rows, not more than heldout_size="
                          f"{config.heldout_size}; lower heldout_size or use a larger dataset")
    heldout, train = rows[-config.heldout_size :], rows[: -config.heldout_size]
    train, notes = _without_heldout_questions(config, train, heldout)
    notes += _check_gold_answers(config, train, heldout)
    heldout_rows = [row for row, _ in heldout]
    return TaskData("math", [row for row, _ in train], heldout_rows, config.instruction, math_reward, score_math_answer,
                    {"dataset": config.dataset, "split": config.split, "heldout": heldout_rows}, notes)


def question_key(question: str) -> str:
    """What makes two questions of a dataset the same problem: their words, white space aside."""
    return " ".join(question.split())


Located = list[tuple[dict, str]]  # rows, each with where it is in the dataset


def _without_heldout_questions(config: MathTaskConfig, train: Located, heldout: Located) -> tuple[Located, list[str]]:
    """The training rows whose question is not also a held-out one (`question_key`), as the arith task keeps them
    disjoint; a note says how many went. A dataset whose every training row is held out is refused."""
    held = {question_key(row["question"]) for row, _ in heldout}
    kept = [(row, at) for row, at in train if question_key(row["question"]) not in held]
    removed = len(train) - len(kept)
    if not kept:
        raise RecipeError(f"dataset {config.dataset!r}: every one of its {len(train)} training rows asks a question "
                          f"that is also held out (the last heldout_size={config.heldout_size} rows); the held-out "
                          "accuracy would measure training problems: use a dataset with other questions")
    if not removed:
        return train, []
    return kept, [f"dataset {config.dataset!r}: {removed} of its {len(train)} training rows ask a question that is "
                  f"also held out (the last heldout_size={config.heldout_size} rows); they are left out of training, "
                  f"{len(kept)} rows remain"]


def _check_gold_answers(config: MathTaskConfig, train: Located, heldout: Located) -> list[str]:
    """Every gold answer read by math-verify before training (`d3s.app.scoring.gold_problem`): one it cannot read
    scores 0 for every completion that does not repeat its text. Some: a warning with their count and the first
    rows; all of the training rows', or all of the held-out rows': refused (the rewards, or the accuracy, would
    be 0 throughout)."""
    notes = []
    for name, rows in (("training", train), ("held-out", heldout)):
        bad = [(row, at) for row, at in rows if gold_problem(row["answer"]) is not None]
        if not bad:
            continue
        shown = "; ".join(f"{at}: {row['answer']!r:.40} ({gold_problem(row['answer'])})" for row, at in bad[:3])
        more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
        what = (f"math-verify cannot read {len(bad)} of the {len(rows)} {name} gold answers "
                f"(column {config.answer_field!r}: {shown}{more})")
        if len(bad) == len(rows):
            score = "reward" if name == "training" else "held-out score"
            raise RecipeError(f"dataset {config.dataset!r}: {what}; every {score} would be 0: check answer_field and "
                              "write the answers as math-verify reads them (LaTeX or plain numbers)")
        notes.append(f"warning: dataset {config.dataset!r}: {what}; those problems score 0 for every completion "
                     "that does not repeat that text")
    return notes
