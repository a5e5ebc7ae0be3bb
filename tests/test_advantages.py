"""Advantages (paper eq. 2) against a plain per-group loop with TRL's conventions."""

import math

import pytest
import torch

import d3s
from d3s.advantages import weighted_rewards, zero_where_flat


def loop_reference(rewards, G, scale, eps=1e-4):
    """Plain-Python advantages: Bessel std, eps on the std, NaN left out, equal group -> 0."""
    r = [float(x) for x in rewards]
    valid_all = [x for x in r if not math.isnan(x)]
    if scale == "batch":
        mu = sum(valid_all) / len(valid_all)
        batch_std = math.sqrt(sum((x - mu) ** 2 for x in valid_all) / (len(valid_all) - 1))
    out = []
    for g in range(0, len(r), G):
        grp = r[g : g + G]
        valid = [x for x in grp if not math.isnan(x)]
        for x in grp:
            if math.isnan(x) or len(valid) == 0 or max(valid) == min(valid):
                out.append(0.0)
                continue
            mean = sum(valid) / len(valid)
            if scale == "none":
                out.append(x - mean)
            elif scale == "group":
                if len(valid) < 2:
                    out.append(0.0)
                    continue
                std = math.sqrt(sum((v - mean) ** 2 for v in valid) / (len(valid) - 1))
                out.append((x - mean) / (std + eps))
            else:
                out.append((x - mean) / (batch_std + eps))
    return out


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("seed", range(5))
def test_matches_loop(scale, seed):
    g = torch.Generator().manual_seed(seed)
    G = 2 + seed
    rewards = torch.rand(6 * G, generator=g, dtype=torch.float64)
    rewards[torch.rand(6 * G, generator=g) < 0.15] = float("nan")
    rewards[:G] = 0.25  # one all-equal group
    got = d3s.group_advantages(rewards, G, scale_rewards=scale)
    torch.testing.assert_close(got, torch.tensor(loop_reference(rewards.tolist(), G, scale), dtype=torch.float64))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_matches_trl_formula_bitwise(scale):
    """The exact arithmetic of TRL's GRPOTrainer (nanmean, its nanstd, + 1e-4)."""
    nanstd = pytest.importorskip("trl.trainer.utils").nanstd
    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 5, (8 * 16,), generator=g).float() / 4
    rewards[5] = float("nan")
    grouped = rewards.view(-1, 16)
    ref = rewards - torch.nanmean(grouped, dim=1).repeat_interleave(16)
    if scale == "group":
        ref = ref / (nanstd(grouped, dim=1).repeat_interleave(16) + 1e-4)
    elif scale == "batch":
        ref = ref / (nanstd(rewards) + 1e-4)
    ref = torch.nan_to_num(ref, nan=0.0)
    assert torch.equal(d3s.group_advantages(rewards, 16, scale_rewards=scale), ref)


def test_all_equal_group_is_exactly_zero_never_nan():
    single = d3s.group_advantages(torch.full((8,), 0.1), 4)
    assert torch.equal(single, torch.zeros(8))  # 0.1 * 4 / 4 != 0.1 in float, still exactly 0


def test_nan_rewards_get_zero_and_are_left_out_of_stats():
    nan = float("nan")
    adv = d3s.group_advantages(torch.tensor([1.0, 0.0, nan, 1.0]), 4)
    ref = torch.tensor(loop_reference([1.0, 0.0, nan, 1.0], 4, "group"))
    torch.testing.assert_close(adv, ref)
    assert adv[2] == 0
    assert torch.equal(d3s.group_advantages(torch.tensor([nan, nan, 1.0, nan]), 4), torch.zeros(4))


def test_bad_input():
    with pytest.raises(ValueError, match="num_generations=3"):
        d3s.group_advantages(torch.rand(8), 3)
    with pytest.raises(ValueError, match="scale_rewards='sequence'"):
        d3s.group_advantages(torch.rand(8), 4, scale_rewards="sequence")
    with pytest.raises(ValueError, match=r"\(B\*G,\)"):
        d3s.group_advantages(torch.rand(2, 4), 4)


def test_equal_rewards_differ_from_trls_residue_by_design():
    """Sixteen rewards of 0.1: TRL's float arithmetic leaves a residue (mean != 0.1), ours is exactly 0."""
    nanstd = pytest.importorskip("trl.trainer.utils").nanstd
    rewards = torch.full((16,), 0.1)
    trl_style = (rewards - torch.nanmean(rewards)) / (nanstd(rewards) + 1e-4)
    assert trl_style.abs().max() > 0  # the residue the docstring names
    assert torch.equal(d3s.group_advantages(rewards, 16), torch.zeros(16))


# -- weighted_rewards ---------------------------------------------------------------------------------


def weighted_loop(rows, weights):
    """sum_f w_f * r_f over the functions that scored the rollout; NaN when none did."""
    out = []
    for row in rows:
        scored = [(w, r) for w, r in zip(weights, row) if not math.isnan(r)]
        out.append(sum(w * r for w, r in scored) if scored else float("nan"))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_weighted_rewards_matches_loop(seed):
    g = torch.Generator().manual_seed(seed)
    N, F = (int(x) for x in torch.randint(1, 13, (2,), generator=g))
    dtype = torch.float64 if seed % 2 else torch.float32
    rows = torch.randn(N, F, generator=g, dtype=dtype)
    rows[torch.rand(N, F, generator=g) < 0.4] = float("nan")
    rows[0] = float("nan")  # a rollout no function scored
    weights = torch.randn(F, generator=g, dtype=dtype)
    weights[torch.rand(F, generator=g) < 0.2] = 0.0  # a zero weight still counts as "scored"
    rows_before, weights_before = rows.clone(), weights.clone()
    got = weighted_rewards(rows, weights)
    expected = torch.tensor(weighted_loop(rows.tolist(), weights.tolist()), dtype=dtype)
    assert got.shape == (N,)
    torch.testing.assert_close(got, expected, equal_nan=True)
    assert torch.isnan(got[0])
    assert torch.equal(rows.isnan(), rows_before.isnan()) and torch.equal(rows.nan_to_num(), rows_before.nan_to_num())
    assert torch.equal(weights, weights_before)


def test_weighted_rewards_edge_cases():
    nan = float("nan")
    rows = torch.tensor([[1.0, nan], [nan, nan], [nan, 2.0], [3.0, 4.0], [5.0, nan]])
    got = weighted_rewards(rows, torch.tensor([0.5, 0.0]))
    torch.testing.assert_close(got, torch.tensor([0.5, nan, 0.0, 1.5, 2.5]), equal_nan=True)
    # integer weights, and no reward function at all: nothing scored any rollout
    torch.testing.assert_close(weighted_rewards(rows, torch.tensor([2, 1])), torch.tensor([2.0, nan, 2.0, 10.0, 10.0]),
                               equal_nan=True)
    assert torch.isnan(weighted_rewards(torch.zeros(3, 0), torch.zeros(0))).all()
    assert weighted_rewards(torch.zeros(0, 2), torch.ones(2)).shape == (0,)


def test_weighted_rewards_bad_input():
    with pytest.raises(ValueError, match="rewards_per_func must be a torch.Tensor"):
        weighted_rewards([[1.0, 2.0]], torch.ones(2))
    with pytest.raises(ValueError, match="rewards_per_func must be 2-D"):
        weighted_rewards(torch.ones(4), torch.ones(1))
    with pytest.raises(ValueError, match="rewards_per_func must be a float tensor"):
        weighted_rewards(torch.ones(4, 2, dtype=torch.int64), torch.ones(2))
    with pytest.raises(ValueError, match="reward_weights must be 1-D"):
        weighted_rewards(torch.ones(4, 2), torch.ones(1, 2))
    with pytest.raises(ValueError, match="reward_weights must be a torch.Tensor"):
        weighted_rewards(torch.ones(4, 2), [1.0, 1.0])


@pytest.mark.parametrize("F,num_weights", [(1, 3), (3, 1), (2, 3)])
def test_weighted_rewards_refuses_weights_of_another_function_count(F, num_weights):
    """`(B*G, F)` rewards need `(F,)` weights; broadcasting (1 against 3) would silently sum copies."""
    with pytest.raises((ValueError, RuntimeError)):
        weighted_rewards(torch.ones(4, F), torch.ones(num_weights))


# -- zero_where_flat ----------------------------------------------------------------------------------


def zero_positions_loop(rewards, G):
    """Where group_advantages is exactly 0: NaN rewards, groups whose valid rewards are all equal
    (one or none valid included), and rewards exactly equal to their group's mean (exact arithmetic)."""
    from fractions import Fraction

    out = []
    for start in range(0, len(rewards), G):
        grp = rewards[start : start + G]
        valid = [Fraction(x) for x in grp if not math.isnan(x)]
        flat = len(valid) == 0 or max(valid) == min(valid)
        mean = sum(valid) / len(valid) if valid else None
        out += [math.isnan(x) or flat or Fraction(x) == mean for x in grp]
    return out


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("seed", range(8))
def test_zero_where_flat_matches_loop(scale, seed):
    g = torch.Generator().manual_seed(seed)
    G = int(torch.randint(1, 7, (1,), generator=g))
    B = int(torch.randint(1, 9, (1,), generator=g))
    rewards = torch.randint(0, 3, (B * G,), generator=g).double() / 4  # many flat groups
    rewards[torch.rand(B * G, generator=g) < 0.2] = float("nan")
    advantages = torch.randn(B * G, generator=g) * 1e-5 + torch.randn(B * G, generator=g)  # a trainer's, noisy
    before = advantages.clone()
    got = zero_where_flat(advantages, rewards, G, scale_rewards=scale)
    zero = zero_positions_loop(rewards.tolist(), G)
    for i in range(B * G):
        assert got[i].item() == (0.0 if zero[i] else advantages[i].item())  # others unchanged, bit for bit
    assert got.dtype == advantages.dtype and torch.equal(advantages, before)


def test_zero_where_flat_edge_cases():
    nan = float("nan")
    residue = torch.tensor([7.45e-5, -7.45e-5, 1e-6, 0.3, -0.3, 2.0])
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.0, 1.0, nan])  # G = 3: a flat group; a group with a NaN
    torch.testing.assert_close(zero_where_flat(residue, rewards, 3), torch.tensor([0.0, 0.0, 0.0, 0.3, -0.3, 0.0]))
    # a single valid reward in its group, and a reward exactly at its group's mean
    got = zero_where_flat(torch.tensor([0.5, 0.5, 0.2, 0.1, 0.3]), torch.tensor([nan, 1.0, 0.0, 1.0, 2.0]), 1)
    assert torch.equal(got, torch.zeros(5))
    got = zero_where_flat(torch.tensor([-0.9, 1e-7, 0.9]), torch.tensor([0.0, 1.0, 2.0]), 3)
    assert torch.equal(got, torch.tensor([-0.9, 0.0, 0.9]))
    assert zero_where_flat(torch.zeros(0), torch.zeros(0), 4).shape == (0,)


def test_zero_where_flat_bad_input():
    with pytest.raises(ValueError, match="advantages must be a float tensor"):
        zero_where_flat(torch.ones(4, dtype=torch.int64), torch.rand(4), 2)
    with pytest.raises(ValueError, match="advantages must be 1-D"):
        zero_where_flat(torch.ones(2, 2), torch.rand(4), 2)
    with pytest.raises(ValueError, match=r"advantages \(6,\) and rewards \(4,\) must have the same shape"):
        zero_where_flat(torch.ones(6), torch.rand(4), 2)
    with pytest.raises(ValueError, match="num_generations=3"):
        zero_where_flat(torch.ones(4), torch.rand(4), 3)
    with pytest.raises(ValueError, match="scale_rewards='sequence'"):
        zero_where_flat(torch.ones(4), torch.rand(4), 2, scale_rewards="sequence")
    with pytest.raises(ValueError, match="rewards must be finite or NaN"):
        zero_where_flat(torch.ones(4), torch.tensor([0.0, float("inf"), 1.0, 1.0]), 2)
