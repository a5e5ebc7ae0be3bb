"""How often the token mask chosen from generation's entropies differs from one chosen on a training forward.

    python benchmarks/bench_generation_entropy.py [--model embedded] [--prompts 8] [--generations 16]

With transformers generation, `D3SGRPOTrainer` reads the entropies for the token mask from the
logits `generate` computes (KV cache, one position at a time) instead of a training-style forward
(the whole sequence at once). Both are the same policy at the same weights; the floats differ in
their last bits. This script generates rollouts of the default task's training prompts as a run
does (sampling at temperature 1), computes the entropies both ways, scores |A| x H with the
rollouts' real advantages, and counts the tokens the two masks disagree on at K = 5%, 10%, 20%.
Prints a table and writes `generation_entropy.json` under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import d3s  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="embedded", help="embedded (default), tiny, or a model folder")
    parser.add_argument("--prompts", type=int, default=8, help="prompts (groups)")
    parser.add_argument("--generations", type=int, default=16, help="G, rollouts per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2, help="generation rounds (different samples)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    a = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from d3s.app.models import resolve_model
    from d3s.app.run_args import RunArgs
    from d3s.app.evaluation.prompts import render_prompt
    from d3s.app.scoring import score_arith
    from d3s.app.tasks import prompt_text, train_problems

    path = resolve_model(a.model)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    config = RunArgs().task_config()
    rows = []
    for rnd in range(a.rounds):
        problems = train_problems(config, a.prompts * (rnd + 1))[rnd * a.prompts:]
        prompts = [render_prompt(tok, prompt_text(p["question"], config.instruction)) for p in problems]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.repeat_interleave(a.generations, dim=0) for k, v in enc.items()}
        torch.manual_seed(rnd)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=a.max_new_tokens, output_logits=True, return_dict_in_generate=True,
                                 pad_token_id=tok.pad_token_id)
        P = enc["input_ids"].size(1)
        completion = out.sequences[:, P:]  # (S, T)
        is_eos = completion == tok.eos_token_id
        first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), torch.full((completion.size(0),), completion.size(1)))
        mask = torch.arange(completion.size(1))[None, :] <= first_eos[:, None]  # (S, T), EOS included
        # generation's entropies: what the trainer's hook computes from each step's logits
        gen = torch.stack([d3s.token_entropy(step.float()) for step in out.logits], dim=1)  # (S, T)
        # a training-style forward of the whole sequences
        with torch.no_grad():
            ids = out.sequences
            attn = torch.cat([enc["attention_mask"], mask.long()], dim=1)
            fwd = []
            for chunk in torch.arange(ids.size(0)).split(16):  # 16 rows at a time: (16, T, V) logits
                logits = model(input_ids=ids[chunk], attention_mask=attn[chunk]).logits[:, P - 1 : -1]
                fwd.append(d3s.token_entropy(logits))
            fwd = torch.cat(fwd)  # (S, T)
        texts = tok.batch_decode(completion, skip_special_tokens=True)
        rewards = torch.tensor([score_arith(t, problems[i // a.generations]["answer"]) for i, t in enumerate(texts)])
        advantages = d3s.group_advantages(rewards, a.generations)
        diff = (gen - fwd).abs()[mask]
        row = {"round": rnd, "tokens": int(mask.sum()), "max_abs_entropy_diff": float(diff.max()),
               "mean_abs_entropy_diff": float(diff.mean()), "reward_mean": float(rewards.mean())}
        for fraction in (0.05, 0.10, 0.20):
            m_gen = d3s.token_mask(advantages, gen, mask, fraction)
            m_fwd = d3s.token_mask(advantages, fwd, mask, fraction)
            row[f"K={fraction:.0%}"] = {"kept": int(m_gen.sum()), "differ": int((m_gen != m_fwd).sum() // 2)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        record = {  # written after every round: a long run keeps what it measured
            "command": " ".join(["python benchmarks/bench_generation_entropy.py", *sys.argv[1:]]),
            "model": a.model, "prompts": a.prompts, "generations": a.generations, "rows": rows,
            "machine": {"platform": platform.platform(), "torch": torch.__version__},
        }
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "generation_entropy.json").write_text(json.dumps(record, indent=2))
    print(f"wrote {a.out / 'generation_entropy.json'}")


if __name__ == "__main__":
    main()
