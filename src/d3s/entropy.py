"""Per-token entropy of the policy's full next-token distribution (docs/method.md section 3).

    H = -sum_v p_v log p_v = logsumexp(z) - sum_v softmax(z)_v * z_v

The second form needs one softmax and no log of small probabilities, so it is stable for any
logits. Rows are processed `chunk_size` at a time in float32: the float32 copy of the logits and the
softmax exist for one chunk only, so peak extra memory is O(chunk_size * V), not O(S * T * V) —
about 2 GB saved per 8k tokens at V = 150k.
"""

from __future__ import annotations

import torch

from d3s import _checks


def token_entropy(logits: torch.Tensor, chunk_size: int = 1024, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) at every position.

    Args:
        logits: `(..., V)` unnormalised scores, any float dtype.
        chunk_size: positions processed at once (bounds the float32 working memory).
        temperature: the sampling temperature; the entropy is that of the sampling distribution.

    Returns:
        `(...)` float32 entropies in nats. Differentiable; `.detach()` it for a mask. `-inf` logits
        (a masked vocabulary) are handled; a NaN logit gives a NaN entropy at its position (passed
        on, not hidden: checking would synchronise the device on every call).

    Raises:
        ValueError: naming the argument, for `logits` that are not a float tensor with a non-empty
            last axis, a `chunk_size` that is not an integer >= 1, or a `temperature` that is not a
            finite number > 0.
    """
    _checks.tensor("logits", logits, kind="float")
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must be (..., V) with V >= 1, got shape {tuple(logits.shape)}")
    chunk_size = _checks.as_int("chunk_size", chunk_size, low=1)
    temperature = _checks.as_float("temperature", temperature, low=0.0, low_open=True)
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])  # (P, V)
    out = []
    for chunk in flat.split(chunk_size, dim=0):
        z = chunk.float()  # (c, V)
        if temperature != 1.0:
            z = z / temperature
        logz = torch.logsumexp(z, dim=-1)  # (c,)
        probs = torch.softmax(z, dim=-1)  # (c, V)
        z = z.masked_fill(torch.isneginf(z), 0.0)  # masked vocabulary: p = 0, and 0 * -inf is NaN
        out.append(logz - (probs * z).sum(dim=-1))  # (c,)
    if not out:
        return flat.new_zeros(lead, dtype=torch.float32)
    return torch.cat(out).view(lead)


def align_step_entropies(steps: list[torch.Tensor], completion_mask: torch.Tensor, width: int) -> torch.Tensor | None:
    """Entropies recorded one decoding step at a time, laid out like the completions.

    Args:
        steps: one `(S,)` entropy per decoding step, in order (step t holds every row's entropy of
            its t-th completion token).
        completion_mask: `(S, T)` the completions' mask; a row's length is its sum.
        width: the width of the result (the completions' padded width).

    Returns:
        `(S, width)`: step t in column t, cut or zero-padded to `width`; None when the steps cannot
        be this batch's (no step, a step of another row count, or a completion longer than the steps).
    """
    if not steps or any(s.numel() != completion_mask.size(0) for s in steps):
        return None
    entropies = torch.stack(steps, dim=1).to(completion_mask.device)  # (S, steps)
    lengths = completion_mask.sum(dim=1)  # (S,)
    if lengths.numel() and int(lengths.max()) > entropies.size(1):
        return None
    if entropies.size(1) >= width:
        return entropies[:, :width]
    return torch.nn.functional.pad(entropies, (0, width - entropies.size(1)))  # (S, width)
