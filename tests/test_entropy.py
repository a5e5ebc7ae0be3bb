"""Chunked entropy against torch.distributions.Categorical."""

import pytest
import torch
from torch.distributions import Categorical

import d3s
from d3s.entropy import align_step_entropies


@pytest.mark.parametrize("chunk_size", [1, 3, 64, 4096])
def test_matches_categorical(chunk_size):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 50, generator=g) * 4
    torch.testing.assert_close(d3s.token_entropy(logits, chunk_size=chunk_size), Categorical(logits=logits).entropy())


def test_temperature_and_extreme_logits():
    logits = torch.tensor([[1e4, 0.0, -1e4], [0.0, 0.0, 0.0], [-float("inf"), 0.0, 0.0]])
    h = d3s.token_entropy(logits)
    assert torch.isfinite(h).all()
    torch.testing.assert_close(h[:2], torch.tensor([0.0, torch.log(torch.tensor(3.0)).item()]))
    torch.testing.assert_close(h[2], torch.log(torch.tensor(2.0)))
    z = torch.randn(5, 11)
    torch.testing.assert_close(d3s.token_entropy(z, temperature=0.7), Categorical(logits=z / 0.7).entropy())


def test_bfloat16_input_and_gradient():
    z = torch.randn(4, 30, dtype=torch.bfloat16, requires_grad=True)
    h = d3s.token_entropy(z, chunk_size=2)
    assert h.dtype == torch.float32 and h.shape == (4,)
    torch.testing.assert_close(h, Categorical(logits=z.float()).entropy(), rtol=1e-4, atol=1e-4)
    h.sum().backward()
    assert z.grad is not None and torch.isfinite(z.grad.float()).all()


# -- align_step_entropies ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_align_step_entropies_matches_loop(seed):
    g = torch.Generator().manual_seed(seed)
    S, n_steps, width = (int(x) for x in torch.randint(1, 10, (3,), generator=g))
    steps = [torch.rand(S, generator=g) for _ in range(n_steps)]
    lengths = torch.randint(0, min(n_steps, width) + 1, (S,), generator=g)
    lengths[0] = min(n_steps, width)  # the longest completion may use every step
    mask = torch.arange(width)[None, :] < lengths[:, None]
    mask = mask if seed % 2 else mask.long()
    got = align_step_entropies(steps, mask, width)
    assert got is not None and got.shape == (S, width)
    for i in range(S):
        for t in range(width):
            assert got[i, t].item() == (steps[t][i].item() if t < n_steps else 0.0)


def test_align_step_entropies_edge_cases():
    steps = [torch.tensor([0.1, 0.2]), torch.tensor([0.3, 0.4]), torch.tensor([0.5, 0.6])]
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    torch.testing.assert_close(align_step_entropies(steps, mask, 5),
                               torch.tensor([[0.1, 0.3, 0.5, 0.0, 0.0], [0.2, 0.4, 0.6, 0.0, 0.0]]))
    # more steps than columns: cut (the longest completion still fits)
    torch.testing.assert_close(align_step_entropies(steps, torch.tensor([[1, 1], [1, 0]]), 2),
                               torch.tensor([[0.1, 0.3], [0.2, 0.4]]))
    assert align_step_entropies(steps, torch.zeros(2, 3), 0).shape == (2, 0)
    assert align_step_entropies([torch.zeros(0)], torch.zeros(0, 4), 4).shape == (0, 4)


def test_align_step_entropies_returns_none_when_the_steps_are_not_this_batchs():
    mask = torch.ones(2, 3)
    two_rows = [torch.rand(2) for _ in range(3)]
    assert align_step_entropies([], mask, 3) is None  # no step
    assert align_step_entropies([torch.rand(2), torch.rand(3), torch.rand(2)], mask, 3) is None  # another row count
    assert align_step_entropies([torch.rand(4)] * 3, torch.ones(4, 3), 3) is not None
    assert align_step_entropies(two_rows[:2], mask, 3) is None  # a completion longer than the steps
    assert align_step_entropies(two_rows[:2], torch.tensor([[1, 1, 0], [1, 0, 0]]), 3) is not None
    assert align_step_entropies(two_rows, mask, 3) is not None  # exactly as long
