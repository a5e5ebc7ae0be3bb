"""More of what a user hands to d3s done wrong, each one a one-line refusal naming the value and what is valid:
an option given twice, an empty recipe, an empty `--output_dir`, a non-bool value in a boolean config field, a
reward function returning something other than one number (or None) per completion, a reward model name that
cannot be found. Also: the config's TRL-style name, `D3SGRPOConfig`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import typing

import numpy as np
import pytest
import torch

pytest.importorskip("trl")

from d3s import cli  # noqa: E402
from d3s.integrations.trl import D3SConfig, D3SGRPOConfig  # noqa: E402
from d3s.integrations.trl.rewards import CheckedReward, check_reward_output, checked_reward_funcs  # noqa: E402

_BARS = ("Writing model shards", "Loading weights", "d3s eval:  ", "d3s eval: 100%")


def fails(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines()
           if line.strip() and not line.startswith(_BARS)]
    assert len(err) == 1 and err[0].startswith(f"d3s {argv[0]}: error: "), err
    return err[0]


# ---------------------------------------------------------------------------------------------
# The command line: an option twice, an empty recipe, an empty output folder
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv,message", [
    (["train", "--max_steps", "2", "--max_steps", "3"], "--max_steps is given twice on the command line; give it once"),
    (["train", "--max_steps=2", "--max_steps", "3"], "--max_steps is given twice on the command line; give it once"),
    (["train", "--no_plots", "--plots"], "--no_plots and --plots both set plots on the command line; give one"),
    (["compare", "--variants", "d3s", "--seeds", "1", "--max_steps", "2", "--max_steps", "3"],
     "--max_steps is given twice on the command line; give it once"),
    (["eval", "--model", "tiny", "--n", "2", "--n", "4"], "--n is given twice on the command line; give it once"),
    (["eval-table", "a.json", "--ks", "1", "--ks", "2"], "--ks is given twice on the command line; give it once"),
])
def test_an_option_given_twice_is_refused(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert fails(capsys, argv).endswith(message)
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("content", ["", "# only a comment\n", "\n\n"])
def test_an_empty_recipe_is_refused(tmp_path, capsys, content):
    recipe = tmp_path / "empty.yaml"
    recipe.write_text(content)
    line = fails(capsys, ["train", "--config", str(recipe), "--output_dir", str(tmp_path / "run")])
    assert line.endswith(f"{recipe}: the recipe is empty; a recipe is a YAML mapping of field: value (without "
                         "--config, d3s train uses the default recipe)")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_output_dir_is_refused(tmp_path, monkeypatch, capsys, value):
    monkeypatch.chdir(tmp_path)
    line = fails(capsys, ["train", "--output_dir", value])
    assert line.endswith(f"output_dir={value!r} is empty; give a folder path (a new or empty folder, or a d3s run's "
                         "folder)")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Boolean config fields
# ---------------------------------------------------------------------------------------------


def _bool_fields() -> list[str]:
    hints = typing.get_type_hints(D3SConfig)
    return [f.name for f in dataclasses.fields(D3SConfig)
            if f.init and hints[f.name] in (bool, bool | None, typing.Optional[bool])]


def test_every_boolean_field_of_the_config_refuses_other_values(tmp_path):
    names = _bool_fields()
    assert {"token_selection", "allow_tightening", "prompt_skip", "dynamic_sampling", "use_cpu", "bf16"} <= set(names)
    for name in names:
        for value in ("false", "true", 0, 1, 1.0, np.bool_(True)):
            with pytest.raises(ValueError) as err:
                D3SConfig(output_dir=str(tmp_path), **{name: value})
            assert str(err.value) == f"{name}={value!r} must be True or False"


def test_token_selection_false_as_a_string_no_longer_turns_it_on(tmp_path):
    with pytest.raises(ValueError, match=r"^token_selection='false' must be True or False$"):
        D3SConfig(output_dir=str(tmp_path), variant="d1s", token_selection="false", k_init=0.2)
    config = D3SConfig(output_dir=str(tmp_path), variant="d1s", token_selection=False, use_cpu=True)
    assert config.token_selection is False


def test_the_recipe_refuses_a_non_bool_value_in_a_boolean_field(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: tiny\ntoken_selection: 'no way'\n")
    line = fails(capsys, ["train", "--config", str(recipe), "--output_dir", str(tmp_path / "run")])
    assert "token_selection" in line and "'no way'" in line


def test_the_config_has_its_trl_style_name():
    import d3s.integrations.trl as glue

    assert D3SGRPOConfig is D3SConfig and "D3SGRPOConfig" in glue.__all__ and "D3SGRPOTrainer" in glue.__all__


# ---------------------------------------------------------------------------------------------
# Reward functions
# ---------------------------------------------------------------------------------------------


def strings(completions, **kwargs):
    return ["1.0" for _ in completions]


WRONG = [
    (lambda completions, **kw: ["1.0"] * len(completions), "str '1.0' for completion 0"),
    (lambda completions, **kw: [True] * len(completions), "bool True for completion 0"),
    (lambda completions, **kw: [[1.0]] * len(completions), "list [1.0] for completion 0"),
    (lambda completions, **kw: [torch.tensor([1.0])] * len(completions), "Tensor tensor([1.]) for completion 0"),
    (lambda completions, **kw: 1.0, "float 1.0;"),
    (lambda completions, **kw: "1.0", "str '1.0';"),
    (lambda completions, **kw: None, "NoneType None;"),
    (lambda completions, **kw: {"r": 1.0}, "dict {'r': 1.0};"),
    (lambda completions, **kw: [1.0], "1 rewards for 3 completions"),
    (lambda completions, **kw: [1e308] * len(completions),
     "1e+308 for completion 0, beyond float32's range (+-3.403e+38) in which TRL keeps rewards, where it would be inf"),
    (lambda completions, **kw: [0.0, -1e39, 0.0], "-1e+39 for completion 1, beyond float32's range"),
]


@pytest.mark.parametrize("func,what", WRONG)
def test_a_reward_function_returning_the_wrong_thing_is_named(func, what):
    checked = checked_reward_funcs([func])[0]
    with pytest.raises(ValueError) as err:
        checked(prompts=["p"] * 3, completions=["a", "b", "c"])
    message = str(err.value)
    assert message.startswith("reward function '<lambda>' returned ") and what in message, message
    assert "one number (int or float), or None, per completion" in message


def test_a_reward_function_returning_strings_is_named_by_its_name():
    (checked,) = checked_reward_funcs([strings])
    assert checked.__name__ == "strings"  # TRL logs rewards/strings/mean under this name
    with pytest.raises(ValueError, match=r"^reward function 'strings' returned str '1.0' for completion 0; it must "):
        checked(prompts=["p", "q"], completions=["a", "b"])


def test_good_reward_outputs_pass_unchanged():
    assert check_reward_output("f", [1, 0.5, None, np.float32(2.0), torch.tensor(3.0)], 5) == [1.0, 0.5, None, 2.0,
                                                                                               3.0]
    assert check_reward_output("f", torch.tensor([1.0, 2.0]), 2) == [1.0, 2.0]
    seen = {}

    def reward(completions, answer, **kwargs):
        seen.update(kwargs, answer=answer)
        return [float(c == a) for c, a in zip(completions, answer)]

    checked = checked_reward_funcs(reward)
    assert isinstance(checked, CheckedReward)
    assert checked(prompts=["p", "q"], completions=["1", "2"], answer=["1", "3"], trainer_state=None) == [1.0, 0.0]
    assert seen["prompts"] == ["p", "q"] and seen["trainer_state"] is None


def test_an_async_reward_function_is_checked_and_stays_async():
    from trl.trainer.utils import is_async_callable

    async def judge(completions, **kwargs):
        return ["x" for _ in completions]

    (checked,) = checked_reward_funcs([judge])
    assert is_async_callable(checked)
    with pytest.raises(ValueError, match=r"^reward function 'judge' returned str 'x' for completion 0"):
        asyncio.run(checked(prompts=["p"], completions=["a"]))


def test_a_reward_model_name_that_is_not_found_offline_is_named(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError) as err:
        checked_reward_funcs(["not/a-model"])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("reward_funcs[0]='not/a-model': a string is taken as a reward model's name")
    assert "was not found locally" in message


def test_a_reward_that_is_neither_callable_nor_a_name_is_refused():
    with pytest.raises(ValueError, match=r"^reward_funcs\[1\]=3 is a int; give a callable"):
        checked_reward_funcs([strings, 3])
