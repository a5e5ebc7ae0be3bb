"""task=math datasets from local files: the rows as written, or one line naming file, line and column."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("datasets")

from d3s import cli  # noqa: E402
from d3s.app import train  # noqa: E402
from d3s.app.errors import RecipeError  # noqa: E402
from d3s.app.run_args import RunArgs  # noqa: E402
from d3s.app.math_data import load_math_rows  # noqa: E402
from d3s.app.tasks import build_task  # noqa: E402


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


# ---------------------------------------------------------------------------------------------
# What a dataset holds: binary columns, a folder, held-out questions among the training rows, gold answers
# math-verify cannot read, content that changes under the same name
# ---------------------------------------------------------------------------------------------


def math_task(path, heldout_size=4, **fields):
    return build_task(RunArgs(task="math", dataset=str(path), heldout_size=heldout_size, **fields).task_config(), 0)


def test_a_binary_parquet_column_is_read_as_text(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "d.parquet"
    table = pa.table({"problem": pa.array([b"What is 3 + 3?", "caf\u00e9?".encode()], pa.binary()),
                      "answer": pa.array([b"6", b"7"], pa.binary())})
    pq.write_table(table, path)
    assert rows_of(path) == [{"question": "What is 3 + 3?", "answer": "6"}, {"question": "caf\u00e9?", "answer": "7"}]
    pq.write_table(pa.table({"problem": pa.array([b"ok", b"caf\xe9"], pa.binary()), "answer": ["1", "2"]}), path)
    with pytest.raises(RecipeError, match=r"^dataset .*d\.parquet: row 1 column 'problem' holds bytes that are not "
                                          r"UTF-8 text \(byte 0xe9 at offset 3\); store the column as text"):
        rows_of(path)


def test_a_folder_named_like_a_data_file_is_not_said_missing(tmp_path):
    folder = tmp_path / "d.jsonl"
    folder.mkdir()
    with pytest.raises(RecipeError, match=r"dataset '.*d\.jsonl' is a folder, not a file; give the "
                                          r"\.json/\.jsonl/\.parquet file itself"):
        rows_of(folder)


def test_held_out_questions_are_left_out_of_training_and_counted(tmp_path):
    """Each row four times: the four held-out rows ask questions training would otherwise see (it used to, silently)."""
    rows = [{"problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(10)]
    path = write_jsonl(tmp_path / "d.jsonl", rows * 4)
    task = math_task(path)
    held = {r["question"] for r in task.heldout}
    assert held == {"What is 6 + 1?", "What is 7 + 1?", "What is 8 + 1?", "What is 9 + 1?"}
    assert not held & {r["question"] for r in task.train}
    assert len(task.train) == 36 - 12  # the 3 other copies of each held-out question are gone
    assert task.notes == [f"dataset {str(path)!r}: 12 of its 36 training rows ask a question that is also held out "
                          "(the last heldout_size=4 rows); they are left out of training, 24 rows remain"]
    spaced = write_jsonl(tmp_path / "e.jsonl", [{"problem": "What is  9 +\t1?", "answer": "10"}, *rows])
    assert "1 of its 7 training rows" in math_task(spaced).notes[0]  # the same question, white space aside
    only = write_jsonl(tmp_path / "f.jsonl", rows[-1:] * 5)
    with pytest.raises(RecipeError, match=r"every one of its 1 training rows asks a question that is also held out"):
        math_task(only)


def test_gold_answers_math_verify_cannot_read_are_named_before_training(tmp_path):
    rows = [{"problem": f"q{i}", "answer": str(i)} for i in range(10)]
    rows[1]["answer"] = rows[4]["answer"] = "\\frac{"
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    assert math_task(path, heldout_size=2).notes == [
        f"warning: dataset {str(path)!r}: math-verify cannot read 2 of the 8 training gold answers (column 'answer': "
        f"dataset {path} line 2: '\\\\frac{{' (no expression in it); dataset {path} line 5: '\\\\frac{{' (no "
        "expression in it)); those problems score 0 for every completion that does not repeat that text"]
    broken = write_jsonl(tmp_path / "e.jsonl", [{"problem": f"q{i}", "answer": "\\frac{"} for i in range(8)]
                         + rows[-2:])
    with pytest.raises(RecipeError, match=r"math-verify cannot read 8 of the 8 training gold answers .* and 5 more\); "
                                          r"every reward would be 0"):
        math_task(broken, heldout_size=2)


def test_d3s_train_says_what_it_left_out(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("D3S_CACHE", str(tmp_path / "cache"))
    rows = [{"problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(10)]
    data = write_jsonl(tmp_path / "d.jsonl", rows * 4)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # stop once the data is read: nothing trains

    monkeypatch.setattr(train, "_make_trainer", interrupted)
    assert cli.main(["train", "--config", "smoke", "--task", "math", "--dataset", str(data), "--heldout_size", "4",
                     "--output_dir", str(tmp_path / "run")]) == 130
    assert (f"d3s train: dataset {str(data)!r}: 12 of its 36 training rows ask a question that is also held out"
            in capsys.readouterr().err)


def test_a_dataset_changed_under_the_same_name_is_not_reused(tmp_path, capsys, monkeypatch):
    """A run records its data's SHA-256; a resume and a reuse by d3s compare refuse data that changed, naming it."""
    monkeypatch.setenv("D3S_CACHE", str(tmp_path / "cache"))
    rows = [{"problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(12)]
    data = write_jsonl(tmp_path / "changing.jsonl", rows)
    root = tmp_path / "cmp"
    argv = ["compare", "--config", "smoke", "--variants", "d3s", "--seeds", "0", "--task", "math", "--dataset",
            str(data), "--heldout_size", "4", "--max_steps", "2", "--plots", "false", "--output_dir", str(root)]
    assert cli.main(argv) == 0
    run = root / "d3s-seed0"
    recorded = json.loads((run / "run_config.json").read_text())["data"]
    assert recorded["dataset"] == str(data) and len(recorded["sha256"]) == 64
    assert cli.main(argv) == 0  # the same data: reused
    write_jsonl(data, [{**r, "answer": str(int(r["answer"]) + 1)} for r in rows])  # its answers changed
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"d3s compare: error: {run} was trained on other data (dataset {str(data)!r}: its "
                              "content changed since the run was trained (sha256 "), err
    assert "reusing" not in "\n".join(err)
    assert cli.main(["train", "--config", "smoke", "--task", "math", "--dataset", str(data), "--heldout_size", "4",
                     "--max_steps", "2", "--output_dir", str(run), "--resume", "true"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"with a recipe that changes training (dataset {str(data)!r}: its content changed since the run was " \
           "trained (sha256 " in line, line
