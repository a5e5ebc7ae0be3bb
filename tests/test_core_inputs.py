"""The core's public functions on any input: a correct result against an independent reference, or a
ValueError naming the argument. Property-based (hypothesis) over shapes, values, NaNs and scalar types."""

from __future__ import annotations

import itertools
import math
import statistics
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import d3s

PROPS = settings(max_examples=60, deadline=None)

# Rewards from a small set so that ties and all-equal groups are common; NaN = unscorable.
reward_values = st.sampled_from([0.0, 0.0, 1.0, 1.0, 0.5, -1.0, 2.5, float("nan")])


@st.composite
def reward_batches(draw, max_groups=4, max_g=6):
    G = draw(st.integers(1, max_g))
    B = draw(st.integers(1, max_groups))
    return torch.tensor(draw(st.lists(reward_values, min_size=B * G, max_size=B * G))), G  # float32, as TRL


def loop_advantages(rewards: list[float], G: int, eps: float) -> list[float]:
    """Paper eq. 2 with TRL's conventions, one group at a time in plain Python (statistics.stdev)."""
    out = []
    for g in range(0, len(rewards), G):
        group = rewards[g : g + G]
        valid = [r for r in group if not math.isnan(r)]
        if len(valid) < 2 or max(valid) == min(valid):
            out += [0.0] * len(group)
            continue
        mean, std = statistics.fmean(valid), statistics.stdev(valid)
        out += [0.0 if math.isnan(r) else (r - mean) / (std + eps) for r in group]
    return out


# ---------------------------------------------------------------------------------------------
# Results against independent references
# ---------------------------------------------------------------------------------------------


@PROPS
@given(reward_batches(), st.sampled_from([0.0, 1e-4, 0.5]))
def test_group_advantages_match_a_plain_loop(batch, eps):
    rewards, G = batch
    got = d3s.group_advantages(rewards, G, eps=eps)
    want = torch.tensor(loop_advantages(rewards.tolist(), G, eps))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.isfinite(got).all()


def test_nan_rewards_are_tolerated_as_documented():
    """A NaN reward (a reward function that returned None) gets advantage 0, and its group's other
    rollouts get the advantages they would have without it."""
    with_nan = d3s.group_advantages(torch.tensor([1.0, float("nan"), 0.0, 2.0]), 4)
    without = d3s.group_advantages(torch.tensor([1.0, 0.0, 2.0]), 3)
    assert with_nan[1] == 0.0
    torch.testing.assert_close(with_nan[[0, 2, 3]], without)
    assert "NaN marks a rollout that could not be scored" in d3s.group_advantages.__doc__


@PROPS
@given(st.lists(st.integers(-3, 3).map(float), min_size=1, max_size=8), st.integers(1, 9))
def test_max_variance_subset_is_the_brute_force_maximum(values, n):
    x = torch.tensor(values, dtype=torch.float64)
    kept = d3s.max_variance_subset(x, n)
    m = len(values)
    assert kept.tolist() == sorted(set(kept.tolist())) and len(kept) == min(n, m)
    best = max(statistics.pvariance([values[i] for i in c]) for c in itertools.combinations(range(m), min(n, m)))
    assert statistics.pvariance([values[i] for i in kept.tolist()]) == pytest.approx(best, abs=1e-12)


@PROPS
@given(reward_batches(), st.integers(1, 6), st.sampled_from(["none", "intra", "cross", "pods"]))
def test_select_rollouts_keeps_only_scorable_rows_and_the_right_number(batch, n_keep, mode):
    rewards, G = batch
    adv = d3s.group_advantages(rewards, G)
    sel = d3s.select_rollouts(adv, rewards, G, n_keep, mode)
    valid = ~torch.isnan(rewards)
    assert not (sel.mask & ~valid).any()  # an unscorable rollout is never trained on
    per_group_valid = valid.view(-1, G).sum(1)
    if mode == "none":
        assert torch.equal(sel.mask, valid)
    elif mode in ("intra", "pods"):
        assert torch.equal(sel.kept_per_group, per_group_valid.clamp(max=n_keep))
    else:
        assert int(sel.mask.sum()) == min(n_keep * len(per_group_valid), int(valid.sum()))
    assert torch.equal(sel.indices, sel.mask.nonzero().flatten())
    assert torch.isfinite(sel.advantages).all()


@PROPS
@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_the_closed_form(nck):
    n, c, k = nck
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert d3s.pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-15)
    assert d3s.pass_at_k(np.int64(n), np.int32(c), torch.tensor(k)) == d3s.pass_at_k(n, c, k)


@PROPS
@given(
    st.integers(2, 32).flatmap(lambda G: st.tuples(st.just(G), st.integers(2, G), st.integers(2, G))),
    st.floats(0.01, 1.0), st.floats(0.01, 1.0), st.floats(0.0, 1.0),
)
def test_linear_schedule_bounds_and_endpoints(gn, k_init, k_final, p):
    G, n_init, n_final = gn
    n, k = d3s.linear_schedule(p, n_init, n_final, k_init, k_final, G)
    assert 2 <= n <= G and min(n_init, n_final) <= n <= max(n_init, n_final)
    assert min(k_init, k_final) - 1e-12 <= k <= max(k_init, k_final) + 1e-12
    assert d3s.linear_schedule(0.0, n_init, n_final, k_init, k_final, G) == (n_init, k_init)
    assert d3s.linear_schedule(1.0, n_init, n_final, k_init, k_final, G) == (n_final, k_final)
    # NumPy and torch scalars are numbers like any other
    assert d3s.linear_schedule(np.float32(p), np.int64(n_init), n_final, np.float64(k_init), k_final,
                               torch.tensor(G)) == d3s.linear_schedule(float(np.float32(p)), n_init, n_final,
                                                                       k_init, k_final, G)


@PROPS
@given(st.integers(1, 5), st.integers(1, 7), st.integers(0, 10_000), st.booleans())
def test_token_entropy_is_minus_sum_p_log_p(rows, vocab, seed, masked):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 5
    if masked and vocab > 1:
        logits[:, 0] = -float("inf")  # a masked vocabulary entry: p = 0 contributes nothing
    p = torch.softmax(logits.double(), dim=-1)
    want = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)
    torch.testing.assert_close(d3s.token_entropy(logits, chunk_size=2).double(), want, rtol=1e-5, atol=1e-5)


@PROPS
@given(st.integers(1, 4), st.integers(1, 5), st.integers(0, 10_000), st.sampled_from([0.1, 0.2, 1.0]))
def test_policy_loss_matches_a_token_loop(S, T, seed, eps):
    g = torch.Generator().manual_seed(seed)
    logps = -torch.rand(S, T, generator=g, dtype=torch.float64) * 3
    old = logps + 0.5 * torch.randn(S, T, generator=g, dtype=torch.float64)
    adv = torch.randn(S, generator=g, dtype=torch.float64)
    mask = torch.rand(S, T, generator=g) < 0.7
    loss, _ = d3s.policy_loss(logps, old, adv, mask, epsilon_low=eps, epsilon_high=eps)
    terms = []
    for i in range(S):
        for t in range(T):
            if mask[i, t]:
                r = math.exp(logps[i, t] - old[i, t])
                a = float(adv[i])
                terms.append(-min(r * a, min(max(r, 1 - eps), 1 + eps) * a))
    want = sum(terms) / max(len(terms), 1)
    assert float(loss) == pytest.approx(want, rel=1e-9, abs=1e-12)


# ---------------------------------------------------------------------------------------------
# Bad input: a ValueError naming the argument, never a wrong result
# ---------------------------------------------------------------------------------------------

R = torch.tensor([0.0, 1.0, 1.0, 0.0])
A = d3s.group_advantages(R, 2)
LP = torch.zeros(2, 3)
M = torch.ones(2, 3, dtype=torch.bool)
SC = torch.tensor([[3.0, 1.0, 2.0], [0.5, -float("inf"), 4.0]])  # token scores, one padding position

BAD_CALLS = {
    "rewards as a list": (lambda: d3s.group_advantages([0.0, 1.0], 2), "rewards must be a torch.Tensor"),
    "rewards 2-D": (lambda: d3s.group_advantages(R.view(2, 2), 2), r"rewards must be 1-D \(B\*G,\)"),
    "infinite reward": (lambda: d3s.group_advantages(torch.tensor([0.0, float("inf")]), 2),
                        "rewards must be finite or NaN .* found inf at index 1"),
    "float G": (lambda: d3s.group_advantages(R, 2.0), "num_generations=2.0 must be an integer"),
    "bool G": (lambda: d3s.group_advantages(R, True), "num_generations=True must be a number, not a bool"),
    "G not dividing": (lambda: d3s.group_advantages(R, 3), "num_generations=3"),
    "NaN eps": (lambda: d3s.group_advantages(R, 2, eps=float("nan")), "eps=nan must be a finite number >= 0"),
    "complex rewards": (lambda: d3s.group_advantages(R.to(torch.complex64), 2), "rewards must be a real tensor"),
    "n as float": (lambda: d3s.max_variance_subset(R, 2.5), "n=2.5 must be an integer >= 1"),
    "n as string": (lambda: d3s.max_variance_subset(R, "2"), "n='2' must be an integer"),
    "values not a tensor": (lambda: d3s.max_variance_subset([1.0, 2.0], 1), "values must be a torch.Tensor"),
    "n_keep float": (lambda: d3s.select_rollouts(A, R, 2, 1.5, "intra"), "n_keep=1.5 must be an integer"),
    "NaN advantage of a scored rollout": (
        lambda: d3s.select_rollouts(torch.tensor([0.0, float("nan"), 1.0, 0.0]), R, 2, 1, "cross"),
        "advantages must be finite for every scorable rollout"),
    "mode": (lambda: d3s.select_rollouts(A, R, 2, 1, "global"), "mode='global'; valid"),
    "c float": (lambda: d3s.pass_at_k(8, 2.7, 1), "c=2.7 must be an integer"),
    "k float": (lambda: d3s.pass_at_k(8, 2, 1.5), "k=1.5 must be an integer"),
    "n as bool": (lambda: d3s.avg_at_n(1, True), "n=True must be a number, not a bool"),
    "kept not bool": (lambda: d3s.sample_usefulness_rate(A, torch.ones(4), 2), "kept must be a bool tensor"),
    "kept shape": (lambda: d3s.sample_usefulness_rate(A, torch.ones(3, dtype=torch.bool), 2), r"kept \(3,\)"),
    "progress NaN": (lambda: d3s.linear_schedule(float("nan"), 2, 4, 0.1, 0.2, 8), "progress=nan must be in"),
    "progress bool": (lambda: d3s.linear_schedule(True, 2, 4, 0.1, 0.2, 8), "progress=True must be in"),
    "n_init float": (lambda: d3s.linear_schedule(0.5, 2.0, 4, 0.1, 0.2, 8), "n_init=2.0 must be an integer"),
    "k_final NaN": (lambda: d3s.linear_schedule(0.5, 2, 4, 0.1, float("nan"), 8), "k_final=nan must be"),
    "G float": (lambda: d3s.linear_schedule(0.5, 2, 4, 0.1, 0.2, 8.0), "num_generations=8.0 must be an integer"),
    "entropy of ints": (lambda: d3s.token_entropy(torch.ones(2, 3, dtype=torch.long)), "logits must be a float"),
    "entropy chunk": (lambda: d3s.token_entropy(LP, chunk_size=0.5), "chunk_size=0.5 must be an integer"),
    "entropy temperature": (lambda: d3s.token_entropy(LP, temperature=float("inf")), "temperature=inf"),
    "advantages of another batch": (lambda: d3s.policy_loss(LP, None, torch.ones(1), M),
                                    r"advantages \(1,\) must be \(S,\), \(S, 1\) or \(S, T\) with S=2"),
    "old logps shape": (lambda: d3s.policy_loss(LP, torch.zeros(2, 2), torch.ones(2), M),
                        r"old_per_token_logps \(2, 2\) must match"),
    "token_mask shape": (lambda: d3s.policy_loss(LP, None, torch.ones(2), M, token_mask=M[:, :2]),
                         r"token_mask \(2, 2\) must match"),
    "negative beta": (lambda: d3s.policy_loss(LP, None, torch.ones(2), M, beta=-0.1, ref_per_token_logps=LP),
                      "beta=-0.1 must be a finite number >= 0"),
    "NaN epsilon": (lambda: d3s.policy_loss(LP, None, torch.ones(2), M, epsilon_high=float("nan")),
                    "epsilon_high=nan"),
    "zero denominator": (lambda: d3s.policy_loss(LP, None, torch.ones(2), M, denominator=0),
                         "denominator=0.0 must be a finite number > 0"),
    "logps as ints": (lambda: d3s.policy_loss(LP.long(), None, torch.ones(2), M), "per_token_logps must be a float"),
    "bool tensor denominator": (lambda: d3s.policy_loss(LP, None, torch.ones(2), M, denominator=torch.tensor(True)),
                                "denominator must be a real number, got a torch.bool tensor"),
    # token selection: counts are integers (never a float, never a bool), fractions real numbers, tensors tensors
    "negative k": (lambda: d3s.top_tokens_mask(SC, -1), "k=-1 must be an integer >= 0"),
    "k float": (lambda: d3s.top_tokens_mask(SC, 2.7), "k=2.7 must be an integer >= 0"),
    "k bool": (lambda: d3s.top_tokens_mask(SC, True), "k=True must be a number, not a bool"),
    "top_tokens_mask n_valid float": (lambda: d3s.top_tokens_mask(SC, 2, n_valid=2.5), "n_valid=2.5 must be an integer"),
    "top_tokens_mask n_valid < 0": (lambda: d3s.top_tokens_mask(SC, 2, n_valid=-1), "n_valid=-1 must be an integer >= 0"),
    "scores as NumPy": (lambda: d3s.top_tokens_mask(SC.numpy(), 2), "scores must be a torch.Tensor, got ndarray"),
    "scores bool": (lambda: d3s.top_tokens_mask(SC > 0, 2), "scores must be a real tensor"),
    "n_valid float": (lambda: d3s.num_tokens_to_keep(10.9, 0.5), "n_valid=10.9 must be an integer >= 0"),
    "n_valid bool": (lambda: d3s.num_tokens_to_keep(True, 1.0), "n_valid=True must be a number, not a bool"),
    "fraction bool": (lambda: d3s.num_tokens_to_keep(10, True), "fraction=True must be a number, not a bool"),
    "fraction string": (lambda: d3s.num_tokens_to_keep(10, "0.5"), "fraction='0.5' must be a finite number in"),
    "token_mask fraction bool": (lambda: d3s.token_mask(A[:2], LP, M, True), "fraction=True must be a number, not a"),
    "token_mask advantages as NumPy": (lambda: d3s.token_mask(A[:2].numpy(), LP, M, 0.5),
                                       "advantages must be a torch.Tensor, got ndarray"),
    "token_mask entropies as NumPy": (lambda: d3s.token_mask(A[:2], LP.numpy(), M, 0.5),
                                      "entropies must be a torch.Tensor, got ndarray"),
    "token_mask completion_mask as NumPy": (lambda: d3s.token_mask(A[:2], LP, M.numpy(), 0.5),
                                            "completion_mask must be a torch.Tensor, got ndarray"),
    "token_scores advantages as a list": (lambda: d3s.token_scores([1.0, 2.0], LP, M),
                                          "advantages must be a torch.Tensor, got list"),
    "token_scores complex advantages": (lambda: d3s.token_scores(A[:2].to(torch.complex64), LP, M),
                                        "advantages must be a real tensor"),
    "token_scores 3-D advantages": (lambda: d3s.token_scores(torch.ones(2, 3, 1), LP, M),
                                    r"advantages \(2, 3, 1\) must be \(S,\), \(S, 1\) or \(S, T\)"),
    "nonfinite_scores as NumPy": (lambda: d3s.nonfinite_scores(A[:2].numpy(), LP, M), "advantages must be a torch"),
    "nonfinite_scores shapes": (lambda: d3s.nonfinite_scores(A[:2], LP, M[:, :2]), r"completion_mask \(2, 2\)"),
    # variants
    "unknown variant field": (lambda: d3s.get_variant("d3s", bogus_field=1),
                              "bogus_field=1 is not a Variant field; valid: name, sample_selection, .*normalizer"),
    "unknown field in replace": (lambda: d3s.VARIANTS["d3s"].replace(bogus_field=1), "bogus_field=1 is not a Variant"),
    "k_final bool": (lambda: d3s.get_variant("d3s", k_final=True), r"k_final=True must be a fraction in \(0, 1\]"),
    "k_init bool": (lambda: d3s.get_variant("d2s", k_init=True), r"k_init=True must be a fraction in \(0, 1\]"),
    "variant name not a string": (lambda: d3s.get_variant(["d3s"]), r"variant=\['d3s'\]; valid: grpo"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_is_a_value_error_naming_the_argument(case):
    call, message = BAD_CALLS[case]
    with pytest.raises(ValueError, match=message):
        call()


@PROPS
@given(st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not float(x).is_integer() or math.isinf(x)))
def test_a_non_integer_count_is_never_truncated(x):
    assume(not (isinstance(x, float) and math.isfinite(x) and x.is_integer()))
    for call in (lambda: d3s.pass_at_k(8, x, 1), lambda: d3s.max_variance_subset(R, x),
                 lambda: d3s.group_advantages(R, x), lambda: d3s.num_tokens_to_keep(x, 0.5),
                 lambda: d3s.top_tokens_mask(SC, x), lambda: d3s.top_tokens_mask(SC, 2, n_valid=x)):
        with pytest.raises(ValueError):
            call()


def test_scalar_types_give_the_same_results():
    base = d3s.group_advantages(R, 2)
    for G in (np.int64(2), np.int32(2), torch.tensor(2)):
        torch.testing.assert_close(d3s.group_advantages(R, G, eps=np.float32(1e-4)), base)
    assert d3s.max_variance_subset(R, np.int64(2)).tolist() == d3s.max_variance_subset(R, 2).tolist()
    assert d3s.avg_at_n(np.int16(3), torch.tensor(4)) == 0.75
    assert d3s.num_tokens_to_keep(np.int64(10), np.float64(0.5)) == d3s.num_tokens_to_keep(torch.tensor(10), 0.5) == 5
    for k in (np.int64(2), torch.tensor(2)):
        assert torch.equal(d3s.top_tokens_mask(SC, k, n_valid=np.int32(5)), d3s.top_tokens_mask(SC, 2))
