"""Greedy held-out accuracy of a model during `d3s train` / `d3s compare`, the way `d3s eval` measures it.

The same sampler (`TransformersSampler`, over the model in memory), prompt rendering
(`render_prompt`), call plan (`call_plan`) and scorer (the task's) as `d3s eval`: on the same
checkpoint, problems and batch size, `d3s eval --temperature 0 --n 1` gives the same completions.
"""

from __future__ import annotations

from typing import Any

from d3s.app.evaluation.generation import SamplingSettings, TransformersSampler, call_plan, problems_per_call
from d3s.app.evaluation.prompts import render_prompt
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
