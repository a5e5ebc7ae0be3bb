"""Hooks around TRL's generation: defer its per-rollout passes, and keep generation's own entropies.

Both are context managers entered while TRL's `_generate_and_score_completions` runs.
"""

from __future__ import annotations

import torch

from d3s.entropy import align_step_entropies, token_entropy
from d3s.integrations.trl.compat import is_peft_model


class DeferredPasses:
    """While TRL generates and scores, its per-rollout no-grad passes (old-policy and reference log-probs)
    return placeholders: they run afterwards, for the kept rollouts only (`D3SGRPOTrainer._d3s_kept_row_passes`).

    Replaces TRL's `_get_per_token_logps_and_entropies` on the trainer instance (pinned in
    `compat.PRIVATE_TRL_API`), and restores it on exit.
    """

    def __init__(self, trainer):
        self.trainer = trainer

    def __enter__(self):
        def placeholder(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
            zeros = torch.zeros(input_ids.size(0), logits_to_keep, device=input_ids.device)
            return zeros, None, None

        self.trainer._get_per_token_logps_and_entropies = placeholder  # shadows the method on this instance
        return self

    def __exit__(self, *exc):
        del self.trainer._get_per_token_logps_and_entropies
        return False


class GenerationEntropy:
    """Records the policy entropy of every generated token from the logits that transformers' `generate`
    computes anyway: a forward hook on the model, one `(rows,)` entropy per decoding step.

    These are the rollout policy's entropies, i.e. the current policy's at the first update on the
    batch (generation uses the weights of that update). Unavailable (None) under vLLM, a custom
    `rollout_func` or tool calling, where no such logits pass through the model.
    """

    def __init__(self, model, temperature: float):
        self.model = model.get_base_model() if is_peft_model(model) else model
        self.temperature = temperature
        self.steps: list[torch.Tensor] = []
        self.handle = None

    def __enter__(self):
        def hook(module, args, output):
            logits = getattr(output, "logits", None)
            if logits is None or logits.dim() != 3 or torch.is_grad_enabled():
                return
            z = logits[:, -1].float() / self.temperature  # (rows, V)
            self.steps.append(token_entropy(z))  # (rows,)

        self.handle = self.model.register_forward_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()
        return False

    def entropies(self, completion_mask: torch.Tensor, width: int) -> torch.Tensor | None:
        """`(S, width)` entropies aligned with the completion tokens, or None if generation gave none."""
        return align_step_entropies(self.steps, completion_mask, width)
