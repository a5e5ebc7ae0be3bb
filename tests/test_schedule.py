"""Dynamic schedule (paper eq. 9)."""

import pytest

import d3s
from d3s.schedule import generation_index, generation_progress


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


# -- generation_index / generation_progress: a simulated trainer loop ---------------------------------


def simulate(max_steps, ga, every, resume_at=None):
    """A trainer run micro-batch by micro-batch: an optimizer step every `ga` micro-batches, a new
    generation batch every `every`. Yields (optimizer_steps, micro_step, generation) before each
    micro-batch; `micro_step` restarts at 0 when resuming at optimizer step `resume_at` (TRL's `_step`
    is not saved in a checkpoint)."""
    optimizer_steps, micro_step, generation, since_generation = 0, 0, -1, None
    for micro_batch in range(max_steps * ga):
        if resume_at is not None and micro_batch == resume_at * ga:
            micro_step = 0
        if since_generation is None or since_generation == every:
            generation, since_generation = generation + 1, 0
        yield optimizer_steps, micro_step, generation
        since_generation += 1
        micro_step += 1
        if micro_step % ga == 0:
            optimizer_steps += 1


COMBOS = [(m, ga, e) for m in (1, 2, 3, 5, 8, 13) for ga in (1, 2, 3, 4) for e in (1, 2, 3, 4, 6, 7, 8, 16)]


@pytest.mark.parametrize("max_steps,ga,every", COMBOS)
def test_generation_index_and_progress_follow_a_simulated_trainer(max_steps, ga, every):
    seen = []
    for opt, micro, generation in simulate(max_steps, ga, every):
        assert generation_index(opt, micro, ga, every) == generation
        if not seen or seen[-1] != generation:
            seen.append(generation)
    assert seen == list(range(len(seen)))
    J = len(seen)
    progress = [generation_progress(j, max_steps, ga, every) for j in seen]
    assert progress[0] == 0.0
    if J == 1:
        assert progress == [0.0]
    else:
        assert progress[-1] == 1.0
        for j, p in enumerate(progress):
            assert p == pytest.approx(j / (J - 1), rel=1e-12, abs=0)  # linear in between
    assert generation_progress(J + 3, max_steps, ga, every) == (1.0 if J > 1 else 0.0)  # clipped


@pytest.mark.parametrize("seed", range(10))
def test_generation_index_survives_a_resume(seed):
    """After a resume the micro-batch counter restarts at 0 but the optimizer-step count does not:
    the index continues exactly where it stopped."""
    import random

    rng = random.Random(seed)
    max_steps, ga, every = rng.randint(2, 20), rng.randint(1, 5), rng.randint(1, 12)
    resume_at = rng.randint(1, max_steps - 1)
    fresh = list(simulate(max_steps, ga, every))
    resumed = list(simulate(max_steps, ga, every, resume_at=resume_at))
    for (o1, m1, gen), (o2, m2, gen2) in zip(fresh, resumed):
        assert gen == gen2 and o1 == o2
        assert generation_index(o1, m1, ga, every) == generation_index(o2, m2, ga, every) == gen


def test_generation_progress_edge_cases():
    assert generation_progress(0, 1, 1, 1) == 0.0  # one generation batch: p = 0
    assert generation_progress(5, 4, 2, 8) == 0.0  # J = ceil(8 / 8) = 1
    assert generation_progress(0, 0, 1, 1) == 0.0 and generation_progress(3, -1, 1, 1) == 0.0  # no steps
    assert generation_progress(1, 2, 1, 1) == 1.0  # J = 2
    assert generation_progress(-2, 10, 1, 1) == 0.0  # clipped below
    assert generation_progress(3, 10, 3, 5) == pytest.approx(3 / 5)  # J = ceil(30 / 5) = 6
    assert generation_progress(3, 10, 3, 4) == pytest.approx(3 / 7)  # J = ceil(30 / 4) = 8: a short last batch
    assert generation_index(0, 0, 4, 2) == 0 and generation_index(3, 6, 4, 2) == 7  # 12 + 6 % 4 = 14 -> 7


@pytest.mark.parametrize(
    "args,match",
    [
        ((0, 0, 0, 1), "gradient_accumulation_steps=0"),
        ((0, 0, 1, 0), "micro_batches_per_generation=0"),
        ((-1, 0, 1, 1), "optimizer_steps=-1"),
        ((0, -1, 1, 1), "micro_step=-1"),
        ((1.0, 0, 1, 1), "optimizer_steps=1.0"),
        ((0, 0, 2.0, 1), "gradient_accumulation_steps=2.0"),
    ],
)
def test_generation_index_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        generation_index(*args)


@pytest.mark.parametrize(
    "args,match",
    [
        ((0, 10, 0, 1), "gradient_accumulation_steps=0"),
        ((0, 10, 1, 0), "micro_batches_per_generation=0"),
        ((0, 10.0, 1, 1), "max_steps=10.0"),
        ((0.5, 10, 1, 1), "index=0.5"),
    ],
)
def test_generation_progress_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        generation_progress(*args)
