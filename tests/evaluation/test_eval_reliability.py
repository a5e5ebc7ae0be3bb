"""`d3s eval` / `d3s eval-table` on bad input and interrupted runs: one-line errors, exact resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from d3s.app.cli import main
from d3s.app.evaluation.runner import run_eval
from d3s.app.evaluation.settings import EvalConfig


def one_line_error(capsys, command: str = "eval") -> str:
    """The error line; before it only progress bars (loading the model), no traceback."""
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith(f"d3s {command}: error: "), err
    assert all(line.startswith("Loading weights") for line in err[:-1]), err
    return err[-1]


def run(tiny_model, out, *benchmarks, **settings):
    config = EvalConfig(model=str(tiny_model), benchmarks=benchmarks, output_dir=str(out), score_workers=1,
                        **{"max_new_tokens": 6, **settings})
    return run_eval(config, progress=False)


def test_resume_after_a_cut_off_line_is_exact(tiny_model, tiny_gsm8k, tmp_path):
    """Several problems per sampling call (n=4, batch 8: two); the cut falls inside a call."""
    settings = dict(n=4, ks=(1, 4), batch_size=8, limit=3)
    benches = (f"gsm8k={tiny_gsm8k}", "arith")
    reference = run(tiny_model, tmp_path / "ref", *benches, **settings)
    lines = (tmp_path / "ref" / "samples.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 1 + 6  # the header, 3 + 3 problems
    for kept in (2, 3, 5):  # header + 1 (inside the first call), + 2 (a whole call), + 4
        out = tmp_path / f"cut{kept}"
        out.mkdir()
        (out / "samples.jsonl").write_text("".join(lines[:kept]) + lines[kept][: len(lines[kept]) // 2])
        resumed = run(tiny_model, out, *benches, **settings)
        assert (out / "samples.jsonl").read_text() == "".join(lines), kept
        assert resumed["benchmarks"] == reference["benchmarks"]


def test_arith_from_a_file_is_read_not_ignored(tiny_model, tmp_path, capsys):
    path = tmp_path / "arith.jsonl"
    path.write_text(json.dumps({"question": "What is 2 + 5?", "answer": "7"}) + "\n"
                    + json.dumps({"question": "What is 1 + 2?", "answer": "3"}) + "\n")
    results = run(tiny_model, tmp_path / "o", f"arith={path}", n=1, ks=(1,), temperature=0.0)
    assert results["benchmarks"]["arith"]["num_problems"] == 2  # the file's, not the 200 built-in ones
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "What is 2 + 5?", "answer": "7"}\n{"question": \n')
    assert main(["eval", "--model", str(tiny_model), "--benchmarks", f"arith={broken}", "--n", "1", "--ks", "1",
                 "--output_dir", str(tmp_path / "b"), "--no_progress"]) == 2
    assert f"{broken}:2: not valid JSON" in one_line_error(capsys)


def test_a_file_that_is_not_utf8_is_one_line(tiny_model, tmp_path, capsys):
    path = tmp_path / "gsm8k.jsonl"
    path.write_bytes(b'{"question": "ok", "answer": "#### 1"}\n{"question": "caf\xe9", "answer": "#### 2"}\n')
    assert main(["eval", "--model", str(tiny_model), "--benchmarks", f"gsm8k={path}", "--n", "1", "--ks", "1",
                 "--output_dir", str(tmp_path / "o"), "--no_progress"]) == 2
    assert f"{path} line 2: not UTF-8 text (byte 0xe9 at offset 56); d3s reads text files as UTF-8" in one_line_error(capsys)


def test_chat_on_without_a_chat_template_is_one_line(tiny_model, tiny_gsm8k, tmp_path, capsys):
    plain = tmp_path / "plain-model"
    shutil.copytree(tiny_model, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    assert main(["eval", "--model", str(plain), "--benchmarks", f"gsm8k={tiny_gsm8k}", "--n", "1", "--ks", "1",
                 "--chat", "on", "--output_dir", str(tmp_path / "o"), "--no_progress"]) == 2
    assert "--chat on, but the model's tokenizer has no chat template" in one_line_error(capsys)


def test_a_prompt_past_the_context_is_refused_before_sampling(tiny_model, tiny_gsm8k, tmp_path, capsys):
    # the tiny model's context is 256 tokens; the prompts are about 20
    out = tmp_path / "o"
    assert main(["eval", "--model", str(tiny_model), "--benchmarks", f"gsm8k={tiny_gsm8k}", "--n", "1", "--ks", "1",
                 "--max_new_tokens", "250", "--output_dir", str(out), "--no_progress"]) == 2
    err = one_line_error(capsys)
    assert "would pass the model's context of 256 tokens; use --max_new_tokens" in err
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 1  # the header only: nothing was sampled


@pytest.mark.parametrize("content,message", [
    ('{"format": "d3s-eval/1", "label": "x", "ks": [1], "benchmarks": {"gsm8k": {"n": 4}}}', "no 'n_correct' counts"),
    ('{"format": "d3s-eval/1", "label": "x", "ks": [1], "benchmarks": {"gsm8k": {"n": 4, "n_correct": [1, 9]}}}',
     "correct counts [9] outside 0..n=4"),
    ('{"format": "d3s-eval/1", "label": "x", "ks": [1]}', "no 'benchmarks'"),
    ('{"format": "d3s-eval/1", "label": "x", "ks": [1], "benchmarks": {"gsm8k": {"n": 4, "n_corr', "not valid JSON"),
])
def test_eval_table_on_a_partial_results_file_is_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "results.json"
    path.write_text(content)
    assert main(["eval-table", str(path)]) == 2
    assert message in one_line_error(capsys, "eval-table")
