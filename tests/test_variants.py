"""The named variants and their validation."""

import pytest

import d3s


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
             "k_final, allow_tightening, importance_sampling_level, normalizer"
    with pytest.raises(ValueError, match=f"bogus_field=1 is not a Variant field; valid: {fields}$"):
        d3s.get_variant("d3s", bogus_field=1)


@pytest.mark.parametrize("field", ["k_init", "k_final"])
def test_a_bool_fraction_is_refused(field):
    with pytest.raises(ValueError, match=f"{field}=True must be a fraction"):
        d3s.VARIANTS["d3s"].replace(**{field: True})
