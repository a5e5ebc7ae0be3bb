"""One D3S training run for `test_trl_multiprocess.py`; launched by it on 1 process (`python`) or on
several (`accelerate launch --cpu --num_processes 2`).

    python trl_multiprocess_run.py OUT_DIR MICRO_BATCHES LOSS_TYPE

The global batch is the same whatever the process count: 4 prompts x G = 4 per generation, split
into MICRO_BATCHES micro-batches per process (1 -> the token mask is computed inside the loss from
the training forward; 2 -> from a no-grad forward right after generation). Each rank writes what it
selected at every step to OUT_DIR/selection_rank{r}.json; rank 0 writes the final parameters and
the logs.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl_tiny import flat_params, length_reward, make_rollout_func, prompt_dataset, run_training  # noqa: E402

from d3s.integrations.trl import D3SConfig, D3SGRPOTrainer  # noqa: E402


# Prompts 2, 3 (both on rank 1 in step 1) and 4 (rank 0, step 2) get a flat reward: their groups
# carry no advantage, so cross selection keeps none of rank 1's rollouts in step 1 and an uneven
# number in step 2. The dataset is read in order (shuffle_dataset=False).
FLAT_PROMPTS = {2, 3, 4}


def dataset(n: int = 32) -> Dataset:
    prompts = prompt_dataset(n)["prompt"]
    return Dataset.from_dict({"prompt": prompts, "flat": [i in FLAT_PROMPTS for i in range(len(prompts))]})


def flat_or_length_reward(completions, flat, **kwargs) -> list[float]:
    return [1.0 if f else r for f, r in zip(flat, length_reward(completions), strict=True)]


class SelectionDump(TrainerCallback):
    """Records the trainer's `d3s_last_selection` after every optimizer step."""

    def __init__(self):
        self.trainer = None
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        sel = self.trainer.d3s_last_selection
        self.steps.append(
            {
                "kept": sel["kept"].tolist(),
                "kept_per_rank_before": sel["kept_per_rank_before"].tolist(),
                "rows_per_rank": sel["rows_per_rank"],
                "tokens_in_loss": sel["tokens_in_loss"],
                "token_mask": sel["token_mask"].int().tolist() if "token_mask" in sel else None,
            }
        )


class _Trainer(D3SGRPOTrainer):
    dump = None

    def _d3s_select(self, batch, entropies):
        _Trainer.dump.trainer = self
        return super()._d3s_select(batch, entropies)


class PromptDump:
    """The rollout function of `trl_tiny`, recording the prompts this process generates for, per round."""

    def __init__(self):
        self.inner = make_rollout_func(8, 4)
        self.rounds = []

    def __call__(self, prompts, trainer):
        self.rounds.append(list(prompts))
        return self.inner(prompts, trainer)


def main(out_dir: str, micro_batches: int, loss_type: str) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dump = SelectionDump()
    _Trainer.dump = dump
    extra = {}
    prompts = None
    if os.environ.get("D3S_TEST_PROMPT_OPTIONS"):  # prompt_skip + dynamic_sampling on 8 prompts, seen every 2 steps
        prompts = PromptDump()
        extra = dict(prompt_skip=True, prompt_skip_explore=0.3, dynamic_sampling=True, max_steps=5,
                     train_dataset=dataset(8), rollout_func=prompts)
    trainer = run_training(
        _Trainer,
        D3SConfig,
        os.path.join(out_dir, f"run-{world}"),
        variant=os.environ.get("D3S_TEST_VARIANT", "d3s"),
        loss_type=loss_type,
        reward_funcs=flat_or_length_reward,
        shuffle_dataset=False,
        learning_rate=0.01,
        per_device_train_batch_size=16 // (world * micro_batches),
        gradient_accumulation_steps=micro_batches,
        callbacks=[dump],
        **{"max_steps": 3, "train_dataset": dataset(), **extra, **json.loads(os.environ.get("D3S_TEST_OPTIONS", "{}"))},
    )
    rank = trainer.accelerator.process_index
    if prompts is not None:
        with open(os.path.join(out_dir, f"prompts_world{world}_rank{rank}.json"), "w") as f:
            json.dump(prompts.rounds, f)
    with open(os.path.join(out_dir, f"selection_world{world}_rank{rank}.json"), "w") as f:
        json.dump(dump.steps, f)
    if rank == 0:
        torch.save(flat_params(trainer.accelerator.unwrap_model(trainer.model)),
                   os.path.join(out_dir, f"params_world{world}.pt"))
        torch.save(torch.stack(trainer.grad_recorder.grads), os.path.join(out_dir, f"grads_world{world}.pt"))
        with open(os.path.join(out_dir, f"logs_world{world}.json"), "w") as f:
            json.dump([h for h in trainer.state.log_history if "loss" in h], f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
