"""The token mask of a generation batch over all ranks (docs/method.md section 3, paper eq. 8).

Trainer glue: gathers every rank's |A| x H scores so that one threshold, identical on every rank,
cuts them (`d3s.token_selection.select_tokens`), and hands each rank its own rows back.
"""

from __future__ import annotations

import torch

from d3s.integrations.trl.rows import gather_rows
from d3s.metrics import advantage_balance
from d3s.token_selection import LOWEST_SCORE, select_tokens, token_scores


def gathered_token_mask(accelerator, args, advantages: torch.Tensor, entropies: torch.Tensor, mask: torch.Tensor,
                        fraction: float):
    """Top-K% |A| x H over the rows of ALL ranks: one threshold, identical on every rank.

    With `token_cut` 'sign' or 'rollout', a `min_tokens_per_rollout` floor or `keep_last_in_loss` (fields of
    `args`, a `D3SConfig`), the cut of `select_tokens` on the same gathered scores.

    Returns this rank's `(R, T)` mask, the mask of all ranks `(P*R, T_max)`, the number of non-finite scores
    (all ranks) and `(balance, one_sided)` of the tokens kept (`d3s.metrics.advantage_balance`).
    """
    scores = token_scores(advantages, entropies.float(), mask)  # (R, T), -inf at padding
    R, T = scores.shape
    all_scores = gather_rows(accelerator, scores, -float("inf"), False)  # (P*R, T_max)
    all_advantages = gather_rows(accelerator, advantages, 0.0, False)  # (P*R,)
    offered = all_scores > -float("inf")  # (P*R, T_max)
    all_mask = select_tokens(all_scores, fraction, advantages=all_advantages, cut=args.token_cut,
                             min_per_rollout=args.min_tokens_per_rollout,
                             keep_last=args.keep_last_in_loss)  # 'batch', 0, False: the paper's
    n_nonfinite = int((all_scores == LOWEST_SCORE).sum())
    rank = accelerator.process_index
    balance = advantage_balance(all_advantages, all_mask, offered)
    return all_mask[rank * R : (rank + 1) * R, :T], all_mask, n_nonfinite, balance
