"""The whole D3S step with N = G and K = 100% is plain GRPO, exactly."""

import subprocess
import sys

import pytest
import torch

import d3s


def plain_grpo_loss(logps, old, rewards, mask, G, eps=0.2, aggregation="token"):
    """GRPO as TRL writes it (bnpo / grpo aggregation), no D3S anywhere."""
    grouped = rewards.view(-1, G)
    adv = (rewards - grouped.mean(1).repeat_interleave(G)) / (grouped.std(1).repeat_interleave(G) + 1e-4)
    c1 = torch.exp(logps - old)
    c2 = torch.clamp(c1, 1 - eps, 1 + eps)
    ptl = -torch.min(c1 * adv.unsqueeze(1), c2 * adv.unsqueeze(1))
    if aggregation == "token":
        return (ptl * mask).sum() / mask.sum().clamp(min=1)
    return ((ptl * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def d3s_step(logps, old, rewards, mask, G, n_keep, fraction, mode, aggregation="token"):
    adv = d3s.group_advantages(rewards, G)
    sel = d3s.select_rollouts(adv, rewards, G, n_keep, mode)
    lp, o, m = logps[sel.indices], old[sel.indices], mask[sel.indices]
    ent = torch.rand(m.shape)  # any entropies: K = 100% keeps every valid token anyway
    tmask = d3s.token_mask(sel.advantages, ent, m, fraction)
    return d3s.policy_loss(lp, o, sel.advantages, m, token_mask=tmask, aggregation=aggregation)[0]


@pytest.mark.parametrize("mode", ["none", "intra", "cross"])
@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_full_keep_is_plain_grpo(mode, aggregation):
    g = torch.Generator().manual_seed(0)
    B, G, T = 4, 8, 12
    rewards = torch.randint(0, 3, (B * G,), generator=g).float()  # mixed groups, distinct std
    rewards[:G] = torch.arange(G).float()  # no all-equal group: TRL's rounding == ours exactly
    logps = (-torch.rand(B * G, T, generator=g) * 2).requires_grad_(True)
    old = logps.detach() + 0.2 * torch.randn(B * G, T, generator=g)
    lengths = torch.randint(1, T + 1, (B * G,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()

    ref = plain_grpo_loss(logps, old, rewards, mask, G, aggregation=aggregation)
    got = d3s_step(logps, old, rewards, mask, G, n_keep=G, fraction=1.0, mode=mode, aggregation=aggregation)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-7)
    g_ref = torch.autograd.grad(ref, logps)[0]
    g_got = torch.autograd.grad(got, logps)[0]
    torch.testing.assert_close(g_got, g_ref, rtol=1e-6, atol=1e-8)


def test_down_sampling_changes_the_step():
    g = torch.Generator().manual_seed(1)
    B, G, T = 4, 8, 6
    rewards = torch.rand(B * G, generator=g)
    logps = (-torch.rand(B * G, T, generator=g)).requires_grad_(True)
    mask = torch.ones(B * G, T)
    full = d3s_step(logps, logps.detach(), rewards, mask, G, G, 1.0, "cross")
    cut = d3s_step(logps, logps.detach(), rewards, mask, G, 2, 0.2, "cross")
    assert not torch.allclose(full, cut)


def test_import_d3s_needs_torch_only():
    code = (
        "import sys, d3s; heavy = [m for m in ('trl', 'transformers', 'accelerate', 'datasets', 'peft') "
        "if m in sys.modules]; print(heavy); assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
