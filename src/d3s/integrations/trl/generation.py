"""Around TRL's generation: defer its per-rollout passes (or count them), keep generation's own entropies, the
shared-prefill path (`decoding`) in place of transformers' `generate`, and what each generation computed.

The first three are context managers entered while TRL's `_generate_and_score_completions` runs.
"""

from __future__ import annotations

import torch

from d3s.entropy import align_step_entropies, token_entropy
from d3s.integrations.trl import decoding
from d3s.integrations.trl.compat import eos_token_ids, is_peft_model, unwrap_for_generation
from d3s.integrations.trl.positions import generate_positions, labelled_positions, unpadded_positions


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


class CountedPasses:
    """While TRL generates and scores with nothing down-sampled, its per-rollout no-grad passes (old-policy and
    reference log-probs) run as TRL runs them and are counted (`trainer.d3s_positions`): the body over every
    column of their rows, the LM head at the positions TRL's fused head scores (`positions.labelled_positions`).

    Wraps TRL's `_get_per_token_logps_and_entropies` on the trainer instance (pinned in
    `compat.PRIVATE_TRL_API`), and restores it on exit.
    """

    def __init__(self, trainer):
        self.trainer = trainer

    def __enter__(self):
        original = self.trainer._get_per_token_logps_and_entropies
        counter = self.trainer.d3s_positions

        def counted(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
            counter.add_no_grad(input_ids.numel(), head=labelled_positions(attention_mask, logits_to_keep))
            return original(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)

        self.trainer._get_per_token_logps_and_entropies = counted  # shadows the method on this instance
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
        self.paused = False  # while the shared-prefill path runs: it records the entropies itself

    def __enter__(self):
        def hook(module, args, output):
            if self.paused:
                return
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


def shared_prefill_turn(trainer, prompt_ids: list[list[int]]) -> tuple[list[list[int]], None, dict[str, int]]:
    """TRL's `_generate_single_turn` on the transformers path, through `decoding.generate`: the same
    `(completion_ids, logprobs=None)`, each distinct prompt prefilled once, finished rows leaving the batch, and
    the positions it computed (`decoding.Generation.positions`).

    The model is unwrapped as TRL unwraps it for `generate` (DeepSpeed ZeRO-3 parameters gathered when
    `ds3_gather_for_generation`, FSDP parameters summoned). When the trainer records generation entropies
    (`GenerationEntropy`, training), they come from this path's own logits, laid out as the hook lays them.
    """
    capture = getattr(trainer, "_d3s_capture", None)
    sampling = decoding.sampling_from_generation_config(trainer.generation_config)
    sampling = decoding.Sampling(**{**vars(sampling), "eos_token_ids": eos_token_ids(trainer)})
    with (
        unwrap_for_generation(trainer) as unwrapped_model,
        torch.no_grad(),
        trainer._dist.summon_full_params(trainer.model_wrapped, recurse=False),
    ):
        if capture is not None:
            capture.paused = True
        try:
            out = decoding.generate(unwrapped_model, prompt_ids, sampling,
                                    entropy_temperature=capture.temperature if capture is not None else None)
        finally:
            if capture is not None:
                capture.paused = False
    if capture is not None:
        capture.steps.extend(out.step_entropies)
    return out.completion_ids, None, out.positions


def turn_positions(trainer, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> dict[str, int]:
    """The positions TRL's own `_generate_single_turn` computed for these rows (`positions`): transformers'
    `generate` on the left-padded batch; vLLM and transformers' continuous batching run outside this process's
    model and are counted unpadded."""
    prompt_lengths, completion_lengths = [len(p) for p in prompt_ids], [len(c) for c in completion_ids]
    if trainer.use_vllm or trainer.use_transformers_continuous_batching:
        return unpadded_positions(prompt_lengths, completion_lengths)
    model = trainer.accelerator.unwrap_model(trainer.model)
    return generate_positions(prompt_lengths, completion_lengths, trainer.pad_to_multiple_of,
                              decoding.keeps_last_logits_only(model))


def counted_rollout_func(trainer, rollout_func):
    """TRL's `rollout_func` hook, its generation counted (training only) as `positions.unpadded_positions` of the
    prompt and completion ids it returns: what it computed is not known here."""

    def counted(prompts, trl_trainer):
        output = rollout_func(prompts, trl_trainer)
        if trainer.model.training and isinstance(output, dict):
            prompt_ids, completion_ids = output.get("prompt_ids") or [], output.get("completion_ids") or []
            trainer.d3s_positions.add_generation(**unpadded_positions([len(p) for p in prompt_ids],
                                                                      [len(c) for c in completion_ids]))
        return output

    return counted
