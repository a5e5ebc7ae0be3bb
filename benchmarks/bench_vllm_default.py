"""The embedded default run (recipes/default.yaml) with vLLM generation on the CPU, against transformers'.

    bash scripts/setup_vllm.sh
    .venv-vllm/bin/python benchmarks/bench_vllm_default.py [--steps 5] [--variants grpo,d3s] [--backends transformers,vllm]

A measurement, not a product feature: it uses the vLLM test harness (tests/with_vllm/vllm_tiny.py:
the CPU environment, the weight-sync workaround) and builds the default run's trainer as `d3s train`
does (SmolLM2-135M-Instruct, 1-digit arithmetic, 2 prompts x 16 rollouts, 48 new tokens, fp32 on a
CPU without native bf16), with `use_vllm=True, vllm_mode="colocate"` for the vLLM backend.

Per optimizer step (one generation batch per step in the default recipe):
- generate: TRL's `_generate_single_turn` (vLLM: weight sync + generation; transformers: `generate`);
- sync: the vLLM weight sync alone (part of generate);
- rest: the step minus generate (rewards, old-policy log-probs under vLLM, D3S selection, forward,
  backward, optimizer).
The first step of each run is reported apart (vLLM compiles and warms up in it); the table gives the
median of the others. Engine start = trainer construction time. Writes a JSON record under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "with_vllm"))

import vllm_tiny  # noqa: E402


class _Timer:
    def __init__(self):
        self.total = 0.0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - start

        return timed


def run_one(backend: str, variant: str, steps: int, out: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback

    from d3s.integrations.trl import D3SGRPOTrainer
    from d3s.app.models import resolve_model
    from d3s.app.recipe import parse_train_args
    from d3s.app.tasks import arith_reward, prompt_messages, train_problems

    argv = ["--variant", variant, "--max_steps", str(steps), "--output_dir", str(out), "--report_to", "none",
            "--save_strategy", "no", "--logging_steps", "1"]
    if backend == "vllm":
        argv += ["--use_vllm", "true", "--vllm_mode", "colocate", "--vllm_max_model_length", "256"]
    run, config, _ = parse_train_args(argv)
    config.bf16 = False  # the default run's precision on a CPU without native bf16 kernels (`precision: auto`)
    model_path = resolve_model(run.model, seed=config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    task = run.task_config()
    prompts_per_step = config.per_device_train_batch_size * config.steps_per_generation // config.num_generations
    problems = train_problems(task, steps * prompts_per_step + 8)
    dataset = Dataset.from_list([{"prompt": prompt_messages(p["question"], task.instruction), "answer": p["answer"]}
                                 for p in problems])

    step_times, gen_times, sync_times = [], [], []
    gen, sync = _Timer(), _Timer()

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start, self.gen0, self.sync0 = time.perf_counter(), gen.total, sync.total

        def on_step_end(self, args, state, control, **kwargs):
            step_times.append(time.perf_counter() - self.start)
            gen_times.append(gen.total - self.gen0)
            sync_times.append(sync.total - self.sync0)

    built = time.perf_counter()
    trainer = D3SGRPOTrainer(model=model_path, reward_funcs=[arith_reward], args=config, train_dataset=dataset,
                             processing_class=tokenizer, callbacks=[StepClock()])
    engine_start = time.perf_counter() - built
    trainer._generate_single_turn = gen.wrap(trainer._generate_single_turn)
    if backend == "vllm":
        trainer.vllm_generation.sync_weights = sync.wrap(trainer.vllm_generation.sync_weights)
    try:
        trainer.train()
    finally:
        vllm_tiny.clear_leaked_env()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    rest = [s - g for s, g in zip(step_times, gen_times)]
    record = {
        "backend": backend, "variant": variant, "steps": steps, "build_s": engine_start,
        "step_s": step_times, "generate_s": gen_times, "sync_s": sync_times, "rest_s": rest,
        "reward": [h.get("reward") for h in logs],
        "rollout_ratio": [h.get("d3s/rollout_ratio") for h in logs],
        "mean_length": [h.get("completions/mean_length") for h in logs],
        "is_ratio_mean": [h.get("sampling/importance_sampling_ratio/mean") for h in logs],
        "torch_threads": torch.get_num_threads(),
    }
    del trainer
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps per run; the first is a warm-up")
    ap.add_argument("--variants", default="grpo,d3s")
    ap.add_argument("--backends", default="transformers,vllm")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vllm-default"))
    args = ap.parse_args()

    reason = vllm_tiny.unavailable_reason()
    if reason is not None and "vllm" in args.backends:
        sys.exit(f"bench_vllm_default: {reason}")
    work = Path(tempfile.mkdtemp(prefix="bench_vllm_"))
    vllm_tiny.set_vllm_cpu_env(work / "vllm_cache")
    vllm_tiny.keep_linear_weights_on_cpu()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "cpu": vllm_tiny.cpu_reason() or ("AVX-512" if "avx512f" in vllm_tiny.cpu_flags() else "AVX2"),
            "load_at_start": os.getloadavg()[0]}

    def med(xs):
        return statistics.median(xs[1:]) if len(xs) > 1 else float("nan")

    records = []
    for backend in args.backends.split(","):
        for variant in args.variants.split(","):
            print(f"bench_vllm_default: {backend} / {variant} ...", flush=True)
            records.append(run_one(backend, variant, args.steps, work / f"{backend}-{variant}"))
            # written after every run, so an interrupted benchmark keeps what it measured
            (out / "bench_vllm_default.json").write_text(json.dumps({"meta": meta, "runs": records}, indent=2))

    lines = ["| backend | variant | build (s) | step 1 (s) | step (s) | generate (s) | of which sync (s) | rest (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['backend']} | {r['variant']} | {r['build_s']:.1f} | {r['step_s'][0]:.1f} | "
                     f"{med(r['step_s']):.1f} | {med(r['generate_s']):.1f} | {med(r['sync_s']):.2f} | "
                     f"{med(r['rest_s']):.1f} |")
    table = "\n".join(lines)
    print(table)
    (out / "table.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
