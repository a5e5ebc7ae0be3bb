"""The math task's data: its config (`MathTaskConfig`), the reading of its `{question, answer}` rows from a local
.json/.jsonl/.parquet file or a hub dataset (a bad file, row or column is a one-line error naming the file, the
line and the column), the digest a run records of a local dataset, and the split into training and held-out rows
(`split_math_rows`: the last `heldout_size` rows held out, training rows that ask a held-out question left out,
gold answers math-verify cannot read warned of). `d3s.app.tasks.build_task` makes the task of it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from d3s.app.datafiles import BadJsonLine, DataFileError, NotUtf8, cell_text, read_rows
from d3s.app.errors import RecipeError
from d3s.app.scoring import gold_problem

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


def split_math_rows(config: MathTaskConfig) -> tuple[list[dict], list[dict], list[str]]:
    """The math task's training rows, its held-out rows (the last `heldout_size`) and what the user should know of
    them: training rows that ask a held-out question are left out, gold answers math-verify cannot read warned of
    (all of a side's: refused)."""
    rows = _math_rows(config)
    if len(rows) <= config.heldout_size:
        raise RecipeError(f"dataset {config.dataset!r} has {len(rows)} rows, not more than heldout_size="
                          f"{config.heldout_size}; lower heldout_size or use a larger dataset")
    heldout, train = rows[-config.heldout_size :], rows[: -config.heldout_size]
    train, notes = _without_heldout_questions(config, train, heldout)
    notes += _check_gold_answers(config, train, heldout)
    return [row for row, _ in train], [row for row, _ in heldout], notes

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
