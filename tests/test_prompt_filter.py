"""The prompt filter (`d3s.prompt_filter`) against plain-loop references and GRESO's closed form."""

import itertools
import math

import pytest
import torch

from d3s.advantages import group_advantages
from d3s.prompt_filter import PromptHistory, choose_prompts, draw_prompts, flat_groups, skip_probability


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- flat groups ------------------------------------------------------------------------------------


def test_flat_groups_are_the_groups_whose_advantages_are_zero():
    nan = float("nan")
    rewards = torch.tensor([1.0, 1.0, 1.0,   0.0, 1.0, 0.0,   nan, 2.0, nan,   nan, nan, nan,   0.3, 0.3, nan])
    assert flat_groups(rewards, 3).tolist() == [True, False, True, True, True]
    torch.manual_seed(0)
    for _ in range(20):  # the same groups group_advantages zeroes
        r = torch.randint(0, 3, (24,)).float() / 10
        r[torch.rand(24) < 0.2] = nan
        zero = (group_advantages(r, 4).reshape(-1, 4) == 0).all(dim=1)
        assert torch.equal(flat_groups(r, 4), zero)


# -- GRESO's skip probability --------------------------------------------------------------------------


def test_skip_probability_is_one_minus_explore_to_the_streak():
    z = torch.tensor([0, 1, 2, 5])
    assert skip_probability(z, 0.5).tolist() == [0.0, 0.5, 0.75, 1 - 0.5**5]
    assert skip_probability(z, 1.0).tolist() == [0.0] * 4  # explore = 1: never skip
    with pytest.raises(ValueError, match="explore"):
        skip_probability(z, 0.0)


def test_the_skip_frequency_matches_the_rule():
    B, trials = 64, 300
    streaks = torch.tensor([0, 1, 2, 3] * (B // 4))
    pool = torch.arange(1000, 1000 + 10 * B)
    skipped = torch.zeros(B)
    g = gen(1)
    for _ in range(trials):
        skipped += choose_prompts(torch.arange(B), streaks, pool, torch.zeros_like(pool), 0.5, g).skipped.float()
    for z in range(4):
        share = skipped[streaks == z].sum() / (trials * B / 4)
        assert share == pytest.approx(1 - 0.5**z, abs=0.03), z


# -- history ----------------------------------------------------------------------------------------


def reference_history(batches, max_streak):
    """Plain loop: a dict of streaks, one outcome per key per batch."""
    z = {}
    for keys, flat in batches:
        outcome = {}
        for k, f in zip(keys, flat):
            outcome[k] = outcome.get(k, True) and f
        for k, f in outcome.items():
            z[k] = min(z.get(k, 0) + 1, max_streak) if f else 0
    return {k: v for k, v in z.items() if v > 0}


@pytest.mark.parametrize("seed", range(5))
def test_history_matches_a_plain_loop(seed):
    torch.manual_seed(seed)
    history = PromptHistory(max_streak=3)
    batches = []
    for _ in range(12):
        keys = torch.randint(-5, 6, (7,))  # repeated keys inside a batch, negative keys
        flat = torch.rand(7) < 0.7
        history.update(keys, flat)
        batches.append((keys.tolist(), flat.tolist()))
        expected = reference_history(batches, 3)
        assert dict(zip(history.keys.tolist(), history.counts.tolist())) == expected
        probe = torch.arange(-6, 7)
        assert history.streaks(probe).tolist() == [expected.get(k, 0) for k in probe.tolist()]


def test_history_state_round_trip():
    history = PromptHistory(max_streak=4)
    history.update(torch.tensor([3, 1, 2]), torch.tensor([True, True, False]))
    copy = PromptHistory(max_streak=1)
    copy.load_state_dict(history.state_dict())
    assert copy.max_streak == 4 and torch.equal(copy.keys, history.keys) and torch.equal(copy.counts, history.counts)
    with pytest.raises(ValueError, match="increasing order"):
        copy.load_state_dict({"max_streak": 2, "keys": torch.tensor([2, 1]), "counts": torch.tensor([1, 1])})


# -- the choice -------------------------------------------------------------------------------------


def reference_choice(batch_keys, batch_streaks, pool_keys, pool_streaks, explore, generator):
    """Plain loop with the same draws in the same order as `choose_prompts`."""
    B, N = len(batch_keys), len(pool_keys)
    v = torch.rand(B, generator=generator, dtype=torch.float64).tolist()
    wanted = [v[b] < 1 - explore ** batch_streaks[b] for b in range(B)]
    order = torch.randperm(N, generator=generator).tolist()
    u = torch.rand(N, generator=generator, dtype=torch.float64).tolist()
    fills, used = [], set()
    for j, i in enumerate(order):
        key = pool_keys[i]
        first = key not in used
        used.add(key)
        if first and key not in batch_keys and u[j] >= 1 - explore ** pool_streaks[i]:
            fills.append(i)
    replacement = [-1] * B
    for b in range(B):
        if wanted[b] and fills:
            replacement[b] = fills.pop(0)
    unfilled = [wanted[b] and replacement[b] < 0 for b in range(B)]
    return replacement, unfilled


@pytest.mark.parametrize("seed, pool_size, explore", list(itertools.product(range(6), [3, 12, 40], [0.2, 0.5, 0.9])))
def test_choice_matches_a_plain_loop(seed, pool_size, explore):
    torch.manual_seed(seed)
    B = 8
    pool_keys = torch.randint(0, pool_size, (pool_size,))  # duplicate prompts in the dataset
    pool_streaks = torch.randint(0, 4, (pool_size,))
    batch_keys = pool_keys[torch.randint(0, pool_size, (B,))]
    batch_streaks = torch.randint(0, 4, (B,))
    choice = choose_prompts(batch_keys, batch_streaks, pool_keys, pool_streaks, explore, gen(seed))
    replacement, unfilled = reference_choice(batch_keys.tolist(), batch_streaks.tolist(), pool_keys.tolist(),
                                             pool_streaks.tolist(), explore, gen(seed))
    assert choice.replacement.tolist() == replacement
    assert choice.unfilled.tolist() == unfilled
    assert torch.equal(choice.skipped, choice.replacement >= 0)
    # the batch after the choice: no replacement repeats a prompt of the batch or another replacement
    new_keys = pool_keys[choice.replacement[choice.skipped]].tolist()
    assert len(set(new_keys)) == len(new_keys) and not set(new_keys) & set(batch_keys.tolist())


def test_prompts_never_seen_flat_are_never_skipped():
    choice = choose_prompts(torch.arange(16), torch.zeros(16, dtype=torch.int64), torch.arange(100, 200),
                            torch.zeros(100, dtype=torch.int64), 0.01, gen(0))
    assert not choice.skipped.any() and not choice.unfilled.any()


def test_draw_prompts_skips_by_the_rule_and_never_repeats():
    pool_keys = torch.arange(50)
    streaks = torch.where(pool_keys < 25, 30, 0)  # skip probability ~1 for the first half
    drawn = draw_prompts(50, pool_keys, streaks, torch.tensor([30, 31]), 0.5, gen(3))
    assert sorted(drawn.tolist()) == [k for k in range(25, 50) if k not in (30, 31)]
    assert draw_prompts(4, pool_keys, streaks, torch.tensor([]), 0.5, gen(3)).numel() == 4
    assert math.isclose(1 - 0.5**30, skip_probability(torch.tensor([30]), 0.5).item())
