"""pass@k against exact enumeration; Avg@n; diagnostics."""

import itertools
import math

import pytest
import torch

import d3s


def enumerate_pass_at_k(n, c, k):
    """Probability that a uniformly random k-subset of n samples (c correct) holds a correct one."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert d3s.pass_at_k(n, c, k) == pytest.approx(enumerate_pass_at_k(n, c, k), abs=1e-12)


def test_closed_form_large_n_stable():
    # 1 - C(n-c, k)/C(n, k) with exact integers, for n in the thousands.
    for n, c, k in [(4000, 3, 16), (4000, 1000, 1), (3000, 1500, 32), (5000, 1, 5000), (2000, 0, 7)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k) if n - c >= k else 1.0
        assert d3s.pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12, abs=1e-15)
    assert d3s.pass_at_k(32, 1, 1) == pytest.approx(1 / 32)


def test_pass_at_1_is_avg():
    for c in range(33):
        assert d3s.pass_at_k(32, c, 1) == pytest.approx(d3s.avg_at_n(c, 32))


@pytest.mark.parametrize("n,c,k,match", [(8, 9, 1, "c=9"), (8, 2, 9, "k=9"), (8, 2, 0, "k=0"), (0, 0, 1, "n=0")])
def test_bad_input(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        d3s.pass_at_k(n, c, k)


def test_sample_usefulness_rate():
    adv = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.0, 0.0, 0.5, -0.5])
    kept = torch.tensor([True, True, True, True, False, False, True, False])
    # groups: [0,0] kept (useless), [1,-1] kept (useful), [0,0] not kept, [0.5] kept (useful)
    assert d3s.sample_usefulness_rate(adv, kept, 2).item() == pytest.approx(2 / 3)
    assert d3s.sample_usefulness_rate(adv, torch.zeros(8, dtype=torch.bool), 2).item() == 0.0


def test_population_variance_keeps_float64_precision():
    """float64 is computed in float64: a float32 cast would turn 1e8 + 1, 1e8 + 2, 1e8 + 4 into equal values."""
    x = torch.tensor([1e8 + 1, 1e8 + 2, 1e8 + 4], dtype=torch.float64)
    v = d3s.population_variance(x)
    assert v.dtype == torch.float64
    assert float(v) == pytest.approx(14 / 9, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_population_variance_below_float64_is_float32_as_before(dtype):
    """Every dtype but float64 gives float32, bit for bit the value logged so far: `values.float().var(correction=0)`."""
    g = torch.Generator().manual_seed(0)
    for scale in (1.0, 1e-3, 1e3):
        x = torch.randn(257, generator=g) * scale + scale  # (257,)
        x = x.to(dtype) if dtype != torch.bool else x > scale
        v = d3s.population_variance(x)
        assert v.dtype == torch.float32
        assert torch.equal(v, x.float().var(correction=0))
    assert d3s.population_variance(torch.zeros(0, dtype=dtype)).dtype == torch.float32


def test_population_variance_of_nothing_is_zero_in_the_documented_dtype():
    for dtype, want in ((torch.float64, torch.float64), (torch.float32, torch.float32)):
        v = d3s.population_variance(torch.zeros(0, dtype=dtype))
        assert v.dtype == want and float(v) == 0.0
