"""Loaders on fixture files in each benchmark's published format; gold extraction; bad input."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from d3s.app.datafiles import read_rows
from d3s.app.evaluation.benchmarks import (
    BENCHMARKS,
    BenchmarkError,
    extract_gold,
    load_benchmark,
    resolve_name,
)
from d3s.app.scoring import last_boxed

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "benchmarks"


def read_records(path: Path) -> list[dict]:
    return [row for _, row in read_rows(path)]


def golds(problems):
    return [p.gold for p in problems]


@pytest.mark.parametrize(
    "name, path, expected",
    [
        ("aime24", "aime24.jsonl", ["204", "025"]),  # math-ai/aime24: boxed `solution`
        ("aime24", "aime_2024_h4.jsonl", ["033"]),  # HuggingFaceH4/aime_2024: `answer` wins
        ("aime25", "aime25.jsonl", ["70", "16"]),
        ("amc23", "amc23.jsonl", ["27", "36"]),  # float answers 27.0 -> "27"
        ("amc23", "aimo-validation-amc.jsonl", ["142"]),  # AI-MO: `problem` + float `answer`
        ("gsm8k", "gsm8k.jsonl", ["72", "1080"]),  # after ####, comma removed
        ("math500", "math500", ["\\left( 3, \\frac{\\pi}{2} \\right)", "\\frac{14}{3}"]),
        ("minerva", "minervamath.jsonl", ["0.49", "\\frac{1}{2}"]),
        ("olympiadbench", "olympiadbench", ["2", "(6,3),(9,3),(9,5),(54,5)", "1, 3"]),
    ],
)
def test_loader_reads_published_format(name, path, expected):
    problems = load_benchmark(name, path=FIXTURES / path)
    assert golds(problems) == expected
    assert all(p.question and p.benchmark == name for p in problems)
    assert [p.problem_id for p in problems] == [str(i) for i in range(len(expected))]


def test_question_field_per_benchmark():
    assert load_benchmark("gsm8k", path=FIXTURES / "gsm8k.jsonl")[0].question.startswith(
        "Natalia sold clips"
    )
    assert "Cities $A$" in load_benchmark("amc23", path=FIXTURES / "amc23.jsonl")[0].question
    assert "Xenia" in load_benchmark("olympiadbench", path=FIXTURES / "olympiadbench")[0].question


def test_data_dir_finds_files_by_name_and_alias(tmp_path):
    (tmp_path / "minervamath.jsonl").write_text((FIXTURES / "minervamath.jsonl").read_text())
    (tmp_path / "MATH-500").mkdir()
    (tmp_path / "MATH-500" / "test.jsonl").write_text((FIXTURES / "math500/test.jsonl").read_text())
    assert golds(load_benchmark("minerva", data_dir=tmp_path)) == ["0.49", "\\frac{1}{2}"]
    assert len(load_benchmark("math", data_dir=tmp_path)) == 2  # alias + hub repo basename
    with pytest.raises(BenchmarkError, match="gsm8k: nothing found in --data_dir"):
        load_benchmark("gsm8k", data_dir=tmp_path)


def _write_parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_hub_snapshot_folder_picks_config_and_split(tmp_path):
    """A local copy of openai/gsm8k: main/ and socratic/ configs, train and test splits."""
    rows = read_records(FIXTURES / "gsm8k.jsonl")
    snapshot = tmp_path / "openai" / "gsm8k"
    _write_parquet(snapshot / "main" / "test-00000-of-00001.parquet", rows)
    _write_parquet(snapshot / "main" / "train-00000-of-00001.parquet", rows[:1] * 5)
    _write_parquet(snapshot / "socratic" / "test-00000-of-00001.parquet", rows[:1] * 3)
    assert golds(load_benchmark("gsm8k", data_dir=tmp_path)) == ["72", "1080"]


def test_parquet_keeps_list_answers(tmp_path):
    rows = read_records(FIXTURES / "olympiadbench" / "OE_TO_maths_en_COMP.json")
    _write_parquet(tmp_path / "OE_TO_maths_en_COMP" / "train.parquet", rows)
    assert golds(load_benchmark("olympiadbench", path=tmp_path))[2] == "1, 3"


def test_json_column_and_wrapped_layouts(tmp_path):
    (tmp_path / "cols.json").write_text(json.dumps({"problem": ["p1", "p2"], "answer": ["1", "2"]}))
    (tmp_path / "wrapped.json").write_text(json.dumps({"data": [{"problem": "p", "answer": 5}]}))
    assert golds(load_benchmark("aime25", path=tmp_path / "cols.json")) == ["1", "2"]
    assert golds(load_benchmark("aime25", path=tmp_path / "wrapped.json")) == ["5"]


@pytest.mark.parametrize(
    "value, fmt, expected",
    [
        ("x\n#### 1,234", "gsm8k", "1234"),
        ("no marker", "gsm8k", None),
        ("so $\\boxed{\\frac{a}{b^{2}}}$.", "boxed", "\\frac{a}{b^{2}}"),
        ("\\boxed{1} then \\boxed{2}", "boxed", "2"),
        ("\\boxed{unclosed", "boxed", None),
        ("no box", "boxed", None),
        (["$1$", "$3$"], "list", "1, 3"),
        ([], "list", None),
        (12.0, "plain", "12"),
        (0.25, "plain", "0.25"),
        ("$\\sqrt{2}$", "plain", "\\sqrt{2}"),
        ("", "plain", None),
        (None, "plain", None),
    ],
)
def test_extract_gold(value, fmt, expected):
    assert extract_gold(value, fmt) == expected


def test_last_boxed_nested_braces():
    assert last_boxed("a \\boxed{\\{1, \\{2\\}\\}} b") == "\\{1, \\{2\\}\\}"


def test_bad_rows_name_file_and_fields(tmp_path):
    (tmp_path / "gsm8k.jsonl").write_text(json.dumps({"prompt": "q", "answer": "#### 1"}) + "\n")
    with pytest.raises(BenchmarkError, match=r"row 0 has none of the question fields.*prompt"):
        load_benchmark("gsm8k", data_dir=tmp_path)
    (tmp_path / "gsm8k.jsonl").write_text(json.dumps({"question": "q", "answer": "7"}) + "\n")
    with pytest.raises(BenchmarkError, match="no gold answer"):
        load_benchmark("gsm8k", data_dir=tmp_path)
    (tmp_path / "gsm8k.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n{oops\n')
    with pytest.raises(BenchmarkError, match=r"gsm8k.jsonl:2: not valid JSON"):
        load_benchmark("gsm8k", data_dir=tmp_path)


def test_unknown_name_lists_valid_ones():
    with pytest.raises(BenchmarkError, match=r"unknown benchmark 'gsm9k'; valid: .*gsm8k"):
        resolve_name("gsm9k")
    assert resolve_name("MATH-500") == "math500"
    assert resolve_name("OlympiadBench") == "olympiadbench"


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(BenchmarkError, match="does not exist"):
        load_benchmark("aime25", path=tmp_path / "nope.jsonl")


def test_unreachable_hub_fails_fast_with_hint(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: refused at once
    start = time.monotonic()
    with pytest.raises(BenchmarkError, match=r"hub is unreachable.*--data_dir"):
        load_benchmark("gsm8k")
    assert time.monotonic() - start < 10


def test_arith_benchmark_is_the_tasks_heldout_set():
    from d3s.app import tasks

    problems = load_benchmark("arith")
    heldout = tasks.heldout_problems(tasks.ArithmeticTaskConfig())
    assert [(p.question, p.gold) for p in problems] == [
        (h["question"], h["answer"]) for h in heldout
    ]
    assert BENCHMARKS["arith"].scorer == "numeric"


def test_hub_path_asks_for_the_published_config_and_split(monkeypatch):
    """The hub loader's request and row mapping, with `datasets.load_dataset` stubbed."""
    import datasets

    from d3s.app.evaluation import benchmarks

    calls = []

    def fake_load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        return read_records(FIXTURES / "olympiadbench" / "OE_TO_maths_en_COMP.json")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(benchmarks, "hub_reachable", lambda timeout_s=3.0: True)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    problems = load_benchmark("olympiadbench")
    assert calls == [("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train")]
    assert golds(problems) == ["2", "(6,3),(9,3),(9,5),(54,5)", "1, 3"]

    def failing_load_dataset(path, name=None, split=None):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", failing_load_dataset)
    with pytest.raises(BenchmarkError, match=r"could not load openai/gsm8k.*--data_dir"):
        load_benchmark("gsm8k")
