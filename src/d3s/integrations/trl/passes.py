"""The no-grad passes of the kept rollouts: what TRL computes for every rollout before the rewards exist.

After selection (`D3SGRPOTrainer._d3s_select`) these run for the kept rows only: the old-policy
log-probs (when TRL needs them: vLLM's sampler correction, or generation not aligned with optimizer
steps), the reference log-probs (beta != 0), the sampler-correction ratio, and the entropies for the
token cut when no pass that runs anyway gave them. Each takes the trainer for its settings and models.
"""

from __future__ import annotations

import torch

from d3s.batch import sampler_correction_ratio
from d3s.integrations.trl import step_metrics
from d3s.integrations.trl.compat import disable_gradient_checkpointing, use_adapter
from d3s.integrations.trl.selective_head import selective_forward


@torch.no_grad()
def kept_row_passes(trainer, batch: dict, mask: torch.Tensor, need_entropy: bool) -> dict:
    """Old-policy, reference and sampler-correction terms of the kept rows only (what TRL computes
    for every rollout before the rewards exist), plus entropies when no pass that runs anyway gave them.
    """
    generate_every = trainer.args.steps_per_generation * trainer.num_iterations
    vllm_correction = trainer.use_vllm and trainer.vllm_importance_sampling_correction
    need_old = trainer.args.gradient_accumulation_steps % generate_every != 0 or vllm_correction
    need_entropy = need_entropy and "d3s_entropies" not in batch
    out = {"entropies": None, "entropy_source": None}
    if need_old or need_entropy:
        logps, entropies = trainer._d3s_no_grad_logps(trainer.model, batch, mask, entropy=need_entropy)
        if need_old:
            batch["old_per_token_logps"] = logps  # (R, T')
        if need_entropy:
            out["entropies"] = entropies
            out["entropy_source"] = "old-policy pass" if need_old else "extra no-grad pass"
    if trainer.beta != 0.0:
        batch["ref_per_token_logps"] = reference_logps(trainer, batch, mask)
    if vllm_correction:
        ratio = sampler_correction_ratio(
            batch["old_per_token_logps"],
            batch["sampling_per_token_logps"],
            mask,
            trainer.vllm_importance_sampling_mode,
            trainer.vllm_importance_sampling_clip_min,
            trainer.vllm_importance_sampling_clip_max,
        )
        batch["importance_sampling_ratio"] = ratio
        step_metrics.replace_sampling_metrics(
            trainer.accelerator, trainer._metrics["train"], batch["old_per_token_logps"],
            batch["sampling_per_token_logps"], mask, ratio,
        )
    return out


def no_grad_logps(trainer, model, batch, mask, entropy: bool = False):
    """Log-probs (and entropies) of the valid completion tokens, in chunks of the training batch size."""
    chunk = trainer.args.per_device_train_batch_size
    logps, entropies = [], []
    with torch.no_grad(), disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        for start in range(0, mask.size(0), chunk):
            rows = slice(start, start + chunk)
            lp, ent, _, computed = selective_forward(
                model,
                trainer.accelerator,
                batch["prompt_ids"][rows],
                batch["prompt_mask"][rows],
                batch["completion_ids"][rows],
                batch["completion_mask"][rows],
                grad_positions=None,
                value_positions=mask[rows].bool(),
                entropy=entropy,
            )
            trainer.d3s_positions.add_no_grad(computed["body"], head=computed["head"] + computed["head_no_grad"])
            logps.append(lp)
            entropies.append(ent)
    return torch.cat(logps), (torch.cat(entropies) if entropy else None)


def reference_logps(trainer, batch, mask):
    """The reference model's log-probs of the valid completion tokens (beta != 0), as TRL chooses the reference."""
    if trainer.ref_model is not None:
        return trainer._d3s_no_grad_logps(trainer.ref_model, batch, mask)[0]
    # PEFT: the reference is the base model (adapters off) or the "ref" adapter, as in TRL
    model = trainer.accelerator.unwrap_model(trainer.model)
    with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
        return trainer._d3s_no_grad_logps(trainer.model, batch, mask)[0]


def zero_loss(trainer, model, inputs: dict) -> torch.Tensor:
    """A loss of exactly 0 whose backward reaches every parameter: a 1-token forward of the first row.

    The update then equals that of the full computation (zero gradients, the optimizer still steps:
    AdamW's moments decay and move the weights), through the same model call as every other micro-batch,
    so DDP/DeepSpeed/FSDP see an ordinary backward.
    """
    one = torch.ones(1, 1, dtype=torch.bool, device=inputs["completion_ids"].device)
    logps, _, _ = trainer._d3s_forward(
        model,
        inputs["prompt_ids"][:1, -1:],
        torch.ones_like(inputs["prompt_mask"][:1, -1:]),
        inputs["completion_ids"][:1, :1],
        torch.ones_like(inputs["completion_mask"][:1, :1]),
        grad_positions=one,
        value_positions=None,
    )
    trainer._d3s_log_loss_metrics(None, None, None, inputs["advantages"], None, None)
    if trainer.aux_loss_enabled:
        trainer._d3s_log_aux_loss(None)
    return (logps * 0.0).sum()
