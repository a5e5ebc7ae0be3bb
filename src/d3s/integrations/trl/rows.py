"""The rows of TRL's generation batch: which per-rollout tensors follow a selection, and how they move.

Sample selection keeps some rollouts of the whole generation batch (all processes) and deals them out
again (`d3s.batch.deal_rows`); every per-row tensor of TRL's batch must follow, gathered over processes
with its second axis padded the way TRL pads it. Anything else per-row (images, ...) is refused rather
than silently dropped.
"""

from __future__ import annotations

import torch

from d3s.batch import last_used_column

ROW_KEYS = {
    "prompt_ids": (None, True),
    "prompt_mask": (0, True),
    "completion_ids": (None, False),
    "completion_mask": (0, False),
    "advantages": (0.0, False),
    "old_per_token_logps": (0.0, False),
    "ref_per_token_logps": (0.0, False),
    "sampling_per_token_logps": (0.0, False),
    "importance_sampling_ratio": (0.0, False),
    "tool_mask": (0, False),
    "d3s_entropies": (0.0, False),  # entropies read from generation, when available
}
"""Per-row keys of the batch -> (padding value of the second axis, pad on the left); None = the pad token."""

COMPLETION_AXIS_KEYS = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
    "tool_mask",
    "d3s_entropies",
)
"""Keys whose second axis is the completion's: cut together when no kept row uses the last columns."""

DEFERRED_KEYS = ("old_per_token_logps", "ref_per_token_logps", "importance_sampling_ratio")
"""Keys TRL fills from its per-rollout passes; deferred, they hold placeholders until the kept rows' passes."""


def loss_mask(batch: dict) -> torch.Tensor:
    """`(S, T)` the tokens a loss may use: the completion mask, less tool output when there is some."""
    mask = batch["completion_mask"]
    return mask if batch.get("tool_mask") is None else mask * batch["tool_mask"]


def check_row_keys(batch: dict) -> None:
    """Refuse a batch with a per-row key that selection would not carry (multimodal inputs)."""
    unknown = sorted(k for k, v in batch.items() if v is not None and k not in (*ROW_KEYS, "num_items_in_batch"))
    if unknown:
        raise NotImplementedError(
            f"D3SGRPOTrainer cannot carry the batch keys {unknown} (multimodal inputs are not supported yet); "
            "use trl.GRPOTrainer for this model"
        )


def gather_rows(accelerator, tensor: torch.Tensor, pad_value, pad_first: bool) -> torch.Tensor:
    """Every process's rows, in process order; the second axis padded to a common width first."""
    if accelerator.num_processes == 1:
        return tensor
    if tensor.dim() > 1:
        tensor = accelerator.pad_across_processes(tensor, dim=1, pad_index=pad_value, pad_first=pad_first)
    return accelerator.gather(tensor)


def take_rows(
    batch: dict,
    rows_global: torch.Tensor,
    trained_advantages: torch.Tensor,
    *,
    accelerator,
    pad_token_id: int,
    cut_columns: bool,
) -> dict:
    """This process's share of the kept rows.

    Args:
        batch: TRL's generation batch of this process.
        rows_global: `(R,)` global row indices (all processes), -1 for a padding row.
        trained_advantages: `(B*G,)` the advantage each rollout trains with (0 where not kept).
        cut_columns: drop completion columns that no kept row uses (right padding: no effect on any
            real token); False when TRL pads to a fixed multiple.

    Returns:
        The batch of the kept rows, `d3s_real` `(R,)` marking the real ones; a padding row has no loss token.
    """
    real = rows_global >= 0  # (R,)
    rows = rows_global.clamp(min=0)  # (R,)
    out = {}
    for key, (pad_value, pad_first) in ROW_KEYS.items():
        if batch.get(key) is None:
            continue
        if key == "advantages":
            out[key] = trained_advantages[rows] * real  # (R,)
            continue
        pad_value = pad_token_id if pad_value is None else pad_value
        out[key] = gather_rows(accelerator, batch[key], pad_value, pad_first)[rows]  # (R, ...)
    out["completion_mask"] = out["completion_mask"] * real.unsqueeze(1)  # padding rows: no loss token
    if cut_columns:
        width = max(last_used_column(out["completion_mask"]), 1)
        for key in COMPLETION_AXIS_KEYS:
            if key in out and out[key].dim() > 1 and out[key].size(1) > width:
                out[key] = out[key][:, :width]
    out["d3s_real"] = real
    return out


def _pad_width(tensor: torch.Tensor, width: int, pad_value, pad_first: bool) -> torch.Tensor:
    """`tensor` `(S, W, ...)` padded along its second axis to `width` (on the left with `pad_first`)."""
    if tensor.dim() < 2 or tensor.size(1) >= width:
        return tensor
    pad = tensor.new_full((tensor.size(0), width - tensor.size(1), *tensor.shape[2:]), pad_value)
    return torch.cat([pad, tensor] if pad_first else [tensor, pad], dim=1)


def merge_generations(batches: list[dict], rows_global: torch.Tensor, *, accelerator, pad_token_id: int,
                      cut_columns: bool) -> dict:
    """This process's share of rows taken from several generation batches of the same size.

    Args:
        batches: TRL's generation batches of this process, each of S rows per process (P*S global rows).
        rows_global: `(P*S,)` indices into the global rows of all batches one after the other
            (batch k's global row i is `k*P*S + i`), in the order the merged batch holds them.

    Returns:
        A batch of S rows per process with every per-row key of `ROW_KEYS` and `num_items_in_batch`
        counted again (loss tokens of all processes). With `cut_columns` (False when TRL pads to a fixed
        multiple) the prompt columns that are padding in every row of every process and the completion
        columns after the last one any row uses are removed, so the rows are padded as if generated together.
    """
    S = batches[0]["completion_ids"].size(0)
    rank = accelerator.process_index
    mine = rows_global[rank * S : (rank + 1) * S]  # (S,)
    out = {}
    for key, (pad_value, pad_first) in ROW_KEYS.items():
        present = [b.get(key) is not None for b in batches]
        if not any(present):
            continue
        if not all(present):
            raise ValueError(f"{key} is in some generation rounds and not in others")
        pad_value = pad_token_id if pad_value is None else pad_value
        parts = [gather_rows(accelerator, b[key], pad_value, pad_first) for b in batches]  # (P*S, W_k, ...)
        width = max(p.size(1) for p in parts) if parts[0].dim() > 1 else 0
        out[key] = torch.cat([_pad_width(p, width, pad_value, pad_first) for p in parts])[mine]  # (S, W, ...)
    out["num_items_in_batch"] = accelerator.gather(loss_mask(out).sum().reshape(1)).sum()
    if not cut_columns:
        return out
    # columns no row needs: left padding of every prompt, completion columns after the last used one
    used_prompt = accelerator.gather(out["prompt_mask"].any(dim=0).long().unsqueeze(0)).any(dim=0)  # (W_p,)
    start = int(used_prompt.nonzero()[0]) if used_prompt.any() else 0
    out["prompt_ids"], out["prompt_mask"] = out["prompt_ids"][:, start:], out["prompt_mask"][:, start:]
    ends = accelerator.gather(torch.tensor([max(last_used_column(out["completion_mask"]), 1)],
                                           device=out["completion_mask"].device))
    width = int(ends.max())
    for key in COMPLETION_AXIS_KEYS:
        if key in out and out[key].dim() > 1 and out[key].size(1) > width:
            out[key] = out[key][:, :width]
    return out
