"""Before a campaign: how hard is a task for the model, and how many prompts per step does it need?

    python benchmarks/task_probe.py [--config RECIPE] [--field value ...] [--groups 24] [--draws 30000]

For the task and model of a `d3s train` recipe (with the same overrides as `d3s train`), prints:

- the number of distinct training problems (arith: in the first `--draws` draws of the training seed, up to
  swapped operands, held-out problems removed; a dataset: its distinct training questions);
- the base model's greedy held-out accuracy with its 95% interval, measured exactly as `d3s train` does;
- at the recipe's temperature, groups of `num_generations` completions for the first `--groups` training
  problems: the share of groups whose rewards are all equal (they carry no signal for any variant), and
  from it the expected share of steps with no signal at 1, 2, 4 and 8 prompts per step (share^P, problems
  drawn independently), with the generation seconds each prompt costs here.

Writes the same as JSON with `--json FILE`. The per-problem success rates are printed too: a task whose
problems the model either always or never solves needs more prompts per step than its mean suggests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=24, help="training problems sampled in groups (default 24)")
    p.add_argument("--draws", type=int, default=30_000, help="arith: draws counted for distinct problems")
    p.add_argument("--json", default=None, help="also write the results to this file")
    args, train_argv = p.parse_known_args(argv)
    if args.groups < 1:
        p.error(f"--groups={args.groups}: use at least 1")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from d3s.app.evaluation.generation import SamplingSettings, TransformersSampler, call_plan, problems_per_call
    from d3s.app.evaluation.heldout import heldout_accuracy
    from d3s.app.evaluation.prompts import render_prompt
    from d3s.app.models import resolve_model
    from d3s.app.recipe import parse_train_args
    from d3s.app.tasks import build_task, canonical_key, generate_problems, heldout_keys, prompt_text

    run, config, _ = parse_train_args(train_argv)
    torch.manual_seed(config.seed)
    model_path = resolve_model(run.model, seed=config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    task = build_task(run.task_config(), args.groups)
    if run.task == "arith":
        cfg = run.task_config()
        keys = {canonical_key(x["expression"]) for x in generate_problems(cfg, cfg.train_seed, args.draws)}
        distinct, how = len(keys - heldout_keys(cfg)), f"in the first {args.draws:,} draws"
    else:
        distinct, how = len({row["question"] for row in task.train}), "in the dataset"

    start = time.perf_counter()
    base = heldout_accuracy(model, tokenizer, task, run.eval_max_new_tokens or config.max_completion_length,
                            run.eval_batch_size)
    eval_s = time.perf_counter() - start

    G = config.num_generations
    problems = task.train[: args.groups]
    prompts = [render_prompt(tokenizer, prompt_text(x["question"], task.instruction)) for x in problems]
    settings = SamplingSettings(n=G, max_new_tokens=config.max_completion_length, temperature=config.temperature,
                                top_p=config.top_p, top_k=config.top_k or 0)
    sampler = TransformersSampler.from_model(model, tokenizer, batch_size=config.per_device_train_batch_size)
    model.eval()
    tokenizer.padding_side = "left"
    rates, flat = [], 0
    start = time.perf_counter()
    for n, call in enumerate(call_plan(prompts, problems_per_call(G, config.per_device_train_batch_size))):
        for i, texts in zip(call, sampler.sample([prompts[i] for i in call], settings, seed=config.seed + n)):
            rewards = [task.score(text, problems[i]["answer"]) for text in texts]
            rates.append(sum(rewards) / G)
            flat += len(set(rewards)) == 1
        print(f"  sampled {len(rates)}/{len(prompts)} groups", file=sys.stderr, flush=True)
    sample_s = time.perf_counter() - start
    share = flat / len(prompts)
    result = {
        "model": run.model, "task": run.task, "task_key": task.key,
        "distinct_training_problems": distinct, "counted": how,
        "base_accuracy": base["accuracy"], "base_ci95": [base["ci_low"], base["ci_high"]], "heldout": base["n"],
        "heldout_eval_s": eval_s,
        "groups": len(prompts), "group_size": G, "temperature": config.temperature,
        "all_equal_groups": flat, "all_equal_share": share, "success_rates": rates,
        "no_signal_steps_expected": {str(P): share**P for P in (1, 2, 4, 8)},
        "generation_s_per_prompt": sample_s / len(prompts),
    }
    print(f"{run.task}: {distinct:,} distinct training problems ({how}); base greedy held-out accuracy "
          f"{base['accuracy']:.1%} [{base['ci_low']:.1%}, {base['ci_high']:.1%}] on {base['n']} problems "
          f"({eval_s:.0f} s)")
    print(f"groups of {G} at temperature {config.temperature:g}: {flat} of {len(prompts)} all-equal ({share:.0%}); "
          f"success rates {', '.join(f'{r:.2f}' for r in rates)}")
    print("expected share of steps with no signal: "
          + ", ".join(f"{P} prompts {share**P:.0%}" for P in (1, 2, 4, 8))
          + f"; generation {sample_s / len(prompts):.1f} s per prompt here")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
