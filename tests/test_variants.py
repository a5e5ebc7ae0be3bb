"""The named variants and their validation."""

import pytest

import d3s
from d3s.variants import paired, scaled_count


def test_table_of_variants():
    v = d3s.VARIANTS
    assert set(v) == {"grpo", "gspo", "pods", "d1s", "d1s-c", "d2s", "d3s", "d3s-i"}
    expected = {
        "grpo": ("none", False, "token"),
        "gspo": ("none", False, "sequence_token"),
        "pods": ("pods", False, "token"),
        "d1s": ("intra", False, "token"),
        "d1s-c": ("cross", False, "token"),
        "d2s": ("cross", True, "token"),
        "d3s": ("cross", True, "token"),
        "d3s-i": ("intra", True, "token"),
    }
    for name, (sample, tokens, level) in expected.items():
        assert (v[name].sample_selection, v[name].token_selection, v[name].importance_sampling_level) == (
            sample, tokens, level)
    assert v["d3s"].schedule == "linear" and v["d2s"].schedule == "constant"
    # paper Table 5
    assert (v["d3s"].num_generations, v["d3s"].n_init, v["d3s"].n_final, v["d3s"].k_init, v["d3s"].k_final) == (
        32, 8, 32, 0.05, 0.2)


def test_schedule_at():
    v = d3s.VARIANTS
    assert v["d3s"].schedule_at(0.0) == (8, 0.05)
    assert v["d3s"].schedule_at(1.0) == (32, 0.2)
    assert v["d2s"].schedule_at(0.7) == (8, 0.05)
    assert v["grpo"].schedule_at(0.3) == (32, 1.0)
    assert v["d1s"].schedule_at(0.3) == (8, 1.0)


def test_combine_with_gspo():
    g = d3s.VARIANTS["d3s"].replace(importance_sampling_level="sequence_token")
    assert g.sample_selection == "cross" and g.importance_sampling_level == "sequence_token"


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"n_init": 40}, "n_init=40 must be an integer in \\[2, num_generations=32\\]"),
        ({"n_final": 1}, "n_final=1"),
        ({"k_init": 0.0}, "k_init=0.0 must be a fraction in \\(0, 1\\]"),
        ({"k_final": 1.5}, "k_final=1.5"),
        ({"sample_selection": "global"}, "sample_selection='global'"),
        ({"schedule": "cosine"}, "schedule='cosine'"),
        ({"normalizer": "mean"}, "normalizer='mean'"),
        ({"num_generations": 1}, "num_generations=1"),
        ({"n_init": 16, "n_final": 8}, "n_final=8 < n_init=16 .* allow_tightening=True"),
    ],
)
def test_validation_names_value_and_range(changes, match):
    with pytest.raises(ValueError, match=match):
        d3s.VARIANTS["d3s"].replace(**changes)


def test_tightening_allowed_when_stated():
    v = d3s.VARIANTS["d3s"].replace(n_init=16, n_final=8, allow_tightening=True)
    assert v.schedule_at(1.0)[0] == 8


def test_constant_schedule_must_be_constant():
    with pytest.raises(ValueError, match="schedule='constant' uses n_init throughout"):
        d3s.VARIANTS["d1s"].replace(n_init=4)
    assert d3s.get_variant("d1s", n_init=4).schedule_at(0.9) == (4, 1.0)
    assert d3s.get_variant("d2s", num_generations=8, n_init=4, k_init=0.1).schedule_at(0.5) == (4, 0.1)
    with pytest.raises(ValueError, match="variant='d4s'; valid: grpo"):
        d3s.get_variant("d4s")


def test_grpo_ignores_n_against_small_groups():
    assert d3s.get_variant("grpo", num_generations=4).schedule_at(0.5) == (4, 1.0)


def test_unknown_field_names_the_field_and_lists_the_valid_ones():
    fields = "name, sample_selection, token_selection, schedule, num_generations, n_init, n_final, k_init, " \
             "k_final, allow_tightening, importance_sampling_level, normalizer, token_cut, min_tokens_per_rollout, " \
             "keep_last_in_loss, schedule_clock"
    with pytest.raises(ValueError, match=f"bogus_field=1 is not a Variant field; valid: {fields}$"):
        d3s.get_variant("d3s", bogus_field=1)


@pytest.mark.parametrize("field", ["k_init", "k_final"])
def test_a_bool_fraction_is_refused(field):
    with pytest.raises(ValueError, match=f"{field}=True must be a fraction"):
        d3s.VARIANTS["d3s"].replace(**{field: True})


# -- scaled_count, paired, and get_variant following paired -------------------------------------------


def test_scaled_count_brute_force():
    """Round half up in exact arithmetic, then clip to [2, G]."""
    from fractions import Fraction

    for reference in (1, 3, 8, 16, 32, 48, 64):
        for G in range(2, 65):
            for n in range(0, 2 * reference + 1):
                x = Fraction(n * G, reference)
                rounded = int(x) + (1 if x - int(x) >= Fraction(1, 2) else 0)
                assert scaled_count(n, G, reference) == min(G, max(2, rounded)), (n, G, reference)


def test_scaled_count_examples():
    assert [scaled_count(n, 16) for n in (8, 32)] == [4, 16]  # the paper's 8 -> 32 of 32, at G = 16
    assert [scaled_count(n, 8) for n in (8, 32)] == [2, 8]
    assert [scaled_count(n, 16) for n in (3, 5, 7)] == [2, 3, 4]  # 1.5, 2.5, 3.5 round up
    assert scaled_count(1, 16) == 2 and scaled_count(64, 16) == 16  # clipped to [2, G]
    assert scaled_count(8, 32) == 8 and scaled_count(6, 12, reference_generations=8) == 9


@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_paired_enumerated(schedule):
    for init in (None, 0, 4, 0.1):
        for final in (None, 0, 16, 0.3):
            got = paired(init, final, schedule)
            if schedule == "constant" and init is not None and final is None:
                expected = (init, init)
            elif schedule == "constant" and init is None and final is not None:
                expected = (final, final)
            else:
                expected = (init, final)  # both given, neither, or linear: unchanged
            assert got == expected and all(type(a) is type(b) for a, b in zip(got, expected)), (init, final)


def test_get_variant_follows_paired():
    """Every variant x schedule override x which ends are given: get_variant = the base variant with the
    pairing rule applied by hand (or the same ValueError when that setting is invalid)."""
    ends = {"n": [{}, {"n_init": 4}, {"n_final": 16}, {"n_init": 4, "n_final": 16}],
            "k": [{}, {"k_init": 0.1}, {"k_final": 0.3}, {"k_init": 0.1, "k_final": 0.3}]}
    for name, base in d3s.VARIANTS.items():
        for schedule in (None, "constant", "linear"):
            effective = schedule or base.schedule
            for n_given in ends["n"]:
                for k_given in ends["k"]:
                    overrides = {**n_given, **k_given, **({"schedule": schedule} if schedule else {})}
                    expected = dict(overrides)
                    if effective == "constant":
                        for a, b in (("n_init", "n_final"), ("k_init", "k_final")):
                            if (a in overrides) != (b in overrides):
                                expected[a] = expected[b] = overrides.get(a, overrides.get(b))
                    try:
                        want = base.replace(**expected)
                    except ValueError:
                        with pytest.raises(ValueError):
                            d3s.get_variant(name, **overrides)
                        continue
                    assert d3s.get_variant(name, **overrides) == want, (name, overrides)


def test_get_variant_constant_schedule_keeps_the_given_value_throughout():
    for kwargs in ({"n_init": 4, "k_init": 0.1}, {"n_final": 4, "k_final": 0.1}, {"n_init": 4, "k_final": 0.1}):
        v = d3s.get_variant("d3s", schedule="constant", **kwargs)
        assert (v.n_init, v.n_final, v.k_init, v.k_final) == (4, 4, 0.1, 0.1)
        assert all(v.schedule_at(p) == (4, 0.1) for p in (0.0, 0.25, 0.5, 1.0))
    assert all(d3s.get_variant("d1s", n_final=4).schedule_at(p) == (4, 1.0) for p in (0.0, 0.6, 1.0))
    # linear: a value given alone sets its own end only
    v = d3s.get_variant("d3s", n_init=4)
    assert (v.n_init, v.n_final) == (4, 32) and v.schedule_at(1.0) == (32, 0.2)
    v = d3s.get_variant("d2s", schedule="linear", n_final=16, k_final=0.2)
    assert v.schedule_at(0.0) == (8, 0.05) and v.schedule_at(1.0) == (16, 0.2)
