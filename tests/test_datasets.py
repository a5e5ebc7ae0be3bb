"""task=math datasets from local files: the rows as written, or one line naming file, line and column."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("datasets")

from d3s import cli  # noqa: E402
from d3s.app.errors import RecipeError  # noqa: E402
from d3s.app.run_args import RunArgs  # noqa: E402
from d3s.app.tasks import load_math_rows  # noqa: E402


def rows_of(path, **fields):
    return load_math_rows(RunArgs(task="math", dataset=str(path), **fields).task_config())


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rows_are_read_as_written(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"problem": "1+1?", "answer": 2, "other": "x"},
                                             {"problem": "2+2?", "answer": "4"}])
    assert rows_of(path) == [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": "4"}]
    array = tmp_path / "d.json"
    array.write_text(json.dumps([{"q": "3?", "a": "3"}]))
    assert rows_of(array, question_field="q", answer_field="a") == [{"question": "3?", "answer": "3"}]


@pytest.mark.parametrize("content,message", [
    ('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?", "answer": \n',
     r"d\.jsonl line 2 column \d+: not valid JSON"),
    ('{"problem": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": "4"}\n',
     r"d\.jsonl line 2: no column 'problem' \(question_field\); the row has question, answer"),
    ('{"problem": "1+1?", "answer": null}\n', r"d\.jsonl line 1: column 'answer' is None; expected a non-empty"),
    ('{"problem": "  ", "answer": "1"}\n', r"d\.jsonl line 1: column 'problem' is '  '"),
    ('["1+1?", "2"]\n', r"d\.jsonl line 1: a row is a JSON object, got list"),
])
def test_a_bad_row_names_file_line_and_column(tmp_path, content, message):
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(RecipeError, match=message):
        rows_of(path)


def test_a_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"problem": "1", "answer": "1"}\n{"problem": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(RecipeError, match=r"d\.jsonl line 2: not UTF-8 text \(byte 0xe9 at offset 48\)"):
        rows_of(path)


def test_a_missing_file_and_a_wrong_suffix(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        rows_of(tmp_path / "none.jsonl")
    csv = tmp_path / "d.csv"
    csv.write_text("problem,answer\n1+1,2\n")
    with pytest.raises(RecipeError, match=r"must be \.json, \.jsonl or \.parquet, not '\.csv'"):
        rows_of(csv)


def test_d3s_train_reports_a_bad_dataset_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("D3S_CACHE", str(tmp_path / "cache"))
    data = write_jsonl(tmp_path / "d.jsonl", [{"problem": f"{i}+1?", "answer": str(i + 1)} for i in range(30)])
    with data.open("a") as f:
        f.write('{"problem": "x", "answer": "1"\n')
    out = tmp_path / "run"
    argv = ["train", "--config", "smoke", "--task", "math", "--dataset", str(data), "--heldout_size", "4",
            "--output_dir", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("d3s train: error: dataset ") and "line 31 column" in err[-1], err
    assert not any("Traceback" in line for line in err)
    assert not (out / "metrics.jsonl").exists()  # nothing written before the data was read
    assert re.search(r"d\.jsonl line 31 column \d+: not valid JSON", err[-1])
