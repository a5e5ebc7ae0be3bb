"""The TRL this glue runs on: the supported versions, every private name of TRL it touches, and the shims
that let one glue run on each supported TRL.

`TRL_VERSION_RANGE` and `TRANSFORMERS_VERSION_RANGE` are the versions measured to work (docs/compatibility.md;
pyproject.toml's `trl` extra states the same ranges, a test checks it). `PRIVATE_TRL_API` lists each private (or
undocumented) method, attribute, module-level name and metric of TRL that the glue overrides, calls, reads or
rewrites, with what each supported TRL version has there; `trl_signature_mismatches()` checks it against the
installed TRL.

Importing this module stops with one line (an ImportError) when the installed TRL or transformers is outside
the ranges or any pinned name does not match: a TRL release that renames or re-signs one of them would
otherwise train silently wrong. `D3S_ALLOW_UNSUPPORTED_TRL=1` imports anyway, with one warning per mismatch.

The shims, each for the versions named:
- `log_prob_kernel`: TRL's chunked log-prob kernel (`trl.kernels.ChunkedLogProbFunction`, TRL >= 1.15) where it
  imports, else `TorchLogProbFunction`, the same values in plain torch (TRL <= 1.14 has no such kernel, and
  TRL 1.15's `trl.kernels` needs Triton, which CPU builds of torch lack);
- `eos_token_ids`: the ids that end a completion (`GRPOTrainer.eos_token_ids` from TRL 1.14 on; before, the
  tokenizer's eos alone, as TRL then cut completions);
- `unwrap_for_generation`: `unwrap_model_for_generation` called as the installed TRL calls it in
  `_generate_single_turn` (its `gradient_checkpointing_kwargs` exists from TRL 1.16 on).
Elsewhere: `D3SGRPOTrainer._generate_single_turn` takes TRL's arguments before and after TRL 1.14 added
`num_generations`, and `rewards` checks async reward functions the way each TRL awaits them.
TRL's own imports live here too, so the rest of the package imports TRL from one place.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import inspect
import os
import warnings

import torch
from packaging.version import Version

from d3s.integrations.private_api import ATTRIBUTE, NAME, mismatches

__all__ = [
    "ALLOW_UNSUPPORTED",
    "GRPOConfig",
    "GRPOTrainer",
    "PRIVATE_TRL_API",
    "PRIVATE_TRL_API_REASONS",
    "REPLACED_TRL_METRICS",
    "TRANSFORMERS_VERSION_RANGE",
    "TRL_VERSION_RANGE",
    "TorchLogProbFunction",
    "disable_gradient_checkpointing",
    "eos_token_ids",
    "is_peft_model",
    "log_prob_kernel",
    "maybe_gather_lm_head_ctx",
    "nanmax",
    "nanmin",
    "trl_signature_mismatches",
    "unwrap_for_generation",
    "unwrap_whole",
    "use_adapter",
]

TRL_VERSION_RANGE = (Version("1.12.0"), Version("1.17"))
"""TRL versions this glue is supported on: [1.12.0, 1.17) (docs/compatibility.md has the measurements)."""

TRANSFORMERS_VERSION_RANGE = (Version("5.3.0"), Version("5.26"))
"""transformers versions this glue is supported on: [5.3.0, 5.26)."""

ALLOW_UNSUPPORTED = "D3S_ALLOW_UNSUPPORTED_TRL"
"""Environment variable: "1" imports the glue with a TRL or transformers it does not support (outside the
ranges, or with a pinned private name that does not match), warning once per mismatch instead of stopping."""


def _first_line(err: BaseException) -> str:
    """`Type: message` of the innermost cause of `err` (TRL's lazy modules wrap the real error in a RuntimeError)."""
    while err.__cause__ is not None:
        err = err.__cause__
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _in_range(version: str, bounds: tuple[Version, Version]) -> bool:
    return bounds[0] <= Version(version) < bounds[1]


def _spec(bounds: tuple[Version, Version]) -> str:
    return f">={bounds[0]},<{bounds[1]}"


if importlib.util.find_spec("trl") is None:  # pragma: no cover - exercised only without trl
    raise ImportError('d3s.integrations.trl needs TRL: pip install "d3s[trl]"')


def _supported(trl_version, transformers_version) -> str:
    return (f"d3s.integrations.trl supports trl{_spec(TRL_VERSION_RANGE)} and "
            f"transformers{_spec(TRANSFORMERS_VERSION_RANGE)}, found trl=={trl_version} and "
            f"transformers=={transformers_version}")


TRL_INSTALLED, TRANSFORMERS_INSTALLED = _installed("trl"), _installed("transformers")

try:
    import trl
    from accelerate.utils import is_peft_model
    from trl import GRPOConfig, GRPOTrainer
    from trl.models.utils import disable_gradient_checkpointing, unwrap_model_for_generation
    from trl.trainer import utils as trl_utils
    from trl.trainer.utils import maybe_gather_lm_head_ctx, nanmax, nanmin, use_adapter
except (ImportError, RuntimeError) as err:  # TRL's lazy modules raise RuntimeError around the real error
    raise ImportError(f"{_supported(TRL_INSTALLED, TRANSFORMERS_INSTALLED)}; importing TRL failed: "
                      f"{_first_line(err)}") from err

TRL_VERSION = Version(trl.__version__)

try:  # TRL >= 1.15 where its kernels import (TRL 1.15's need Triton)
    from trl.kernels import ChunkedLogProbFunction
except (ImportError, RuntimeError):
    ChunkedLogProbFunction = None

VOCABULARY_CHUNK = 32768
"""Vocabulary columns per tile of TRL's log-prob kernel: the value TRL's fused head passes (a test compares), so the
selective head's values are TRL's to the bit; another width changes them only by float rounding."""


class TorchLogProbFunction:
    """`ChunkedLogProbFunction.apply` of TRL's kernel in plain torch: the same arguments and outputs, the same
    values up to float rounding (the exactness tests compare them with TRL's own log-probs).

    Used where TRL has no such kernel (TRL 1.14, or TRL 1.15 without Triton). The logits of `TOKEN_CHUNK` tokens
    at a time exist at once, and autograd keeps each chunk's log-softmax for the backward: `N x V` floats
    over a call of N tokens, as TRL 1.14's own forward keeps its full logits.
    """

    TOKEN_CHUNK = 4096
    OUTPUTS = ("log_probs", "entropy")

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size=None, final_logit_softcapping=None,
              logit_scale=1.0, outputs=("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")):
        """`(log_probs (N,), entropy (N,) or None, None, None, None)` of `hidden (N, H) @ weight.T (V, H)`."""
        unknown = set(outputs) - set(TorchLogProbFunction.OUTPUTS)
        if unknown:
            raise NotImplementedError(f"the plain-torch log-prob kernel computes {TorchLogProbFunction.OUTPUTS}, "
                                      f"not {sorted(unknown)}")
        logps, entropies = [], []
        # at least one chunk: with no token the outputs are still connected to the graph (an empty backward works)
        for start in range(0, max(hidden.size(0), 1), TorchLogProbFunction.TOKEN_CHUNK):
            h = hidden[start : start + TorchLogProbFunction.TOKEN_CHUNK]  # (n, H)
            z = torch.nn.functional.linear(h, weight, bias).float() * logit_scale  # (n, V)
            if final_logit_softcapping is not None:
                z = final_logit_softcapping * torch.tanh(z / final_logit_softcapping)
            if temperature != 1.0:
                z = z / temperature
            # as TRL's `selective_log_softmax` and `entropy_from_logits` on float32 logits, the computation of
            # TRL 1.14's own forward: the target's logit minus the row's logsumexp; -sum p log p
            target = z.gather(-1, targets[start : start + h.size(0), None]).squeeze(-1)  # (n,)
            logps.append(target - torch.logsumexp(z, dim=-1))  # (n,)
            if "entropy" in outputs:
                log_p = z.log_softmax(dim=-1)  # (n, V)
                entropies.append(-(log_p.exp() * log_p).sum(dim=-1))  # (n,)
        return torch.cat(logps), (torch.cat(entropies) if "entropy" in outputs else None), None, None, None


LOG_PROB_KERNEL = TorchLogProbFunction if ChunkedLogProbFunction is None else ChunkedLogProbFunction
"""The log-prob kernel of the selective head: TRL's where it imports, else the plain-torch one."""

if getattr(trl_utils, "_ChunkedLogProbFunction", False) is None:
    # TRL 1.15 without Triton: its fused LM head finds no kernel and every GRPOTrainer forward fails; the
    # plain-torch kernel takes its place (TRL 1.16 falls back to torch itself on such a machine)
    trl_utils._ChunkedLogProbFunction = TorchLogProbFunction


def log_prob_kernel(hidden, weight, bias, labels, temperature, final_logit_softcapping, logit_scale, outputs):
    """`(log_probs (N,), entropy (N,) or None)` at the N rows of `hidden` `(N, H)`: `LOG_PROB_KERNEL`."""
    logps, entropy, *_ = LOG_PROB_KERNEL.apply(
        hidden, weight, bias, labels, temperature, VOCABULARY_CHUNK, final_logit_softcapping,
        logit_scale, outputs,
    )
    return logps, entropy


def eos_token_ids(trainer) -> tuple[int, ...]:
    """The token ids that end a completion, as the installed TRL's `_generate_single_turn` cuts them."""
    ids = getattr(trainer, "eos_token_ids", None)  # TRL >= 1.14
    return tuple(ids) if ids is not None else (trainer.processing_class.eos_token_id,)


@functools.lru_cache(maxsize=None)
def _parameters_of(function) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters)


def unwrap_for_generation(trainer):
    """TRL's `unwrap_model_for_generation(...)` context, with the arguments the installed TRL's
    `_generate_single_turn` passes (`gradient_checkpointing_kwargs` from TRL 1.16 on)."""
    kwargs = {"gather_deepspeed3_params": trainer.args.ds3_gather_for_generation,
              "generation_kwargs": trainer.generation_kwargs}
    if "gradient_checkpointing_kwargs" in _parameters_of(unwrap_model_for_generation):
        kwargs["gradient_checkpointing_kwargs"] = trainer.args.gradient_checkpointing_kwargs
    return unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator, **kwargs)


def unwrap_whole(trainer):
    """TRL's `unwrap_model_for_generation` context with every parameter gathered (DeepSpeed ZeRO-3), whatever
    `ds3_gather_for_generation` says: held-out generation needs the whole weights on every process."""
    kwargs = {}
    if "gradient_checkpointing_kwargs" in _parameters_of(unwrap_model_for_generation):  # TRL >= 1.16
        kwargs["gradient_checkpointing_kwargs"] = trainer.args.gradient_checkpointing_kwargs
    return unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator, **kwargs)


_PER_TOKEN_LOGPS = (
    "(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, "
    "compute_aux_loss=False, pixel_values=None, image_grid_thw=None, num_images=None, pixel_attention_mask=None, "
    "spatial_shapes=None, num_tiles=None, image_sizes=None, token_type_ids=None, mm_token_type_ids=None, "
    "image_position_ids=None)"
)

_PRIVATE_TRL_NAMES = {
    # -- overridden by D3SGRPOTrainer
    "GRPOTrainer._calculate_rewards": (
        "(self, inputs, prompts, completions, completion_ids_list)",
        "Overridden to keep the rewards of every rollout per reward function, all processes (TRL gathers them here): "
        "the selection reads them. Not public: the batch TRL returns holds advantages, not rewards, and wrapping the "
        "reward functions would miss the reward models TRL scores itself.",
    ),
    "GRPOTrainer._generate_and_score_completions": (
        "(self, inputs)",
        "Overridden: the algorithm's step, between TRL's scoring and its split into micro-batches, where the kept "
        "rollouts and tokens are chosen. Not public: `rollout_func` runs before the rewards exist, and no public hook "
        "sees the scored batch.",
    ),
    "GRPOTrainer._generate_single_turn": (
        {
            "<1.14": "(self, prompt_ids, images, multimodal_fields, has_tool_images=False)",
            ">=1.14": "(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False)",
        },
        "Overridden with `shared_prefill_generation`: replaces transformers' `generate` in TRL's turn and nothing "
        "else. Not public: `rollout_func` receives the prompts before TRL applies the chat template and tokenizes "
        "them, and would replace that too.",
    ),
    "GRPOTrainer._save_checkpoint": (
        "(self, model, trial)",
        "Overridden to write the prompt history (`prompt_skip`) into each checkpoint folder, as TRL writes its entropy "
        "controller's state. Not public: `on_save` runs after the folder is complete (outside `d3s train`'s atomic "
        "save) and not for the saves `d3s train` makes itself.",
    ),
    "GRPOTrainer._load_optimizer_and_scheduler": (
        "(self, checkpoint)",
        "Overridden to read the prompt history back when a run resumes, as TRL reads its entropy controller's state. "
        "Not public: no callback is given the checkpoint folder a run resumes from.",
    ),
    "GRPOTrainer._get_per_token_logps_and_entropies": (
        {"<1.14": _PER_TOKEN_LOGPS,
         "==1.14.*": "(self, model, *args, batch_size=None, compute_aux_loss=False, **kwargs)",
         ">=1.15": _PER_TOKEN_LOGPS},
        "Replaced on the instance while TRL generates (`generation.DeferredPasses`): TRL calls it as (model, "
        "input_ids, attention_mask, logits_to_keep, ...) for its per-rollout passes, which then return placeholders "
        "and run later for the kept rollouts only. Not public: no setting turns those passes off.",
    ),
    "GRPOTrainer.compute_loss": (
        "(self, model, inputs, return_outputs=False, num_items_in_batch=None)",
        "Public (transformers' Trainer): overridden for the D3S loss; with nothing down-sampled it is TRL's.",
    ),
    "GRPOTrainer.train": (
        "(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None)",
        "Public (transformers' Trainer): overridden to keep the initial weights for the KL metric before a checkpoint "
        "loads (`on_train_begin` runs after).",
    ),
    "GRPOTrainer.create_optimizer": (
        "(self, model=None)",
        "Public (transformers' Trainer): overridden to wrap the optimizer's step (`optimizer_steps`).",
    ),
    # -- relied on, called
    "GRPOTrainer._prepare_inputs": (
        "(self, generation_batch)",
        "Relied on, not overridden: it shuffles the generation batch and splits it into `steps_per_generation` "
        "micro-batches, and the counts the glue shares between them (0-dim tensors) travel through it. No public "
        "equivalent.",
    ),
    "GRPOTrainer.get_off_policy_mask": (
        "(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold)",
        "Called: TRL's off-policy mask, so the D3S loss masks as TRL does. An undocumented static method.",
    ),
    "GRPOTrainer._get_output_dir": (
        "(self, trial)",
        "Called: the folder transformers writes a checkpoint to (a hyperparameter search changes it), where the prompt "
        "history goes. No public equivalent.",
    ),
    # -- attributes read
    "GRPOTrainer._step": (
        ATTRIBUTE,
        "Read: TRL's micro-batch counter gives the index of the generation batch, the schedule's clock. "
        "`state.global_step` counts optimizer steps only.",
    ),
    "GRPOTrainer._metrics": (
        ATTRIBUTE,
        "Written: TRL's metric store, so the d3s/* metrics are averaged and logged with TRL's. `Trainer.log` would log "
        "each value at its own step, apart from TRL's.",
    ),
    "GRPOTrainer.aux_loss_enabled": (
        ATTRIBUTE,
        "Read: whether a mixture-of-experts router loss trains, as TRL decided. Undocumented; recomputing it would "
        "copy TRL's rule.",
    ),
    "GRPOTrainer.current_gradient_accumulation_steps": (
        ATTRIBUTE,
        "Read: transformers' accumulation count of the current step (smaller at an epoch's end), which divides the "
        "loss as in TRL. Undocumented.",
    ),
    "GRPOTrainer._dist": (
        ATTRIBUTE,
        "Read by the shared-prefill path: FSDP's `summon_full_params` around generation, as TRL's "
        "`_generate_single_turn` calls it. No public equivalent.",
    ),
    "GRPOTrainer.generation_config": (
        ATTRIBUTE,
        "Read by the shared-prefill path: TRL's generation settings, honoured as `generate` honours them. "
        "Undocumented.",
    ),
    "GRPOTrainer.generation_kwargs": (
        ATTRIBUTE,
        "Read by the shared-prefill path: passed to `unwrap_model_for_generation` as TRL passes them. Undocumented.",
    ),
    "GRPOTrainer.eos_token_ids": (
        {">=1.14": ATTRIBUTE},
        "Read by the shared-prefill path: the ids that end a completion, as TRL cuts completions (before TRL 1.14, "
        "the tokenizer's eos: `eos_token_ids`). Undocumented.",
    ),
    # -- module-level names
    "trl.trainer.utils.maybe_gather_lm_head_ctx": (
        "(*params)",
        "Called: gathers the LM head under DeepSpeed ZeRO-3 around the selective head, as TRL's fused head does. "
        "Not in TRL's documented API; kept so both heads gather alike.",
    ),
    "trl.trainer.utils.use_adapter": (
        "(model, adapter_name)",
        "Called: switches a PEFT model to its reference (no adapter, or the 'ref' adapter) as TRL chooses the "
        "reference. Not in TRL's documented API.",
    ),
    "trl.models.utils.disable_gradient_checkpointing": (
        "(model, gradient_checkpointing_kwargs=None)",
        "Called: the no-grad passes run without gradient checkpointing, as TRL's. Not in TRL's documented API.",
    ),
    "trl.trainer.utils._ChunkedLogProbFunction": (
        {"==1.15.*": NAME},
        "Set where TRL 1.15 left it None (no Triton): its own GRPOTrainer then cannot compute log-probs at all; the "
        "plain-torch kernel takes its place. A fix of TRL 1.15 on such machines, not replaceable.",
    ),
    "trl.trainer.utils.add_fused_lm_head": (
        {">=1.15": "(model, temperature=1.0, cast_lm_head_to_fp32=False, outputs=('log_probs',))"},
        "Not called: `selective_head.head_scales` copies how it reads a model's logit scale and softcap, and a test "
        "compares both heads.",
    ),
    "GRPOTrainer.pad_to_multiple_of": (
        ATTRIBUTE,
        "Read by `generation.turn_positions`: the width TRL pads a prompt batch to before `generate`, so the positions "
        "counted are the ones computed. Undocumented.",
    ),
    "GRPOTrainer.use_transformers_continuous_batching": (
        ATTRIBUTE,
        "Read by `generation.turn_positions`: with transformers' continuous batching, generation is counted from the "
        "ids it returns, not from a padded batch. Undocumented.",
    ),
    "GRPOTrainer.rollout_func": (
        ATTRIBUTE,
        "Replaced on the instance by a wrapper that counts what a custom generation returns "
        "(`generation.counted_rollout_func`); the user's function runs unchanged. Undocumented as an attribute.",
    ),
}

PRIVATE_TRL_API = {name: expected for name, (expected, _) in _PRIVATE_TRL_NAMES.items()}
"""Every private or undocumented TRL name the glue relies on (and the public methods it overrides): "Owner.name" ->
the parameters of a method (defaults kept), `ATTRIBUTE` (set on the trainer by TRL) or `NAME` (a module-level
name); or a dict from TRL version specifiers to those, where the supported versions differ (a version no
specifier matches does not rely on the name)."""

PRIVATE_TRL_API_REASONS = {name: why for name, (_, why) in _PRIVATE_TRL_NAMES.items()}
"""For each entry of `PRIVATE_TRL_API`: how the glue uses it, and why no public API does instead (docs/trl.md
shows them as a table)."""

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
    out = mismatches(PRIVATE_TRL_API, {"GRPOTrainer": GRPOTrainer}, version=TRL_VERSION)
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for metric in REPLACED_TRL_METRICS:
        if f'"{metric}"' not in source:
            out[f"metric {metric}"] = ("logged by GRPOTrainer._generate_and_score_completions", "<not found>")
    return out


def unsupported(trl_version: str, transformers_version: str, found: dict[str, tuple[str, str]]) -> list[str]:
    """What stops the import: the versions outside the ranges, then each mismatched private name (one line each)."""
    out = []
    if not _in_range(trl_version, TRL_VERSION_RANGE):
        out.append(f"trl=={trl_version} is outside trl{_spec(TRL_VERSION_RANGE)}")
    if not _in_range(transformers_version, TRANSFORMERS_VERSION_RANGE):
        out.append(f"transformers=={transformers_version} is outside transformers{_spec(TRANSFORMERS_VERSION_RANGE)}")
    out += [f"{name}: expected {expected}, found {got}" for name, (expected, got) in found.items()]
    return out


def check_supported(trl_version: str, transformers_version: str, found: dict[str, tuple[str, str]],
                    allow: bool) -> None:
    """Raise one ImportError line naming the installed and supported versions and the first mismatched names
    (or, with `allow`, warn once per problem)."""
    problems = unsupported(trl_version, transformers_version, found)
    if not problems:
        return
    if allow:
        for problem in problems:
            warnings.warn(f"d3s.integrations.trl ({ALLOW_UNSUPPORTED}=1): {problem}", stacklevel=3)
        return
    names = ", ".join(found) if len(found) <= 3 else ", ".join(list(found)[:3]) + f" and {len(found) - 3} more"
    mismatched = f"; private TRL names that do not match: {names}" if found else ""
    raise ImportError(f"{_supported(trl_version, transformers_version)}{mismatched}. Install a supported version "
                      f"(pip install \"d3s[trl]\"), or set {ALLOW_UNSUPPORTED}=1 to try this one anyway "
                      "(docs/compatibility.md)")


check_supported(TRL_INSTALLED or trl.__version__, TRANSFORMERS_INSTALLED or "0", trl_signature_mismatches(),
                allow=os.environ.get(ALLOW_UNSUPPORTED, "") == "1")
