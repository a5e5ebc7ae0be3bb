"""Benchmark definitions and loaders: the ONE place that maps each benchmark's fields.

Every benchmark of the paper's Table 1 is read in the format its commonly used Hugging Face
version publishes, from the hub or from a local copy (a file or a folder of JSON / JSONL /
parquet, e.g. a snapshot of the hub repository):

    aime24         math-ai/aime24 (test)            problem   answer, else \\boxed{} of solution
    aime25         math-ai/aime25 (test)            problem   answer
    amc23          math-ai/amc23 (test)             question  answer (floats: 27.0 -> "27")
    gsm8k          openai/gsm8k (main, test)        question  text after "####", commas removed
    math500        HuggingFaceH4/MATH-500 (test)    problem   answer, else \\boxed{} of solution
    minerva        math-ai/minervamath (test)       question  answer
    olympiadbench  Hothan/OlympiadBench             question  final_answer (a list, joined)
                   (OE_TO_maths_en_COMP, train)
    arith          generated offline (d3s.app.tasks)    question  answer (checked numerically)

Field names are tried in order, so the other common copies load as well (HuggingFaceH4/aime_2024
has `answer` and a full `solution`; AI-MO/aimo-validation-amc has `problem` and a float
`answer`; math-ai/olympiadbench has `question` and a `final_answer` list).
"""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal
from urllib.parse import urlparse

from d3s.app.datafiles import SUFFIXES, BadJsonLine, DataFileError, NotUtf8, read_rows
from d3s.app.errors import UsageError
from d3s.app.scoring import Scorer, last_boxed
from d3s.app.tasks import ArithmeticTaskConfig, heldout_problems

AnswerFormat = Literal["plain", "gsm8k", "boxed", "list"]


class BenchmarkError(UsageError):
    """Bad benchmark input: unknown name, missing file, unreadable row."""


@dataclass(frozen=True)
class BenchmarkSpec:
    """Where a benchmark lives and how its rows map to (question, gold answer)."""

    name: str
    """Name used on the command line."""
    title: str
    """Column header in the results table (as in the paper's Table 1)."""
    hf_path: str | None
    """Hub dataset id; None for a generated benchmark."""
    hf_config: str | None
    """Hub dataset config name, if any."""
    hf_split: str
    """Split evaluated on."""
    question_fields: tuple[str, ...]
    """Row fields holding the question, tried in order."""
    answer_fields: tuple[tuple[str, AnswerFormat], ...]
    """(field, format) pairs holding the gold answer, tried in order."""
    scorer: Scorer = "math_verify"
    """How completions are checked."""


BENCHMARKS: dict[str, BenchmarkSpec] = {
    spec.name: spec
    for spec in (
        BenchmarkSpec(
            "aime24", "AIME24", "math-ai/aime24", None, "test",
            ("problem", "question", "Problem"),
            (("answer", "plain"), ("Answer", "plain"), ("solution", "boxed")),
        ),
        BenchmarkSpec(
            "aime25", "AIME25", "math-ai/aime25", None, "test",
            ("problem", "question", "Problem"),
            (("answer", "plain"), ("Answer", "plain"), ("solution", "boxed")),
        ),
        BenchmarkSpec(
            "amc23", "AMC23", "math-ai/amc23", None, "test",
            ("question", "problem"),
            (("answer", "plain"), ("solution", "boxed")),
        ),
        BenchmarkSpec(
            "gsm8k", "GSM8k", "openai/gsm8k", "main", "test",
            ("question",),
            (("answer", "gsm8k"),),
        ),
        BenchmarkSpec(
            "math500", "MATH", "HuggingFaceH4/MATH-500", None, "test",
            ("problem", "question"),
            (("answer", "plain"), ("solution", "boxed")),
        ),
        BenchmarkSpec(
            "minerva", "Minerva", "math-ai/minervamath", None, "test",
            ("question", "problem"),
            (("answer", "plain"), ("solution", "boxed")),
        ),
        BenchmarkSpec(
            "olympiadbench", "Olympiad", "Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train",
            ("question", "problem"),
            (("final_answer", "list"), ("answer", "plain")),
        ),
        BenchmarkSpec(
            "arith", "Arith", None, None, "heldout",
            ("question",),
            (("answer", "plain"),),
            scorer="numeric",
        ),
    )
}  # fmt: skip

PAPER_BENCHMARKS = ("aime24", "aime25", "amc23", "gsm8k", "math500", "minerva", "olympiadbench")
"""The seven benchmarks of the paper's Table 1, in its column order."""

ALIASES = {
    "aime2024": "aime24",
    "aime2025": "aime25",
    "amc": "amc23",
    "amc2023": "amc23",
    "math": "math500",
    "math-500": "math500",
    "minervamath": "minerva",
    "minerva_math": "minerva",
    "olympiad": "olympiadbench",
    "olympiad_bench": "olympiadbench",
}


@dataclass(frozen=True)
class Problem:
    """One evaluation problem."""

    benchmark: str
    problem_id: str
    """Stable id within the benchmark (the row index)."""
    question: str
    gold: str
    """Gold answer as text, ready for the scorer."""

    @property
    def digest(self) -> str:
        """Short hash of question + gold: detects a cache written for another dataset version."""
        return hashlib.sha1(f"{self.question}\x00{self.gold}".encode()).hexdigest()[:12]


def resolve_name(name: str) -> str:
    """Canonical benchmark name, or BenchmarkError naming the valid ones."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in BENCHMARKS:
        raise BenchmarkError(
            f"unknown benchmark {name!r}; valid: {', '.join(BENCHMARKS)} "
            f"(aliases: {', '.join(sorted(ALIASES))})"
        )
    return key


# ---------------------------------------------------------------------------------------------
# Gold answers (pure)
# ---------------------------------------------------------------------------------------------


def _strip_dollars(text: str) -> str:
    text = text.strip()
    while len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text[1:-1].strip()
    return text


def _plain(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int):
        return str(value)
    text = _strip_dollars(str(value))
    return text or None


def extract_gold(value: Any, fmt: AnswerFormat) -> str | None:
    """Gold answer text from one field value in the given format; None when it has none.

    - plain: the value as text (`$...$` stripped; a float like 142.0 becomes "142").
    - gsm8k: the text after the last `####`, thousands commas removed ("1,000" -> "1000").
    - boxed: the content of the last `\\boxed{}` of a solution.
    - list: a list of answers (OlympiadBench `final_answer`), each `$`-stripped, joined by ", ".
    """
    if fmt == "plain":
        return _plain(value)
    elif fmt == "gsm8k":
        if not isinstance(value, str) or "####" not in value:
            return None
        return _plain(value.rsplit("####", 1)[1].replace(",", ""))
    elif fmt == "boxed":
        if not isinstance(value, str):
            return None
        boxed = last_boxed(value)
        return _plain(boxed) if boxed is not None else None
    elif fmt == "list":
        if isinstance(value, str):
            return _plain(value)
        if not isinstance(value, Iterable):
            return _plain(value)
        parts = [p for p in (_plain(v) for v in value) if p]
        return ", ".join(parts) if parts else None
    else:
        raise ValueError(f"unknown answer format {fmt!r}")


def row_to_problem(spec: BenchmarkSpec, row: dict[str, Any], index: int, where: str) -> Problem:
    """Map one dataset row to a Problem using the spec's field lists (BenchmarkError if none)."""
    question = next(
        (str(row[f]) for f in spec.question_fields if isinstance(row.get(f), str) and row[f]),
        None,
    )
    if question is None:
        raise BenchmarkError(
            f"{spec.name}: {where} row {index} has none of the question fields "
            f"{spec.question_fields}; its fields are {sorted(row)}"
        )
    for field_name, fmt in spec.answer_fields:
        if field_name in row:
            gold = extract_gold(row[field_name], fmt)
            if gold is not None:
                return Problem(spec.name, str(index), question, gold)
    raise BenchmarkError(
        f"{spec.name}: {where} row {index} has no gold answer in "
        f"{[f for f, _ in spec.answer_fields]}; its fields are {sorted(row)}"
    )


# ---------------------------------------------------------------------------------------------
# Local files
# ---------------------------------------------------------------------------------------------


def read_file(path: Path) -> list[Any]:
    """Rows of one local data file (`d3s.app.datafiles.read_rows`); BenchmarkError names the file and line."""
    try:
        return [row for _, row in read_rows(path)]
    except NotUtf8 as e:
        raise BenchmarkError(str(e)) from None
    except BadJsonLine as e:
        raise BenchmarkError(f"{path}:{e.line}: not valid JSON ({e.msg} at column {e.column})") from None
    except DataFileError as e:
        raise BenchmarkError(f"{path}: {e}") from None


def _pick_files(spec: BenchmarkSpec, folder: Path) -> list[Path]:
    """Data files of a folder: narrowed to the spec's config, then its split, when that matches."""
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and p.suffix.lower() in SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    for wanted in (spec.hf_config, spec.hf_split):
        if wanted:
            narrowed = [p for p in files if wanted.lower() in str(p.relative_to(folder)).lower()]
            files = narrowed or files
    return files


def local_candidates(spec: BenchmarkSpec, data_dir: Path) -> list[Path]:
    """Paths under `data_dir` looked at for a benchmark, in order."""
    stems = [spec.name] + [alias for alias, name in ALIASES.items() if name == spec.name]
    if spec.hf_path:
        stems += [spec.hf_path, spec.hf_path.split("/")[-1]]
    out: list[Path] = []
    for stem in dict.fromkeys(stems):
        out.append(data_dir / stem)
        out += [data_dir / f"{stem}{ext}" for ext in SUFFIXES]
    return out


def load_local(spec: BenchmarkSpec, path: Path) -> list[Problem]:
    """Problems from a file, or from all matching data files of a folder."""
    if not path.exists():
        raise BenchmarkError(f"{spec.name}: {path} does not exist")
    files = _pick_files(spec, path) if path.is_dir() else [path]
    if not files:
        raise BenchmarkError(
            f"{spec.name}: no {'/'.join(SUFFIXES)} file under {path}"
        )
    problems: list[Problem] = []
    for file in files:
        for row in read_file(file):
            if not isinstance(row, dict):
                raise BenchmarkError(f"{spec.name}: {file} holds a non-record row: {row!r:.80}")
            problems.append(row_to_problem(spec, row, len(problems), str(file)))
    return problems


# ---------------------------------------------------------------------------------------------
# Hub
# ---------------------------------------------------------------------------------------------


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Quick TCP check of the hub endpoint, so an offline machine fails in seconds, not minutes.

    Behind a proxy the check is skipped (True): `datasets` then tries and reports itself.
    """
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def load_hub(spec: BenchmarkSpec) -> list[Problem]:
    """Problems from the Hugging Face hub (or its local cache when HF_HUB_OFFLINE=1)."""
    assert spec.hf_path is not None
    hint = (
        f"download it elsewhere (e.g. `hf download {spec.hf_path} --repo-type dataset "
        f"--local-dir DIR/{spec.name}`) and pass --data_dir DIR"
    )
    if not _hub_offline() and not hub_reachable():
        raise BenchmarkError(
            f"{spec.name}: the Hugging Face hub is unreachable and no --data_dir was given; {hint}"
        )
    try:
        import datasets
    except ImportError as e:
        raise ImportError("loading from the hub needs `datasets`: pip install datasets") from e
    try:
        ds = datasets.load_dataset(spec.hf_path, spec.hf_config, split=spec.hf_split)
    except (OSError, ValueError, datasets.exceptions.DatasetNotFoundError) as e:
        raise BenchmarkError(
            f"{spec.name}: could not load {spec.hf_path} from the hub "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); {hint}"
        ) from e
    where = f"{spec.hf_path}[{spec.hf_split}]"
    return [row_to_problem(spec, dict(row), i, where) for i, row in enumerate(ds)]


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def load_arith(task: ArithmeticTaskConfig | None = None) -> list[Problem]:
    """The held-out problems of the embedded `d3s train` task (generated offline)."""
    return [
        Problem("arith", str(i), p["question"], p["answer"])
        for i, p in enumerate(heldout_problems(task or ArithmeticTaskConfig()))
    ]


def load_benchmark(
    name: str, data_dir: str | Path | None = None, path: str | Path | None = None
) -> list[Problem]:
    """Problems of one benchmark.

    Args:
        name: benchmark name or alias.
        data_dir: folder holding local copies (see `local_candidates`); when given, the hub is
            not used.
        path: an explicit file or folder for this benchmark (wins over `data_dir`).
    """
    spec = BENCHMARKS[resolve_name(name)]
    if path is not None:  # an explicit file wins, for arith too (rows with `question`, `answer`)
        return load_local(spec, Path(path))
    if spec.name == "arith":
        return load_arith()
    if data_dir is not None:
        data_dir = Path(data_dir)
        if not data_dir.is_dir():
            raise BenchmarkError(f"--data_dir {data_dir} is not a folder")
        for candidate in local_candidates(spec, data_dir):
            if candidate.exists():
                return load_local(spec, candidate)
        tried = ", ".join(p.name for p in local_candidates(spec, data_dir)[:4])
        raise BenchmarkError(
            f"{spec.name}: nothing found in --data_dir {data_dir} (looked for {tried}, ...)"
        )
    return load_hub(spec)
