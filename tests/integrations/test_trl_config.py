"""D3SConfig: variant shortcut, validation before any model loads, and the pinned TRL surface."""

import subprocess
import sys

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
import trl  # noqa: E402
from packaging.version import Version  # noqa: E402

from d3s import linear_schedule  # noqa: E402
from d3s.integrations.trl import (  # noqa: E402
    TRANSFORMERS_VERSION_RANGE,
    TRL_VERSION_RANGE,
    D3SConfig,
    trl_signature_mismatches,
)


def config(tmp_path, **kwargs) -> D3SConfig:
    defaults = dict(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=8, num_generations=8,
                    report_to=[])
    defaults.update(kwargs)
    return D3SConfig(**defaults)


def test_import_d3s_does_not_import_trl():
    code = "import sys, d3s, d3s.integrations; assert 'trl' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.supported_range
def test_installed_trl_is_in_the_verified_range():
    low, high = TRL_VERSION_RANGE
    assert low <= Version(trl.__version__) < high, (
        f"trl {trl.__version__} is outside the verified range [{low}, {high}); re-verify the overridden methods"
    )
    import transformers

    low, high = TRANSFORMERS_VERSION_RANGE
    assert low <= Version(transformers.__version__) < high, f"transformers {transformers.__version__}: [{low}, {high})"


def test_overridden_trl_methods_keep_their_signatures():
    mismatches = trl_signature_mismatches()
    assert not mismatches, "TRL changed methods that D3SGRPOTrainer overrides or calls:\n" + "\n".join(
        f"  {name}: expected {expected}, found {found}" for name, (expected, found) in mismatches.items()
    )


def test_default_is_plain_grpo(tmp_path):
    args = config(tmp_path)
    assert (args.sample_selection, args.token_selection, args.schedule, args.normalizer) == (
        "none", False, "constant", "selected")
    assert args.d3s_settings.schedule_at(0.5) == (8, 1.0)


def test_variant_d3s_scales_the_paper_counts_to_num_generations(tmp_path):
    args = config(tmp_path, variant="d3s", num_generations=16, per_device_train_batch_size=16)
    # paper: G = 32, N 8 -> 32, K 5% -> 20%; here G = 16 -> N 4 -> 16
    assert (args.sample_selection, args.token_selection, args.schedule) == ("cross", True, "linear")
    assert (args.n_init, args.n_final, args.k_init, args.k_final) == (4, 16, 0.05, 0.2)
    assert args.d3s_settings.schedule_at(0.5) == linear_schedule(0.5, 4, 16, 0.05, 0.2, 16)


def test_variant_with_the_papers_group_size_keeps_the_papers_values(tmp_path):
    args = config(tmp_path, variant="d3s-i", num_generations=32, per_device_train_batch_size=32)
    assert (args.sample_selection, args.n_init, args.n_final, args.k_init, args.k_final) == (
        "intra", 8, 32, 0.05, 0.2)


def test_explicit_fields_win_over_the_variant(tmp_path):
    args = config(tmp_path, variant="d3s", n_init=3, k_final=0.5, normalizer="all")
    assert (args.n_init, args.n_final, args.k_init, args.k_final, args.normalizer) == (3, 8, 0.05, 0.5, "all")


def test_gspo_variant_sets_the_sequence_level_and_combines_with_others(tmp_path):
    assert config(tmp_path, variant="gspo").importance_sampling_level == "sequence"
    args = config(tmp_path, variant="d2s", importance_sampling_level="sequence")
    assert args.d3s_settings.importance_sampling_level == "sequence_token"
    assert config(tmp_path, importance_sampling_level="sequence_token").importance_sampling_level == "sequence"


def test_resolving_the_d3s_fields_twice_changes_nothing(tmp_path):
    args = config(tmp_path, variant="d3s")
    before = args.to_dict()
    args._resolve_d3s()  # the fields are concrete now: nothing left for the variant to fill
    assert args.to_dict() == before


def test_every_d3s_field_is_recorded_as_it_is(tmp_path):
    # `run_config.json` records `to_dict()`, which hides fields whose name ends in "_token" (as secrets): a d3s field
    # must never be named so, or its value is lost from the record and the recipe check
    import dataclasses

    args = config(tmp_path, variant="d3s", token_cut="sign", min_tokens_per_rollout=2, keep_last_in_loss=True)
    ours = {f.name for f in dataclasses.fields(D3SConfig)} - {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert {"variant", "keep_last_in_loss", "min_tokens_per_rollout", "prompt_skip"} <= ours
    recorded = args.to_dict()
    assert {name: recorded[name] for name in ours} == {name: getattr(args, name) for name in ours}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(variant="d4s"), "variant='d4s'"),
        (dict(sample_selection="cross", n_init=9), "n_init=9"),
        (dict(sample_selection="cross", n_init=1), "n_init=1"),
        (dict(sample_selection="cross"), "needs n_init"),
        (dict(sample_selection="uniform", n_init=4), "sample_selection='uniform'"),  # 'random' is a control
        (dict(token_selection=True, k_init=0.0), "k_init=0.0"),
        (dict(token_selection=True, k_init=1.5), "k_init=1.5"),
        (dict(token_selection=True), "needs k_init"),
        (dict(n_init=4), "sample_selection='none'"),
        (dict(k_init=0.1), "token_selection=False"),
        (dict(sample_selection="cross", n_init=2, n_final=8), "schedule='constant'"),
        (dict(sample_selection="cross", n_init=8, n_final=2, schedule="linear"), "allow_tightening"),
        (dict(schedule="cosine"), "schedule='cosine'"),
        (dict(normalizer="mean"), "normalizer='mean'"),
        (dict(variant="d2s", top_entropy_quantile=0.2), "top_entropy_quantile=0.2"),
        (dict(variant="d1s", top_entropy_quantile=0.2), "top_entropy_quantile=0.2"),
        (dict(variant="d3s", loss_type="sapo"), "loss_type='sapo'"),
        (dict(variant="d1s-c", loss_type="cispo"), "loss_type='cispo'"),
        (dict(variant="grpo", importance_sampling_level="sequence"), "variant='gspo'"),
        (dict(importance_sampling_level="group"), "importance_sampling_level='group'"),
        (dict(variant="d2s", entropy_coef=0.01), "entropy_coef=0.01"),
        (dict(variant="pods", use_adaptive_entropy=True), "use_adaptive_entropy=True"),
        (dict(variant="d3s-i", delta=2.0), "delta=2.0"),
    ],
)
def test_inconsistent_settings_are_rejected_with_the_values(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(tmp_path, **kwargs)


TRL_ONLY_OPTIONS = [
    dict(loss_type="cispo"),
    dict(loss_type="sapo"),
    dict(loss_type="luspo", importance_sampling_level="sequence"),
    dict(loss_type="vespo"),
    dict(top_entropy_quantile=0.2),
    dict(entropy_coef=0.01),
    dict(use_adaptive_entropy=True),
    dict(delta=2.0),
]


@pytest.mark.parametrize("variant", [None, "grpo", "gspo"])
@pytest.mark.parametrize("kwargs", TRL_ONLY_OPTIONS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_with_d3s_off_every_trl_option_is_accepted(tmp_path, variant, kwargs):
    if variant == "grpo" and kwargs.get("importance_sampling_level") == "sequence":
        variant = "gspo"
    args = config(tmp_path, variant=variant, **kwargs)
    assert not args.d3s_active
    for key, value in kwargs.items():
        assert getattr(args, key) == value


def test_trainer_refuses_a_plain_grpo_config(tmp_path):
    from trl import GRPOConfig

    from d3s.integrations.trl import D3SGRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=8, num_generations=8)
    with pytest.raises(TypeError, match="D3SConfig"):
        D3SGRPOTrainer(model="unused", reward_funcs=[], args=args)


@pytest.mark.parametrize(
    "variant, given, expected",
    [
        ("d1s", dict(n_init=3), dict(n_init=3, n_final=3)),  # constant: n_init alone sets the constant
        ("d1s", dict(n_final=5), dict(n_init=5, n_final=5)),  # ... and so does n_final alone
        ("d2s", dict(k_init=0.1), dict(k_init=0.1, k_final=0.1, n_init=2, n_final=2)),
        ("d2s", dict(k_final=0.3), dict(k_init=0.3, k_final=0.3)),
        ("d3s", dict(n_init=3), dict(n_init=3, n_final=8)),  # linear: each sets its own end
        ("d3s", dict(k_final=0.5), dict(k_init=0.05, k_final=0.5)),
    ],
)
def test_explicit_counts_on_a_variant_follow_one_rule(tmp_path, variant, given, expected):
    args = config(tmp_path, variant=variant, **given)
    assert {name: getattr(args, name) for name in expected} == expected
    if variant != "d3s":  # the core's get_variant follows the same rule for constant variants
        core = __import__("d3s").get_variant(variant, num_generations=8, **given)
        assert core.schedule_at(0.7) == core.schedule_at(0.0)


def test_d3s_train_variant_d1s_with_n_init_trains_with_that_n(tmp_path):
    from d3s.app.recipe import parse_train_args

    _, cfg, _ = parse_train_args(["--config", "smoke", "--variant", "d1s", "--n_init", "2",
                                  "--output_dir", str(tmp_path)])
    assert (cfg.n_init, cfg.n_final) == (2, 2)
    assert {cfg.d3s_settings.schedule_at(p)[0] for p in (0.0, 0.5, 1.0)} == {2}


def test_kl_metric_default_is_every_5_generations_and_off_when_sharded(tmp_path, monkeypatch):
    assert config(tmp_path).kl_log_every == 5
    assert config(tmp_path, kl_log_every=3).kl_log_every == 3
    with monkeypatch.context() as m:
        m.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` with an FSDP config sets
        assert config(tmp_path).kl_log_every == 0
        assert config(tmp_path, kl_log_every=2).kl_log_every == 2  # the user's explicit choice stays


class _ShardedTrainer:
    """What `KLMonitor.keep_initial_weights` reads of a trainer whose model DeepSpeed or FSDP shards."""

    def __init__(self, args, deepspeed: bool):
        import types

        self.args, self.beta = args, 0.0
        self.is_deepspeed_enabled, self.is_fsdp_enabled = deepspeed, not deepspeed
        self.model = torch.nn.Linear(2, 2)
        self.accelerator = types.SimpleNamespace(unwrap_model=lambda m: m, is_main_process=True)


@pytest.mark.parametrize("deepspeed", [True, False], ids=["deepspeed", "fsdp"])
def test_kl_metric_under_sharding_turns_off_by_default_and_refuses_an_explicit_request(tmp_path, capsys, deepspeed):
    from d3s.integrations.trl.kl_monitor import KLMonitor

    args = config(tmp_path)  # kl_log_every left unset: resolved to 5 here (no launcher in this process)
    monitor = KLMonitor(args.kl_log_every, args.kl_log_rollouts)
    monitor.keep_initial_weights(_ShardedTrainer(args, deepspeed))
    assert monitor.every == 0 and monitor.initial_model is None and not monitor.due(0.0, 0)
    assert capsys.readouterr().err.count("\n") == 1  # one line says so
    explicit = config(tmp_path, kl_log_every=5)
    with pytest.raises(ValueError, match="kl_log_every=5 at beta=0 keeps a frozen copy"):
        KLMonitor(5, 8).keep_initial_weights(_ShardedTrainer(explicit, deepspeed))
