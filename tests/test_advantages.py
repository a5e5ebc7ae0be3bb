"""Advantages (paper eq. 2) against a plain per-group loop with TRL's conventions."""

import math

import pytest
import torch

import d3s


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
