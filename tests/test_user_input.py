"""What a user hands to `d3s train`, `d3s compare`, `d3s eval` and `d3s eval-table`, done wrong: one line
`d3s <command>: error: ...` (exit status 2) that names the file or option, or the input read as written.

Files: every text file the user hands in (recipe, dataset, benchmark copy, results file) is decoded by
`d3s.app.datafiles.read_text`, so a file that is not UTF-8 gets the same message everywhere. Options: every
switch `--help` lists is taken as it is listed.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("trl")

from d3s import cli  # noqa: E402
from d3s.app.datafiles import DataFileError, read_rows  # noqa: E402
from d3s.app.errors import RecipeError  # noqa: E402
from d3s.app.recipe import load_recipe, make_parser, parse_train_args  # noqa: E402

# progress bars of building and loading the tiny model, not messages
_BARS = ("Writing model shards", "Loading weights", "d3s eval:  ", "d3s eval: 100%")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("D3S_CACHE", str(tmp_path_factory.getbasetemp() / "d3s-cache"))


def error_line(capsys, command: str) -> str:
    """The one error line of a command; nothing else on the standard error but progress bars."""
    err = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines()
           if line.strip() and not line.startswith(_BARS)]
    assert len(err) == 1 and err[0].startswith(f"d3s {command}: error: "), err
    return err[0]


def fails(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    return error_line(capsys, argv[0])


LATIN1 = b'{"problem": "1 + 1?", "answer": "2", "question": "1 + 1?"}\n{"problem": "caf\xe9", "answer": "1"}\n'


# ---------------------------------------------------------------------------------------------
# Recipes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content,message", [
    ("model: tiny\nnum_generations: 4\nnum_generations: 8\n",
     "r.yaml line 3: 'num_generations' is set twice (first on line 2); keep one"),
    ("model: tiny\nmodel_init_kwargs:\n  a: 1\n  a: 2\n", "r.yaml line 4: 'a' is set twice (first on line 3)"),
])
def test_a_recipe_that_sets_a_field_twice_is_refused(tmp_path, capsys, content, message):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(content)
    # --max_steps 0 is refused after the recipe is read: a recipe taken as it is never starts training here
    line = fails(capsys, ["train", "--config", str(recipe), "--output_dir", str(tmp_path / "o"), "--max_steps", "0"])
    assert message in line
    assert not (tmp_path / "o").exists()


def test_a_merge_key_may_still_be_overridden(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_init_kwargs:\n  <<: {a: 1, b: 2}\n  a: 3\n")
    assert load_recipe(str(recipe)) == {"model_init_kwargs": {"a": 3, "b": 2}}


def test_a_recipe_runs_no_code(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    marker = tmp_path / "ran"
    recipe.write_text(f'model: !!python/object/apply:builtins.open ["{marker}", "w"]\n')
    assert "not valid YAML (could not determine a constructor" in fails(capsys, ["train", "--config", str(recipe)])
    assert not marker.exists()


@pytest.mark.parametrize("content,extra,message", [
    # a key that is not a field name (used to be a TypeError traceback)
    ("model: tiny\n~: 2\n", [], r"r.yaml: None is not a field name"),
    ("model: tiny\n1: 2\n", [], r"r.yaml: 1 is not a field name"),
    # an empty value for a field that takes no None (used to be a TypeError traceback)
    ("model: tiny\nmax_steps:\n", [], r"r.yaml: field 'max_steps' is empty \(null\); expected an integer"),
    # a switch that is on by default was not converted: 'maybe' trained with plots on, "false" too
    ("model: tiny\nplots: maybe\n", [], r"r.yaml: field 'plots' is 'maybe'; expected true or false"),
    # --config given twice, or as --config=NAME (both used to be "unknown field 'config'")
    ("model: tiny\n", ["--config", "smoke"], r"--config is given twice; give one recipe"),
])
def test_bad_recipe_input_is_one_line(tmp_path, capsys, content, extra, message):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(content)
    line = fails(capsys, ["train", "--config", str(recipe), "--output_dir", str(tmp_path / "o"), *extra,
                          "--max_steps", "0"])  # refused after the recipe is read: never trains here
    assert re.search(message, line), line


def test_a_quoted_false_in_a_recipe_is_false(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text('model: tiny\nplots: "false"\n')
    run, _, _ = parse_train_args(["--config", str(recipe)])
    assert run.plots is False
    run, config, _ = parse_train_args(["--config=smoke"])
    assert run.model == "tiny" and config.max_steps == 4


def test_a_folder_as_recipe(tmp_path, capsys):
    assert "is a folder; give a YAML file" in fails(capsys, ["train", "--config", str(tmp_path)])


# ---------------------------------------------------------------------------------------------
# One reader for every text file the user hands in
# ---------------------------------------------------------------------------------------------


def _not_utf8(path: Path, offset: int) -> str:
    return (f"{path} line 2: not UTF-8 text (byte 0xe9 at offset {offset}); d3s reads text files as UTF-8: "
            "save it as UTF-8")


def test_a_recipe_that_is_not_utf8(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_bytes(b"model: tiny\ninstruction: caf\xe9\n")
    assert fails(capsys, ["train", "--config", str(recipe)]).endswith(_not_utf8(recipe, 28))


def test_a_dataset_that_is_not_utf8(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_bytes(LATIN1)
    line = fails(capsys, ["train", "--config", "smoke", "--task", "math", "--dataset", str(data),
                          "--output_dir", str(tmp_path / "o")])
    assert line.endswith(_not_utf8(data, LATIN1.index(b"\xe9")))


def test_a_benchmark_file_that_is_not_utf8(tmp_path, capsys):
    data = tmp_path / "gsm8k.jsonl"
    data.write_bytes(LATIN1)
    line = fails(capsys, ["eval", "--model", "tiny", "--benchmarks", f"arith={data}", "--n", "1", "--ks", "1",
                          "--output_dir", str(tmp_path / "o")])
    assert line.endswith(_not_utf8(data, LATIN1.index(b"\xe9")))


def test_a_results_file_that_is_not_utf8(tmp_path, capsys):
    results = tmp_path / "results.json"
    content = b'{"format": "d3s-eval/1",\n "label": "caf\xe9"}\n'
    results.write_bytes(content)
    offset = content.index(b"\xe9")
    # d3s eval writes UTF-8: such a file is another kind, and eval-table says what it reads
    assert (f"{results} is not a d3s eval results file (line 2: not UTF-8 text (byte 0xe9 at offset {offset})); "
            "eval-table reads the results.json") in fails(capsys, ["eval-table", str(results)])


def test_utf16_is_named(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_bytes("model: tiny\n".encode("utf-16"))
    assert "line 1: not UTF-8 text (byte 0xff at offset 0) (it looks like UTF-16)" in fails(
        capsys, ["train", "--config", str(recipe)])


def test_a_byte_order_mark_is_not_text(tmp_path):
    """Editors on Windows start UTF-8 files with one; JSON refused it ('Unexpected UTF-8 BOM')."""
    rows = [{"problem": "1 + 1?", "answer": "2"}, {"problem": "2 + 2?", "answer": "4"}]
    bom = b"\xef\xbb\xbf"
    for name, text in (("d.jsonl", "".join(json.dumps(r) + "\n" for r in rows)), ("d.json", json.dumps(rows))):
        path = tmp_path / name
        path.write_bytes(bom + text.encode())
        assert [row for _, row in read_rows(path)] == rows
    recipe = tmp_path / "r.yaml"
    recipe.write_bytes(bom + b"model: tiny\n")
    assert load_recipe(str(recipe)) == {"model": "tiny"}


# ---------------------------------------------------------------------------------------------
# Switches: what --help lists is what the parser takes
# ---------------------------------------------------------------------------------------------


def _train_switches() -> list[tuple[str, str, bool]]:
    """`(option, field, value it sets)` of every switch `d3s train --help` shows."""
    out = []
    for action in make_parser()._actions:
        shown = [s for s in action.option_strings if "-" not in s[2:]]  # the snake_case spelling --help shows
        if not shown:
            continue
        if action.const is True and action.nargs == "?":
            out.append((shown[0], action.dest, True))
        elif type(action).__name__ == "_StoreFalseAction":
            out.append((shown[0], action.dest, False))
    return out


def test_every_train_switch_in_help_is_taken(capsys):
    switches = _train_switches()
    assert ("--no_plots", "plots", False) in switches and ("--plots", "plots", True) in switches
    assert len(switches) > 40
    assert cli.main(["train", "--help"]) == 0
    shown = capsys.readouterr().out
    # one spelling per option, as in every d3s command: --help lists no kebab-case twin (--no-plots, --max-steps)
    assert not re.findall(r"--[a-z0-9]+-[a-z0-9-]+", shown)
    assert re.search(r"--no_plots\s+same as --plots false\n", shown)
    parser = make_parser()
    for option, field, value in switches:
        assert re.search(rf"{option}\b", shown), option
        assert getattr(parser.parse_known_args([option])[0], field) is value, option
        try:
            parse_train_args(["--config", "smoke", option])
        except RecipeError as err:  # the settings refuse this value (fp16 on a CPU): not a parser refusal
            assert "unknown field" not in str(err) and "(on the command line)" not in str(err), (option, err)


def test_no_flag_is_one_spelling(tmp_path, capsys):
    run, _, _ = parse_train_args(["--config", "smoke", "--no_plots"])
    assert run.plots is False
    line = fails(capsys, ["train", "--config", "smoke", "--no-plots", "--output_dir", str(tmp_path)])
    assert "unknown field 'no-plots' in the command line; did you mean 'no_plots'?" in line
    # d3s compare passes it to every run
    line = fails(capsys, ["compare", "--config", "smoke", "--no_plots", "--max_steps", "0",
                          "--output_dir", str(tmp_path / "c")])
    assert "max_steps=0 (from the command line)" in line and not (tmp_path / "c").exists()


def test_every_eval_switch_in_help_is_taken(capsys):
    from d3s.app.cli import eval_parser, parse_eval_args

    switches = [a for a in eval_parser()._actions if a.const is True or type(a).__name__ == "_StoreFalseAction"]
    assert {a.option_strings[0] for a in switches} >= {"--require_boxed", "--overwrite", "--progress",
                                                       "--no_progress"}
    assert cli.main(["eval", "--help"]) == 0
    shown = capsys.readouterr().out
    base = ["--model", "m", "--benchmarks", "arith"]
    for action in switches:
        option = action.option_strings[0]
        assert re.search(rf"{option}\b", shown), option

        def value(*argv):
            config, command = parse_eval_args([*base, *argv])
            return getattr(config if hasattr(config, action.dest) else command, action.dest)

        if action.const is True:
            assert value(option) is True and value(option, "true") is True and value(option, "false") is False
        else:
            assert value(option) is False


def test_compare_bad_choice_is_one_line(tmp_path, capsys):
    """Documents: since compare's options were built with `options.dataclass_parser`, no usage dump."""
    line = fails(capsys, ["compare", "--keep_checkpoints", "bogus", "--output_dir", str(tmp_path / "c")])
    assert line == ("d3s compare: error: argument --keep_checkpoints: invalid choice: 'bogus' (choose from 'all', "
                    "'model', 'none')")


# ---------------------------------------------------------------------------------------------
# Models whose weights are a pickle
# ---------------------------------------------------------------------------------------------


class _OpensAFile:
    """Unpickled, it would create `path`: code a pickle runs."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


@pytest.fixture
def pickled_model(tmp_path) -> tuple[Path, Path]:
    """A copy of the tiny model whose weights are `pytorch_model.bin` holding, beside the tensors, an object whose
    unpickling creates a file; and that file's path."""
    import torch
    from safetensors.torch import load_file

    from d3s.app.models import tiny_model_path

    folder = tmp_path / "pickled"
    shutil.copytree(tiny_model_path(), folder)
    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "unpickled"
    torch.save({**weights, "extra": _OpensAFile(str(marker))}, folder / "pytorch_model.bin")
    return folder, marker


def test_pickled_weights_are_not_loaded_by_train(pickled_model, tmp_path, capsys):
    folder, marker = pickled_model
    line = fails(capsys, ["train", "--config", "smoke", "--model", str(folder), "--output_dir", str(tmp_path / "o")])
    assert f"model {str(folder)!r}: its pickled weights (pytorch_model.bin) hold objects other than tensors" in line
    assert "convert them to safetensors" in line
    assert not marker.exists()


def test_pickled_weights_are_not_loaded_by_eval(pickled_model, tmp_path, capsys):
    folder, marker = pickled_model
    line = fails(capsys, ["eval", "--model", str(folder), "--benchmarks", "arith", "--n", "1", "--ks", "1",
                          "--limit", "1", "--output_dir", str(tmp_path / "o"), "--no_progress"])
    assert f"model {str(folder)!r}: its pickled weights (pytorch_model.bin)" in line
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# Output paths
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where,message", [
    ("afile", "--output_dir '{tmp}/afile' is a file; give a folder"),
    ("afile/sub", "--output_dir '{tmp}/afile/sub' is inside '{tmp}/afile', a file; give a folder"),
    ("", "--output_dir is empty; give a folder"),
])
def test_eval_output_dir_that_is_not_a_folder(tmp_path, capsys, monkeypatch, where, message):
    monkeypatch.chdir(tmp_path)  # an empty --output_dir used to mean this folder
    (tmp_path / "afile").write_text("keep me")
    out = str(tmp_path / where) if where else ""
    line = fails(capsys, ["eval", "--model", "tiny", "--benchmarks", "arith", "--n", "1", "--ks", "1", "--limit", "1",
                          "--max_new_tokens", "2", "--no_progress", "--output_dir", out])
    assert message.format(tmp=tmp_path) in line
    assert (tmp_path / "afile").read_text() == "keep me"


@pytest.fixture
def results_file(tmp_path) -> Path:
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"format": "d3s-eval/1", "label": "x", "model": "m", "ks": [1],
                                "benchmarks": {"gsm8k": {"n": 4, "n_correct": [1, 2], "verify_failures": 0}}}))
    return path


@pytest.mark.parametrize("output,message", [
    (".", "is a folder; give a file path in an existing folder"),
    ("no/such/t.md", "is in '{tmp}/no/such', which is not a folder"),
])
def test_eval_table_output_that_cannot_be_a_file(results_file, tmp_path, capsys, output, message):
    line = fails(capsys, ["eval-table", str(results_file), "--ks", "1", "--output", str(tmp_path / output)])
    assert message.format(tmp=tmp_path) in line


# ---------------------------------------------------------------------------------------------
# eval-table on files that are not results files
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,content", [
    ("samples.jsonl", '{"type": "header", "fingerprint": {}}\n{"type": "problem"}\n'),
    ("r.jsonl", '{"a": 1}\n'),
    ("data.parquet", "PAR1 not really PAR1"),
    ("compare.json", '{"reference": "grpo"}'),
])
def test_eval_table_says_what_it_reads(tmp_path, capsys, name, content):
    path = tmp_path / name
    path.write_text(content)
    line = fails(capsys, ["eval-table", str(path)])
    assert f"{path} is not a d3s eval results file" in line
    assert "eval-table reads the results.json that d3s eval writes" in line and "partly written" not in line


# ---------------------------------------------------------------------------------------------
# A broken parquet file
# ---------------------------------------------------------------------------------------------


def test_a_broken_parquet_file_is_one_line(tmp_path, capfd, monkeypatch):
    """pyarrow's C++ code logs to the standard error itself; that line is held back, the error says it all."""
    import os

    import pyarrow.parquet as pq

    def read_table(path, *args, **kwargs):
        os.write(2, b"W20250101 00:00:00 arrow/io/file.cc:123 parquet: bad footer\n")
        raise OSError("Couldn't deserialize thrift: TProtocolException: Invalid data")

    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1 broken PAR1")
    monkeypatch.setattr(pq, "read_table", read_table)
    with pytest.raises(DataFileError, match=r"not a readable parquet file \(Couldn't deserialize thrift"):
        read_rows(path)
    assert capfd.readouterr().err == ""
    assert cli.main(["eval", "--model", "tiny", "--benchmarks", f"arith={path}", "--n", "1", "--ks", "1",
                     "--output_dir", str(tmp_path / "o")]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert err == [f"d3s eval: error: {path}: not a readable parquet file (Couldn't deserialize thrift: "
                   "TProtocolException: Invalid data)"]


# ---------------------------------------------------------------------------------------------
# Found by trying bad input as a new user: each of these was a traceback, was taken silently, or was refused
# with a misleading message
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path, monkeypatch) -> Path:
    """A working folder of inputs: `good.jsonl` (40 problems), `twice.jsonl` (a row setting `answer` twice),
    `booleans.jsonl` (answers `true`), `huge-train.jsonl` / `huge-heldout.jsonl` (a 200k-character question
    among the training / held-out rows), `gsm8k.jsonl` (a benchmark copy), `noconfig/` (a folder that is no
    model), `empty/`, `afile`."""
    monkeypatch.chdir(tmp_path)
    rows = [{"problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(40)]

    def jsonl(name, rows):
        Path(name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    jsonl("good.jsonl", rows)
    jsonl("booleans.jsonl", [{**r, "answer": True} for r in rows])
    jsonl("huge-train.jsonl", [{**r, "problem": "x" * 200_000} if i == 0 else r for i, r in enumerate(rows)])
    jsonl("huge-heldout.jsonl", [{**r, "problem": "x" * 200_000} if i == 39 else r for i, r in enumerate(rows)])
    Path("twice.jsonl").write_text(Path("good.jsonl").read_text() + '{"problem": "2 + 2?", "answer": "4", '
                                   '"answer": "5"}\n')
    jsonl("gsm8k.jsonl", [{"question": "What is 1 + 1?", "answer": "#### 2"}])
    for name in ("noconfig", "empty"):
        Path(name).mkdir()
    Path("noconfig/README").write_text("not a model")
    Path("afile").write_text("x")
    return tmp_path


MATH = ["train", "--config", "smoke", "--task", "math", "--heldout_size", "4", "--max_steps", "1",
        "--output_dir", "o", "--dataset"]
EVAL = ["eval", "--model", "tiny", "--n", "1", "--ks", "1", "--limit", "1", "--max_new_tokens", "2",
        "--no_progress", "--output_dir", "o"]


@pytest.mark.parametrize("argv,message", [
    # dataset rows
    (MATH + ["twice.jsonl"], r"twice.jsonl line 41 column 1: not valid JSON \(key 'answer' is set twice in one "
                             r"object\)"),
    (MATH + ["booleans.jsonl"], r"booleans.jsonl line 1: column 'answer' is True; expected a non-empty string"),
    (MATH + ["huge-train.jsonl"], r"1 training problem\(s\) do not fit the model's context of 512 tokens: the "
                                  r"longest prompt \('xxx.*is 200\d\d\d tokens, plus max_completion_length=8"),
    (MATH + ["huge-heldout.jsonl"], r"1 held-out problem\(s\) do not fit the model's context of 512 tokens"),
    (MATH + ["empty"], r"dataset folder 'empty' holds no data file that can be read"),
    # models that are not there or are no model
    (["train", "--config", "smoke", "--output_dir", "o", "--model", "./noconfig"],
     r"model folder './noconfig' has no config.json; give a folder written by save_pretrained"),
    (["train", "--config", "smoke", "--output_dir", "o", "--model", "nobody/no-such-model"],
     r"could not load model 'nobody/no-such-model' as a local folder or hub model: "),
    (EVAL[:1] + ["--model", "./noconfig"] + EVAL[3:] + ["--benchmarks", "arith"], r"has no config.json"),
    (EVAL[:1] + ["--model", ""] + EVAL[3:] + ["--benchmarks", "arith"], r"--model is empty"),
    # d3s eval values
    (EVAL + ["--benchmarks", "arith", "--device", "gpu0"], r"--device 'gpu0' is not a device; valid: auto, cpu"),
    (EVAL + ["--benchmarks", "arith", "--temperature", "nan"], r"temperature=nan must be a finite number >= 0"),
    (EVAL + ["--benchmarks", "gsm8k="], r"benchmark 'gsm8k=' names no file; write gsm8k=PATH"),
    (EVAL + ["--benchmarks", "arith=twice.jsonl"], r"twice.jsonl:41: not valid JSON \(key 'answer' is set twice"),
    # d3s eval-table and d3s compare options
    (["eval-table", "afile", "--ks", "0"], r"--ks 0: every k must be >= 1"),
    (["compare", "--config", "smoke", "--variants", "grpo,grpo", "--output_dir", "c"],
     r"--variants lists grpo more than once"),
    (["compare", "--config", "smoke", "--seeds", "1,-1", "--output_dir", "c"],
     r"--seeds -1: a seed is an integer in \[0, 2\*\*32 - 1\]"),
    (["compare", "--keep-checkpoints", "all", "--output_dir", "c"],
     r"unknown option --keep-checkpoints; did you mean --keep_checkpoints\?"),
    # d3s train options
    (["train", "--config", "smoke", "--output_dir", "o", "--seed", "-1"],
     r"seed=-1 \(from the command line\); valid: an integer >= 0 and <= 4294967295"),
    (["train", "--config", "--output_dir", "o"], r"--config needs a recipe file or name"),
    (["train", "--config", "smoke", "--output_dir", "o", "--model", ""], r"model is empty"),
    (MATH + ["missing.parquet"], r"dataset file 'missing.parquet' does not exist"),
])
def test_found_by_trying(files, capsys, argv, message):
    line = fails(capsys, argv)
    assert re.search(message, line), line
    assert not Path("c").exists() and not (Path("o") / "run_config.json").exists()


def test_config_inside_a_recipe(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("config: smoke\n")
    assert "is not a field; a recipe is given on the command line" in fails(capsys, ["train", "--config", str(recipe)])
