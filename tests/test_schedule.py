"""Dynamic schedule (paper eq. 9)."""

import pytest

import d3s


def test_endpoints_are_exact():
    assert d3s.linear_schedule(0.0, 8, 32, 0.05, 0.2, 32) == (8, 0.05)
    assert d3s.linear_schedule(1.0, 8, 32, 0.05, 0.2, 32) == (32, 0.2)


def test_midpoints_and_rounding_half_up():
    n, k = d3s.linear_schedule(0.5, 8, 32, 0.05, 0.2, 32)
    assert n == 20 and k == pytest.approx(0.125)
    assert d3s.linear_schedule(0.5, 2, 3, 0.1, 0.1, 4)[0] == 3  # 2.5 rounds up
    assert d3s.linear_schedule(0.25, 2, 4, 0.1, 0.1, 4)[0] == 3  # 2.5 rounds up


def test_monotone_over_training():
    prev = (0, 0.0)
    for step in range(101):
        n, k = d3s.linear_schedule(step / 100, 8, 32, 0.05, 0.2, 32)
        assert n >= prev[0] and k >= prev[1] - 1e-15
        assert 8 <= n <= 32 and 0.05 - 1e-12 <= k <= 0.2 + 1e-12
        prev = (n, k)


def test_constant_and_tightening():
    assert all(d3s.linear_schedule(p, 8, 8, 0.05, 0.05, 32) == (8, 0.05) for p in (0, 0.3, 1))
    assert d3s.linear_schedule(1.0, 16, 4, 0.2, 0.05, 16) == (4, 0.05)


def test_multiple_of():
    assert d3s.linear_schedule(0.5, 8, 32, 0.05, 0.2, 32, multiple_of=8)[0] == 16
    assert d3s.linear_schedule(0.0, 2, 32, 0.05, 0.2, 32, multiple_of=8)[0] == 8


@pytest.mark.parametrize(
    "args,match",
    [
        ((-0.1, 8, 32, 0.05, 0.2, 32), "progress=-0.1"),
        ((1.5, 8, 32, 0.05, 0.2, 32), "progress=1.5"),
        ((0.5, 40, 32, 0.05, 0.2, 32), "n_init=40"),
        ((0.5, 8, 1, 0.05, 0.2, 32), "n_final=1"),
        ((0.5, 8, 32, 0.0, 0.2, 32), "k_init=0.0"),
        ((0.5, 8, 32, 0.05, 1.2, 32), "k_final=1.2"),
    ],
)
def test_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        d3s.linear_schedule(*args)
