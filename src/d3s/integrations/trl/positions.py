"""What the trainer's model computes, counted in positions: the body's and the LM head's, for each kind of pass.

`Positions` holds the running totals (all processes); `d3s train` reads its FLOPs from them
(`d3s.app.budget.computed_flops`, docs/compare.md). Counting never changes training. Each pass is counted where
it runs, as the code computes it:

- generation (`D3SGRPOTrainer._generate_single_turn`), as the path that generated computed it:
  - the shared-prefill path (`decoding.generate`) reports its own counts: each distinct prompt prefilled once
    (the prefix all of them share once), one decode position per row and step while the row generates, the LM
    head at the last position of each prefill call and at every decode position;
  - transformers' `generate` (TRL's path without `shared_prefill_generation`): `generate_positions`;
  - generation outside this process (vLLM, transformers' continuous batching) or by a custom `rollout_func`:
    `unpadded_positions`, what an engine without padding or prefix cache computes;
- scoring passes without gradient (old-policy, reference, entropy): the body over every column of their rows
  (padding included), the head at the positions scored: the kept rows' valid tokens (`selective_head`), or, for
  TRL's own passes, the completion tokens its fused head scores;
- training forwards: the body over every column computed (padding included), the head with gradient at the
  positions in the loss, and without at positions only read.

The held-out evaluation and the KL monitor measure; they are not counted (`Positions.uncounted`).
"""

from __future__ import annotations

import contextlib
import math
from typing import Sequence

import torch

COUNTS = ("prefill", "decode", "generation_head", "no_grad", "no_grad_head", "trained", "trained_head")
"""The totals of `Positions`:

- `prefill`, `decode`: positions of the body in generation's prefill and decoding calls;
- `generation_head`: positions the LM head ran at in generation;
- `no_grad`, `no_grad_head`: positions of the body and of the LM head in the scoring passes without gradient (and
  the head's positions that a training forward computes without gradient);
- `trained`, `trained_head`: positions of the body and of the LM head in training forwards, each with its
  backward."""


def generate_positions(prompt_lengths: Sequence[int], completion_lengths: Sequence[int],
                       pad_to_multiple_of: int | None = None, last_logits_only: bool = True) -> dict[str, int]:
    """What transformers' `generate` computes for one left-padded batch (TRL's `_generate_single_turn`).

    The prompts are prefilled together, padded to the longest (rounded up to `pad_to_multiple_of`): S x width
    positions. `generate` then decodes every row at every step until all rows have finished: a finished row keeps
    decoding padding. The steps are the longest completion (as TRL cuts it: up to and including the first
    end-of-sequence token), the first token drawn from the prefill: S x (steps - 1) decode positions. The LM head
    runs at the prefill's last position (`generate` sets `logits_to_keep=1` when the forward takes it, else at every
    prefill position) and at every decode position.
    """
    S = len(prompt_lengths)
    if S == 0:
        return {"prefill": 0, "decode": 0, "head": 0}
    width = max(prompt_lengths)
    if pad_to_multiple_of:
        width = math.ceil(width / pad_to_multiple_of) * pad_to_multiple_of
    prefill = S * width
    decode = S * max(max(completion_lengths) - 1, 0)
    return {"prefill": prefill, "decode": decode, "head": (S if last_logits_only else prefill) + decode}


def unpadded_positions(prompt_lengths: Sequence[int], completion_lengths: Sequence[int]) -> dict[str, int]:
    """Generation as an engine without padding or prefix cache computes it: each rollout's prompt prefilled once,
    each completion token after the first decoded once (the first comes from the prefill), the LM head at each
    prompt's last position and at every decode position."""
    decode = sum(max(n - 1, 0) for n in completion_lengths)
    return {"prefill": sum(prompt_lengths), "decode": decode, "head": len(prompt_lengths) + decode}


def labelled_positions(attention_mask: torch.Tensor, logits_to_keep: int) -> int:
    """Positions TRL's fused LM head scores in `_get_per_token_logps_and_entropies`: the attended positions of the
    last `logits_to_keep` columns (the completion tokens; the labels elsewhere are -100). `attention_mask`: `(S, L)`.

    TRL computes the head there where Triton runs (CUDA, XPU); elsewhere it computes it at every position and masks
    the result. The count is the first, so that it does not depend on the device (docs/compare.md)."""
    return int(attention_mask[:, -logits_to_keep:].sum())


class Positions:
    """The running totals of `COUNTS`, every process together. A count of this process is pending until the next
    training forward sums it over the processes (`log_trained`, which every process calls per micro-batch)."""

    def __init__(self) -> None:
        self.totals = dict.fromkeys(COUNTS, 0.0)
        self.pending = dict.fromkeys(COUNTS, 0.0)  # this process's, not yet summed over processes
        self.counting = True

    def add_generation(self, prefill: float, decode: float, head: float) -> None:
        """A generation call of this process (`decoding.Generation.positions`, `generate_positions`, ...)."""
        if self.counting:
            self.pending["prefill"] += float(prefill)
            self.pending["decode"] += float(decode)
            self.pending["generation_head"] += float(head)

    def add_no_grad(self, positions: float, head: float = 0.0) -> None:
        """A scoring pass of this process: `positions` of the body, `head` of the LM head."""
        if self.counting:
            self.pending["no_grad"] += float(positions)
            self.pending["no_grad_head"] += float(head)

    @contextlib.contextmanager
    def uncounted(self):
        """Passes inside are measurement, not training (the KL monitor): not counted."""
        self.counting = False
        try:
            yield
        finally:
            self.counting = True

    def snapshot(self) -> dict[str, float]:
        return dict(self.totals)

    def restore(self, totals: dict[str, float]) -> None:
        """Continue from `totals` (a resumed run's last record, a rewind to the last finished step)."""
        self.totals = {name: float(totals.get(name) or 0.0) for name in COUNTS}
        self.pending = dict.fromkeys(COUNTS, 0.0)

    def log_trained(self, accelerator, metrics: dict, positions: int, accumulation_steps: int, *, head: int = 0,
                    head_no_grad: int = 0) -> None:
        """A training forward of this process (collective: every process calls it per micro-batch): `positions` of
        the body, `head` of the LM head with gradient, `head_no_grad` without.

        Logs `d3s/tokens_computed` (the forward's body positions, all ranks) and `d3s/tokens_no_grad` (the scoring
        passes' since the last call), each summed over the step's micro-batches (TRL averages a step's values,
        hence the factor)."""
        local = dict(self.pending)
        local["trained"] += float(positions)
        local["trained_head"] += float(head)
        local["no_grad_head"] += float(head_no_grad)
        total = accelerator.reduce(torch.tensor([local[name] for name in COUNTS], device=accelerator.device),
                                   reduction="sum")  # float32: exact for counts below 2**24 per micro-batch
        self.pending = dict.fromkeys(COUNTS, 0.0)
        summed = dict(zip(COUNTS, total.tolist()))
        for name in COUNTS:
            self.totals[name] += summed[name]
        metrics["d3s/tokens_computed"].append(summed["trained"] * accumulation_steps)
        metrics["d3s/tokens_no_grad"].append(summed["no_grad"] * accumulation_steps)
