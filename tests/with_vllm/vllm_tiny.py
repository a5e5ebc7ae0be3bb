"""The vLLM test harness: a tiny local model that TRL's colocated vLLM engine can load, on a CPU.

Everything here runs in the vLLM environment (`scripts/setup_vllm.sh` -> `.venv-vllm/`), never in
the default one. No downloads: the tokenizer is built in code and the model is random.

- `unavailable_reason()`: why vLLM cannot run in this interpreter on this machine, or None.
- `set_vllm_cpu_env(cache_dir)`: the environment vLLM's CPU backend needs in a test process.
- `keep_linear_weights_on_cpu()`: the weight-sync workaround (see its docstring).
- `save_tiny_model(folder)`: a random 2-layer Llama (hidden 128) and its tokenizer, saved to `folder`.
- `make_config(config_cls, output_dir, **overrides)`, `build(...)`, `train(trainer)`.
- `vllm_weight_mismatch(trainer)`: how far the engine's weights are from the trainer's.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys
from pathlib import Path

VOCAB = 64
PAD, EOS = 0, 1
SETUP_HINT = "bash scripts/setup_vllm.sh && bash scripts/test_vllm.sh"

# Variables TRL's colocate mode writes into os.environ for vLLM's external launcher and never removes.
LEAKED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo); empty where they cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_reason() -> str | None:
    """Why this machine cannot run vllm-cpu 0.31 at all, or None.

    vllm-cpu 0.31.0 ships x86 kernels for AVX2 (`_C_AVX2`), AVX-512 (`_C_AVX512`) and AVX-512 BF16/AMX
    (`_C`), and picks one at start-up; a Linux x86-64 CPU with at least AVX2 runs it (measured on an
    AVX2-only AMD EPYC). Other platforms are not tried here.
    """
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return f"vLLM tests run on Linux x86-64 only (this is {sys.platform} {platform.machine()})"
    flags = cpu_flags()
    if "avx2" not in flags and "avx512f" not in flags:
        return "this CPU has neither AVX2 nor AVX-512, which vllm-cpu needs"
    return None


def unavailable_reason() -> str | None:
    """Why vLLM cannot run in this interpreter, or None. Loads vLLM's CPU kernels in a child process
    first, so a kernel the CPU cannot execute (SIGILL) is reported instead of killing pytest."""
    reason = cpu_reason()
    if reason is not None:
        return reason
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:  # absent, or only a namespace package
        return f"vLLM is not installed in this environment ({sys.executable}); run: {SETUP_HINT}"
    probe = "from vllm.platforms import current_platform; current_platform.import_kernels(); print('ok')"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or "ok" not in done.stdout:
        tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return f"vLLM's CPU kernels do not load on this machine: {tail}"
    return None


def set_vllm_cpu_env(cache_dir: str | Path) -> None:
    """What vLLM's CPU backend needs in a test process (set before the first engine starts)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache; the default takes 90% of RAM
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process, as TRL colocate wants
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_dir))  # torch.compile artefacts out of ~/.cache
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("WANDB_DISABLED", "true")


def keep_linear_weights_on_cpu() -> None:
    """Make TRL's colocate weight sync work on vLLM's CPU backend (a test-harness workaround).

    What it works around: after loading, vLLM's CPU backend (vllm-cpu 0.31.0,
    `vllm.model_executor.layers.linear.UnquantizedLinearMethod.process_weights_after_loading`)
    calls `vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`,
    which repacks each linear layer's weight for oneDNN and replaces `layer.weight` by an empty
    parameter without a `weight_loader`. TRL then fails at its first weight sync (`load_weights`)
    with "'Parameter' object has no attribute 'weight_loader'", and even a successful copy would
    not reach the packed copy that the kernels use. This replacement keeps `layer.weight` and
    computes with `torch.nn.functional.linear` on it, so every sync is seen by the next generation.

    How to check whether it is still needed (e.g. after a vLLM upgrade): run the tests without it,
    `D3S_VLLM_CPU_WEIGHT_WORKAROUND=0 .venv-vllm/bin/python -m pytest -m vllm tests/with_vllm -k weight_sync`.
    If that passes, vLLM keeps the weights on its own and this function can go. Call it before the
    first engine is built.
    """
    import torch
    import vllm.model_executor.layers.utils as vllm_layer_utils

    def dispatch_keeping_weight(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    # linear.py and vocab_parallel_embedding.py import the function at call time, from this module
    vllm_layer_utils.dispatch_cpu_unquantized_gemm = dispatch_keeping_weight


def clear_leaked_env() -> None:
    for name in LEAKED_ENV:
        os.environ.pop(name, None)


# -- model, data, reward ---------------------------------------------------------------------------


def tiny_tokenizer():
    """A word-level tokenizer over "t0".."t60", built in code (no download)."""
    from d3s.app.models import word_level_tokenizer

    return word_level_tokenizer(["<pad>", "<eos>", "<unk>", *(f"t{i}" for i in range(VOCAB - 3))], padding_side="left")


def save_tiny_model(folder: str | Path, seed: int = 0, hidden_size: int = 128, num_hidden_layers: int = 2) -> str:
    """A random Llama saved in float32 with its tokenizer; returns the folder (TRL and vLLM load it by path)."""
    from d3s.app.models import tiny_llama

    tokenizer = tiny_tokenizer()
    # initializer_range 0.1: a policy peaked enough for entropies to differ, random enough to explore
    model = tiny_llama(tokenizer, hidden_size, num_hidden_layers, seed=seed, max_position_embeddings=64,
                       initializer_range=0.1, dtype="float32")
    folder = str(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def prompt_dataset(n: int = 32, prompt_len: int = 3):
    """`n` prompts of `prompt_len` words (equal token lengths: no left-padding differences)."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [" ".join(f"t{(i + j) % 50}" for j in range(prompt_len)) for i in range(n)]})


def length_reward(completions, **kwargs) -> list[float]:
    """Pure: 1 point per 't5'..'t9' word plus 0.1 per word."""
    return [sum(w in {"t5", "t6", "t7", "t8", "t9"} for w in c.split()) + 0.1 * len(c.split()) for c in completions]


# -- configs and runs ------------------------------------------------------------------------------

BASE = dict(
    use_vllm=True,
    vllm_mode="colocate",
    vllm_max_model_length=32,
    use_cpu=True,
    bf16=False,
    num_generations=4,
    per_device_train_batch_size=8,  # 2 prompts x 4 rollouts per step
    gradient_accumulation_steps=1,
    max_completion_length=8,
    learning_rate=0.05,  # large, so two steps move the weights visibly
    temperature=1.0,
    beta=0.0,
    loss_type="dapo",
    max_steps=2,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    seed=0,
    data_seed=0,
    disable_tqdm=True,
)


def make_config(config_cls, output_dir: str | Path, **overrides):
    return config_cls(output_dir=str(output_dir), **{**BASE, **overrides})


def build(trainer_cls, args, model_path: str, callbacks=None, dataset=None):
    """`trainer_cls` on the tiny model saved at `model_path`, generating with a colocated vLLM engine."""
    return trainer_cls(
        model=model_path,
        reward_funcs=length_reward,
        args=args,
        train_dataset=dataset if dataset is not None else prompt_dataset(),
        processing_class=tiny_tokenizer(),
        callbacks=callbacks,
    )


def train(trainer):
    """Trains; removes the rank variables TRL leaves behind even if training fails. Returns the trainer."""
    try:
        trainer.train()
    finally:
        clear_leaked_env()
    return trainer


def step_logs(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "loss" in h]


def flat_params(model):
    import torch

    return torch.cat([p.detach().float().flatten().cpu() for p in model.parameters()])


def vllm_model(trainer):
    """The model inside the trainer's colocated engine (in this process: V1 multiprocessing off)."""
    llm = trainer.vllm_generation.llm
    return llm.llm_engine.model_executor.driver_worker.model_runner.model


def vllm_weight_mismatch(trainer) -> float:
    """Largest |vLLM weight - trainer weight| over all parameters, the trainer's cast to vLLM's dtype.

    vLLM fuses Llama's q/k/v projections into `qkv_proj` and gate/up into `gate_up_proj` (in that
    order, along the output axis); every other parameter has the trainer's name.
    """
    import torch

    hf = dict(trainer.accelerator.unwrap_model(trainer.model).named_parameters())
    fused = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    worst = 0.0
    for name, param in vllm_model(trainer).named_parameters():
        for fused_name, parts in fused.items():
            if f".{fused_name}." in name:
                expected = torch.cat([hf[name.replace(fused_name, part)].detach() for part in parts], dim=0)
                break
        else:
            expected = hf[name].detach()
        assert expected.shape == param.shape, f"{name}: vLLM {tuple(param.shape)}, trainer {tuple(expected.shape)}"
        diff = (param.detach().float() - expected.to(param.dtype).float()).abs().max().item()
        worst = max(worst, diff)
    return worst


if __name__ == "__main__":
    # `python tests/with_vllm/vllm_tiny.py`: exit 0 where this machine can run vllm-cpu, else print why and
    # exit 1. Standard library only: used by scripts/setup_vllm.sh and .ci/run before anything is installed.
    why = cpu_reason()
    print(why or f"vllm-cpu can run on this CPU ({'AVX-512' if 'avx512f' in cpu_flags() else 'AVX2'})")
    sys.exit(1 if why else 0)
