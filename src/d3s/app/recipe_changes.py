"""Which recipe changes may continue a run: two `run_config.json` contents compared field by field.

A resume (`d3s.app.resume`) and a comparison that reuses a finished run (`d3s.app.compare.command`) refuse a
recipe whose changes alter training; a change to where and how often things are logged, saved, shown or
evaluated is free. A field added after runs were recorded is compared against the value those runs trained with
(`ADDED_FIELDS`), so committed runs stay reusable.
"""

from __future__ import annotations

import json
from typing import Any

# Fields that do not change what is trained: where and how often things are logged, saved, shown or
# evaluated on the held-out set. Everything else must match the run being resumed.
FREE_RUN_FIELDS = frozenset({"resume", "plots", "eval_every", "eval_batch_size", "budget_eval_shares"})
FREE_TRAINER_FIELDS = frozenset({
    "output_dir", "logging_dir", "logging_steps", "logging_strategy", "logging_first_step", "logging_nan_inf_filter",
    "log_level", "log_level_replica", "log_on_each_node", "log_completions", "num_completions_to_print",
    "wandb_log_unique_prompts", "log_unique_prompts", "report_to", "run_name", "project", "trackio_space_id",
    "disable_tqdm", "save_steps", "save_strategy", "save_total_limit", "save_on_each_node", "save_safetensors",
    "push_to_hub", "hub_model_id", "hub_strategy", "hub_token", "hub_private_repo", "hub_always_push",
    "hub_revision", "resume_from_checkpoint", "overwrite_output_dir", "dataloader_num_workers",
    "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
    "eval_strategy", "eval_steps", "eval_delay", "per_device_eval_batch_size", "eval_accumulation_steps",
    "eval_on_start", "skip_memory_metrics", "include_num_input_tokens_seen", "include_tokens_per_second",
    "batch_eval_metrics", "bf16_full_eval", "fp16_full_eval", "do_eval", "eval_do_concat_batches",
    "eval_use_gather_object", "num_generations_eval", "log_completions_hub_repo", "log_multimodal",
})


# How a run was started, not what it trains: never reported as a change.
# `bf16`/`fp16` are requests; `mixed_precision` records what the trainer ran (before it was recorded, `bf16`
# was set too late to take effect, so a record's `bf16: true` may have trained in fp32)
_IGNORED_FIELDS = frozenset({"resume", "resume_from_checkpoint", "bf16", "fp16"})

# Fields added after runs were recorded: a record without one trained as with this value (so committed runs stay
# reusable).
ADDED_FIELDS = {
    "prompt_skip": False, "prompt_skip_explore": 0.5, "prompt_skip_history": 8,
    "dynamic_sampling": False, "dynamic_sampling_max_rounds": 3, "task_train_size": 0,
    "token_cut": "batch", "min_tokens_per_rollout": 0, "schedule_clock": "steps",
    "keep_last_in_loss": False, "shared_prefill_generation": False, "compute_budget": 0.0,
    # Recorded since precision took effect: before, `bf16` was set after the trainer settings were built, so a
    # run without a launcher's --mixed_precision trained in fp32 whatever its recorded `bf16` said
    "mixed_precision": "no",
}


def _normal(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _has_token_cut(trainer: dict) -> bool:
    return bool(trainer.get("token_selection"))


# Fields that change nothing where the run has no token cut (`token_selection` off) or no linear schedule: a
# recipe may set them for every variant it runs (`d3s compare`), and a difference in them is free there.
_INERT_UNLESS = {
    "token_cut": _has_token_cut,
    "min_tokens_per_rollout": _has_token_cut,
    "keep_last_in_loss": _has_token_cut,
    "schedule_clock": lambda trainer: trainer.get("schedule") == "linear",
}


def data_change(saved: dict, now: dict) -> str | None:
    """How the dataset of two `run_config.json` contents differs in content under the same name (their `data`
    records its SHA-256, `d3s.app.math_data.dataset_digest`), or None (the same, or not recorded: a run made before it
    was, a hub dataset)."""
    old, new = saved.get("data") or {}, now.get("data") or {}
    if not (old.get("sha256") and new.get("sha256")) or old["sha256"] == new["sha256"]:
        return None
    if old.get("dataset") != new.get("dataset"):  # another file: the `dataset` field names the change
        return None
    return (f"dataset {new.get('dataset')!r}: its content changed since the run was trained (sha256 "
            f"{old['sha256'][:12]}... -> {new['sha256'][:12]}...)")


def training_changes(saved: dict, now: dict) -> tuple[list[str], list[str]]:
    """Compare two `run_config.json` contents: `(changes that alter training, free changes)`, each as
    `field: old -> new`. Fields missing on one side are compared against None (a field of
    `ADDED_FIELDS`: against the value runs had before it existed). A token-cut option that differs between two
    runs without a token cut (a schedule clock, between two runs without a linear schedule) is a free change.
    A dataset whose content changed under the same name (`data_change`) is a change that alters training."""
    changed, free = [], []
    data = data_change(saved, now)
    if data:
        changed.append(data)
    for section, allowed in (("run", FREE_RUN_FIELDS), ("trainer", FREE_TRAINER_FIELDS)):
        a, b = saved.get(section) or {}, now.get(section) or {}
        for name in sorted(set(a) | set(b)):
            if name.startswith("_") or name in _IGNORED_FIELDS:
                continue
            old, new = _normal(a.get(name, ADDED_FIELDS.get(name))), _normal(b.get(name, ADDED_FIELDS.get(name)))
            if old != new:
                inert = section == "trainer" and name in _INERT_UNLESS and not (
                    _INERT_UNLESS[name](a) or _INERT_UNLESS[name](b))
                (free if name in allowed or inert else changed).append(f"{name}: {old!r} -> {new!r}")
    return changed, free
