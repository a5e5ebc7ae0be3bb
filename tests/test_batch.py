"""d3s.batch: the trainer's row dealing, loss denominators and sampler correction, against plain loops."""

import math
import random

import pytest
import torch

from d3s.batch import deal_rows, last_used_column, loss_denominator, sampler_correction_ratio


@pytest.mark.parametrize("seed", range(40))
def test_deal_rows_against_a_plain_loop(seed):
    rng = random.Random(seed)
    P, spg = rng.randint(1, 4), rng.randint(1, 3)
    total = rng.randint(1, 40)
    kept = sorted(rng.sample(range(total), rng.randint(0, total)))
    got = deal_rows(torch.tensor(kept, dtype=torch.long), P, spg)
    # plain loop: fill R slots per process in order, R the smallest multiple of spg that holds them all
    R = spg
    while R * P < len(kept):
        R += spg
    want = [[-1] * R for _ in range(P)]
    for i, row in enumerate(kept):
        want[i // R][i % R] = row
    assert got.tolist() == want
    assert (got >= 0).sum() == len(kept)  # every kept row exactly once
    assert P * R - len(kept) < max(P * spg, 1) + (P * spg if not kept else 0)


def test_deal_rows_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_processes=0"):
        deal_rows(torch.arange(3), 0, 1)
    with pytest.raises(ValueError, match="integer tensor"):
        deal_rows(torch.arange(3.0), 1, 1)
    with pytest.raises(ValueError, match="steps_per_generation=1.5"):
        deal_rows(torch.arange(3), 1, 1.5)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
@pytest.mark.parametrize("P, spg, ga", [(1, 1, 1), (2, 2, 2), (3, 2, 4), (2, 4, 2)])
def test_global_denominators_give_the_generation_batch_mean(loss_type, P, spg, ga):
    """The micro-batch losses of one generation batch, summed on each process and averaged over processes
    (what gradient accumulation and DDP do), give the generation batch's mean times spg / ga (the share of
    one optimizer step it is), however its rows are split."""
    g = torch.Generator().manual_seed(P * 100 + spg * 10 + ga)
    R = 2 * spg  # rows per process
    lengths = torch.randint(0, 6, (P, R), generator=g)
    values = torch.randn(P, R, 6, generator=g)
    valid = torch.arange(6)[None, None, :] < lengths[..., None]  # (P, R, 6)
    num_rows, num_tokens = int((lengths > 0).sum()), int(valid.sum())
    total = 0.0
    for p in range(P):
        for micro in range(spg):
            rows = slice(micro * (R // spg), (micro + 1) * (R // spg))
            aggregation, denominator, accumulation = loss_denominator(
                loss_type, num_rows=num_rows, num_tokens=num_tokens, num_processes=P, gradient_accumulation_steps=ga,
                steps_per_generation=spg, rows_in_micro_batch=R // spg, max_completion_length=6)
            v, m = values[p, rows], valid[p, rows]
            if aggregation == "token":
                loss = (v * m).sum() / denominator
            else:
                loss = ((v * m).sum(-1) / m.sum(-1).clamp(min=1)).sum() / denominator
            total += loss / accumulation
    if loss_type == "dapo":
        want = (values * valid).sum() / num_tokens
    else:
        want = ((values * valid).sum(-1) / valid.sum(-1).clamp(min=1)).sum() / num_rows
    torch.testing.assert_close(total / P, want * spg / ga)


def test_denominator_of_the_per_micro_batch_loss_types():
    common = dict(num_rows=8, num_tokens=40, num_processes=2, gradient_accumulation_steps=4, steps_per_generation=2,
                  max_completion_length=16)
    assert loss_denominator("bnpo", rows_in_micro_batch=3, **common) == ("token", None, 4.0)
    assert loss_denominator("dr_grpo", rows_in_micro_batch=3, **common) == ("token", 48.0, 4.0)
    assert loss_denominator("dr_grpo", rows_in_micro_batch=0, **common) == ("token", 16.0, 4.0)
    with pytest.raises(ValueError, match="loss_type='cispo'"):
        loss_denominator("cispo", rows_in_micro_batch=3, **common)


def _trl_style_ratio(old, sampling, mask, mode, lo, hi):
    """Per token, with a plain loop (TRL's rules: NaN -> no correction, truncate or mask outside [lo, hi])."""
    S, T = old.shape
    seq = mode.startswith("sequence")
    out = torch.zeros(S, 1 if seq else T)
    for i in range(S):
        diffs = []
        for t in range(T):
            d = (float(old[i, t]) - float(sampling[i, t])) * float(mask[i, t])
            diffs.append(0.0 if math.isnan(d) else d)
        values = [sum(diffs)] if seq else diffs
        for j, d in enumerate(values):
            r = math.exp(d)
            if mode.endswith("truncate"):
                r = min(max(r, lo if lo is not None else -math.inf), hi if hi is not None else math.inf)
            elif (lo is not None and r < lo) or (hi is not None and r > hi):
                r = 0.0
            out[i, j] = r
    return out


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("bounds", [(None, 3.0), (0.5, 2.0), (None, None)])
def test_sampler_correction_ratio_against_a_plain_loop(mode, bounds):
    g = torch.Generator().manual_seed(7)
    old = -torch.rand(5, 7, generator=g) * 3
    sampling = old + torch.randn(5, 7, generator=g) * 0.5
    sampling[1, 2] = float("nan")  # a token the sampler could not score
    mask = (torch.rand(5, 7, generator=g) < 0.8).float()
    got = sampler_correction_ratio(old, sampling, mask, mode, *bounds)
    torch.testing.assert_close(got, _trl_style_ratio(old, sampling, mask, mode, *bounds), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="mode='token'"):
        sampler_correction_ratio(old, sampling, mask, "token", None, None)


def test_last_used_column():
    used = torch.zeros(3, 6, dtype=torch.bool)
    assert last_used_column(used) == 0
    used[1, 2] = True
    assert last_used_column(used) == 3
    used[2, 5] = True
    assert last_used_column(used) == 6
