"""The TRL this glue was written against: the verified version range, and every private name of TRL it touches.

`PRIVATE_TRL_API` lists each private (or undocumented) method, attribute, module-level name and
metric of TRL that the glue overrides, calls, reads or rewrites; `trl_signature_mismatches()` checks
it against the installed TRL (a test runs it), so a TRL release that renames or re-signs one of them
fails a test instead of training silently wrong. TRL's own imports live here too, so the rest of the
package imports TRL from one place.
"""

from __future__ import annotations

import inspect
import warnings

try:
    import trl
    from accelerate.utils import is_peft_model
    from trl import GRPOConfig, GRPOTrainer
    from trl.kernels import ChunkedLogProbFunction
    from trl.models.utils import disable_gradient_checkpointing, unwrap_model_for_generation
    from trl.trainer import utils as trl_utils
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE, maybe_gather_lm_head_ctx, nanmax, nanmin, use_adapter
except ImportError as err:  # pragma: no cover - exercised only without trl
    raise ImportError('d3s.integrations.trl needs TRL: pip install "d3s[trl]"') from err

from packaging.version import Version

from d3s.integrations.private_api import ATTRIBUTE, NAME, mismatches

__all__ = [
    "ChunkedLogProbFunction",
    "GRPOConfig",
    "GRPOTrainer",
    "PRIVATE_TRL_API",
    "REPLACED_TRL_METRICS",
    "TRL_VERSION_RANGE",
    "_CHUNKED_LOGPROB_CHUNK_SIZE",
    "disable_gradient_checkpointing",
    "is_peft_model",
    "maybe_gather_lm_head_ctx",
    "nanmax",
    "nanmin",
    "trl_signature_mismatches",
    "unwrap_model_for_generation",
    "use_adapter",
]

TRL_VERSION_RANGE = (Version("1.16.0"), Version("1.17"))
"""TRL versions this glue was verified against: [1.16.0, 1.17)."""

PRIVATE_TRL_API = {
    # overridden by D3SGRPOTrainer
    "GRPOTrainer._calculate_rewards": "(self, inputs, prompts, completions, completion_ids_list)",
    "GRPOTrainer._generate_and_score_completions": "(self, inputs)",
    "GRPOTrainer._compute_loss": "(self, model, inputs)",
    "GRPOTrainer.training_step": "(self, model, inputs, num_items_in_batch)",
    "GRPOTrainer.train": "(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None)",
    "GRPOTrainer.create_optimizer": "(self, model=None)",  # public Trainer API: wraps the step (optimizer_steps)
    # overridden with `shared_prefill_generation` (generation.shared_prefill_turn)
    "GRPOTrainer._generate_single_turn": (
        "(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False)"
    ),
    # overridden to keep the prompt history (prompt_skip) in checkpoints, as TRL keeps its entropy controller's
    "GRPOTrainer._save_checkpoint": "(self, model, trial)",
    "GRPOTrainer._load_optimizer_and_scheduler": "(self, checkpoint)",
    # replaced on the instance while TRL generates (generation.DeferredPasses, generation.CountedPasses)
    "GRPOTrainer._get_per_token_logps_and_entropies": (
        "(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, "
        "compute_aux_loss=False, pixel_values=None, image_grid_thw=None, num_images=None, "
        "pixel_attention_mask=None, spatial_shapes=None, num_tiles=None, image_sizes=None, token_type_ids=None, "
        "mm_token_type_ids=None, image_position_ids=None)"
    ),
    # relied on: shuffles the generation batch and splits it into `steps_per_generation` micro-batches
    "GRPOTrainer._prepare_inputs": "(self, generation_batch)",
    # called
    "GRPOTrainer.get_off_policy_mask": "(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold)",
    "GRPOTrainer._get_output_dir": "(self, trial)",  # where a checkpoint folder is written
    # attributes read
    "GRPOTrainer._step": ATTRIBUTE,  # micro-batch counter: the generation index and the optimizer step's end
    "GRPOTrainer._metrics": ATTRIBUTE,  # {"train": {name: [values]}}: every metric is appended there
    "GRPOTrainer._tokenizer": ATTRIBUTE,  # its pad token pads gathered prompt/completion ids
    "GRPOTrainer._is_vlm": ATTRIBUTE,  # vision-language models are refused
    "GRPOTrainer.aux_loss_enabled": ATTRIBUTE,
    "GRPOTrainer.current_gradient_accumulation_steps": ATTRIBUTE,
    # read by generation.shared_prefill_turn, as TRL's `_generate_single_turn` reads them
    "GRPOTrainer._dist": ATTRIBUTE,  # `summon_full_params` around generation (FSDP)
    "GRPOTrainer.generation_config": ATTRIBUTE,
    "GRPOTrainer.generation_kwargs": ATTRIBUTE,
    "GRPOTrainer.eos_token_ids": ATTRIBUTE,
    # read by generation.turn_positions (what TRL's own generation computed)
    "GRPOTrainer.pad_to_multiple_of": ATTRIBUTE,
    "GRPOTrainer.use_transformers_continuous_batching": ATTRIBUTE,
    # replaced on the instance by a wrapper that counts what it generates (generation.counted_rollout_func)
    "GRPOTrainer.rollout_func": ATTRIBUTE,
    # module-level names imported
    "trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE": NAME,
    "trl.trainer.utils.maybe_gather_lm_head_ctx": "(*params)",
    "trl.trainer.utils.use_adapter": "(model, adapter_name)",
    "trl.models.utils.disable_gradient_checkpointing": "(model, gradient_checkpointing_kwargs=None)",
    # the logic of `selective_head.head_scales` is a copy of the one inside this function (a test compares them)
    "trl.trainer.utils.add_fused_lm_head": "(model, temperature=1.0, cast_lm_head_to_fp32=False, outputs=('log_probs',))",
}
"""Every private or undocumented TRL name the glue relies on: "Owner.name" -> the parameters of a method
(defaults kept), `ATTRIBUTE` (set on the trainer by TRL) or `NAME` (a module-level name)."""

REPLACED_TRL_METRICS = (
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
)
"""Metrics TRL logs in `_generate_and_score_completions` from its per-rollout passes. With those passes
deferred they would describe placeholders, so the trainer overwrites them with the kept rows' values."""


def trl_signature_mismatches() -> dict[str, tuple[str, str]]:
    """`{name: (expected, found)}` for every entry of `PRIVATE_TRL_API` and `REPLACED_TRL_METRICS` that the
    installed TRL no longer matches (empty when all hold)."""
    out = mismatches(PRIVATE_TRL_API, {"GRPOTrainer": GRPOTrainer})
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for metric in REPLACED_TRL_METRICS:
        if f'"{metric}"' not in source:
            out[f"metric {metric}"] = ("logged by GRPOTrainer._generate_and_score_completions", "<not found>")
    return out


if not TRL_VERSION_RANGE[0] <= Version(trl.__version__) < TRL_VERSION_RANGE[1]:
    warnings.warn(
        f"d3s.integrations.trl was verified with trl>={TRL_VERSION_RANGE[0]},<{TRL_VERSION_RANGE[1]}, found "
        f"trl=={trl.__version__}; it overrides private GRPOTrainer methods, check `trl_signature_mismatches()`",
        stacklevel=2,
    )
