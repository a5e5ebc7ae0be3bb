"""Training-phase cost and peak memory of TRL's GRPO vs D3S on the same model and generated batch.

    python benchmarks/bench_trl_training_phase.py [--rounds 3] [--steps 2] [--prompts 2] [--extra SETTING]
    python benchmarks/bench_trl_training_phase.py --model embedded --num-generations 16 \
        --prompt-len 45 --min-len 8 --max-len 48 --no-gradient-checkpointing   # the default run's model, shapes
    python benchmarks/bench_trl_training_phase.py --model qwen-head ...        # a 151,936 x 896 LM head

A model (`tiny`: a 13M Llama built from a config; `qwen-head`: Qwen2.5-0.5B's vocabulary and width,
151,936 x 896, on 2 layers, built from a config; `embedded`: the default run's SmolLM2-135M-Instruct;
or a local folder) trains on one fixed generation batch of B prompts x G rollouts (random tokens,
binary rewards), through TRL's `GRPOTrainer` (baseline) and `D3SGRPOTrainer` at the paper's early
setting (N = G/4, K = 5%) and late setting (N = G, K = 20%), constant schedules. `--extra` adds the
settings that make TRL run extra passes: `num_iterations=2` (old-policy log-probs) or `beta=0.04`
(reference log-probs).

Generation is a fixed `rollout_func`, so only the training phase differs. With transformers
generation D3S reads the token-mask entropies from `generate`'s logits; a `rollout_func` has none,
so the `d3s` rows here get them the same way, outside the timed region (`gen-entropy`); the row
`d3s late, extra pass` shows the fallback (an extra no-grad pass over the kept rows), which is what
a run pays under vLLM without the sampler correction or with a custom `rollout_func`.

Per optimizer step:
- fwd+bwd: `training_step` minus its `_prepare_inputs` (the policy forward, loss, backward);
- passes: the no-grad passes over rollouts (GRPO: TRL's old-policy/reference passes over all rows;
  D3S: `_d3s_kept_row_passes`, over the kept rows);
- optim: the optimizer step; select: the rest of D3S's `_d3s_select` (gather, selection, re-dealing);
- train phase = fwd+bwd + passes + optim + select.
Peak memory: the process's resident-set high-water mark during the run, above the resident set at its
start (Linux: VmHWM reset through /proc/self/clear_refs; freed heap returned with malloc_trim first).

The settings run in turn, `--rounds` times; the first step of every run is a warm-up and is dropped,
the mean of the others is reported (with `num_iterations=2` use an odd `--steps`, so the measured
steps hold whole generations: a step with the generation's passes and one without). Prints a table and writes a JSON record under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from d3s.app.models import tiny_llama, word_level_tokenizer  # noqa: E402
from d3s.integrations.trl import D3SConfig, D3SGRPOTrainer  # noqa: E402

VOCAB, HIDDEN, LAYERS, INTERMEDIATE = 8192, 384, 4, 1024
G, PROMPT_LEN, MIN_LEN, MAX_LEN = 32, 32, 32, 128
MODEL = "tiny"  # "tiny"/"qwen-head"/"qwen-0.5b": built from a config; otherwise d3s.app.models.resolve_model ("embedded", a folder)
MODEL_SHAPES = {"tiny": (8192, 384, 4, 1024, 6), "qwen-head": (151936, 896, 2, 4864, 14),
                "qwen-0.5b": (151936, 896, 24, 4864, 14)}
DEVICE = "cpu"


def _now() -> float:
    """perf_counter after the device's queued work has finished (CUDA kernels run asynchronously)."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def words(vocab: int) -> list[str]:
    """The built models' vocabulary: `<pad>`, `<eos>`, `<unk>` (ids 0, 1, 2), then the words w0, w1, ..."""
    return ["<pad>", "<eos>", "<unk>", *(f"w{i}" for i in range(vocab - 3))]


def tokenizer() -> PreTrainedTokenizerFast:
    if MODEL not in MODEL_SHAPES:
        from transformers import AutoTokenizer

        from d3s.app.models import resolve_model

        tok = AutoTokenizer.from_pretrained(resolve_model(MODEL))
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        tok.padding_side = "left"
        return tok
    return word_level_tokenizer(words(VOCAB), padding_side="left")


def model() -> LlamaForCausalLM:
    if MODEL not in MODEL_SHAPES:
        from transformers import AutoModelForCausalLM

        from d3s.app.models import resolve_model

        torch.manual_seed(0)  # a fixed random state after loading too: `model_alone` draws its batch from it
        return AutoModelForCausalLM.from_pretrained(resolve_model(MODEL), dtype=torch.float32)
    vocab, hidden, layers, intermediate, heads = MODEL_SHAPES[MODEL]
    return tiny_llama(word_level_tokenizer(words(vocab)), hidden, layers, intermediate_size=intermediate,
                      num_attention_heads=heads, num_key_value_heads=2 if MODEL.startswith("qwen") else heads,
                      max_position_embeddings=512, tie_word_embeddings=MODEL.startswith("qwen"))


def fixed_rollout(prompts, trainer):
    """The same generation batch at every call: row i of the batch gets the same tokens."""
    rank = trainer.accelerator.process_index
    prompt_ids, completion_ids = [], []
    eos = trainer.eos_token_ids[0] if MODEL not in MODEL_SHAPES else 1
    for i in range(len(prompts)):
        rng = random.Random(rank * len(prompts) + i)
        prompt_ids.append([rng.randrange(3, VOCAB) for _ in range(PROMPT_LEN)])
        completion_ids.append([rng.randrange(3, VOCAB) for _ in range(rng.randrange(MIN_LEN, MAX_LEN))] + [eos])
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}


def binary_reward(completions, completion_ids, **kwargs) -> list[float]:
    return [float(sum(ids) % 3 == 0) for ids in completion_ids]


PHASES = ("fwd_bwd", "passes", "optim", "select")


class Timer(TrainerCallback):
    """Per optimizer step: seconds of each phase."""

    def __init__(self):
        self.steps: list[dict] = []
        self.current = dict.fromkeys(PHASES, 0.0)
        self._optim_start = 0.0

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._optim_start = _now()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.current["optim"] += _now() - self._optim_start

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(self.current)
        self.current = dict.fromkeys(PHASES, 0.0)


def timed(trainer_cls, entropies_from_generation: bool):
    """`trainer_cls` with its phases timed (see the module docstring)."""

    class Timed(trainer_cls):
        timer: Timer

        def _prepare_inputs(self, generation_batch):
            start = _now()
            out = super()._prepare_inputs(generation_batch)
            self._prepare_seconds += _now() - start
            return out

        def training_step(self, model, inputs, num_items_in_batch=None):
            self._prepare_seconds = 0.0
            start = _now()
            out = super().training_step(model, inputs, num_items_in_batch)
            self.timer.current["fwd_bwd"] += _now() - start - self._prepare_seconds
            return out

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):  # TRL's passes over all rows (GRPO)
            start = _now()
            out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            if not torch.is_grad_enabled():
                self.timer.current["passes"] += _now() - start
            return out

        def _d3s_kept_row_passes(self, *args, **kwargs):
            start = _now()
            out = super()._d3s_kept_row_passes(*args, **kwargs)
            elapsed = _now() - start
            self.timer.current["passes"] += elapsed
            self._passes_seconds += elapsed
            return out

        def _d3s_select(self, batch, entropies):
            if entropies_from_generation and entropies is None:
                # what transformers generation hands over for free (computed here, untimed)
                entropies = self._d3s_no_grad_logps(self.model, batch, batch["completion_mask"], entropy=True)[1]
            self._passes_seconds = 0.0
            start = _now()
            out = super()._d3s_select(batch, entropies)
            self.timer.current["select"] += _now() - start - self._passes_seconds
            return out

    return Timed


def _rss_reset() -> int:
    """Return freed heap to the OS, reset the resident-set high-water mark; the current resident set (kB)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return -1
    return _status_kb("VmRSS")


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def run(name: str, trainer_cls, config_cls, steps: int, prompts: int, out_dir: Path, entropies_from_generation=False,
        **d3s) -> dict:
    args = config_cls(
        output_dir=str(out_dir / name.replace(" ", "_").replace("/", "-")), use_cpu=DEVICE == "cpu",
        per_device_train_batch_size=prompts * G, gradient_accumulation_steps=1, num_generations=G,
        max_completion_length=MAX_LEN + 1, max_steps=steps, logging_steps=1, report_to=[], save_strategy="no", seed=0,
        learning_rate=1e-6, loss_type="dapo", disable_tqdm=True, log_level="error", bf16=DEVICE == "cuda", **d3s,
    )
    timer = Timer()
    cls = timed(trainer_cls, entropies_from_generation)
    cls.timer = timer
    trainer = cls(model=model(), reward_funcs=binary_reward, args=args, processing_class=tokenizer(),
                  train_dataset=Dataset.from_dict({"prompt": [f"w{i}" for i in range(64)]}),
                  rollout_func=fixed_rollout, callbacks=[timer])
    base = _rss_reset()
    if DEVICE == "cuda":  # device memory instead of the resident set
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() // 1024
    trainer.train()
    peak = _status_kb("VmHWM") if DEVICE == "cpu" else torch.cuda.max_memory_allocated() // 1024
    logs = [h for h in trainer.state.log_history if "loss" in h]
    del trainer
    return {
        "name": name,
        "rows_trained": logs[-1].get("d3s/rollouts_kept", prompts * G) + logs[-1].get("d3s/padding_rows", 0),
        "token_consumption_ratio": logs[-1].get("d3s/token_consumption_ratio", 1.0),
        "peak_extra_mb": (peak - base) / 1024 if base > 0 and peak > 0 else None,
        "per_step": timer.steps[1:],  # the first step is a warm-up
    }


def model_alone(rows: int, reps: int) -> list[float]:
    """fwd+bwd seconds of the bare model (TRL's fused log-prob/entropy head) on `rows` full-width rows."""
    from trl.trainer.utils import add_fused_lm_head

    m = model().to(DEVICE)
    add_fused_lm_head(m, outputs=("log_probs", "entropy"))
    ids = torch.randint(3, VOCAB, (rows, PROMPT_LEN + MAX_LEN), device=DEVICE)  # VOCAB: the model's (set in main)
    labels = ids.clone()
    labels[:, :PROMPT_LEN] = -100
    times = []
    for _ in range(reps + 1):  # + warm-up
        start = _now()
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=DEVICE == "cuda"):
            out = m(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, fused_lm_head=True)
        out.log_probs.float().sum().backward()
        times.append(_now() - start)
        m.zero_grad(set_to_none=True)
    return times[1:]


def main() -> None:
    global MODEL, G, PROMPT_LEN, MIN_LEN, MAX_LEN, VOCAB, DEVICE
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every setting once, in turn")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per run (the first is warm-up)")
    parser.add_argument("--prompts", type=int, default=2, help="B, prompts per generation batch (x G)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--model", default="tiny",
                        help="tiny (a 13M Llama, default), qwen-head (151,936 x 896 head, 2 layers), "
                             "qwen-0.5b (Qwen2.5-0.5B's shapes, 24 layers), embedded, a folder")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cpu (fp32, default) or cuda (bf16 autocast, as GPU users train; memory is the "
                             "device's peak allocation instead of the resident set)")
    parser.add_argument("--extra", choices=["none", "num_iterations=2", "beta=0.04"], default="none",
                        help="a setting that makes TRL run a no-grad pass over the rollouts")
    parser.add_argument("--num-generations", type=int, default=G, help=f"G (default {G})")
    parser.add_argument("--prompt-len", type=int, default=PROMPT_LEN, help=f"prompt tokens (default {PROMPT_LEN})")
    parser.add_argument("--min-len", type=int, default=MIN_LEN, help=f"shortest completion (default {MIN_LEN})")
    parser.add_argument("--max-len", type=int, default=MAX_LEN, help=f"longest completion (default {MAX_LEN})")
    parser.add_argument("--no-gradient-checkpointing", action="store_true",
                        help="as `d3s train` runs on a CPU (default: TRL's default, checkpointing on)")
    a = parser.parse_args()
    MODEL, G, PROMPT_LEN, MIN_LEN, MAX_LEN = a.model, a.num_generations, a.prompt_len, a.min_len, a.max_len
    DEVICE = a.device
    extra = {"gradient_checkpointing": False} if a.no_gradient_checkpointing else {}
    if a.extra == "num_iterations=2":
        extra["num_iterations"] = 2
    elif a.extra == "beta=0.04":
        extra["beta"] = 0.04
    if a.threads:
        torch.set_num_threads(a.threads)
    a.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="d3s-bench-"))  # the trainers' output_dir (nothing is saved)
    probe = model()
    VOCAB, n_params = probe.config.vocab_size, sum(p.numel() for p in probe.parameters())
    del probe
    name = MODEL if MODEL not in MODEL_SHAPES else f"Llama-style {MODEL}, {MODEL_SHAPES[MODEL][2]} layers, hidden {MODEL_SHAPES[MODEL][1]}"
    print(f"model: {name}, vocab {VOCAB}: {n_params / 1e6:.1f}M parameters; "
          f"batch: {a.prompts} prompts x G={G}, prompts {PROMPT_LEN} tokens, completions {MIN_LEN}-{MAX_LEN} tokens; "
          f"torch threads: {torch.get_num_threads()}; {a.rounds} rounds x {a.steps - 1} measured steps")

    early = dict(sample_selection="cross", n_init=G // 4, token_selection=True, k_init=0.05, kl_log_every=0)
    late = dict(sample_selection="cross", n_init=G, token_selection=True, k_init=0.20, kl_log_every=0)
    settings = [
        ("grpo (TRL GRPOTrainer)", GRPOTrainer, GRPOConfig, {}),
        (f"d3s early: N={G // 4}/{G}, K=5%", D3SGRPOTrainer, D3SConfig, dict(early, entropies_from_generation=True)),
        (f"d3s late: N={G}/{G}, K=20%", D3SGRPOTrainer, D3SConfig, dict(late, entropies_from_generation=True)),
        ("d3s late, extra pass", D3SGRPOTrainer, D3SConfig, late),
    ]
    # Rounds interleave the settings, so that a change of machine load hits all of them alike
    runs = {name: [] for name, *_ in settings}
    floor = {a.prompts * G: [], a.prompts * G // 4: []}
    for _ in range(a.rounds):
        for name, trainer_cls, config_cls, d3s in settings:
            runs[name].append(run(name, trainer_cls, config_cls, a.steps, a.prompts, scratch, **d3s, **extra))
            print(f"  {name}: {[round(sum(s.values()), 3) for s in runs[name][-1]['per_step']]} s, peak "
                  f"+{runs[name][-1]['peak_extra_mb'] or 0:.0f} MB", flush=True)
        for rows in floor:
            floor[rows] += model_alone(rows, 1)

    results = []
    for name, *_ in settings:
        steps = [s for r in runs[name] for s in r["per_step"]]
        med = {k: statistics.mean(s[k] for s in steps) for k in PHASES}
        med["train_phase"] = statistics.mean(sum(s[k] for k in PHASES) for s in steps)
        peaks = [r["peak_extra_mb"] for r in runs[name] if r["peak_extra_mb"] is not None]
        results.append({**runs[name][-1], "seconds": med, "per_step": steps,
                        "peak_extra_mb": statistics.median(peaks) if peaks else None})
    base = results[0]["seconds"]["train_phase"]
    header = f"{'setting':26s} {'rows':>5s} {'tokens':>7s} {'fwd+bwd s':>10s} {'passes s':>9s} {'optim s':>8s} " \
             f"{'select s':>9s} {'train s':>8s} {'vs GRPO':>8s} {'peak MB':>8s}"
    print(header)
    print("-" * len(header))
    for r in results:
        s = r["seconds"]
        r["ratio_vs_grpo"] = s["train_phase"] / base
        peak = f"{r['peak_extra_mb']:8.0f}" if r["peak_extra_mb"] is not None else f"{'-':>8s}"
        print(f"{r['name']:26s} {r['rows_trained']:5.0f} {r['token_consumption_ratio']:7.1%} {s['fwd_bwd']:10.3f} "
              f"{s['passes']:9.3f} {s['optim']:8.3f} {s['select']:9.4f} {s['train_phase']:8.3f} "
              f"{r['ratio_vs_grpo']:8.3f} {peak}")
    big, small = sorted(floor, reverse=True)
    floor_ratio = statistics.median(floor[small]) / statistics.median(floor[big])
    print(f"model alone, fwd+bwd of {small} vs {big} full-width rows: {statistics.median(floor[small]):.3f} s vs "
          f"{statistics.median(floor[big]):.3f} s = {floor_ratio:.3f}")
    record = {
        "command": " ".join(["python benchmarks/bench_trl_training_phase.py", *sys.argv[1:]]),
        "model": MODEL,
        "extra": a.extra,
        "device": DEVICE if DEVICE == "cpu" else torch.cuda.get_device_name(),
        "cpu_flags": sorted({f for f in Path("/proc/cpuinfo").read_text().split() if f.startswith(("avx512", "amx", "avx2"))}),
        "model_parameters": n_params,
        "batch": {"prompts": a.prompts, "num_generations": G, "prompt_tokens": PROMPT_LEN,
                  "completion_tokens": [MIN_LEN, MAX_LEN]},
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "load_average_at_end": os.getloadavg()},
        "results": results,
        "model_alone_fwd_bwd_seconds": {str(k): v for k, v in floor.items()},
        "model_alone_ratio": floor_ratio,
    }
    suffix = "" if MODEL == "tiny" else f"_{Path(MODEL).name}"
    suffix += "" if a.extra == "none" else "_" + a.extra.replace("=", "").replace(".", "")
    suffix += "" if DEVICE == "cpu" else "_cuda"
    path = a.out / f"bench_trl_training_phase{suffix}.json"
    path.write_text(json.dumps(record, indent=2))
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
