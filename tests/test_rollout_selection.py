"""Sample-level selection against brute force over every subset (paper eqs. 6-7)."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import d3s
from d3s.rollout_selection import max_variance_mask


def pop_var(xs):
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)


def brute_force_max_var(values, n):
    vals = [float(v) for v in values]
    return max(pop_var([vals[i] for i in c]) for c in itertools.combinations(range(len(vals)), n))


def assert_optimal(values, n):
    idx = d3s.max_variance_subset(torch.tensor(values, dtype=torch.float64), n)
    m = len(values)
    assert idx.dtype == torch.long
    assert idx.tolist() == sorted(set(idx.tolist())), "indices must be unique and ascending"
    assert len(idx) == min(n, m)
    got = pop_var([float(values[i]) for i in idx.tolist()])
    best = brute_force_max_var(values, min(n, m))
    scale = max(1.0, max(abs(float(v)) for v in values) ** 2)
    assert got == pytest.approx(best, rel=1e-9, abs=1e-12 * scale), (values, n, idx)


@pytest.mark.parametrize("seed", range(60))
def test_matches_brute_force_random(seed):
    g = torch.Generator().manual_seed(seed)
    m = int(torch.randint(1, 13, (1,), generator=g))
    n = int(torch.randint(1, m + 1, (1,), generator=g))
    kind = seed % 4
    if kind == 0:
        values = torch.randn(m, generator=g)
    elif kind == 1:  # heavy ties: few distinct values
        values = torch.randint(-2, 3, (m,), generator=g).double()
    elif kind == 2:  # huge, offset and negative
        values = torch.randn(m, generator=g, dtype=torch.float64) * 1e6 - 3e9
    else:  # skewed
        values = torch.randn(m, generator=g).exp() ** 3
    assert_optimal(values.tolist(), n)


@pytest.mark.parametrize(
    "values,n",
    [
        ([3.0], 1),
        ([1.0, 1.0, 1.0, 1.0], 2),  # all equal
        ([0.0, 0.0, 1.0, 1.0, 1.0], 3),  # binary rewards
        ([-5.0, -5.0, 7.0, 7.0, 0.0, 0.0], 4),
        ([1e12, -1e12, 3.0, 1e12 + 1.0], 2),
        ([2.0, -1.0, 0.5, 3.0, -4.0], 1),  # n = 1: any single value, variance 0
        ([2.0, -1.0, 0.5, 3.0, -4.0], 5),  # n = m: everything
        ([0.1, 0.2, 0.3], 7),  # n > m: everything
    ],
)
def test_edge_cases_match_brute_force(values, n):
    assert_optimal(values, n)


def test_n_at_least_m_keeps_everything():
    x = torch.randn(10)
    assert d3s.max_variance_subset(x, 10).tolist() == list(range(10))
    assert d3s.max_variance_subset(x, 11).tolist() == list(range(10))


@pytest.mark.parametrize("bad", [0, -1, 2.5, "3", None])
def test_bad_n_raises_naming_value(bad):
    with pytest.raises(ValueError, match=f"n={bad!r}" if not isinstance(bad, int) else f"n={bad}"):
        d3s.max_variance_subset(torch.randn(5), bad)


def test_nan_or_inf_raises():
    with pytest.raises(ValueError, match="finite, found nan"):
        d3s.max_variance_subset(torch.tensor([0.0, float("nan"), 1.0]), 2)
    with pytest.raises(ValueError, match="finite, found inf"):
        d3s.max_variance_subset(torch.tensor([0.0, float("inf"), 1.0]), 2)


def test_ties_broken_by_value_then_index():
    # All equal: the first n in (value, index) order, i.e. the lowest indices.
    assert d3s.max_variance_subset(torch.zeros(6), 3).tolist() == [0, 1, 2]
    # Two values, symmetric: k = 1 from the top and 1 from the bottom. Among the equal top values the
    # last in (value, index) order is taken, among the bottom ones the first.
    x = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    assert d3s.max_variance_subset(x, 2).tolist() == [1, 4]
    # Deterministic: a permutation-equivariant, repeatable answer.
    assert d3s.max_variance_subset(x, 4).tolist() == d3s.max_variance_subset(x.clone(), 4).tolist()


def test_float_rounding_cannot_flip_ties():
    # The same values through a positive affine map pick the same subset despite rounding.
    g = torch.Generator().manual_seed(0)
    r = torch.randint(0, 2, (64,), generator=g).double()
    a = (r - r.mean()) / (r.std() + 1e-4)
    assert d3s.max_variance_subset(r, 16).tolist() == d3s.max_variance_subset(a, 16).tolist()


def test_batched_mask_equals_rowwise():
    g = torch.Generator().manual_seed(1)
    v = torch.randn(7, 9, generator=g)
    mask = max_variance_mask(v, 4)
    for r in range(7):
        assert mask[r].nonzero().flatten().tolist() == d3s.max_variance_subset(v[r], 4).tolist()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(-100, 100, allow_nan=False, width=32), min_size=2, max_size=40),
    st.integers(2, 40),
)
def test_lemma_1_standardised_advantages_keep_variance_at_least_one(raw, n):
    """Paper Lemma 1: standardise a set to mean 0 and variance 1; for every 2 <= n <= m the
    max-variance subset of size n has variance >= 1.

    It holds with the Bessel (sample) variance — TRL's standardisation — and the max-variance
    subset is the same for either variance at fixed n. (With the population variance it is false:
    see the next test.)"""
    x = torch.tensor(raw, dtype=torch.float64)
    if x.std() < 1e-6:
        return  # no spread, nothing to standardise
    x = (x - x.mean()) / x.std()
    n = min(n, len(raw))
    idx = d3s.max_variance_subset(x, n)
    assert x[idx].var().item() >= 1 - 1e-9


def test_lemma_1_fails_for_the_population_variance():
    # [-1, -1, 1, 1] has population variance 1; every 3-subset has population variance 8/9.
    x = torch.tensor([-1.0, -1.0, 1.0, 1.0], dtype=torch.float64)
    idx = d3s.max_variance_subset(x, 3)
    assert x[idx].var(correction=0).item() == pytest.approx(8 / 9)
    assert brute_force_max_var(x.tolist(), 3) == pytest.approx(8 / 9)


# ---------------------------------------------------------------- select_rollouts


def test_intra_keeps_the_same_subset_as_pods_on_rewards():
    g = torch.Generator().manual_seed(3)
    B, G, N = 16, 8, 3
    rewards = torch.randint(0, 4, (B * G,), generator=g).float() / 3
    adv = d3s.group_advantages(rewards, G)
    intra = d3s.select_rollouts(adv, rewards, G, N, "intra")
    pods = d3s.select_rollouts(adv, rewards, G, N, "pods")
    assert torch.equal(intra.indices, pods.indices)
    assert intra.kept_per_group.tolist() == [N] * B
    # intra keeps the advantages; pods re-normalises them within each kept group.
    assert torch.equal(intra.advantages, adv[intra.indices])
    kept_r = rewards[pods.indices].view(B, N)
    ref = (kept_r - kept_r.mean(1, keepdim=True)) / (kept_r.std(1, keepdim=True) + 1e-4)
    ref[kept_r.std(1) == 0] = 0.0
    torch.testing.assert_close(pods.advantages, ref.view(-1))


def _selected(seed: int, B: int, G: int, N: int, mode: str, draw=torch.randn):
    """Rewards drawn with `draw`, their group advantages and the selection `mode` makes of them."""
    rewards = draw(B * G, generator=torch.Generator().manual_seed(seed))
    adv = d3s.group_advantages(rewards, G)
    return adv, d3s.select_rollouts(adv, rewards, G, N, mode)


def test_intra_is_rowwise_brute_force():
    B, G, N = 5, 7, 3
    adv, sel = _selected(4, B, G, N, "intra")
    for b in range(B):
        kept = [i - b * G for i in sel.indices.tolist() if b * G <= i < (b + 1) * G]
        assert len(kept) == N
        got = pop_var(adv[b * G : (b + 1) * G][kept].tolist())
        assert got == pytest.approx(brute_force_max_var(adv[b * G : (b + 1) * G].tolist(), N), rel=1e-9)


def test_cross_is_one_global_choice():
    B, G, N = 3, 4, 2
    adv, sel = _selected(5, B, G, N, "cross", draw=torch.rand)
    assert len(sel.indices) == N * B
    assert pop_var(sel.advantages.tolist()) == pytest.approx(brute_force_max_var(adv.tolist(), N * B), rel=1e-9)
    assert sel.kept_per_group.sum().item() == N * B
    assert torch.equal(sel.advantages, adv[sel.indices])  # NOT re-normalised
    assert torch.equal(sel.mask.nonzero().flatten(), sel.indices)


def test_cross_can_leave_a_group_empty():
    # Group 1 has all-equal rewards (advantage 0); cross selection prefers the extremes elsewhere.
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.0, 1.0, 0.0, 1.0])
    adv = d3s.group_advantages(rewards, 4)
    sel = d3s.select_rollouts(adv, rewards, 4, 2, "cross")
    assert sel.kept_per_group.tolist() == [2, 0, 4] or sel.kept_per_group[1].item() == 0
    assert (sel.advantages != 0).all()


def test_nan_rewards_are_never_kept():
    nan = float("nan")
    rewards = torch.tensor([1.0, nan, 0.0, 0.0, nan, nan, nan, nan, 1.0, 0.0, 0.5, nan])
    adv = d3s.group_advantages(rewards, 4)
    for mode in ("none", "intra", "cross", "pods"):
        sel = d3s.select_rollouts(adv, rewards, 4, 2, mode)
        assert not torch.isnan(rewards[sel.indices]).any(), mode
        assert not torch.isnan(sel.advantages).any(), mode
    sel = d3s.select_rollouts(adv, rewards, 4, 2, "intra")
    assert sel.kept_per_group.tolist() == [2, 0, 2]  # the all-NaN group keeps nothing


def test_zero_variance_groups_select_without_nan():
    rewards = torch.ones(4 * 8)
    adv = d3s.group_advantages(rewards, 8)
    for mode in ("intra", "cross", "pods"):
        sel = d3s.select_rollouts(adv, rewards, 8, 3, mode)
        assert len(sel.indices) == 12
        assert torch.equal(sel.advantages, torch.zeros(12))


def test_none_keeps_everything_scorable():
    rewards = torch.rand(12)
    adv = d3s.group_advantages(rewards, 4)
    sel = d3s.select_rollouts(adv, rewards, 4, 2, "none")
    assert sel.indices.tolist() == list(range(12))
    assert torch.equal(sel.advantages, adv)


def test_select_rollouts_rejects_bad_input():
    r = torch.rand(12)
    a = d3s.group_advantages(r, 4)
    with pytest.raises(ValueError, match="mode='global'"):
        d3s.select_rollouts(a, r, 4, 2, "global")
    with pytest.raises(ValueError, match="num_generations=5"):
        d3s.select_rollouts(a, r, 5, 2, "intra")
    with pytest.raises(ValueError, match="n_keep=0"):
        d3s.select_rollouts(a, r, 4, 0, "intra")
