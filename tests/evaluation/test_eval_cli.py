"""End to end: `d3s eval` / `d3s eval-table` on a tiny local model and fixture benchmarks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from d3s.app.cli import main
from d3s.app.errors import UsageError
from d3s.app.evaluation.generation import TransformersSampler
from d3s.app.evaluation.runner import run_eval
from d3s.app.evaluation.settings import EvalConfig
from d3s.metrics import pass_at_k


def read_cache(out: Path) -> list[dict]:
    """The cached problems in the benchmark file's order (they are sampled shortest prompt first)."""
    lines = (out / "samples.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines[1:]]
    return sorted(records, key=lambda r: (r["benchmark"], int(r["problem_id"])))


def answered(completion: str) -> str | None:
    m = re.search(r"\\boxed\{\s*(\d+)\s*\}", completion)
    return m.group(1) if m else None


def eval_args(model, bench, out, *extra):
    return ["eval", "--model", str(model), "--benchmarks", f"gsm8k={bench}", "--output_dir",
            str(out), "--max_new_tokens", "6", "--no_progress", "--score_workers", "1", *extra]


def test_greedy_eval_end_to_end(tiny_model, tiny_gsm8k, tmp_path, capsys):
    out = tmp_path / "greedy"
    rc = main(eval_args(tiny_model, tiny_gsm8k, out, "--n", "2", "--ks", "1,2",
                        "--temperature", "0"))
    assert rc == 0
    records = read_cache(out)
    assert [r["completions"] for r in records] == [["\\boxed{ 7 }"] * 2] * 3
    assert [r["n_correct"] for r in records] == [2, 0, 0]  # golds 7, 3, 5
    results = json.loads((out / "results.json").read_text())
    gsm = results["benchmarks"]["gsm8k"]
    assert gsm["metrics"]["pass@1"] == pytest.approx(1 / 3)
    assert gsm["metrics"]["avg@2"] == pytest.approx(1 / 3)
    assert gsm["verify_failures"] == 0
    assert "| tiny-llama" in capsys.readouterr().out
    assert "| GSM8k |" in (out / "results.md").read_text()


def test_sampled_eval_counts_match_completions(tiny_model, tiny_gsm8k, tmp_path):
    out = tmp_path / "sampled"
    assert main(eval_args(tiny_model, tiny_gsm8k, out, "--n", "8", "--ks", "1,4,8",
                          "--batch_size", "16")) == 0
    records = read_cache(out)
    golds = ["7", "3", "5"]
    for rec, gold in zip(records, golds):
        assert rec["gold"] == gold
        assert len(rec["completions"]) == 8
        assert {answered(c) for c in rec["completions"]} <= {"7", "3"}
        assert rec["n_correct"] == sum(answered(c) == gold for c in rec["completions"])
    # Both answers are sampled (50 / 50 each): 24 draws all alike would be a broken sampler.
    assert {answered(c) for r in records for c in r["completions"]} == {"7", "3"}
    results = json.loads((out / "results.json").read_text())
    m = results["benchmarks"]["gsm8k"]["metrics"]
    counts = [r["n_correct"] for r in records]
    for k in (1, 4, 8):
        assert m[f"pass@{k}"] == pytest.approx(sum(pass_at_k(8, c, k) for c in counts) / 3)
    assert results["average"]["pass@1"] == pytest.approx(m["pass@1"])


def test_pooled_scoring_keeps_order(tiny_gsm8k):
    """The pool plumbing of score_problem (a thread pool here: cheap; processes in production)."""
    from concurrent.futures import ThreadPoolExecutor

    from d3s.app.evaluation.benchmarks import load_benchmark
    from d3s.app.evaluation.runner import score_problem

    problem = load_benchmark("gsm8k", path=tiny_gsm8k)[0]  # gold 7
    config = EvalConfig(model="m", benchmarks=("arith",), n=9, ks=(1,), score_workers=2)
    completions = [
        "\\boxed{7}", "\\boxed{3}", "", "7", "\\boxed{14/2}", "x", "\\boxed{7}", "8", "7.0"
    ]
    with ThreadPoolExecutor(2) as pool:
        pooled = score_problem(problem, completions, config, pool)
    assert pooled == score_problem(problem, completions, config)
    assert pooled["scores"] == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert pooled["n_correct"] == 5


@pytest.mark.slow
def test_parallel_scoring_matches_serial(tiny_model, tiny_gsm8k, tmp_path):
    """Process-pool scoring end to end (slow: each spawned worker imports torch)."""
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    args = ("--n", "6", "--ks", "1,6", "--benchmarks", f"gsm8k={tiny_gsm8k},arith", "--limit", "2")
    assert main(eval_args(tiny_model, tiny_gsm8k, serial, *args)) == 0
    assert main(eval_args(tiny_model, tiny_gsm8k, parallel, *args, "--score_workers", "2")) == 0
    assert read_cache(parallel) == read_cache(serial)
    assert sum(r["n_correct"] for r in read_cache(serial)) > 0


def test_chat_template_is_used(tiny_model, tiny_gsm8k, tmp_path):
    # Without the chat template the prompt does not end in `<assistant>`: the model stops at once.
    out = tmp_path / "nochat"
    assert main(eval_args(tiny_model, tiny_gsm8k, out, "--n", "1", "--ks", "1",
                          "--temperature", "0", "--chat", "off")) == 0
    assert [r["completions"] for r in read_cache(out)] == [[""]] * 3


class CountingSampler:
    """Real transformers sampler that records how many problems it was asked for."""

    def __init__(self, model: str, fail_on_call: int | None = None):
        self.inner = TransformersSampler(model, device="cpu", batch_size=4)
        self.tokenizer = self.inner.tokenizer
        self.problems_sampled = 0
        self.calls = 0
        self.fail_on_call = fail_on_call

    @property
    def add_special_tokens(self):
        return self.inner.add_special_tokens

    @add_special_tokens.setter
    def add_special_tokens(self, value):
        self.inner.add_special_tokens = value

    def sample(self, prompts, settings, seed):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise KeyboardInterrupt
        self.problems_sampled += len(prompts)
        return self.inner.sample(prompts, settings, seed)


def test_interrupted_eval_resumes_to_the_same_result(tiny_model, tiny_gsm8k, tmp_path):
    def config(out):  # n = batch_size = 4: one problem per sampling call
        return EvalConfig(model=str(tiny_model), benchmarks=(f"gsm8k={tiny_gsm8k}", "arith"),
                          n=4, ks=(1, 2), output_dir=str(out), max_new_tokens=6, batch_size=4,
                          limit=3, score_workers=1)

    full = CountingSampler(str(tiny_model))
    reference = run_eval(config(tmp_path / "ref"), lambda c: full, progress=False)
    assert full.problems_sampled == 6

    out = tmp_path / "resumed"
    first = CountingSampler(str(tiny_model), fail_on_call=3)
    with pytest.raises(KeyboardInterrupt):
        run_eval(config(out), lambda c: first, progress=False)
    assert len(read_cache(out)) == 2 and not (out / "results.json").exists()
    # An interrupt in the middle of writing leaves a partial last line: it is dropped.
    with (out / "samples.jsonl").open("a") as f:
        f.write('{"type": "problem", "benchmark": "gsm8')

    second = CountingSampler(str(tiny_model))
    resumed = run_eval(config(out), lambda c: second, progress=False)
    assert second.problems_sampled == 4  # only the missing problems
    assert resumed["benchmarks"] == reference["benchmarks"]
    assert read_cache(out) == read_cache(tmp_path / "ref")

    third = CountingSampler(str(tiny_model))
    run_eval(config(out), lambda c: third, progress=False)
    assert third.problems_sampled == 0  # everything cached: no sampling at all


def test_changed_settings_refuse_the_cache(tiny_model, tiny_gsm8k, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(eval_args(tiny_model, tiny_gsm8k, out, "--n", "2", "--ks", "1")) == 0
    capsys.readouterr()
    assert main(eval_args(tiny_model, tiny_gsm8k, out, "--n", "4", "--ks", "1")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "n: cached 2 != now 4" in err and "--overwrite" in err
    assert main(eval_args(tiny_model, tiny_gsm8k, out, "--n", "4", "--ks", "1",
                          "--overwrite")) == 0


def test_eval_table_side_by_side(tiny_model, tiny_gsm8k, tmp_path, capsys):
    base, tuned = tmp_path / "base", tmp_path / "tuned"
    assert main(eval_args(tiny_model, tiny_gsm8k, base, "--n", "4", "--ks", "1,4",
                          "--temperature", "0")) == 0
    assert main(eval_args(tiny_model, tiny_gsm8k, tuned, "--n", "4", "--ks", "1,4")) == 0
    capsys.readouterr()
    table_file = tmp_path / "table.md"
    rc = main(["eval-table", str(base / "results.json"), str(tuned), "--labels", "Base,GRPO",
               "--ks", "1,4", "--output", str(table_file)])
    assert rc == 0
    table = capsys.readouterr().out
    assert table_file.read_text() == table
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[0] == "| Model | GSM8k | Average |"
    assert rows[1] == "| Base | 33.3/33.3 | 33.3/33.3 |"  # greedy: only the gold-7 problem
    tuned_counts = [r["n_correct"] for r in read_cache(tuned)]
    p1 = 100 * sum(tuned_counts) / 12
    p4 = 100 * sum(pass_at_k(4, c, 4) for c in tuned_counts) / 3
    assert rows[2] == f"| GRPO | {p1:.1f}/{p4:.1f} | {p1:.1f}/{p4:.1f} |"
    # k beyond the stored n is refused with the valid range
    assert main(["eval-table", str(base), "--ks", "1,8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "k=[8] > n=4" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--benchmarks", "gsm9k"], "unknown benchmark 'gsm9k'; valid: aime24"),
        (["--benchmarks", "gsm8k=/no/such.jsonl"], "'/no/such.jsonl' (for gsm8k) does not exist"),
        (["--benchmarks", "arith", "--n", "4", "--ks", "1,8"], "k=[8] invalid"),
        (["--benchmarks", "arith", "--data_dir", "/no/such/dir"], "--data_dir /no/such/dir is not a folder"),
        (["--n", "abc"], "argument --n: 'abc' is not an integer"),
        (["--temperature", "hot"], "argument --temperature: 'hot' is not a number"),
        (["--ks", "1,x"], "argument --ks: '1,x' is not a comma-separated list of integers"),
        (["--backend", "tpu"],
         "argument --backend: invalid choice: 'tpu' (choose from 'auto', 'transformers', 'vllm')"),
        (["--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8' (choose from 'auto', 'float32', 'bfloat16'"),
        (["--chat", "yes"], "argument --chat: invalid choice: 'yes' (choose from 'auto', 'on', 'off')"),
        (["--require_boxed", "maybe"], "argument --require_boxed: 'maybe' is not true or false"),
        (["--max_new_tokens"], "argument --max_new_tokens: expected one argument"),
        (["--max_tokens", "5"], "unrecognized arguments: --max_tokens 5"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, message, tmp_path, capsys):
    rc = main(["eval", "--model", "/no/model", "--output_dir", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and message in err


def test_missing_model_folder(tmp_path, capsys):
    rc = main(["eval", "--model", str(tmp_path / "nope"), "--benchmarks", "arith", "--n", "1",
               "--ks", "1", "--limit", "1", "--output_dir", str(tmp_path / "o")])
    assert rc == 2
    assert "does not exist" in capsys.readouterr().err


def test_top_level_usage(capsys):
    assert main([]) == 2
    assert main(["--help"]) == 0
    assert "eval-table" in capsys.readouterr().out
    assert main(["nonsense"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'nonsense'; valid: " in err and "eval, eval-table" in err


# Options: the fields of EvalConfig, spelled like `d3s train`'s (d3s.app.options).


def parse(argv, tmp_path):
    from d3s.app.cli import parse_eval_args

    argv = [str(tmp_path) if a == "DATA" else str(tmp_path / "o") if a == "OUT" else a for a in argv]
    return parse_eval_args(["--model", "m", "--benchmarks", "arith", "--n", "16", *argv])


def test_every_config_field_is_an_option_with_help(capsys):
    from dataclasses import fields

    from d3s.app.cli import EvalCommandArgs, eval_parser

    parser = eval_parser()
    options = {o: a for a in parser._actions for o in a.option_strings}
    for cls in (EvalConfig, EvalCommandArgs):
        for f in fields(cls):
            if f.init:
                assert f"--{f.name}" in options, f.name
                assert options[f"--{f.name}"].help, f.name
    assert not [o for o in options if "-" in o[2:]]  # one spelling each: snake_case
    assert main(["eval", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--max_new_tokens MAX_NEW_TOKENS" in out and "(default: 2048)" in out
    assert "--output_dir" in out and "--ks KS" in out and "--no_progress" in out
    assert "--max-new-tokens" not in out


@pytest.mark.parametrize("option", ["--max-new-tokens", "--output", "--k", "--no-progress", "--max_new"])
def test_one_spelling_per_option(option, capsys):
    """No other spelling of an option is taken: kebab-case, the former `--output` / `--k`, abbreviations."""
    assert main(["eval", "--model", "m", option, "7"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"d3s eval: error: unrecognized arguments: {option} 7"]


def test_settings_from_the_command_line(tmp_path):
    config, command = parse(["--max_new_tokens", "7", "--top_p", "0.5", "--top_k", "3", "--data_dir", "DATA",
                             "--batch_size", "5", "--prompt_template", "Q: {question}", "--system_prompt", "Be brief.",
                             "--require_boxed", "--verify_timeout", "2", "--score_workers", "1", "--no_progress",
                             "--output_dir", "OUT", "--ks", "1,2"], tmp_path)
    assert (config.max_new_tokens, config.top_p, config.top_k, config.batch_size) == (7, 0.5, 3, 5)
    assert (config.data_dir, config.output_dir) == (str(tmp_path), str(tmp_path / "o"))
    assert (config.prompt_template, config.system_prompt) == ("Q: {question}", "Be brief.")
    assert (config.require_boxed, config.verify_timeout, config.score_workers) == (True, 2, 1)
    assert config.ks == (1, 2) and not command.progress
    config, _ = parse(["--top_k=4"], tmp_path)  # `--name=value` too
    assert config.top_k == 4
    with pytest.raises(UsageError, match="--top_k is given twice on the command line; give it once"):
        parse(["--top_k=4", "--top_k", "5"], tmp_path)  # refused, as a recipe's field set twice is


def test_switches_bare_or_with_a_value(tmp_path):
    config, command = parse([], tmp_path)
    assert (config.require_boxed, config.overwrite, command.progress) == (False, False, True)
    config, command = parse(["--require_boxed", "--overwrite", "--no_progress"], tmp_path)
    assert (config.require_boxed, config.overwrite, command.progress) == (True, True, False)
    config, command = parse(["--require_boxed", "false", "--overwrite", "true", "--progress", "true"],
                            tmp_path)
    assert (config.require_boxed, config.overwrite, command.progress) == (False, True, True)
