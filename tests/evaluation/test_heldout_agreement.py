"""`d3s train`'s held-out accuracy and `d3s eval` are one evaluator: same model, problems and batch size
give the same greedy completions and the same accuracy."""

import json

import pytest

pytest.importorskip("transformers")

from d3s.app.evaluation.generation import call_plan  # noqa: E402
from d3s.app.evaluation.heldout import heldout_accuracy  # noqa: E402
from d3s.app.evaluation.runner import run_eval  # noqa: E402
from d3s.app.evaluation.settings import EvalConfig  # noqa: E402
from d3s.app.models import tiny_model_path  # noqa: E402
from d3s.app.scoring import score_arith  # noqa: E402
from d3s.app.tasks import ARITH_INSTRUCTION, TaskData, arith_reward  # noqa: E402

ROWS = [  # prompts of different lengths: the call plan reorders them, batches of 2 mix lengths
    {"question": "What is 3 + 4?", "answer": "7"},
    {"question": "Calculate 12 * 12 - 100 + 7 * 3.", "answer": "65"},
    {"question": "1+1=", "answer": "2"},
    {"question": "What is 9 - 2?", "answer": "7"},
    {"question": "Compute 8 * 7 - 6 * 5 + 4 * 3 - 2.", "answer": "36"},
    {"question": "5*5", "answer": "25"},
    {"question": "Work out (2 + 3) * 4 please.", "answer": "20"},
]


def test_call_plan_orders_by_length_and_partitions():
    prompts = ["ccc", "a", "bb", "dddd", "e"]
    assert call_plan(prompts, 2) == [[1, 4], [2, 0], [3]]  # stable among equal lengths
    assert sorted(i for call in call_plan(prompts, 3) for i in call) == list(range(5))


def test_train_heldout_figure_equals_d3s_eval(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import torch

    tiny = tiny_model_path(seed=3, cache=tmp_path / "cache")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny), AutoTokenizer.from_pretrained(tiny)
    torch.manual_seed(0)
    for param in model.parameters():  # large random weights: greedy decoding writes varied text, not one token
        param.data.normal_(0.0, 0.5)
    path = tmp_path / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    model.train()  # as during training
    tokenizer.padding_side = "right"  # TRL's; the evaluation restores it
    task = TaskData("arith", [], ROWS, ARITH_INSTRUCTION, arith_reward, score_arith, {})
    during_training = heldout_accuracy(model, tokenizer, task, max_new_tokens=12, batch_size=2)
    assert model.training and tokenizer.padding_side == "right"

    data = tmp_path / "heldout.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    fields = {f for f in EvalConfig.__dataclass_fields__}
    out_key = "output_dir" if "output_dir" in fields else "output"
    config = EvalConfig(model=str(path), benchmarks=(f"arith={data}",), n=1, ks=(1,), temperature=0.0,
                        max_new_tokens=12, batch_size=2, device="cpu", dtype="float32", score_workers=1,
                        **{out_key: str(tmp_path / "eval")})
    results = run_eval(config, progress=False)
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    by_id = {s["problem_id"]: s for s in samples if s.get("type") == "problem"}
    eval_completions = [by_id[str(i)]["completions"][0] for i in range(len(ROWS))]

    train_completions = [e["completion"] for e in during_training["examples"]]
    assert train_completions == eval_completions[:5]
    assert len({c for c in eval_completions if c.strip()}) >= 3  # varied text, so agreement means something
    assert results["benchmarks"]["arith"]["n_correct"] == [int(score_arith(c, r["answer"]))
                                                           for c, r in zip(eval_completions, ROWS)]
    assert during_training["correct"] == sum(results["benchmarks"]["arith"]["n_correct"])


def _varied_tiny_model(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import torch

    tiny = tiny_model_path(seed=3, cache=tmp_path / "cache")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny), AutoTokenizer.from_pretrained(tiny)
    torch.manual_seed(0)
    for param in model.parameters():  # large random weights: varied text of varied lengths
        param.data.normal_(0.0, 0.5)
    return model, tokenizer


@pytest.mark.parametrize("batch_size", [2, 7, 64])
def test_shared_prefill_heldout_completions_equal_generate(tmp_path, batch_size):
    """The shared-prefill path gives `generate`'s greedy completions, whatever the batch size."""
    model, tokenizer = _varied_tiny_model(tmp_path)
    task = TaskData("arith", [], ROWS, ARITH_INSTRUCTION, arith_reward, score_arith, {})
    plain = heldout_accuracy(model, tokenizer, task, 12, 2, keep_completions=True)
    shared = heldout_accuracy(model, tokenizer, task, 12, batch_size, shared_prefill=True, keep_completions=True)
    assert shared["completions"] == plain["completions"] and shared["correct"] == plain["correct"]
    assert len(set(plain["completions"])) >= 3


def test_shared_prefill_sampler_draws_n_per_prompt_reproducibly(tmp_path):
    from d3s.app.evaluation.generation import SamplingSettings, TransformersSampler

    model, tokenizer = _varied_tiny_model(tmp_path)
    tokenizer.padding_side = "left"
    sampler = TransformersSampler.from_model(model.eval(), tokenizer, batch_size=5, shared_prefill=True)
    settings = SamplingSettings(n=4, max_new_tokens=8, temperature=1.0, top_p=0.9, top_k=0)
    prompts = [r["question"] for r in ROWS[:3]]
    first = sampler.sample(prompts, settings, seed=1)
    assert [len(c) for c in first] == [4, 4, 4]
    assert first == sampler.sample(prompts, settings, seed=1)  # the seed fixes the draws
    assert len({c for group in first for c in group}) > 3  # samples, not one greedy text repeated
