"""GRPO with D3S's rollout selection in a plain TRL script: a dataset, a reward function, `D3SConfig`,
`D3SGRPOTrainer`, `train()`. Copy it and change the dataset and the reward.

Against a TRL GRPO script, two lines change: the import, and `GRPOConfig(...)` -> `D3SConfig(..., variant=...)`.

    pip install -e ".[trl]"                                    # from a clone of d3s (README, "Install")

    # CPU, a few steps (the test suite runs this with a tiny local model: tests/test_examples.py)
    python examples/trl_grpo.py --model path/to/model --max_steps 5

    # one GPU
    python examples/trl_grpo.py --model Qwen/Qwen2.5-Math-1.5B --dataset my_data.jsonl --output_dir runs/d1s-c
    # one GPU, vLLM generating on the same GPU (pip install vllm)
    python examples/trl_grpo.py --model Qwen/Qwen2.5-Math-1.5B --use_vllm --vllm_mode colocate

    # 8 GPUs on one node, DeepSpeed ZeRO-3 (pip install -e ".[deepspeed]"): the paper recipes' launcher config
    accelerate launch --config_file recipes/accelerate/zero3-8gpu.yaml examples/trl_grpo.py \
        --model Qwen/Qwen2.5-Math-7B --use_vllm --vllm_mode colocate
    # vLLM server mode: GPU 0 generates, GPUs 1-7 train
    CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model Qwen/Qwen2.5-Math-7B
    CUDA_VISIBLE_DEVICES=1,2,3,4,5,6,7 accelerate launch --config_file recipes/accelerate/zero3-8gpu.yaml \
        --num_processes 7 examples/trl_grpo.py --model Qwen/Qwen2.5-Math-7B --use_vllm --vllm_mode server

Where these were run: the CPU line in the default test suite. The GPU lines are TRL's usual launches with this
script; none has been run on GPUs by this project (README, "What is tested, what is not"). The same ZeRO-3
config with colocated vLLM runs the paper recipes of `d3s train` at tiny scale on CPUs in CI (docs/vllm.md),
not this script. For a 7B-8B model, the recipes' memory settings per GPU (micro-batches of 4 rollouts, gradient
checkpointing, vllm_gpu_memory_utilization) are in recipes/paper-qwen2.5-math-7b.yaml.

`--dataset`: a JSONL file, or a dataset on the Hugging Face Hub or saved locally, with a `question` and an `answer`
column (`answer`: the final number). Without it, a small built-in list of arithmetic questions.
"""

from __future__ import annotations

import argparse
import random
import re

import torch
from datasets import Dataset, load_dataset

from d3s.integrations.trl import D3SConfig, D3SGRPOTrainer  # was: from trl import GRPOConfig, GRPOTrainer


def arithmetic_questions(n: int = 256, seed: int = 0) -> Dataset:
    """`n` questions such as "What is 7 * 8?" with their answers ("56"): one- and two-digit operands, + - *."""
    rng = random.Random(seed)
    apply = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    rows = []
    for _ in range(n):
        a, b, op = rng.randint(0, 99), rng.randint(0, 9), rng.choice("+-*")
        rows.append({"question": f"What is {a} {op} {b}?", "answer": str(apply[op](a, b))})
    return Dataset.from_list(rows)


def load_questions(path: str | None) -> Dataset:
    """The training set: `question` and `answer` columns, from a JSONL file, a Hub or local dataset, or built in."""
    if path is None:
        return arithmetic_questions()
    if path.endswith((".jsonl", ".json")):
        data = load_dataset("json", data_files=path, split="train")
    else:
        data = load_dataset(path, split="train")
    missing = {"question", "answer"} - set(data.column_names)
    if missing:
        raise SystemExit(f"--dataset {path}: no column {', '.join(sorted(missing))}; it has {data.column_names}")
    return data


def to_prompt(row: dict) -> dict:
    """TRL's conversational format: the question as the user's turn (the model's chat template applies)."""
    text = f"{row['question']}\nThink step by step, then give the final number on the last line."
    return {"prompt": [{"role": "user", "content": text}]}


NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def correct_answer(completions, answer, **kwargs) -> list[float]:
    """1.0 when the last number of a completion equals the `answer` column, else 0.0 (no number: 0.0). Pure.

    `completions` are TRL's: a list of messages per completion for conversational prompts, a string otherwise."""
    rewards = []
    for completion, expected in zip(completions, answer):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        numbers = NUMBER.findall(text.replace(",", ""))
        rewards.append(1.0 if numbers and float(numbers[-1]) == float(expected) else 0.0)
    return rewards


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Hub model name or a local model folder")
    parser.add_argument("--dataset", help="JSONL file or dataset with question/answer columns (default: built in)")
    parser.add_argument("--output_dir", default="runs/trl-grpo")
    parser.add_argument("--max_steps", type=int, default=200)
    parser.add_argument("--num_generations", type=int, default=16, help="G: rollouts per prompt")
    parser.add_argument("--per_device_train_batch_size", type=int, default=16, help="rollouts per GPU per step")
    parser.add_argument("--max_completion_length", type=int, default=1024)
    parser.add_argument("--learning_rate", type=float, default=1e-6)
    parser.add_argument("--use_vllm", action="store_true", help="generate with vLLM (TRL's use_vllm)")
    parser.add_argument("--vllm_mode", choices=["colocate", "server"], default="colocate")
    args = parser.parse_args(argv)

    dataset = load_questions(args.dataset).map(to_prompt)
    gpu = torch.cuda.is_available()
    config = D3SConfig(
        # D1S-C: keep the rollouts of the generation batch whose advantages have the largest variance (N = 8 of
        # G = 32, scaled to your G: 4 of 16), constant, and train on all their tokens. On a 135M model on CPU
        # arithmetic it was not shown to beat a tuned GRPO at GRPO's compute; untested at GPU scale and with long
        # completions: run GRPO at the same compute beside it (README, "Which variant should I use?").
        # The paper's D3S is variant="d3s" (it also cuts tokens: K 5% -> 20%).
        variant="d1s-c",
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.per_device_train_batch_size,
        max_completion_length=args.max_completion_length,
        learning_rate=args.learning_rate,
        loss_type="dapo",  # TRL's default; with D3S on: grpo, dapo, bnpo or dr_grpo
        beta=0.0,
        use_vllm=args.use_vllm,
        vllm_mode=args.vllm_mode,
        use_cpu=not gpu,
        bf16=gpu,  # fp32 on a CPU
        logging_steps=1,
        report_to="none",  # or "tensorboard", "wandb"
    )
    trainer = D3SGRPOTrainer(model=args.model, reward_funcs=correct_answer, args=config, train_dataset=dataset)
    trainer.train()
    trainer.save_model(args.output_dir)


if __name__ == "__main__":
    main()
