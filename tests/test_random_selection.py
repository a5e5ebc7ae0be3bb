"""The random-selection controls (docs/method.md section 9.3): as many rollouts as the max-variance rule of the
same scope keeps, chosen uniformly at random, reproducibly."""

import itertools
import math

import pytest
import torch

from d3s import select_rollouts
from d3s.rollout_selection import random_mask, selection_generator

CONTROL = {"random": "cross", "random-intra": "intra"}


def _batch(seed: int, B: int, G: int, nan_share: float = 0.0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (B * G,), generator=g).float()  # ties and flat groups are common
    rewards[torch.rand(B * G, generator=g) < nan_share] = float("nan")
    from d3s import group_advantages

    return group_advantages(rewards, G), rewards


@pytest.mark.parametrize("control", sorted(CONTROL))
@pytest.mark.parametrize("nan_share", [0.0, 0.2])
def test_keeps_as_many_as_the_max_variance_rule_of_its_scope(control, nan_share):
    for seed in range(60):
        B, G = 1 + seed % 5, 2 + seed % 7
        advantages, rewards = _batch(seed, B, G, nan_share)
        for n in range(1, G + 2):
            rule = select_rollouts(advantages, rewards, G, n, CONTROL[control])
            ctrl = select_rollouts(advantages, rewards, G, n, control, generator=selection_generator(seed, n))
            assert ctrl.indices.numel() == rule.indices.numel()
            if control == "random-intra":  # the per-group counts too
                assert torch.equal(ctrl.kept_per_group, rule.kept_per_group)
            assert not torch.isnan(rewards[ctrl.indices]).any()  # never an unscorable rollout
            assert torch.equal(ctrl.advantages, advantages[ctrl.indices])  # advantages unchanged, as for cross


def test_the_choice_is_uniform_over_subsets():
    # every 3-subset of 7 rollouts equally likely: a chi-square test over the C(7, 3) = 35 subsets
    m, n, draws = 7, 3, 35 * 200
    valid = torch.ones(1, m, dtype=torch.bool)
    generator = torch.Generator().manual_seed(0)
    counts = dict.fromkeys(itertools.combinations(range(m), n), 0)
    for _ in range(draws):
        counts[tuple(random_mask(valid, n, generator)[0].nonzero().flatten().tolist())] += 1
    expected = draws / math.comb(m, n)
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    from scipy.stats import chi2 as chi2_dist

    assert chi2_dist.sf(chi2, df=len(counts) - 1) > 1e-3  # a biased choice (e.g. always the first n) gives ~0
    assert min(counts.values()) > 0


def test_invalid_entries_are_never_chosen_and_the_rest_uniformly():
    valid = torch.tensor([[True, False, True, True, False, True]])
    generator = torch.Generator().manual_seed(1)
    hits = torch.zeros(6)
    for _ in range(4000):
        mask = random_mask(valid, 2, generator)
        assert int(mask.sum()) == 2 and not (mask & ~valid).any()
        hits += mask[0].float()
    # each of the 4 valid entries is chosen with probability 2/4: 2000 of 4000, sd ~32
    assert ((hits[valid[0]] - 2000).abs() < 160).all()


def test_the_same_seed_and_step_draw_the_same_subset_and_others_differ():
    advantages, rewards = _batch(0, 4, 8)
    draw = lambda seed, step: select_rollouts(advantages, rewards, 8, 2, "random",  # noqa: E731
                                              generator=selection_generator(seed, step)).indices.tolist()
    assert draw(3, 5) == draw(3, 5)
    assert len({tuple(draw(seed, step)) for seed in range(3) for step in range(4)}) > 6


def test_a_control_is_not_the_max_variance_choice():
    # over many batches the random choice has a lower kept advantage variance than max-variance selection
    lower = 0
    for seed in range(40):
        advantages, rewards = _batch(seed, 4, 8)
        if advantages.abs().sum() == 0:
            continue
        rule = select_rollouts(advantages, rewards, 8, 2, "cross")
        ctrl = select_rollouts(advantages, rewards, 8, 2, "random", generator=selection_generator(seed, 0))
        assert rule.advantages.var(unbiased=False) >= ctrl.advantages.var(unbiased=False) - 1e-6
        lower += bool(rule.advantages.var(unbiased=False) > ctrl.advantages.var(unbiased=False) + 1e-6)
    assert lower > 20


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="mode='randomly'"):
        select_rollouts(torch.zeros(4), torch.zeros(4), 2, 1, "randomly")
    with pytest.raises(ValueError, match="index"):
        selection_generator(0, -1)
