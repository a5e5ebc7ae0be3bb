"""Chunked entropy against torch.distributions.Categorical."""

import pytest
import torch
from torch.distributions import Categorical

import d3s


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
