"""The paper recipes fit the hardware they name (8 x 80 GB GPUs), checked on a CPU without weights.

Each `recipes/paper-*.yaml` must:
- load and validate as a D3SConfig (the GPU-only switches `bf16`, `use_cpu` overridden for the CPU);
- give the paper's generation batch on 8 processes: 16 prompts x G = 32 = 512 rollouts, one
  optimizer step per generation batch, micro-batches that D3S's re-dealing never enlarges;
- name a sharding config (`recipes/accelerate/zero3-8gpu.yaml`, DeepSpeed ZeRO-3) that exists;
- fit the model's context window with its prompt and completion lengths;
- carry, in its header, the per-GPU memory arithmetic that `memory_per_gpu_gb` below computes from
  the model's published architecture (an AutoConfig built by hand: no download) and the recipe.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("trl")
yaml = pytest.importorskip("yaml")

import torch  # noqa: E402

from d3s.app.recipe import RECIPES_DIR, load_recipe, parse_train_args  # noqa: E402

GPUS, GPU_GB = 8, 80.0
ACCELERATE_CONFIG = "recipes/accelerate/zero3-8gpu.yaml"
PROMPT_ROOM = 512  # tokens kept free for the prompt: DeepScaleR problems with the chat template fit


def _qwen2(**kw):
    from transformers import Qwen2Config

    return Qwen2Config(**kw)


def _llama(**kw):
    from transformers import LlamaConfig

    return LlamaConfig(**kw)


# The published config.json numbers of each model (hub downloads are impossible here).
LLAMA31_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                  tie_word_embeddings=False)
ARCHITECTURES = {
    "paper-qwen2.5-math-7b": (_qwen2, dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                                           num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                                           max_position_embeddings=4096, tie_word_embeddings=False)),
    "paper-qwen2.5-math-1.5b": (_qwen2, dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                                             num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                                             max_position_embeddings=4096, tie_word_embeddings=True)),
    "paper-llama3.1-8b-instruct": (_llama, LLAMA31_8B),
    "paper-openmath2-llama3.1-8b": (_llama, LLAMA31_8B),  # a full fine-tune of Llama-3.1-8B: same shapes
}
PAPER_RECIPES = sorted(p.stem for p in RECIPES_DIR.glob("paper-*.yaml"))


def architecture(name: str):
    make, numbers = ARCHITECTURES[name]
    return make(**numbers)


def num_parameters(config) -> int:
    """Parameters of the model built from `config` on the meta device (no memory, no weights)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def memory_per_gpu_gb(config, n_params: int, recipe: dict) -> dict[str, float]:
    """Estimated peak memory of one GPU, in GB (1e9 bytes), for a recipe under DeepSpeed ZeRO-3 on 8 GPUs,
    bf16, gradient checkpointing, TRL's vLLM colocate mode (sleep mode off: the engine's share is held
    while training). m = per_device_train_batch_size, L = vllm_max_model_length (prompt + completion).

    - states: 18 B per parameter sharded over the GPUs: bf16 weights (2) + fp32 gradients (4) + fp32
      master weights (4) + AdamW's two fp32 moments (8).
    - zero3_buffers: gathered layers in flight (stage3_max_live_parameters = 1e9 -> 2 GB in bf16),
      prefetch and reduce buckets, the gathered LM head: an allowance of 4 GB.
    - checkpoints: one bf16 hidden state per layer and token: layers x m x L x h x 2 B.
    - layer_recompute: the one layer recomputed during backward, its saved tensors and their gradients:
      m x L x (8h + 2 kv + 6 I) x 2 B (norms, q, o, residuals ~ 8h; k, v; gate, up, act, act*up and
      two transient gradients ~ 6 I).
    - lm_head: TRL's fused LM head never materialises the logits: a 4,096-token x 32,768-vocab tile in
      bf16 plus two fp32 work buffers, 4096 x 32768 x 10 B.
    - vllm: vllm_gpu_memory_utilization x 80 GB (its bf16 weights, KV cache and activations).
    - overhead: CUDA context, NCCL buffers, allocator fragmentation: an allowance of 6 GB.
    """
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    m, L = recipe["per_device_train_batch_size"], recipe["vllm_max_model_length"]
    GB = 1e9
    parts = {
        "states": 18 * n_params / GPUS / GB,
        "zero3_buffers": 4.0,
        "checkpoints": layers * m * L * h * 2 / GB,
        "layer_recompute": m * L * (8 * h + 2 * kv + 6 * inter) * 2 / GB,
        "lm_head": 4096 * 32768 * 10 / GB,
        "vllm": recipe["vllm_gpu_memory_utilization"] * GPU_GB,
        "overhead": 6.0,
    }
    parts["total"] = sum(parts.values())
    return parts


def vllm_kv_cache(config, n_params: int, recipe: dict) -> tuple[float, int]:
    """(KV-cache GB, rollouts of L tokens held at once) in vLLM's share: minus its bf16 weights and
    ~2 GB for its own activations."""
    head_dim = config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 2  # K and V, bf16
    kv_gb = recipe["vllm_gpu_memory_utilization"] * GPU_GB - 2 * n_params / 1e9 - 2.0
    return kv_gb, int(kv_gb * 1e9 / per_token / recipe["vllm_max_model_length"])


def _comment_number(text: str, label: str) -> float:
    """The number after `label` in a header line: `label ... <dots> 12.3 GB` or `label 12.3 GB|B`."""
    found = re.search(rf"^#[^\n]*{re.escape(label)}[^\n]*?\.{{2,}} ?([\d.]+) GB", text, flags=re.M) or re.search(
        rf"^#[^\n]*{re.escape(label)} ([\d.]+) (?:GB|B)\b", text, flags=re.M
    )
    assert found, f"no '{label} ... N GB' line in the recipe header"
    return float(found.group(1))


@pytest.fixture(scope="module", params=PAPER_RECIPES)
def paper(request):
    name = request.param
    recipe = load_recipe(name)
    # The GPU-only switches are the only overrides: a CPU cannot validate bf16 training.
    run, config, _ = parse_train_args(["--config", name, "--use_cpu", "true", "--precision", "fp32"])
    arch = architecture(name)
    return name, recipe, run, config, arch, num_parameters(arch)


def test_all_four_paper_recipes_are_checked():
    assert PAPER_RECIPES == sorted(ARCHITECTURES)


def test_recipe_validates(paper):
    name, recipe, run, config, _, _ = paper
    assert run.model == recipe["model"] and run.task == "math"
    assert config.variant == "d3s" and config.num_generations == 32
    assert (config.n_init, config.n_final, config.k_init, config.k_final) == (8, 32, 0.05, 0.2)
    assert recipe["bf16"] is True and recipe["use_cpu"] is False  # what the GPUs run
    assert config.gradient_checkpointing
    assert config.use_vllm and config.vllm_mode == "colocate"


def test_batch_arithmetic_on_8_gpus(paper):
    name, recipe, _, config, _, _ = paper
    m, ga, spg, G = (config.per_device_train_batch_size, config.gradient_accumulation_steps,
                     config.steps_per_generation, config.num_generations)
    generation_batch = m * GPUS * spg  # TRL's generation_batch_size on 8 processes
    assert generation_batch == 512 and generation_batch % G == 0 and generation_batch // G == 16
    assert spg == ga, "one optimizer step per generation batch, as in the paper (on-policy)"
    # D3S deals the K <= 512 kept rollouts out again: spg * ceil(K / (P * spg)) rows per rank, so a
    # micro-batch never holds more than m rows.
    for kept in (8 * 16, 512):  # N = 8 (start) and N = 32 (end) of each group
        rows_per_rank = spg * -(-kept // (GPUS * spg))
        assert rows_per_rank // spg <= m


def test_names_a_sharding_config_that_exists(paper):
    name, *_ = paper
    text = (RECIPES_DIR / f"{name}.yaml").read_text()
    assert f"--config_file {ACCELERATE_CONFIG}" in text
    accelerate = yaml.safe_load((RECIPES_DIR / ACCELERATE_CONFIG.removeprefix("recipes/")).read_text())
    assert accelerate["distributed_type"] == "DEEPSPEED"
    assert accelerate["deepspeed_config"]["zero_stage"] == 3
    assert accelerate["deepspeed_config"]["offload_optimizer_device"] == "none"  # the arithmetic assumes it
    assert accelerate["num_processes"] == GPUS and accelerate["mixed_precision"] == "bf16"


def test_fits_the_context_window(paper):
    _, recipe, _, config, arch, _ = paper
    L = recipe["vllm_max_model_length"]
    assert config.max_completion_length + PROMPT_ROOM <= L <= arch.max_position_embeddings
    assert recipe["eval_max_new_tokens"] + PROMPT_ROOM <= arch.max_position_embeddings


def test_memory_arithmetic_in_the_header_fits_80gb(paper):
    name, recipe, _, _, arch, n_params = paper
    text = (RECIPES_DIR / f"{name}.yaml").read_text()
    assert _comment_number(text, "N =") == pytest.approx(n_params / 1e9, abs=0.005)
    parts = memory_per_gpu_gb(arch, n_params, recipe)
    for label, key in [("sharded over 8", "states"), ("checkpointed layer inputs", "checkpoints"),
                       ("recomputed in backward", "layer_recompute"), ("vllm_gpu_memory_utilization", "vllm"),
                       ("total", "total")]:
        assert _comment_number(text, label) == pytest.approx(parts[key], abs=0.051), label
    assert parts["total"] <= 0.9 * GPU_GB, f"{name}: {parts['total']:.1f} GB leaves under 10% of {GPU_GB} GB"
    # unsharded (plain DDP), the states alone would not leave room for the rest
    assert 18 * n_params / 1e9 + parts["vllm"] > GPU_GB or name.endswith("1.5b")
    kv_gb, rollouts = vllm_kv_cache(arch, n_params, recipe)
    assert _comment_number(text, "KV cache") == pytest.approx(kv_gb, abs=0.051)
    assert rollouts >= 8, f"{name}: vLLM holds only {rollouts} rollouts of {recipe['vllm_max_model_length']} tokens"


def header(name: str) -> str:
    """The memory block of a recipe's header, as the recipes carry it (run this file to print them)."""
    recipe = load_recipe(name)
    arch = architecture(name)
    n = num_parameters(arch)
    p = memory_per_gpu_gb(arch, n, recipe)
    kv_gb, rollouts = vllm_kv_cache(arch, n, recipe)
    head_dim = arch.hidden_size // arch.num_attention_heads
    m, L = recipe["per_device_train_batch_size"], recipe["vllm_max_model_length"]
    lines = [
        f"# Memory per GPU, 8 x 80 GB, DeepSpeed ZeRO-3 + bf16 + gradient checkpointing + vLLM colocated.",
        f"# N = {n / 1e9:.2f} B parameters (hidden h = {arch.hidden_size}, I = {arch.intermediate_size}, "
        f"{arch.num_hidden_layers} layers, kv = {arch.num_key_value_heads} x {head_dim}, vocab {arch.vocab_size}),",
        f"# m = {m} rollouts per micro-batch, L = {L} tokens (vllm_max_model_length: prompt + completion):",
        f"#   weights, gradients, AdamW: 18 B x N sharded over 8 ......... {p['states']:.1f} GB"
        f" (unsharded: {18 * n / 1e9:.0f} GB)",
        f"#   ZeRO-3 gathered layers and buckets (allowance) ............ {p['zero3_buffers']:.1f} GB",
        f"#   checkpointed layer inputs, layers x m x L x h x 2 B ........ {p['checkpoints']:.1f} GB",
        f"#   one layer recomputed in backward, m x L x (8h+2kv+6I) x 2 B .. {p['layer_recompute']:.1f} GB",
        f"#   logits: TRL's fused LM head, 4096 x 32768 tiles ............ {p['lm_head']:.1f} GB",
        f"#   vLLM, vllm_gpu_memory_utilization x 80 GB ................. {p['vllm']:.1f} GB",
        f"#     (bf16 weights {2 * n / 1e9:.1f} GB, its activations ~2 GB, KV cache {kv_gb:.1f} GB = "
        f"{rollouts} rollouts of L at once)",
        f"#   CUDA context, NCCL, fragmentation (allowance) .............. {p['overhead']:.1f} GB",
        f"#   total ...................................................... {p['total']:.1f} GB of 80",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    for recipe_name in PAPER_RECIPES:
        print(recipe_name)
        print(header(recipe_name))


@pytest.mark.parametrize("name", PAPER_RECIPES)
def test_under_its_deepspeed_launcher_the_kl_metric_is_off_not_an_error(name, monkeypatch):
    """Under `accelerate launch --config_file <zero3>` the model is sharded; at beta = 0 the KL metric would need an
    unsharded copy of it, so it is off there by default instead of failing at step 0. (The launcher's environment
    itself needs DeepSpeed installed to build the arguments: the sharding it announces is stood in for here.)"""
    from d3s.integrations.trl import D3SConfig

    monkeypatch.setattr(D3SConfig, "d3s_sharded", property(lambda self: True))
    _, config, _ = parse_train_args(["--config", name, "--use_cpu", "true", "--precision", "fp32"])
    assert config.beta == 0.0 and config.kl_log_every == 0
