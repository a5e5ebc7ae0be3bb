"""`d3s train` / `d3s compare` end to end on the smoke recipe (tiny local model, CPU, seconds)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("trl")

from d3s import cli  # noqa: E402
from d3s.app.recipe import RECIPES_DIR, parse_train_args  # noqa: E402


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("D3S_CACHE", str(tmp_path_factory.getbasetemp() / "d3s-cache"))


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def train(out: Path, *extra: str) -> int:
    return cli.main(["train", "--config", "smoke", "--output_dir", str(out), *extra])


def test_smoke_train_writes_everything(tmp_path):
    out = tmp_path / "run"
    assert train(out) == 0
    recs = records(out)
    assert [r["step"] for r in recs if r["type"] == "train"] == [1, 2, 3, 4]
    assert [r["step"] for r in recs if r["type"] == "eval"] == [0, 2, 4]
    first = next(r for r in recs if r["type"] == "train")
    # the schedule at p = 0 (G = 4: the paper's N 8 of 32 scales to 1, kept >= 2; K = 5%)
    assert first["d3s/n_keep"] == 2 and first["d3s/k_fraction"] == pytest.approx(0.05)
    assert first["d3s/rollouts_kept"] == 2 * 2  # N x B prompts
    tokens = [r["trained_tokens"] for r in recs if r["type"] == "train"]
    assert tokens == sorted(tokens) and tokens[-1] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["after"]["n"] == 16
    train_recs = [r for r in recs if r["type"] == "train"]
    # cumulative training-forward positions, and the share of steps whose groups all had equal rewards
    assert summary["computed_tokens"] == sum(r["d3s/tokens_computed"] for r in train_recs) > 0
    assert summary["no_signal_steps"] == sum(r["frac_reward_zero_std"] == 1.0 for r in train_recs) / 4
    # where a step's time goes: the timed parts add up to TRL's step_time, step by step and on average
    parts = ("generation", "selection", "kl_monitor", "forward", "backward")
    for r in train_recs:
        assert sum(r[f"d3s/time/{p}"] for p in parts) == pytest.approx(r["step_time"], rel=1e-6)
    seconds = summary["step_seconds"]
    assert seconds["step"] == pytest.approx(sum(r["step_time"] for r in train_recs) / 4)
    assert sum(seconds[p] for p in parts) == pytest.approx(seconds["step"], rel=1e-6)
    assert summary["command_wall_s"] > summary["train_wall_s"] > 0
    # the machine's load when the run started (run_config.json too) and when it ended: whether it ran alone
    config = json.loads((out / "run_config.json").read_text())
    assert summary["load"]["start"] == config["load_start"]
    for load in summary["load"].values():
        assert set(load) == {"load_1min", "load_5min", "cpu_count"} and load["cpu_count"] == os.cpu_count()
        assert load["load_1min"] >= 0
    assert 0.0 <= summary["before"]["ci_low"] <= summary["before"]["accuracy"] <= summary["before"]["ci_high"] <= 1
    assert summary["zero_gradient_steps"]["steps"] == 4
    zero = [r for r in train_recs if r["d3s/zero_gradient"] == 1.0]
    assert summary["zero_gradient_steps"]["zero_gradient"] == len(zero)
    assert summary["zero_gradient_steps"]["moved"] == sum(r["d3s/weights_moved"] == 1.0 for r in zero)
    assert (out / "training.png").stat().st_size > 10_000
    assert (out / "checkpoint-4").is_dir()
    # the same output folder again without --resume: refused, nothing overwritten
    assert train(out) == 2


def test_every_arm_of_a_seed_trains_on_one_prompt_stream(tmp_path):
    # arms of different lengths and variants: each step records its prompts, a longer arm sees a longer prefix
    assert train(tmp_path / "short", "--variant", "grpo", "--max_steps", "2", "--eval_every", "0") == 0
    assert train(tmp_path / "long", "--variant", "d1s-c", "--max_steps", "4", "--eval_every", "0",
                 "--num_generations", "2") == 0  # 4 prompts per step instead of 2: the same stream, cut otherwise
    streams = {name: [h for r in records(tmp_path / name) if r["type"] == "train" for h in r["prompt_hashes"]]
               for name in ("short", "long")}
    assert len(streams["short"]) == 2 * 2 and len(streams["long"]) > len(streams["short"])
    assert all(len(h) == 8 for h in streams["short"])
    assert streams["long"][: len(streams["short"])] == streams["short"]


def test_compare_runs_reuses_and_summarises(tmp_path, capsys):
    root = tmp_path / "cmp"
    argv = ["compare", "--variants", "grpo,d3s", "--seeds", "1", "--config", "smoke", "--output_dir", str(root),
            "--max_steps", "2", "--eval_every", "1"]
    assert cli.main(argv) == 0
    md = (root / "compare.md").read_text()
    assert "| grpo |" in md and "| d3s |" in md
    summary = json.loads((root / "compare.json").read_text())
    assert summary["reference"] == "grpo" and set(summary["variants"]) == {"grpo", "d3s"}
    grpo = summary["variants"]["grpo"]
    if grpo["quiet_with_reference"] is not False:  # the reference reaches itself (unless this machine is loaded)
        assert grpo["speedup_wall"] == pytest.approx(1.0)
    else:
        assert grpo["speedup_wall"] is None and "wall-clock withheld: " in md
    assert (root / "compare.png").stat().st_size > 10_000
    per_seed = summary["variants"]["d3s"]["per_seed"][0]
    assert per_seed["computed_tokens"] > 0 and per_seed["code_version"].startswith("0.1.0")
    assert summary["code_versions"] == [per_seed["code_version"]]
    # each run records the machine it was timed on; both ran here, so their wall-clocks pair
    machine = json.loads((root / "d3s-seed1" / "run_config.json").read_text())["machine"]
    assert machine["cpu_count"] == os.cpu_count() and machine["accelerator"] is None and machine["processes"] == 1
    assert per_seed["machine"] == machine == summary["variants"]["grpo"]["per_seed"][0]["machine"]
    if per_seed["to_target"] is not None:
        assert per_seed["to_target_vs_reference"]["same_machine"] is True
    assert "not all timed on one machine" not in md
    # a finished run keeps only its final model (--keep_checkpoints model): no resume state
    kept = sorted(p.name for p in (root / "d3s-seed1").glob("checkpoint-*"))
    assert kept == ["checkpoint-2"]
    assert (root / "d3s-seed1" / "checkpoint-2" / "model.safetensors").is_file()
    assert not list((root / "d3s-seed1" / "checkpoint-2").glob("optimizer.pt"))
    capsys.readouterr()
    assert cli.main(argv) == 0  # finished runs are reused, not retrained
    assert "reusing" in capsys.readouterr().err
    assert cli.main(argv[:-2] + ["--eval_every", "2"]) == 0  # how often it evaluates does not change training
    assert "leave out" not in (root / "compare.md").read_text()
    # a subset of the folder's runs: its tables say which finished runs they no longer show
    subset = ["compare", "--variants", "d3s", *argv[3:]]
    assert cli.main(subset) == 0
    md = (root / "compare.md").read_text()
    assert "| grpo |" not in md and "finished runs these tables leave out: grpo-seed1." in md
    assert "leave out: grpo-seed1" in capsys.readouterr().err
    # a recipe that trains differently is never mixed in with these runs
    assert cli.main(argv + ["--learning_rate", "0.123"]) == 2
    err = capsys.readouterr().err
    assert "was trained with another recipe than this command's (learning_rate:" in err and "0.123" in err


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
def test_every_shipped_recipe_validates(recipe):
    import torch

    extra = [] if torch.cuda.is_available() else ["--precision", "fp32"]  # GPU recipes, checked on a CPU
    run, config, meta = parse_train_args(["--config", recipe, *extra])
    assert config.variant in {"d3s", "grpo", "gspo", "pods", "d1s", "d1s-c", "d2s", "d3s-i"}
    assert config.d3s_settings.num_generations == config.num_generations
    if recipe.startswith("paper-"):
        assert config.num_generations == 32 and (config.n_init, config.n_final) == (8, 32)
        assert (config.k_init, config.k_final) == (0.05, 0.2) and run.task == "math"


def test_overrides_and_precedence():
    run, config, _ = parse_train_args(["--config", "smoke", "--learning_rate", "0.5", "--variant", "grpo"])
    assert config.learning_rate == 0.5 and config.variant == "grpo" and config.sample_selection == "none"
    assert run.model == "tiny"


@pytest.mark.parametrize(
    "content,extra,message",
    [
        ("model: [unclosed\n", [], "not valid YAML"),
        ("learning_rat: 0.1\n", [], "unknown field 'learning_rat'.*did you mean 'learning_rate'"),
        ("- a\n- b\n", [], "a recipe is a YAML mapping"),
        ("", ["--no_such_field", "1"], "unknown field 'no_such_field' in the command line"),
        ("", ["--variant", "d4s"], "variant='d4s'; valid: grpo"),
        ("", ["--precision", "fp8"], "precision='fp8'"),
        # values that used to fail deep inside TRL or torch, or at step 0 with a traceback
        ("model: tiny\nnum_generations: 0\n", [], r"num_generations=0 \(from recipe .*r.yaml\); valid: an integer >= 2"),
        ("model: tiny\nlearning_rate: -0.1\n", [], r"learning_rate=-0.1 \(from recipe .*\); valid: a finite number >= 0"),
        ("model: tiny\n", ["--learning_rate", "nan"], r"learning_rate=nan \(from the command line\)"),
        ("model: tiny\n", ["--max_steps", "0"], r"max_steps=0 \(from the command line\); valid: an integer >= 1"),
        ("model: tiny\n", ["--temperature", "0"], r"temperature=0.0 .*valid: a finite number > 0"),
        # a type error in the YAML names the file and the field, with no usage dump
        ("model: tiny\nlearning_rate: abc\n", [], r"r.yaml: field 'learning_rate' is 'abc'; expected a number"),
        ("model: tiny\nmax_steps: 2.5\n", [], r"r.yaml: field 'max_steps' is 2.5; expected an integer"),
        ("model: tiny\nuse_cpu: maybe\n", [], r"r.yaml: field 'use_cpu' is 'maybe'; expected true or false"),
        ("model: tiny\nlr_scheduler_type: wiggly\n", [], r"field 'lr_scheduler_type' is 'wiggly'; valid: linear"),
        ("model: [tiny]\n", [], r"field 'model' is \['tiny'\]; expected a string"),
        # a bad flag value: one line too
        ("model: tiny\n", ["--learning_rate", "abc"], r"argument --learning_rate: invalid float value: 'abc'"),
        ("model: tiny\n", ["--max_steps"], r"argument --max_steps: expected one argument"),
        ("model: tiny\n", ["--task_min_terms", "3"], r"task_min_terms=3, task_max_terms=2"),
        ("model: tiny\n", ["--task_heldout_seed", "1"], r"task_train_seed=1 equals task_heldout_seed=1"),
    ],
)
def test_bad_recipe_gives_one_line_error(tmp_path, capsys, content, extra, message):
    import re

    recipe = tmp_path / "r.yaml"
    recipe.write_text(content or "model: tiny\n")
    assert cli.main(["train", "--config", str(recipe), "--output_dir", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("d3s train: error:"), err
    assert re.search(message, err[0]), err[0]


def test_a_setting_only_the_trainer_checks_is_one_line(tmp_path, capsys):
    assert train(tmp_path / "run", "--report_to", "5") == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines()
           if line.strip() and not line.startswith(("Writing model shards", "Loading weights"))]  # the tiny model
    assert len(err) == 1 and err[0].startswith("d3s train: error: the trainer refused the recipe: 5 is not"), err


def test_compare_refuses_a_train_field_it_sets(tmp_path, capsys):
    # `--variant` is not an abbreviation of `--variants`: it is refused, nothing runs
    assert cli.main(["compare", "--config", "smoke", "--variant", "grpo", "--output_dir", str(tmp_path / "c")]) == 2
    assert "--variant is set by d3s compare for each run; remove it" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_missing_model_folder_and_unknown_recipe(tmp_path, capsys):
    assert cli.main(["train", "--config", "smoke", "--model", "./no/such/model", "--output_dir", str(tmp_path)]) == 2
    assert "model folder './no/such/model' does not exist" in capsys.readouterr().err
    assert cli.main(["train", "--config", "nonexistent-recipe"]) == 2
    assert "neither a file nor a shipped recipe" in capsys.readouterr().err


def test_help_lists_fields(capsys):
    assert cli.main(["train", "--help"]) == 0
    text = capsys.readouterr().out
    for field in ("--variant", "--n_init", "--k_final", "--heldout_size", "--learning_rate", "--model"):
        assert field in text


@pytest.mark.parametrize("argv,added", [
    ([], {}),  # grpo: the recipe's floor is inert without a token cut
    (["--variant", "d1s-c"], {}),
    (["--variant", "d3s"], {"recipe": {"min_tokens_per_rollout": 4}}),
    (["--variant", "d3s", "--min_tokens_per_rollout", "0"], {}),  # the paper's D3S
    (["--variant", "d3s", "--token_cut", "sign"], {"recipe": {"min_tokens_per_rollout": 4},
                                                   "command line": {"token_cut": "sign"}}),
    (["--config", "arith-2digit"], {}),
])
def test_what_a_recipe_adds_to_its_variant_is_named(argv, added):
    """`d3s` on the default recipe is D3S with a floor of 4 tokens per kept rollout: the run's start line and its
    run_config.json say so, and so does the `d3s` arm of `d3s compare` (its runs record what `d3s train` would)."""
    from d3s.app.compare.command import planned_run_config
    from d3s.app.recipe import variant_additions, variant_label
    from d3s.app.train import resolve_run_config

    run, config, recipe = parse_train_args(argv)
    assert variant_additions(config, recipe) == added
    assert resolve_run_config(run, config, recipe)["variant"] == {"name": config.variant, "added": added}
    if argv[:2] == ["--variant", "d3s"] and len(argv) == 2:
        assert variant_label(config.variant, added) == "d3s (+ recipe: min_tokens_per_rollout=4)"
        planned = planned_run_config(Path("runs/cmp/d3s-seed1"), "d3s", 1, [])
        assert planned["variant"]["added"] == {"recipe": {"min_tokens_per_rollout": 4}}


def test_the_start_line_and_run_config_name_the_recipes_additions(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(out, "--min_tokens_per_rollout", "2", "--max_steps", "1", "--eval_every", "1",
                 "--skip_steps_without_signal", "true") == 0
    assert ("d3s train: d3s (+ command line: min_tokens_per_rollout=2) skipping optimizer steps without signal on "
            "arith with") in capsys.readouterr().err
    recorded = json.loads((out / "run_config.json").read_text())["variant"]
    assert recorded == {"name": "d3s", "added": {"command line": {"min_tokens_per_rollout": 2}}}
