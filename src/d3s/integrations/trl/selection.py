"""One generation batch through D3S's selection (docs/method.md sections 2-3; the paper's order: select first).

Rewards -> advantages -> rollouts kept -> every per-rollout pass for the kept ones -> token mask, for
`D3SGRPOTrainer._d3s_select`, which takes the trainer for its settings, accelerator and metrics. Sample selection
runs on the advantages of ALL processes, so every rank computes the same kept set; the kept rows are dealt out
again evenly (`d3s.batch.deal_rows`, `rows`), and the loss's global counts travel with the batch.
"""

from __future__ import annotations

import torch

from d3s.advantages import weighted_rewards, zero_where_flat
from d3s.batch import deal_rows
from d3s.integrations.trl import step_metrics
from d3s.integrations.trl.rows import DEFERRED_KEYS, loss_mask, take_rows
from d3s.rollout_selection import select_rollouts, selection_generator


def select(trainer, batch: dict, generation_entropies: torch.Tensor | None) -> dict:
    """The batch the trainer trains on: the kept rows of this rank, their advantages, the passes TRL deferred,
    the token mask (`d3s_token_mask`) and the loss's global counts (`d3s_num_rows`, `d3s_num_tokens`).

    With nothing down-sampled, TRL's batch is returned unchanged and only the metrics are logged. Sets
    `trainer.d3s_last_selection` (what was kept, for metrics and tests).
    """
    settings = trainer.args.d3s_settings
    device = trainer.accelerator.device
    G, P, rank = trainer.num_generations, trainer.accelerator.num_processes, trainer.accelerator.process_index
    metrics = trainer._metrics["train"]
    progress = trainer.d3s_progress()
    n_keep, fraction = settings.schedule_at(progress)

    rewards = weighted_rewards(trainer._d3s_rewards_per_func, trainer.reward_weights)  # (B*G,)
    trl_advantages = trainer.accelerator.gather(batch["advantages"])  # (B*G,)
    advantages = trl_advantages
    if trainer.multi_objective_aggregation == "sum_then_normalize":
        advantages = zero_where_flat(trl_advantages, rewards, G, scale_rewards=trainer.scale_rewards)  # (B*G,)
    mask = loss_mask(batch)  # (S_local, T)
    valid_per_row = trainer.accelerator.gather(mask.sum(dim=1))  # (B*G,) loss tokens per rollout
    step_metrics.log_generated_entropy(trainer.accelerator, metrics, generation_entropies, mask, trainer.d3s_active)
    trainer._d3s_monitor_kl(batch)
    if not trainer.d3s_active:  # TRL's batch unchanged
        trainer.d3s_last_selection = step_metrics.log_unchanged_batch(
            metrics, progress, G, rewards, advantages, trl_advantages, valid_per_row
        )
        return batch

    S_local = batch["advantages"].size(0)
    batch["advantages"] = advantages[rank * S_local : (rank + 1) * S_local]
    if settings.sample_selection == "none":
        kept = torch.arange(advantages.numel(), device=device)  # (K,)
        kept_advantages = advantages
    else:
        generator = None
        if settings.sample_selection.startswith("random"):  # the controls: seeded per generation batch
            generator = selection_generator(trainer.args.seed, trainer.d3s_generation_index())
        selection = select_rollouts(
            advantages, rewards, G, n_keep, settings.sample_selection, scale_rewards=trainer.scale_rewards,
            generator=generator,
        )
        kept, kept_advantages = selection.indices, selection.advantages  # (K,), (K,)
    kept_mask = torch.zeros_like(advantages, dtype=torch.bool)
    kept_mask[kept] = True
    trained_advantages = torch.zeros_like(advantages)  # (B*G,)
    trained_advantages[kept] = kept_advantages
    if generation_entropies is not None:
        batch["d3s_entropies"] = generation_entropies  # (S_local, T), travels with its rows
    for key in DEFERRED_KEYS:
        batch.pop(key, None)  # placeholders of the deferred passes; recomputed below for the kept rows
    slots = deal_rows(kept, P, trainer.args.steps_per_generation)  # (P, R)
    batch = take_rows(
        batch, slots[rank], trained_advantages, accelerator=trainer.accelerator,
        pad_token_id=trainer.processing_class.pad_token_id, cut_columns=trainer.pad_to_multiple_of is None,
    )
    mask = loss_mask(batch)  # (R, T')

    passes = trainer._d3s_kept_row_passes(batch, mask, need_entropy=settings.token_selection)
    n_valid = int(valid_per_row[kept].sum())  # loss tokens of the kept rollouts, all ranks
    n_rows, n_tokens = kept.numel(), n_valid
    entropy_source = n_nonfinite = all_token_mask = None
    balance = step_metrics.whole_rollout_balance(trained_advantages, valid_per_row)
    if settings.token_selection:
        entropies = batch.pop("d3s_entropies", None)
        entropy_source = "generation"
        if entropies is None:
            entropies, entropy_source = passes["entropies"], passes["entropy_source"]
        token_mask, all_token_mask, n_nonfinite, balance = trainer._d3s_token_mask(
            batch["advantages"], entropies, mask, fraction
        )
        batch["d3s_token_mask"] = token_mask  # (R, T')
        n_tokens = int(all_token_mask.sum())
        if settings.normalizer == "selected":
            n_rows = int(all_token_mask.any(dim=1).sum())
    batch.pop("d3s_entropies", None)

    # Global counts shared by every micro-batch (0-dim tensors survive TRL's shuffle and split)
    denominator_tokens = n_tokens if settings.normalizer == "selected" else n_valid
    batch["d3s_num_rows"] = torch.tensor(float(n_rows), device=device)
    batch["d3s_num_tokens"] = torch.tensor(float(denominator_tokens), device=device)
    batch["num_items_in_batch"] = torch.tensor(float(n_valid), device=device)

    step_metrics.log_selection(
        metrics, progress=progress, n_keep=n_keep, fraction=fraction, num_generations=G, rewards=rewards,
        trained_advantages=trained_advantages, kept_mask=kept_mask, kept_advantages=kept_advantages,
        valid_per_row=valid_per_row, tokens_in_loss=n_tokens, padding_rows=slots.numel() - kept.numel(),
        nonfinite_scores=n_nonfinite, balance=balance,
    )
    clipped = metrics.get("completions/clipped_ratio") or [None]  # TRL's, of this generation batch (all ranks)
    trainer._d3s_diagnosis.update(
        n_tokens / max(kept.numel(), 1), balance[1], settings.token_selection, trainer.accelerator.is_main_process,
        clipped=clipped[-1],
    )
    trainer.d3s_last_selection = {
        "kept": kept.cpu(), "n_keep": n_keep, "fraction": fraction, "tokens_in_loss": n_tokens,
        "rows_per_rank": batch["completion_mask"].size(0), "entropy_source": entropy_source,
        "kept_per_rank_before": torch.bincount(torch.div(kept, S_local, rounding_mode="floor"), minlength=P).cpu(),
        **({"token_mask": all_token_mask.cpu()} if settings.token_selection else {}),
    }
    return batch
