"""Greedy held-out accuracy of a model during `d3s train` / `d3s compare`, the way `d3s eval` measures it.

The same sampler (`TransformersSampler`, over the model in memory), prompt rendering
(`render_prompt`), call plan (`call_plan`) and scorer (the task's) as `d3s eval`: on the same
checkpoint, problems and batch size, `d3s eval --temperature 0 --n 1` gives the same completions.
"""

from __future__ import annotations

import math
from typing import Any

from d3s.app.errors import RecipeError
from d3s.app.evaluation.generation import SamplingSettings, TransformersSampler, call_plan, problems_per_call
from d3s.app.evaluation.prompts import has_chat_template, render_prompt
from d3s.app.intervals import wilson_interval
from d3s.app.tasks import TaskData, prompt_text


def heldout_accuracy(model: Any, tokenizer: Any, task: TaskData, max_new_tokens: int, batch_size: int) -> dict:
    """Greedy accuracy on the task's held-out problems, scored by the task's verifier, with a 95% Wilson
    interval and the first five completions. The model's mode and the tokenizer's padding side are
    restored afterwards."""
    problems = task.heldout
    prompts = [render_prompt(tokenizer, prompt_text(p["question"], task.instruction)) for p in problems]
    sampler = TransformersSampler.from_model(model, tokenizer, batch_size=batch_size)
    greedy = SamplingSettings(n=1, max_new_tokens=max_new_tokens, temperature=0.0, top_p=1.0, top_k=0)
    completions: list[str] = [""] * len(prompts)
    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    try:
        for call in call_plan(prompts, problems_per_call(greedy.n, batch_size)):
            for i, texts in zip(call, sampler.sample([prompts[i] for i in call], greedy, seed=0)):
                completions[i] = texts[0]
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    correct = int(sum(task.score(c, p["answer"]) for c, p in zip(completions, problems)))
    low, high = wilson_interval(correct, len(problems))
    return {"accuracy": correct / len(problems), "correct": correct, "n": len(problems), "ci_low": low,
            "ci_high": high, "examples": [{"question": p["question"], "answer": p["answer"], "completion": c}
                                          for p, c in list(zip(problems, completions))[:5]]}


def check_prompts_fit(model: Any, tokenizer: Any, task: TaskData, run: Any, config: Any) -> None:
    """Refuse, before anything is generated, a training or held-out problem of `d3s train` (settings `run`,
    `config`) whose prompt tokens plus its new tokens pass the context: the model's `max_position_embeddings`,
    and for training with vLLM also `vllm_max_model_length`. Generating past the context gives garbage, and a
    huge field of a dataset would exhaust the memory inside generation. `d3s eval` checks its prompts the same
    way (`runner.check_context`)."""
    context = getattr(model.config, "max_position_embeddings", None) or math.inf
    vllm = getattr(config, "vllm_max_model_length", None) if getattr(config, "use_vllm", False) else None
    train_limit = min(context, vllm or math.inf)
    eval_option = "eval_max_new_tokens" if run.eval_max_new_tokens else "max_completion_length"
    special = not has_chat_template(tokenizer)  # a chat template already carries them
    for what, rows, option, new, limit in (
        ("training", task.train, "max_completion_length", config.max_completion_length, train_limit),
        ("held-out", task.heldout, eval_option, run.eval_max_new_tokens or config.max_completion_length, context),
    ):
        if not rows or limit == math.inf:
            continue
        prompts = [render_prompt(tokenizer, prompt_text(p["question"], task.instruction)) for p in rows]
        lengths = [len(ids) for ids in tokenizer(prompts, add_special_tokens=special)["input_ids"]]
        longest = max(range(len(rows)), key=lengths.__getitem__)
        if lengths[longest] + new > limit:
            over = sum(n + new > limit for n in lengths)
            where = "vllm_max_model_length" if limit == vllm and limit < context else "the model's context"
            raise RecipeError(
                f"{over} {what} problem(s) do not fit {where} of {limit} tokens: the longest prompt "
                f"({rows[longest]['question'][:40]!r}...) is {lengths[longest]} tokens, plus {option}={new} new "
                f"ones; shorten or drop those problems, or lower {option}")
