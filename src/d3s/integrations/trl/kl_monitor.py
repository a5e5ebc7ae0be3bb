"""The KL metric at beta = 0: k3 KL(current || initial policy), measured every few generation batches.

At beta != 0 TRL's loss has the KL to the reference and it is logged every step at no cost. At
beta = 0 there is no reference, yet the paper plots the drift from the starting policy (docs/method.md
section 7), so `KLMonitor` measures it: every `kl_log_every` generation batches, the token mean over
the valid tokens of the first `kl_log_rollouts` rollouts of each process's generation batch.

Cost: two no-grad forwards of those rollouts (current and initial weights) per measurement, and a
frozen copy of the starting weights in memory (none with PEFT: the adapters are switched off).
"""

from __future__ import annotations

import copy
import sys

import torch

from d3s.integrations.trl.compat import is_peft_model, use_adapter
from d3s.integrations.trl.rows import loss_mask
from d3s.loss import k3_kl


class KLMonitor:
    """Owns the frozen initial weights; `measure` returns the KL of a batch's first rows."""

    def __init__(self, every: int, rollouts: int):
        self.every = every
        self.rollouts = rollouts
        self.initial_model = None

    def active(self, beta: float) -> bool:
        return beta == 0.0 and self.every > 0 and self.rollouts > 0

    def due(self, beta: float, generation_index: int) -> bool:
        """Whether the generation batch `generation_index` is measured."""
        return self.active(beta) and generation_index % self.every == 0

    def keep_initial_weights(self, trainer) -> None:
        """Copy the starting weights, once (before a checkpoint is loaded, so a resumed run keeps them too).

        Under DeepSpeed/FSDP the copy would not be sharded: the metric is off there unless the user asked
        for it (then refused); one line says so.
        """
        if trainer.beta != 0.0 or self.initial_model is not None:
            return
        sharded = trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled
        if sharded and getattr(trainer.args, "_d3s_kl_default", False):
            self.every = 0
            if trainer.accelerator.is_main_process:
                print("d3s: the KL metric at beta=0 is off under DeepSpeed/FSDP (kl_log_every=0): the frozen "
                      "copy of the initial weights it needs is not sharded", file=sys.stderr, flush=True)
            return
        if not self.active(trainer.beta):
            return
        model = trainer.accelerator.unwrap_model(trainer.model)
        if is_peft_model(model):
            return  # the initial policy is the model with its adapters switched off
        if sharded:
            raise ValueError(
                f"kl_log_every={self.every} at beta=0 keeps a frozen copy of the model, which is not supported under "
                "DeepSpeed/FSDP; set kl_log_every=0 (the default there), or beta > 0 (the KL to the reference is "
                "then logged)"
            )
        self.initial_model = copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def measure(self, trainer, batch: dict, no_grad_logps) -> float:
        """k3 KL(current || initial), token mean over the valid tokens of the first rows, all processes.

        `no_grad_logps(model, rows, mask)` gives the `(n, T)` log-probs of `rows` under `model`.
        """
        n = self.rollouts
        rows = {key: batch[key][:n] for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
        if batch.get("tool_mask") is not None:
            rows["tool_mask"] = batch["tool_mask"][:n]
        mask = loss_mask(rows)
        current = no_grad_logps(trainer.model, rows, mask)
        model = trainer.accelerator.unwrap_model(trainer.model)
        if is_peft_model(model):
            with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                initial = no_grad_logps(trainer.model, rows, mask)
        else:
            if self.initial_model is None:
                raise RuntimeError("the initial weights were not kept; was the trainer built before train()?")
            initial = no_grad_logps(self.initial_model, rows, mask)
        kl = k3_kl(current * mask, initial * mask) * mask  # (n, T)
        totals = trainer.accelerator.reduce(torch.stack([kl.sum(), mask.sum().float()]), reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()
