"""LoRA (`peft_config`) and gradient checkpointing with the selective forward.

Every variant trains LoRA adapters (the base weights stay as they were); with D3S off the run equals
TRL's `GRPOTrainer` with the same LoRA config bit for bit; and with adapters on, or with gradient
checkpointing on, the selective forward's loss and gradients equal the full masked computation's at
every micro-batch (`CheckingTrainer` of test_trl_compute).
"""

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

import torch  # noqa: E402
from peft import LoraConfig  # noqa: E402
from test_trl_compute import SMALL, CheckingTrainer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl_tiny import flat_params, run_training, step_logs, tiny_model  # noqa: E402

from d3s import VARIANTS  # noqa: E402
from d3s.integrations.trl import D3SConfig, D3SGRPOTrainer  # noqa: E402


def lora() -> LoraConfig:
    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def base_and_adapter_params(model):
    named = dict(model.named_parameters())
    adapters = {n: p for n, p in named.items() if "lora_" in n}
    base = {n: p for n, p in named.items() if "lora_" not in n}
    return base, adapters


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_trains_lora_adapters_and_leaves_the_base_weights(tmp_path, variant):
    config = dict(variant=variant, max_steps=2, kl_log_every=1, **SMALL)
    if variant == "d2s":
        config.update(k_init=0.3)
    run = run_training(D3SGRPOTrainer, D3SConfig, tmp_path, peft_config=lora(), **config)
    base, adapters = base_and_adapter_params(run.model)
    assert adapters and all(p.requires_grad for p in adapters.values())
    assert any(float(p.abs().max()) > 0 for n, p in adapters.items() if "lora_B" in n)  # B starts at 0: it trained
    fresh = dict(tiny_model(0).named_parameters())
    for name, p in base.items():
        key = name.removeprefix("base_model.model.").replace(".base_layer", "")
        assert torch.equal(p.detach(), fresh[key].detach()), name
    logs = step_logs(run)
    assert len(logs) == 2 and all(h["kl"] >= 0 for h in logs)  # KL to the initial policy: adapters switched off


@pytest.mark.parametrize("extra", [{}, {"beta": 0.04}], ids=["beta0", "beta0.04"])
def test_d3s_off_with_lora_is_trl_bit_for_bit(tmp_path, extra):
    common = dict(max_steps=2, **SMALL, **extra)
    theirs = run_training(GRPOTrainer, GRPOConfig, tmp_path / "trl", peft_config=lora(), **common)
    ours = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "d3s", variant="grpo", peft_config=lora(), **common)
    assert torch.equal(flat_params(theirs.model), flat_params(ours.model))
    assert len(theirs.grad_recorder.grads) == len(ours.grad_recorder.grads) == 2
    for a, b in zip(theirs.grad_recorder.grads, ours.grad_recorder.grads):
        assert a.abs().max() > 0 and torch.equal(a, b)


@pytest.mark.parametrize(
    "variant, peft, checkpointing, beta",
    [
        ("d3s", True, False, 0.0),
        ("d2s", True, False, 0.04),
        ("d3s", False, True, 0.0),
        ("d1s-c", False, True, 0.04),
        ("d3s-i", True, True, 0.0),
    ],
)
def test_selective_forward_equals_the_full_computation_with_adapters_or_checkpointing(
    tmp_path, variant, peft, checkpointing, beta
):
    config = dict(variant=variant, max_steps=2, kl_log_every=0, beta=beta, learning_rate=0.05,
                  gradient_checkpointing=checkpointing,
                  gradient_checkpointing_kwargs={"use_reentrant": False} if checkpointing else None, **SMALL)
    if variant == "d2s":
        config.update(k_init=0.3)

    def setup(trainer):
        trainer.checked = []

    run = run_training(CheckingTrainer, D3SConfig, tmp_path, setup=setup, peft_config=lora() if peft else None,
                       **config)
    assert len(run.checked) == 2 * 2 and max(run.checked) > 0
    if checkpointing:
        assert run.accelerator.unwrap_model(run.model).is_gradient_checkpointing
