"""Token mask (paper eq. 8) against a sort-based reference."""

import math

import pytest
import torch

import d3s


def sort_reference(advantages, entropies, completion_mask, fraction):
    """Sort every valid token by (score desc, flat index asc) and keep the first ceil(K * n)."""
    S, T = entropies.shape
    items = []
    for i in range(S):
        for t in range(T):
            if completion_mask[i, t]:
                a = advantages[i] if advantages.dim() == 1 else advantages[i, t]
                items.append((-(abs(float(a)) * float(entropies[i, t])), i * T + t))
    items.sort()
    k = max(1, math.ceil(round(fraction * len(items), 9))) if items else 0
    mask = torch.zeros(S * T, dtype=torch.bool)
    for _, flat in items[:k]:
        mask[flat] = True
    return mask.view(S, T)


@pytest.mark.parametrize("seed", range(25))
def test_matches_sort_reference(seed):
    g = torch.Generator().manual_seed(seed)
    S, T = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 12, (1,), generator=g))
    lengths = torch.randint(0, T + 1, (S,), generator=g)
    completion_mask = torch.arange(T)[None, :] < lengths[:, None]
    if seed % 3 == 0:  # ties: few distinct advantages and entropies, some zero
        advantages = torch.randint(-1, 2, (S,), generator=g).float()
        entropies = torch.randint(0, 3, (S, T), generator=g).float()
    elif seed % 3 == 1:  # per-token advantages
        advantages = torch.randn(S, T, generator=g)
        entropies = torch.rand(S, T, generator=g)
    else:
        advantages = torch.randn(S, generator=g)
        entropies = torch.rand(S, T, generator=g) * 5
    fraction = [0.05, 0.2, 0.5, 0.07, 1.0][seed % 5]
    got = d3s.token_mask(advantages, entropies, completion_mask, fraction)
    ref = sort_reference(advantages, entropies, completion_mask, fraction)
    assert torch.equal(got, ref)


def test_exact_count_never_padding_at_least_one():
    g = torch.Generator().manual_seed(0)
    S, T = 16, 40
    completion_mask = torch.rand(S, T, generator=g) < 0.6
    adv = torch.zeros(S)  # every score ties at 0
    ent = torch.rand(S, T, generator=g)
    for fraction in (1e-6, 0.05, 0.2, 1.0):
        m = d3s.token_mask(adv, ent, completion_mask, fraction)
        n_valid = int(completion_mask.sum())
        assert int(m.sum()) == max(1, math.ceil(round(fraction * n_valid, 9)))
        assert not (m & ~completion_mask).any()


def test_no_valid_tokens_gives_empty_mask():
    m = d3s.token_mask(torch.ones(3), torch.rand(3, 4), torch.zeros(3, 4, dtype=torch.bool), 0.5)
    assert not m.any()


def test_num_tokens_to_keep_rounding():
    assert d3s.num_tokens_to_keep(100, 0.07) == 7  # 0.07 * 100 = 7.000000000000001 in float
    assert d3s.num_tokens_to_keep(101, 0.07) == 8
    assert d3s.num_tokens_to_keep(3, 0.01) == 1
    assert d3s.num_tokens_to_keep(0, 0.5) == 0
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=f"fraction={bad}"):
            d3s.num_tokens_to_keep(10, bad)


def test_global_threshold_from_gathered_scores_equals_single_process():
    """Two 'processes' each hold half the rows: gather, cut once, slice — same as one process."""
    g = torch.Generator().manual_seed(7)
    adv = torch.randn(6, generator=g)
    ent = torch.rand(6, 10, generator=g)
    cm = torch.rand(6, 10, generator=g) < 0.8
    whole = d3s.token_mask(adv, ent, cm, 0.2)
    scores = [d3s.token_scores(adv[:3], ent[:3], cm[:3]), d3s.token_scores(adv[3:], ent[3:], cm[3:])]
    gathered = torch.cat(scores)
    k = d3s.num_tokens_to_keep(int(cm.sum()), 0.2)
    mask = d3s.top_tokens_mask(gathered, k)
    assert torch.equal(mask[:3], whole[:3]) and torch.equal(mask[3:], whole[3:])


def test_scores_are_detached():
    adv = torch.randn(2, requires_grad=True)
    ent = torch.rand(2, 3, requires_grad=True)
    s = d3s.token_scores(adv, ent, torch.ones(2, 3, dtype=torch.bool))
    assert not s.requires_grad


@pytest.mark.parametrize("seed", range(10))
def test_kthvalue_path_equals_topk_path(monkeypatch, seed):
    """Large inputs find the cut with kthvalue, small ones with topk: same mask, ties included."""
    from d3s import token_selection as tokens

    g = torch.Generator().manual_seed(seed)
    adv = torch.randint(-2, 3, (12,), generator=g).float()
    ent = torch.randint(0, 4, (12, 30), generator=g).float()
    cm = torch.rand(12, 30, generator=g) < 0.7
    small = d3s.token_mask(adv, ent, cm, 0.1)
    monkeypatch.setattr(tokens, "_KTHVALUE_FROM", 1)
    large = d3s.token_mask(adv, ent, cm, 0.1)
    assert torch.equal(small, large)
    assert torch.equal(large, sort_reference(adv, ent, cm, 0.1))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", ["entropy", "advantage"])
def test_non_finite_scores_never_empty_or_overfill_the_mask(bad, where):
    """A NaN/inf |A| * H ranks below every real score: exactly ceil(K * n_valid) tokens, real ones first."""
    g = torch.Generator().manual_seed(3)
    S, T = 6, 10
    completion_mask = torch.rand(S, T, generator=g) < 0.8
    adv = torch.randn(S, generator=g)
    ent = torch.rand(S, T, generator=g) + 0.1
    if where == "entropy":
        ent[0, :] = bad  # a whole row of broken entropies
        ent[3, 2] = bad
        broken = torch.zeros(S, T, dtype=torch.bool)
        broken[0, :], broken[3, 2] = True, True
    else:
        adv[2] = bad
        broken = torch.zeros(S, T, dtype=torch.bool)
        broken[2, :] = True
    broken &= completion_mask
    n_valid = int(completion_mask.sum())
    for fraction in (0.05, 0.2, 0.5, 1.0):
        m = d3s.token_mask(adv, ent, completion_mask, fraction)
        k = max(1, math.ceil(round(fraction * n_valid, 9)))
        assert int(m.sum()) == k
        assert not (m & ~completion_mask).any()
        n_real = n_valid - int(broken.sum())
        # broken tokens only fill what the real tokens cannot
        assert int((m & broken).sum()) == max(0, k - n_real)
        # the real tokens kept are the top real scores (reference over the real tokens only)
        real_mask = completion_mask & ~broken
        ref = sort_reference(adv.nan_to_num(0.0, 0.0, 0.0), ent.nan_to_num(0.0, 0.0, 0.0), real_mask, min(1.0, k / n_real))
        if k <= n_real:
            assert torch.equal(m & real_mask, ref)
    assert int(d3s.nonfinite_scores(adv, ent, completion_mask)) == int(broken.sum())


def test_all_scores_non_finite_still_keep_the_count():
    completion_mask = torch.ones(2, 5, dtype=torch.bool)
    m = d3s.token_mask(torch.ones(2), torch.full((2, 5), float("nan")), completion_mask, 0.2)
    assert int(m.sum()) == 2


def test_top_tokens_mask_refuses_nan_scores():
    scores = torch.tensor([[1.0, float("nan")], [0.5, -float("inf")]])
    with pytest.raises(ValueError, match="NaN"):
        d3s.top_tokens_mask(scores, 1)


def test_top_tokens_mask_k_zero_keeps_nothing_and_k_above_n_valid_keeps_all():
    scores = torch.tensor([[3.0, 1.0], [-float("inf"), 2.0]])
    assert not d3s.top_tokens_mask(scores, 0).any()
    assert torch.equal(d3s.top_tokens_mask(scores, 99), scores > -float("inf"))


def test_bool_advantages_score_as_zero_and_one():
    """A bool advantage tensor is read as 0/1, as `group_advantages` reads bool rewards (documented)."""
    ent = torch.rand(2, 3)
    cm = torch.tensor([[1, 1, 0], [1, 1, 1]])
    as_bool = torch.tensor([True, False])
    assert torch.equal(d3s.token_scores(as_bool, ent, cm), d3s.token_scores(torch.tensor([1.0, 0.0]), ent, cm))
    assert int(d3s.nonfinite_scores(as_bool, ent, cm)) == 0
    assert "bool advantages count as 0/1" in d3s.token_scores.__doc__


def test_per_row_and_per_token_advantages_of_shape_s_1_and_s_t():
    g = torch.Generator().manual_seed(1)
    adv, ent = torch.randn(3, generator=g), torch.rand(3, 4, generator=g)
    cm = torch.ones(3, 4, dtype=torch.bool)
    want = d3s.token_scores(adv, ent, cm)
    assert torch.equal(d3s.token_scores(adv[:, None], ent, cm), want)
    assert torch.equal(d3s.token_scores(adv[:, None].expand(3, 4), ent, cm), want)
