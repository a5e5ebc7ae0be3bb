"""Which prompts a generation batch holds: skip before generating, refill after (docs/method.md section 9.1).

Two departures from the D3S paper, both opt-in, both about groups with no signal: a group whose valid
rewards are all equal has advantage exactly 0 (section 1), so generating it buys nothing.

- **Skip before generating** (GRESO, Zheng et al., arXiv 2506.02177, sec. 4): a prompt whose last z
  groups in a row were flat is skipped with probability

      p_skip(z) = 1 - p_e ** z            p_e: the exploration probability, z capped at `max_streak`

  so a prompt never seen flat (z = 0) is always generated, and a skipped prompt is retried with
  probability p_e ** z. A skipped prompt is replaced by another prompt of the dataset, so the batch
  keeps its size. GRESO adapts p_e during training (separately for all-correct and all-wrong prompts,
  towards a target share of flat groups); here p_e is fixed.
- **Refill after scoring** (DAPO's dynamic sampling, Yu et al., arXiv 2503.14476, sec. 3.2): flat
  groups are dropped and more prompts generated; the prompts of a refill round are drawn here too.

A prompt is identified by an int64 key (the trainer hashes its dataset row). Every draw comes from one
`torch.Generator` the caller seeds, in a fixed order, so every process of a distributed run that holds
the same history and seed makes the same choice. Tensors and numbers in, tensors out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from d3s import _checks


def flat_groups(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """`(B,)` True for a group with no signal: its valid rewards are all equal, or fewer than two are valid.

    The same rule that gives a group advantage exactly 0 (`d3s.advantages.group_advantages`, section 1).

    Args:
        rewards: `(B*G,)` group-major rewards, NaN where unscorable.
    """
    _checks.tensor("rewards", rewards, dims=(1,), kind="float")
    G = _checks.as_int("num_generations", num_generations, low=1)
    if rewards.numel() % G:
        raise ValueError(f"rewards has {rewards.numel()} values, not a multiple of num_generations={G}")
    grouped = rewards.reshape(-1, G)  # (B, G)
    valid = ~torch.isnan(grouped)
    hi = torch.where(valid, grouped, torch.full_like(grouped, -float("inf"))).amax(dim=1)  # (B,)
    lo = torch.where(valid, grouped, torch.full_like(grouped, float("inf"))).amin(dim=1)  # (B,)
    return (hi == lo) | (valid.sum(dim=1) < 2)


def skip_probability(streaks: torch.Tensor, explore: float) -> torch.Tensor:
    """`(n,)` float64 GRESO's p_skip = 1 - explore ** z for the flat streaks z (0 for z = 0)."""
    _checks.tensor("streaks", streaks, dims=(1,))
    explore = _checks.as_float("explore", explore, low=0.0, high=1.0, low_open=True)
    return 1.0 - torch.full(streaks.shape, explore, dtype=torch.float64) ** streaks.to(torch.float64)


class PromptHistory:
    """Each prompt's flat streak z: how many of its most recent generation batches in a row gave it only
    flat groups, capped at `max_streak`. A generation batch in which any group of the prompt had signal
    resets z to 0. Only prompts with z > 0 are stored (z = 0 is the same as never seen).

    A prompt counts once per generation batch (`update` takes every group of one batch): it is flat there
    when all its groups in that batch were flat.
    """

    def __init__(self, max_streak: int):
        self.max_streak = _checks.as_int("max_streak", max_streak, low=1)
        self.keys = torch.zeros(0, dtype=torch.int64)  # (n,) sorted
        self.counts = torch.zeros(0, dtype=torch.int64)  # (n,) in [1, max_streak]

    def __len__(self) -> int:
        return self.keys.numel()

    def streaks(self, keys: torch.Tensor) -> torch.Tensor:
        """`(m,)` int64 the flat streak of each key (0 for a key never seen flat)."""
        keys = keys.to(torch.int64).cpu().contiguous()
        if len(self) == 0:
            return torch.zeros_like(keys)
        at = torch.searchsorted(self.keys, keys).clamp(max=len(self) - 1)  # (m,)
        return torch.where(self.keys[at] == keys, self.counts[at], torch.zeros_like(keys))

    def update(self, keys: torch.Tensor, flat: torch.Tensor) -> None:
        """Record one generation batch: `keys` `(B,)` int64 of its groups, `flat` `(B,)` bool."""
        keys, flat = keys.to(torch.int64).cpu(), flat.to(torch.bool).cpu()
        if keys.shape != flat.shape or keys.dim() != 1:
            raise ValueError(f"keys {tuple(keys.shape)} and flat {tuple(flat.shape)} must be the same 1-d shape")
        seen, inverse = torch.unique(keys, return_inverse=True)  # (U,), (B,)
        signal = torch.zeros(seen.numel(), dtype=torch.bool).scatter_reduce(0, inverse, ~flat, "amax")  # (U,)
        grown = (self.streaks(seen) + 1).clamp(max=self.max_streak)  # (U,)
        new = torch.where(signal, torch.zeros_like(grown), grown)  # (U,)
        # merge: an updated key replaces its old entry (the later of two equal keys wins)
        keys_all = torch.cat([self.keys, seen])
        counts_all = torch.cat([self.counts, new])
        merged, where = torch.unique(keys_all, return_inverse=True)
        last = torch.full((merged.numel(),), -1, dtype=torch.int64).scatter_reduce(
            0, where, torch.arange(keys_all.numel()), "amax")
        counts = counts_all[last]
        self.keys, self.counts = merged[counts > 0], counts[counts > 0]

    def state_dict(self) -> dict:
        return {"max_streak": self.max_streak, "keys": self.keys.clone(), "counts": self.counts.clone()}

    def load_state_dict(self, state: dict) -> None:
        keys, counts = state["keys"].to(torch.int64), state["counts"].to(torch.int64)
        if keys.shape != counts.shape or keys.dim() != 1 or (keys.numel() > 1 and not bool((keys[1:] > keys[:-1]).all())):
            raise ValueError("a prompt history needs 1-d keys in increasing order and one count per key")
        self.max_streak = _checks.as_int("max_streak", state["max_streak"], low=1)
        self.keys, self.counts = keys.clone(), counts.clamp(max=self.max_streak).clone()


def draw_prompts(
    count: int,
    pool_keys: torch.Tensor,
    pool_streaks: torch.Tensor,
    exclude_keys: torch.Tensor,
    explore: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """Up to `count` prompts of the pool, in a random order, none of them skipped.

    The pool is visited in the order of one `torch.randperm(N)`; the prompt at position j passes when
    `u_j >= p_skip(z)` with `u = torch.rand(N)` (one draw per position, both from `generator`), its key
    is not in `exclude_keys`, and no earlier position holds the same key.

    Args:
        pool_keys: `(N,)` int64 key of every prompt of the pool (the dataset); equal keys are one prompt.
        pool_streaks: `(N,)` their flat streaks.
        exclude_keys: `(E,)` keys that must not be drawn (the batch's own prompts).

    Returns:
        `(n,)` int64 pool indices, n <= count (fewer when the pool runs out).
    """
    count = _checks.as_int("count", count, low=0)
    N = pool_keys.numel()
    if pool_streaks.shape != pool_keys.shape:
        raise ValueError(f"pool_streaks {tuple(pool_streaks.shape)} must match pool_keys {tuple(pool_keys.shape)}")
    order = torch.randperm(N, generator=generator)  # (N,)
    u = torch.rand(N, generator=generator, dtype=torch.float64)  # (N,) position j's draw
    keys = pool_keys.cpu()[order]  # (N,)
    passes = u >= skip_probability(pool_streaks.cpu()[order], explore)  # (N,)
    passes &= ~torch.isin(keys, exclude_keys.to(torch.int64).cpu())
    # the first position of every key: a prompt listed twice in the dataset is drawn once at most
    seen, inverse = torch.unique(keys, return_inverse=True)
    first = torch.full((seen.numel(),), N, dtype=torch.int64).scatter_reduce(0, inverse, torch.arange(N), "amin")
    passes &= first[inverse] == torch.arange(N)
    return order[passes][:count]


@dataclass(frozen=True)
class PromptChoice:
    """The prompts of one generation batch after skipping.

    Attributes:
        replacement: `(B,)` int64 pool index of the prompt that replaces prompt b, -1 where b is kept.
        skipped: `(B,)` bool, the prompts replaced (`replacement >= 0`).
        unfilled: `(B,)` bool, prompts the rule skipped but that are kept: the pool had no replacement left.
    """

    replacement: torch.Tensor
    skipped: torch.Tensor
    unfilled: torch.Tensor


def choose_prompts(
    batch_keys: torch.Tensor,
    batch_streaks: torch.Tensor,
    pool_keys: torch.Tensor,
    pool_streaks: torch.Tensor,
    explore: float,
    generator: torch.Generator,
) -> PromptChoice:
    """GRESO's pre-generation filter on one batch of B prompts, and the replacements that keep its size.

    Draws, in this order from `generator`: `v = torch.rand(B)` (prompt b is skipped when
    `v_b < p_skip(z_b)`), then `draw_prompts` for as many replacements as there are skipped prompts,
    excluding the batch's own keys. The k-th skipped prompt (in batch order) gets the k-th replacement;
    skipped prompts beyond the replacements found are kept (`unfilled`).

    Args:
        batch_keys: `(B,)` int64 keys of the batch's prompts; batch_streaks: `(B,)` their flat streaks.
        pool_keys, pool_streaks: `(N,)` the prompts replacements are drawn from (see `draw_prompts`).
    """
    _checks.tensor("batch_keys", batch_keys, dims=(1,))
    if batch_streaks.shape != batch_keys.shape:
        raise ValueError(f"batch_streaks {tuple(batch_streaks.shape)} must match batch_keys {tuple(batch_keys.shape)}")
    B = batch_keys.numel()
    v = torch.rand(B, generator=generator, dtype=torch.float64)  # (B,)
    wanted = v < skip_probability(batch_streaks.cpu(), explore)  # (B,)
    slots = torch.nonzero(wanted).flatten()  # (S,) in batch order
    fill = draw_prompts(slots.numel(), pool_keys, pool_streaks, batch_keys, explore, generator)  # (n,), n <= S
    replacement = torch.full((B,), -1, dtype=torch.int64)
    replacement[slots[: fill.numel()]] = fill
    skipped = replacement >= 0
    return PromptChoice(replacement=replacement, skipped=skipped, unfilled=wanted & ~skipped)
