"""Recipes for `d3s train` / `d3s compare`: a YAML file plus command-line overrides of any field.

A recipe sets the fields of two dataclasses, in one flat namespace (as `trl grpo --config` does):
`RunArgs` (`d3s.app.run_args`: model, task, held-out evaluation, precision, compute budget) and
`d3s.integrations.trl.D3SConfig` (every TRL `GRPOConfig` field plus the D3S ones: `variant`, `n_init`, ...).

    d3s train                                    # the embedded default recipe
    d3s train --config smoke                     # a recipe shipped with d3s, by name
    d3s train --config my.yaml --learning_rate 1e-5 --variant grpo

Precedence: the field's default < the recipe < the command line. Unknown fields and bad values end
with a one-line error naming them.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from d3s.app.budget import check_budget
from d3s.app.datafiles import DuplicateKey, NotUtf8, read_text, yaml_loader
from d3s.app.errors import RecipeError
from d3s.app.options import refuse_repeated
from d3s.app.run_args import RunArgs
from d3s.variants import get_variant, scaled_count

RECIPES_DIR = Path(__file__).parent / "recipes"
DEFAULT_RECIPE = "default"


def recipe_path(name_or_path: str) -> Path:
    """A recipe file: a path, or the name of a recipe shipped in `d3s/app/recipes/` (`recipes/` in the repository)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise RecipeError(f"recipe {name_or_path!r} is a folder; give a YAML file or a shipped recipe's name")
    shipped = RECIPES_DIR / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    names = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
    raise RecipeError(f"recipe {name_or_path!r} is neither a file nor a shipped recipe ({names})")


def load_recipe(name_or_path: str) -> dict[str, Any]:
    """The mapping of a recipe file, read with `d3s.app.datafiles.read_text` (UTF-8) and a safe YAML loader
    that refuses a field set twice; every problem is a `RecipeError` naming the file and the line."""
    import yaml

    path = recipe_path(name_or_path)
    try:
        data = yaml.load(read_text(path), Loader=yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except NotUtf8 as err:
        raise RecipeError(str(err)) from None
    except DuplicateKey as err:
        raise RecipeError(f"{path} {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise RecipeError(f"{path}{where}: not valid YAML ({getattr(err, 'problem', err)})") from None
    if data is None:
        raise RecipeError(f"{path}: the recipe is empty; a recipe is a YAML mapping of field: value (without "
                          "--config, d3s train uses the default recipe)")
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a YAML mapping of field: value, got {type(data).__name__}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise RecipeError(f"{path}: {bad[0]!r} is not a field name; a recipe maps field names to values")
    return data


def _field_names() -> dict[str, type]:
    from d3s.integrations.trl import D3SConfig

    return {f.name: cls for cls in (RunArgs, D3SConfig) for f in dataclasses.fields(cls) if f.init}


def _check_known(keys: Sequence[str], where: str) -> None:
    known = _field_names()
    for key in keys:
        if key == "config":
            raise RecipeError(f"'config' in {where} is not a field; a recipe is given on the command line "
                              "(--config RECIPE) and does not name another")
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise RecipeError(f"unknown field {key!r} in {where}{hint} (`d3s train --help` lists every field)")


def take_config(argv: list[str]) -> tuple[list[str], str]:
    """`(argv without it, the recipe)` of `--config RECIPE` or `--config=RECIPE`, given at most once."""
    at = [i for i, a in enumerate(argv) if a == "--config" or a.startswith("--config=")]
    if not at:
        return argv, DEFAULT_RECIPE
    if len(at) > 1:
        raise RecipeError("--config is given twice; give one recipe (override its fields with --field value)")
    i = at[0]
    if argv[i].startswith("--config="):
        name, end = argv[i].split("=", 1)[1], i + 1
    elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
        name, end = argv[i + 1], i + 2
    else:
        raise RecipeError("--config needs a recipe file or name")
    if not name:
        raise RecipeError("--config needs a recipe file or name")
    return argv[:i] + argv[end:], name


def _command_line_fields(argv: Sequence[str], parser) -> list[str]:
    """The fields that `argv`'s options set (`--no_plots` sets `plots`); an option `parser` does not have, another
    spelling (`--no-plots`) included, is a RecipeError naming the closest one it has."""
    options = {s[2:]: a.dest for a in parser._actions for s in a.option_strings if s.startswith("--")}
    fields = []
    for arg in argv:
        if not arg.startswith("--"):
            continue
        name = arg[2:].split("=", 1)[0]
        if name not in options:
            close = [name.replace("-", "_")] if name.replace("-", "_") in options else \
                difflib.get_close_matches(name, list(options), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise RecipeError(f"unknown field {name!r} in the command line{hint} (`d3s train --help` lists every "
                              "field)")
        fields.append(options[name])
    return fields


def make_parser():
    """The `d3s train` parser: transformers' `HfArgumentParser` over `RunArgs` and `D3SConfig`, with one spelling
    per option as every d3s command (`d3s.app.options`): the kebab-case twins it adds (`--max-steps`,
    `--no-plots`) are taken out of the parser and its `--help`, and `--no_flag` is described as what it does."""
    from transformers import HfArgumentParser

    from d3s.integrations.trl import D3SConfig

    parser = HfArgumentParser((RunArgs, D3SConfig), prog="d3s train")
    for action in parser._actions:
        for option in [s for s in action.option_strings if s.startswith("--") and "-" in s[2:]]:
            action.option_strings.remove(option)
            del parser._option_string_actions[option]
        if action.nargs == 0 and action.const is False:  # --no_flag (store_false); its field's default is --flag's
            action.help, action.default = f"same as --{action.dest} false", argparse.SUPPRESS
    return parser


def _device_defaults() -> dict[str, Any]:
    """Under every recipe: a CPU-only machine trains on the CPU, without gradient checkpointing (its
    precision is `precision`'s, see `mixed_precision`)."""
    if torch.cuda.is_available():
        return {}
    return {"use_cpu": True, "bf16": False, "gradient_checkpointing": False}


def train_device(use_cpu: bool) -> str:
    """Where training runs: 'cuda' when a GPU is visible and `use_cpu` is off, else 'cpu'."""
    return "cuda" if torch.cuda.is_available() and not use_cpu else "cpu"


def bf16_native(device: str) -> bool:
    """Whether this device runs bf16 natively: a GPU that supports it, or a CPU whose oneDNN has bf16
    kernels (AVX512-BF16 / AMX). Without them CPU autocast emulates bf16 and runs many times slower than
    fp32 (measured: > 25x on an AVX2-only CPU)."""
    if device.startswith("cuda"):
        return torch.cuda.is_bf16_supported()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def mixed_precision(precision: str, use_cpu: bool) -> str:
    """The trainer's mixed precision for `precision` on this machine: 'bf16' (autocast) or 'no' (fp32).
    'auto' is bf16 on a GPU with native bf16 and fp32 on a CPU. On a CPU with native bf16 (AVX512-BF16/AMX)
    autocast shortens a default-recipe GRPO step to ~0.84x (forward 0.63x, backward 0.81x, generation 1.0x;
    benchmarks/results/cpu-precision/), a D3S step less (generation is most of it), while fp32 runs are
    the same from CPU to CPU up to float rounding, so results compare across machines. `precision` decides
    over the recipe's `bf16`/`fp16` and a launcher's `--mixed_precision`."""
    device = train_device(use_cpu)
    if precision == "bf16" and device == "cpu" and not bf16_native(device):
        print("d3s train: note: precision bf16 on a CPU without native bf16 (AVX512-BF16/AMX) emulates it, "
              "many times slower than fp32; precision auto or fp32 runs fp32", file=sys.stderr)
    auto_bf16 = precision == "auto" and device != "cpu" and bf16_native(device)
    return "bf16" if precision == "bf16" or auto_bf16 else "no"


def _field_types() -> dict[str, str]:
    """Each field's declared type as text, from the class annotations (HfArgumentParser rewrites `field.type`)."""
    from d3s.integrations.trl import D3SConfig

    out: dict[str, str] = {}
    for cls in (D3SConfig, RunArgs):
        for klass in reversed(cls.__mro__):
            out.update({k: str(v) for k, v in getattr(klass, "__annotations__", {}).items()})
    return out


def _kind(convert) -> str:
    from transformers.hf_argparser import string_to_bool

    if convert is int:
        return "an integer"
    if convert is float:
        return "a number"
    if convert is string_to_bool:
        return "true or false"
    return "a string"


def _coerce_recipe_value(key: str, value: Any, action, type_text: str, where: str) -> Any:
    """A recipe value converted the way its command-line flag would be, or a RecipeError naming file and field."""
    from transformers.hf_argparser import string_to_bool

    convert = action.type
    if convert is None:
        return value
    if value is None:  # `field:` or `field: null` in YAML
        if action.default is None or "None" in type_text or "Optional" in type_text:
            return None
        raise RecipeError(f"{where}: field {key!r} is empty (null); expected {_kind(convert)}")
    if isinstance(value, (list, tuple, dict)):
        if "list" in type_text or "dict" in type_text or action.nargs in ("+", "*"):
            return value
        raise RecipeError(f"{where}: field {key!r} is {value!r}; expected {_kind(convert)}, not a list or mapping")
    try:
        if convert is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            out = int(value) if not isinstance(value, str) else int(value.strip())
        elif convert is float:
            if isinstance(value, bool):
                raise ValueError
            out = float(value)
        elif convert is string_to_bool:
            out = value if isinstance(value, bool) else string_to_bool(str(value))
        elif convert is str:
            if isinstance(value, bool):
                raise ValueError
            out = str(value)
        else:  # a choice (enum) field: argparse checks the choices below
            out = convert(str(value)) if not isinstance(value, str) else convert(value)
    except (ValueError, TypeError, Exception) as err:  # noqa: BLE001 - argparse's converters raise many kinds
        if isinstance(err, RecipeError):
            raise
        raise RecipeError(f"{where}: field {key!r} is {value!r}; expected {_kind(convert)}") from None
    if action.choices is not None and out not in action.choices:
        choices = ", ".join(str(c) for c in action.choices)
        raise RecipeError(f"{where}: field {key!r} is {value!r}; valid: {choices}")
    return out


# Trainer settings whose bad values would otherwise fail deep inside TRL or torch (a ZeroDivisionError, a
# traceback at step 0): `(name, lowest, highest, lowest allowed?)`; None = unbounded.
_NUMBER_RULES: tuple[tuple[str, float | None, float | None, bool], ...] = (
    ("seed", 0, 2**32 - 1, True),
    ("num_generations", 2, None, True),
    ("per_device_train_batch_size", 1, None, True),
    ("gradient_accumulation_steps", 1, None, True),
    ("steps_per_generation", 1, None, True),
    ("num_iterations", 1, None, True),
    ("max_completion_length", 1, None, True),
    ("learning_rate", 0.0, None, True),
    ("weight_decay", 0.0, None, True),
    ("warmup_ratio", 0.0, 1.0, True),
    ("max_grad_norm", 0.0, None, True),
    ("temperature", 0.0, None, False),
    ("top_p", 0.0, 1.0, False),
    ("beta", 0.0, None, True),
    ("epsilon", 0.0, None, True),
    ("epsilon_high", 0.0, None, True),
    ("save_steps", 0.0, None, False),
    ("logging_steps", 0.0, None, False),
)


def _check_numbers(values: dict[str, Any], origin) -> None:
    steps = values.get("max_steps")
    if steps is not None and steps != -1 and steps < 1:
        raise RecipeError(f"max_steps={steps!r} (from {origin('max_steps')}); valid: an integer >= 1, or -1 to train "
                          "num_train_epochs epochs")
    for name, low, high, low_ok in _NUMBER_RULES:
        value = values.get(name)
        if value is None:
            continue
        if not isinstance(value, float) or math.isfinite(value):
            bad = value < low if low_ok else value <= low
            bad = bad or (high is not None and value > high)
        else:
            bad = True
        if bad:
            lo = f">= {low}" if low_ok else f"> {low}"
            valid = f"{lo} and <= {high}" if high is not None else lo
            what = "an integer " if isinstance(value, int) and not isinstance(low, float) else "a finite number "
            raise RecipeError(f"{name}={value!r} (from {origin(name)}); valid: {what}{valid}")


def parse_train_args(argv: Sequence[str], *, defaults: dict[str, Any] | None = None):
    """`(RunArgs, D3SConfig, recipe dict)` from `[--config RECIPE] [--field value ...]`.

    `defaults` are applied under the recipe (used by `d3s compare` to set output folders). Every bad
    value ends in a `RecipeError` naming the file or flag, the field and what is valid.
    """
    from d3s.integrations.trl import D3SConfig

    argv, recipe_name = take_config(list(argv))
    recipe = load_recipe(recipe_name)
    recipe.pop("env", None)
    where = str(recipe_path(recipe_name))
    _check_known(list(recipe), f"recipe {recipe_name!r}")

    parser = make_parser()

    def error(message: str):  # argparse's own errors: one line, no usage dump
        raise RecipeError(f"{message} (on the command line)")

    parser.error = error
    flags = _command_line_fields(argv, parser)
    refuse_repeated(parser, argv)
    actions: dict[str, Any] = {}
    for action in parser._actions:  # a switch's `--flag`, not its `--no_flag` (which converts nothing)
        if action.option_strings:
            actions.setdefault(action.dest, action)
    types = _field_types()
    recipe = {k: _coerce_recipe_value(k, v, actions[k], types.get(k, ""), where) if k in actions else v
              for k, v in recipe.items()}
    merged = {**_device_defaults(), **(defaults or {}), **recipe}
    parser.set_defaults(**merged)
    # Lists in YAML (report_to: [tensorboard]) are accepted as they are.
    for action in parser._actions:
        if action.dest in merged and action.required:
            action.required = False
    namespace, extra = parser.parse_known_args(args=argv)
    if extra:
        raise RecipeError(f"unexpected arguments {' '.join(extra)!r} on the command line (fields are --name value)")
    values = vars(namespace)
    if values.get("output_dir") is not None and not str(values["output_dir"]).strip():
        raise RecipeError(f"output_dir={values['output_dir']!r} is empty; give a folder path (a new or empty "
                          "folder, or a d3s run's folder)")

    def origin(name: str) -> str:
        return "the command line" if name in flags else f"recipe {where}" if name in recipe else "the default"

    try:
        run_args = RunArgs(**{f.name: values[f.name] for f in dataclasses.fields(RunArgs) if f.init})
        # Settled before the config is built: TrainingArguments derives its mixed precision (and DeepSpeed's
        # "auto" bf16) from `bf16` when built, so setting `bf16` afterwards would change nothing
        precision = mixed_precision(run_args.precision, bool(values.get("use_cpu")))
        if precision == "bf16" and not values.get("use_cpu") and not torch.cuda.is_available():
            raise RecipeError(f"precision={run_args.precision!r} with use_cpu false trains in bf16 on a GPU, and no "
                              "GPU is visible (CUDA); on this machine pass --use_cpu true (and --precision fp32: a "
                              "CPU runs bf16 slower or emulated)")
        values["bf16"], values["fp16"] = precision == "bf16", False
        if "shared_prefill_generation" not in flags and "shared_prefill_generation" not in recipe:
            # the CLI's default: on wherever transformers generates (vLLM and continuous batching do their own)
            values["shared_prefill_generation"] = not (values.get("use_vllm")
                                                       or values.get("use_transformers_continuous_batching"))
        config = D3SConfig(**{f.name: values[f.name] for f in dataclasses.fields(D3SConfig)
                              if f.init and f.name in values})
    except RecipeError:
        raise
    except (ValueError, TypeError, ArithmeticError) as err:
        _check_numbers(values, origin)  # a named bad number explains a failure deep inside TRL best
        raise RecipeError(str(err).strip().splitlines()[0]) from None
    _check_numbers(values, origin)
    _apply_mixed_precision(config, precision)
    check_budget(run_args, config)
    return run_args, config, {"name": recipe_name, "path": where, "values": recipe}


def _apply_mixed_precision(config, precision: str) -> None:
    """Make `precision` win over a launcher's `ACCELERATE_MIXED_PRECISION`, which TrainingArguments reads
    first and keeps when `bf16` is off (and hands to an environment-made DeepSpeed plugin)."""
    config.mixed_precision = precision
    plugin = getattr(config, "deepspeed_plugin", None)
    if plugin is not None and getattr(config, "deepspeed", None) is None:
        plugin.set_mixed_precision(precision)


def set_offline_defaults() -> None:
    """No hub traffic unless the user asked for it."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


# The settings a named variant fixes (`d3s.variants`), and when a setting takes effect: the token-cut options only
# with a token cut, the schedule clock only with a linear schedule.
_VARIANT_FIELDS = ("sample_selection", "token_selection", "schedule", "n_init", "n_final", "k_init", "k_final",
                   "normalizer", "token_cut", "min_tokens_per_rollout", "keep_last_in_loss", "schedule_clock",
                   "importance_sampling_level")
_TAKES_EFFECT = {"token_cut": lambda c: bool(c.token_selection),
                 "min_tokens_per_rollout": lambda c: bool(c.token_selection),
                 "keep_last_in_loss": lambda c: bool(c.token_selection),
                 "schedule_clock": lambda c: c.schedule == "linear"}


def _variant_values(name: str, num_generations: int) -> dict[str, Any]:
    """The D3S fields as `D3SConfig(variant=name, num_generations=G)` resolves them with nothing else set."""
    v = get_variant(name)
    counts = v.sample_selection != "none"
    return {"sample_selection": v.sample_selection, "token_selection": v.token_selection, "schedule": v.schedule,
            "n_init": scaled_count(v.n_init, num_generations, v.num_generations) if counts else None,
            "n_final": scaled_count(v.n_final, num_generations, v.num_generations) if counts else None,
            "k_init": v.k_init if v.token_selection else None, "k_final": v.k_final if v.token_selection else None,
            "normalizer": v.normalizer, "token_cut": v.token_cut, "min_tokens_per_rollout": v.min_tokens_per_rollout,
            "keep_last_in_loss": v.keep_last_in_loss, "schedule_clock": v.schedule_clock,
            "importance_sampling_level": "sequence" if v.importance_sampling_level == "sequence_token" else "token"}


def variant_additions(config, recipe: dict | None) -> dict[str, dict[str, Any]]:
    """What a run trains beyond its named `variant`: the D3S fields whose value differs from the one the variant
    alone gives and that take effect, by where they were set, `{"recipe": {...}, "command line": {...}}` (empty
    sections left out). `d3s train --variant d3s` on the default recipe gives `{"recipe": {"min_tokens_per_rollout":
    4}}`: D3S with a floor, not the paper's D3S. A field the recipe file sets to the value the run has counts as the
    recipe's; any other (a flag, a `d3s compare` run setting) as the command line's."""
    if config.variant is None:
        return {}
    own = _variant_values(config.variant, config.num_generations)
    values = (recipe or {}).get("values") or {}
    added: dict[str, dict[str, Any]] = {}
    for name in _VARIANT_FIELDS:
        value = getattr(config, name)
        if value == own[name] or not _TAKES_EFFECT.get(name, lambda c: True)(config):
            continue
        where = "recipe" if name in values and values[name] == value else "command line"
        added.setdefault(where, {})[name] = value
    return {where: added[where] for where in ("recipe", "command line") if where in added}


def variant_label(variant: str | None, additions: dict[str, dict[str, Any]]) -> str:
    """'d3s (+ recipe: min_tokens_per_rollout=4)': the variant and what the recipe or command line adds to it."""
    extra = "; ".join(f"+ {where}: " + ", ".join(f"{k}={v}" for k, v in fields.items())
                      for where, fields in additions.items())
    return (variant or "custom") + (f" ({extra})" if extra else "")
