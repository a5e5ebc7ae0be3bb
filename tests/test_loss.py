"""Policy loss (paper eqs. 1, 3, 10) against a plain loop, gradcheck and closed forms."""

import math

import pytest
import torch

import d3s
from d3s.loss import clip_shares, k3_kl


def make_batch(seed, S=5, T=7, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logps = (-torch.rand(S, T, generator=g, dtype=dtype) * 3).requires_grad_(True)
    old = logps.detach() + torch.randn(S, T, generator=g, dtype=dtype) * 0.3
    ref = logps.detach() + torch.randn(S, T, generator=g, dtype=dtype) * 0.2
    adv = torch.randn(S, generator=g, dtype=dtype)
    lengths = torch.randint(0, T + 1, (S,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(dtype)
    tmask = torch.rand(S, T, generator=g) < 0.5
    return logps, old, ref, adv, mask, tmask


def loop_loss(logps, old, ref, adv, mask, tmask, *, level, el, eh, beta, normalizer, aggregation):
    """Token by token, in plain Python floats, following METHOD section 5."""
    S, T = logps.shape
    lp, o, r = logps.tolist(), old.tolist(), ref.tolist()
    seq_terms, tok_sum, n_used, n_valid, rows_used = [], 0.0, 0, 0, 0
    for i in range(S):
        valid = [t for t in range(T) if mask[i, t] > 0]
        used = [t for t in valid if tmask is None or tmask[i, t]]
        if level == "sequence_token":
            s = math.exp(sum(lp[i][t] - o[i][t] for t in valid) / max(len(valid), 1))
        row = 0.0
        for t in used:
            ratio = math.exp(lp[i][t] - o[i][t]) if level == "token" else s
            a = float(adv[i])
            term = -min(ratio * a, min(max(ratio, 1 - el), 1 + eh) * a)
            if beta:
                d = r[i][t] - lp[i][t]
                term += beta * (math.exp(d) - d - 1)
            row += term
        tok_sum += row
        n_used += len(used)
        n_valid += len(valid)
        rows_used += len(used) > 0
        div = len(used) if normalizer == "selected" else len(valid)
        seq_terms.append(row / max(div, 1))
    if aggregation == "token":
        return tok_sum / max(n_used if normalizer == "selected" else n_valid, 1)
    if normalizer == "selected":
        return sum(seq_terms) / max(rows_used, 1)
    return sum(seq_terms) / S


@pytest.mark.parametrize("level", ["token", "sequence_token"])
@pytest.mark.parametrize("normalizer", ["selected", "all"])
@pytest.mark.parametrize("aggregation", ["token", "sequence"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("masked", [False, True])
def test_matches_plain_loop(level, normalizer, aggregation, beta, masked):
    logps, old, ref, adv, mask, tmask = make_batch(11)
    tmask = tmask if masked else None
    loss, metrics = d3s.policy_loss(
        logps, old, adv, mask, token_mask=tmask, importance_sampling_level=level, epsilon_low=0.2,
        epsilon_high=0.28, beta=beta, ref_per_token_logps=ref, normalizer=normalizer, aggregation=aggregation,
    )
    expected = loop_loss(logps, old, ref, adv, mask, tmask, level=level, el=0.2, eh=0.28, beta=beta,
                         normalizer=normalizer, aggregation=aggregation)
    assert loss.item() == pytest.approx(expected, rel=1e-10, abs=1e-12)
    used = mask.bool() & (tmask if tmask is not None else True)
    assert metrics["tokens_used"].item() == used.sum().item()
    assert all(not v.requires_grad for v in metrics.values())


@pytest.mark.parametrize("normalizer", ["selected", "all"])
def test_gradcheck_token_level(normalizer):
    # (GSPO-token's stop-gradients make its analytic gradient differ from finite differences by
    # design; its gradient is checked against TRL's sequence-level GSPO below.)
    logps, old, ref, adv, mask, tmask = make_batch(3, S=3, T=4)
    f = lambda lp: d3s.policy_loss(lp, old, adv, mask, token_mask=tmask, beta=0.1, ref_per_token_logps=ref,
                                   normalizer=normalizer)[0]
    assert torch.autograd.gradcheck(f, (logps,))


def test_selected_vs_all_normalizer_closed_form():
    """On-policy (ratio 1), beta 0, one advantage: loss = -A * used/denominator."""
    S, T = 4, 10
    logps = torch.zeros(S, T, requires_grad=True)
    mask = torch.ones(S, T)
    tmask = torch.zeros(S, T, dtype=torch.bool)
    tmask[:, :2] = True  # K = 20%
    adv = torch.full((S,), 2.0)
    sel, _ = d3s.policy_loss(logps, None, adv, mask, token_mask=tmask, normalizer="selected")
    all_, _ = d3s.policy_loss(logps, None, adv, mask, token_mask=tmask, normalizer="all")
    assert sel.item() == pytest.approx(-2.0)
    assert all_.item() == pytest.approx(-2.0 * 0.2)  # a K-times smaller step


def test_masked_tokens_get_no_gradient_and_kl_only_on_kept():
    logps, old, ref, adv, mask, tmask = make_batch(5)
    loss, m = d3s.policy_loss(logps, old, adv, mask, token_mask=tmask, beta=0.5, ref_per_token_logps=ref)
    loss.backward()
    dropped = ~(mask.bool() & tmask)
    assert (logps.grad[dropped] == 0).all()
    assert (logps.grad[~dropped] != 0).any()
    used = (mask.bool() & tmask).double()
    d = ref - logps.detach()
    assert m["kl"].item() == pytest.approx(((d.exp() - d - 1) * used).sum().item() / used.sum().item())


def test_gspo_token_value_is_sequence_ratio_and_gradient_is_per_token():
    logps, old, _, adv, mask, _ = make_batch(8)
    # value: every token's ratio equals the length-normalised sequence ratio
    log_ratio = logps.detach() - old
    seq = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    w = logps - logps.detach() + seq.unsqueeze(1)
    assert torch.equal(torch.exp(w).detach(), torch.exp(seq).unsqueeze(1).expand_as(w))
    # gradient: masking one token removes exactly that token's gradient, others unchanged
    tmask = mask.bool().clone()
    tmask[0, 3] = False
    g_full = torch.autograd.grad(d3s.policy_loss(logps, old, adv, mask, importance_sampling_level="sequence_token",
                                                 aggregation="sequence", normalizer="all")[0], logps)[0]
    g_mask = torch.autograd.grad(d3s.policy_loss(logps, old, adv, mask, token_mask=tmask, aggregation="sequence",
                                                 importance_sampling_level="sequence_token", normalizer="all")[0],
                                 logps)[0]
    assert g_mask[0, 3] == 0 and g_full[0, 3] != 0
    keep = torch.ones_like(tmask)
    keep[0, 3] = False
    torch.testing.assert_close(g_mask[keep], g_full[keep])


def test_gspo_token_unmasked_has_trls_sequence_level_gradient():
    """Without a token mask, GSPO-token + per-sequence mean has the gradient of TRL's GSPO."""
    logps, old, _, adv, mask, _ = make_batch(9)
    eps = 0.2
    loss, _ = d3s.policy_loss(logps, old, adv, mask, importance_sampling_level="sequence_token",
                              aggregation="sequence", normalizer="all", epsilon_low=eps, epsilon_high=eps)
    # TRL: coef (S, 1) = exp(mean log-ratio), loss broadcast over T, per-sequence mean, mean over rows
    lw = ((logps - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    c1 = torch.exp(lw).unsqueeze(1)
    c2 = torch.clamp(c1, 1 - eps, 1 + eps)
    ptl = -torch.min(c1 * adv.unsqueeze(1), c2 * adv.unsqueeze(1)).expand_as(mask)
    trl_loss = ((ptl * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-12)
    g1 = torch.autograd.grad(loss, logps)[0]
    g2 = torch.autograd.grad(trl_loss, logps)[0]
    torch.testing.assert_close(g1, g2)


def test_denominator_override_and_empty_batch():
    logps, old, _, adv, mask, tmask = make_batch(2)
    l1, _ = d3s.policy_loss(logps, old, adv, mask, token_mask=tmask)
    l2, _ = d3s.policy_loss(logps, old, adv, mask, token_mask=tmask, denominator=1000.0)
    n = (mask.bool() & tmask).sum().item()
    assert l2.item() == pytest.approx(l1.item() * n / 1000.0)
    empty = torch.zeros(0, 5, requires_grad=True)
    loss, m = d3s.policy_loss(empty, None, torch.zeros(0), torch.zeros(0, 5))
    assert loss.item() == 0.0 and m["tokens_used"].item() == 0
    loss.backward()


def test_clip_metrics():
    logps = torch.zeros(2, 2, requires_grad=True)
    old = torch.tensor([[math.log(2.0), 0.0], [-math.log(2.0), 0.0]])  # ratios 0.5, 1, 2, 1
    adv = torch.tensor([-1.0, 1.0])
    _, m = d3s.policy_loss(logps, old, adv, torch.ones(2, 2))
    assert m["clip_ratio/low_mean"].item() == pytest.approx(0.25)
    assert m["clip_ratio/high_mean"].item() == pytest.approx(0.25)
    assert m["clip_ratio/region_mean"].item() == pytest.approx(0.5)


def test_bad_arguments():
    logps, old, ref, adv, mask, _ = make_batch(0)
    with pytest.raises(ValueError, match="normalizer='mean'"):
        d3s.policy_loss(logps, old, adv, mask, normalizer="mean")
    with pytest.raises(ValueError, match="importance_sampling_level='sequence'"):
        d3s.policy_loss(logps, old, adv, mask, importance_sampling_level="sequence")
    with pytest.raises(ValueError, match="beta=0.1 needs ref_per_token_logps"):
        d3s.policy_loss(logps, old, adv, mask, beta=0.1)


@pytest.mark.parametrize("level", ["token", "sequence_token"])
def test_importance_weighted_kl_matches_trls_bias_correction(level):
    """TRL's use_bias_correction_kl: KL x importance ratio (token ratio, or the sequence ratio with
    its gradient through every token), added after the surrogate."""
    logps, old, ref, adv, mask, _ = make_batch(4)
    beta = 0.3
    loss, _ = d3s.policy_loss(logps, old, adv, mask, importance_sampling_level=level, beta=beta,
                              ref_per_token_logps=ref, kl_importance_weighted=True)
    log_ratio = logps - old
    if level == "token":
        w = torch.exp(log_ratio)
        surrogate_w = w
    else:
        w = torch.exp((log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1))
        surrogate_w = torch.exp(logps - logps.detach()) * w.detach()
    a = adv.unsqueeze(1)
    ptl = -torch.min(surrogate_w * a, torch.clamp(surrogate_w, 0.8, 1.2) * a)
    d = ref - logps
    ptl = ptl + beta * (torch.exp(d) - d - 1) * w
    expected = (ptl * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-10)
    torch.testing.assert_close(torch.autograd.grad(loss, logps)[0], torch.autograd.grad(expected, logps)[0])


# -- k3_kl ----------------------------------------------------------------------------------------------


def test_k3_kl_closed_form_at_scalars():
    ln2 = math.log(2.0)
    cases = [(0.0, 0.0, 0.0), (0.0, ln2, 1.0 - ln2), (ln2, 0.0, ln2 - 0.5), (-1.0, -3.0, math.exp(-2.0) + 1.0),
             (-3.0, -1.0, math.exp(2.0) - 3.0), (-0.25, -0.25, 0.0)]
    for logp, ref, expected in cases:
        got = k3_kl(torch.tensor(logp, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64))
        assert got.item() == pytest.approx(expected, rel=1e-14, abs=1e-15)


@pytest.mark.parametrize("seed", range(10))
def test_k3_kl_matches_loop_nonnegative_and_zero_iff_equal(seed):
    g = torch.Generator().manual_seed(seed)
    S, T = (int(x) for x in torch.randint(1, 9, (2,), generator=g))
    logps = -torch.rand(S, T, generator=g, dtype=torch.float64) * 5
    delta = torch.randn(S, T, generator=g, dtype=torch.float64) * 2
    delta = delta.sign() * delta.abs().clamp(min=1e-2)  # away from 0, where rounding decides the sign
    equal = torch.rand(S, T, generator=g) < 0.3
    ref = torch.where(equal, logps, logps + delta)
    got = k3_kl(logps, ref)
    assert got.shape == (S, T)
    for i in range(S):
        for t in range(T):
            d = ref[i, t].item() - logps[i, t].item()
            assert got[i, t].item() == pytest.approx(math.exp(d) - d - 1, rel=1e-12, abs=1e-15)
            if equal[i, t]:
                assert got[i, t].item() == 0.0
            else:
                assert got[i, t].item() > 0.0
    g32 = k3_kl(logps.float(), ref.float())
    assert (g32[~equal] > 0).all() and (g32[equal] == 0).all()


def test_k3_kl_expectation_is_the_exact_kl():
    """Sampled under pi_theta, k3 is unbiased: sum_x p(x) k3(log p(x), log q(x)) = KL(p || q) (enumerated)."""
    g = torch.Generator().manual_seed(0)
    for V in (2, 3, 10, 50):
        p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 2, 0)
        q = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 2, 0)
        k = k3_kl(p.log(), q.log())
        expectation = sum(p[x].item() * k[x].item() for x in range(V))
        kl = sum(p[x].item() * math.log(p[x].item() / q[x].item()) for x in range(V))
        assert expectation == pytest.approx(kl, rel=1e-10)


def test_k3_kl_broadcasts_and_differentiates_in_both_arguments():
    g = torch.Generator().manual_seed(1)
    logps = (-torch.rand(3, 4, generator=g, dtype=torch.float64)).requires_grad_(True)
    ref = (-torch.rand(3, 1, generator=g, dtype=torch.float64)).requires_grad_(True)
    kl = k3_kl(logps, ref)
    assert kl.shape == (3, 4)
    kl.sum().backward()
    for i in range(3):
        d_ref = 0.0
        for t in range(4):
            d = ref[i, 0].item() - logps[i, t].item()
            assert kl[i, t].item() == pytest.approx(math.exp(d) - d - 1, rel=1e-12, abs=1e-15)
            assert logps.grad[i, t].item() == pytest.approx(1.0 - math.exp(d), rel=1e-12, abs=1e-15)
            d_ref += math.exp(d) - 1.0
        assert ref.grad[i, 0].item() == pytest.approx(d_ref, rel=1e-12, abs=1e-15)


# -- clip_shares ----------------------------------------------------------------------------------------


def clip_shares_loop(coef, advantages, used, el, eh):
    """Per row, over the used (nonzero) tokens: share with ratio < 1 - el and A < 0, and ratio > 1 + eh and A > 0."""
    lows, highs = [], []
    for row, a, u in zip(coef.tolist(), advantages.tolist(), used.tolist()):
        tokens = [c for c, keep in zip(row, u) if keep != 0]
        if not tokens:
            lows.append(float("nan"))
            highs.append(float("nan"))
            continue
        lows.append(sum(1 for c in tokens if c < 1 - el and a < 0) / len(tokens))
        highs.append(sum(1 for c in tokens if c > 1 + eh and a > 0) / len(tokens))
    return torch.tensor(lows, dtype=torch.float32), torch.tensor(highs, dtype=torch.float32)


@pytest.mark.parametrize("used_dtype", [torch.bool, torch.int64, torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(8))
def test_clip_shares_matches_loop(seed, used_dtype):
    g = torch.Generator().manual_seed(seed)
    S, T = (int(x) for x in torch.randint(1, 12, (2,), generator=g))
    # ratios on a grid of 1/8 and dyadic epsilons, so that ratios exactly at 1 - el / 1 + eh occur
    coef = torch.randint(0, 17, (S, T), generator=g).double() / 8
    advantages = torch.randint(-2, 3, (S,), generator=g).double()  # zero advantages included
    used = (torch.rand(S, T, generator=g) < 0.6).to(used_dtype)
    used[0] = 0  # a row with no used token
    el, eh = [0.25, 0.125, 0.5][seed % 3], [0.25, 0.375, 0.5][(seed // 3) % 3]
    low, high = clip_shares(coef, advantages, used, el, eh)
    ref_low, ref_high = clip_shares_loop(coef, advantages, used, el, eh)
    assert low.dtype == high.dtype == torch.float32 and low.shape == high.shape == (S,)
    torch.testing.assert_close(low, ref_low, equal_nan=True)
    torch.testing.assert_close(high, ref_high, equal_nan=True)
    assert torch.isnan(low[0]) and torch.isnan(high[0])


def test_clip_shares_edge_cases():
    coef = torch.tensor([[0.5, 0.8, 1.0, 1.2, 2.0]], dtype=torch.float64)
    used = torch.ones(1, 5)
    # the bounds themselves are not clipped (strict inequalities); each side needs its advantage sign
    low, high = clip_shares(coef, torch.tensor([-1.0]), used, 0.25, 0.25)
    assert (low.item(), high.item()) == (pytest.approx(0.2), 0.0)
    assert [x.item() for x in clip_shares(coef, torch.tensor([1.0]), used, 0.5, 1.0)] == [0.0, 0.0]
    low, high = clip_shares(coef, torch.tensor([1.0]), used, 0.5, 0.5)
    assert (low.item(), high.item()) == (0.0, pytest.approx(0.2))
    assert [x.item() for x in clip_shares(coef, torch.tensor([0.0]), used, 0.1, 0.1)] == [0.0, 0.0]
    low, high = clip_shares(torch.zeros(0, 3), torch.zeros(0), torch.zeros(0, 3), 0.2, 0.2)
    assert low.shape == high.shape == (0,)


def test_clip_shares_counts_nonzero_used_entries_as_tokens():
    """`used`: nonzero = used, so a mask holding 2 (or 0.5) counts that token once, as a bool mask does."""
    coef = torch.tensor([[0.5, 1.0, 1.0, 0.5]])
    adv = torch.tensor([-1.0])
    for used in (torch.tensor([[1, 2, 0, 3]]), torch.tensor([[0.5, 1.0, 0.0, 1.0]])):
        torch.testing.assert_close(clip_shares(coef, adv, used, 0.2, 0.2),
                                   clip_shares(coef, adv, used != 0, 0.2, 0.2))
        torch.testing.assert_close(clip_shares(coef, adv, used, 0.2, 0.2)[0], torch.tensor([2 / 3]))


def test_clip_shares_of_low_precision_ratios_are_float32_shares():
    """bfloat16 ratios (logits of a bf16 model): the comparisons are exact, the shares are returned in
    float32 and must be float32-accurate, as TRL's `.float()` means (bf16 counts past 256 are not)."""
    T = 301
    coef = torch.ones(2, T, dtype=torch.bfloat16)
    coef[:, :3] = 0.5
    coef[1, 3:10] = 2.0
    low, high = clip_shares(coef, torch.tensor([-1.0, 1.0]), torch.ones(2, T), 0.2, 0.2)
    ref_low, ref_high = clip_shares_loop(coef.float(), torch.tensor([-1.0, 1.0]), torch.ones(2, T), 0.2, 0.2)
    torch.testing.assert_close(low, ref_low)
    torch.testing.assert_close(high, ref_high)
