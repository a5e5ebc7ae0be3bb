"""The examples a user copies run as they are: `examples/trl_grpo.py` trains a tiny local model for two steps on a
CPU, its reward function is pure, and the launcher configs its launch lines name exist."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("trl_grpo", ROOT / "examples" / "trl_grpo.py")
trl_grpo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trl_grpo)


def test_the_trl_example_trains_a_tiny_model_on_a_cpu(tmp_path, monkeypatch):
    from d3s.app.models import tiny_model_path

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model = tiny_model_path(cache=tmp_path / "cache")  # a 2-layer Llama with a chat template, built locally
    out = tmp_path / "run"
    trl_grpo.main(["--model", str(model), "--max_steps", "2", "--num_generations", "4",
                   "--per_device_train_batch_size", "8", "--max_completion_length", "12", "--output_dir", str(out)])
    assert (out / "model.safetensors").is_file()


def test_the_trl_example_turns_on_d1s_c():
    text = (ROOT / "examples" / "trl_grpo.py").read_text()
    assert 'variant="d1s-c"' in text


def test_the_example_reward_is_pure_and_scores_bad_output_zero():
    completions = [[{"role": "assistant", "content": "7 * 8 = 56\n56"}], [{"role": "assistant", "content": "no idea"}],
                   "so the answer is 1,024", [{"role": "assistant", "content": "55"}]]
    answers = ["56", "56", "1024", "56"]
    assert trl_grpo.correct_answer(completions, answer=answers, question=["q"] * 4) == [1.0, 0.0, 1.0, 0.0]


def test_the_example_reads_a_jsonl_dataset_and_names_a_missing_column(tmp_path):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text('{"question": "What is 2 + 2?", "answer": "4"}\n')
    bad.write_text('{"problem": "What is 2 + 2?", "answer": "4"}\n')
    assert trl_grpo.load_questions(str(good))[0] == {"question": "What is 2 + 2?", "answer": "4"}
    with pytest.raises(SystemExit, match="no column question"):
        trl_grpo.load_questions(str(bad))


def test_the_launch_lines_name_launcher_configs_that_exist():
    doc = trl_grpo.__doc__
    configs = re.findall(r"--config_file (\S+)", doc)
    assert configs and all((ROOT / c).is_file() for c in configs), configs
    assert "zero3-8gpu.yaml" in configs[0]
