"""Every private TRL name the glue relies on is pinned, and the pins hold for the installed TRL."""

import re
from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from d3s.integrations.private_api import ATTRIBUTE, NAME, mismatches  # noqa: E402
from d3s.integrations.trl import PRIVATE_TRL_API, D3SConfig, D3SGRPOTrainer  # noqa: E402
from d3s.integrations.trl.selective_head import add_selective_lm_head, head_scales  # noqa: E402
from tests.integrations.trl_tiny import tiny_model  # noqa: E402

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "d3s" / "integrations" / "trl"


def test_every_trl_method_the_trainer_overrides_is_pinned():
    overridden = {
        name
        for name, member in vars(D3SGRPOTrainer).items()
        if callable(member) and not name.startswith("__") and hasattr(GRPOTrainer, name)
    }
    assert overridden, "the trainer overrides nothing?"
    missing = sorted(f"GRPOTrainer.{name}" for name in overridden if f"GRPOTrainer.{name}" not in PRIVATE_TRL_API)
    assert not missing, f"overridden but not pinned in PRIVATE_TRL_API: {missing}"


def test_every_private_trainer_name_the_package_reads_is_pinned():
    """`self._x` / `trainer._x` of TRL (not the glue's own `_d3s_*`) anywhere in the package is in the table."""
    used = set()
    for source in PACKAGE.glob("*.py"):
        for match in re.finditer(r"\b(?:self|trainer)\.(_[a-zA-Z]\w*)", source.read_text(encoding="utf-8")):
            name = match.group(1)
            ours = name.startswith("_d3s") or (hasattr(D3SConfig, name) and not hasattr(GRPOConfig, name))
            if not ours:
                used.add(name)
    assert {"_step", "_metrics"} <= used
    missing = sorted(f"GRPOTrainer.{n}" for n in used if f"GRPOTrainer.{n}" not in PRIVATE_TRL_API)
    assert not missing, f"read but not pinned in PRIVATE_TRL_API: {missing}"


def test_every_private_trl_import_is_pinned():
    imported = set()
    for source in PACKAGE.glob("*.py"):
        for module, names in re.findall(r"^\s*from (trl[\w.]*) import \(?([^)\n]+)", source.read_text(), re.M):
            imported |= {f"{module}.{n.strip()}" for n in names.split(",") if n.strip().startswith("_")}
    assert all(name in PRIVATE_TRL_API for name in imported), imported - set(PRIVATE_TRL_API)


def test_the_log_prob_kernel_tiles_the_vocabulary_as_trl_does():
    """`compat.VOCABULARY_CHUNK` is the tile width TRL's fused head passes to its kernel (TRL >= 1.15)."""
    from trl.trainer import utils as trl_utils

    from d3s.integrations.trl.compat import VOCABULARY_CHUNK

    theirs = getattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", None)
    if theirs is None:
        pytest.skip("this TRL has no chunked log-prob kernel: the plain-torch one does not tile")
    assert VOCABULARY_CHUNK == theirs


def test_the_checker_reports_a_renamed_or_resigned_name():
    table = {
        "GRPOTrainer._compute_loss": "(self, model, inputs, extra)",
        "GRPOTrainer._no_such_attribute": ATTRIBUTE,
        "GRPOTrainer._step": ATTRIBUTE,
        "trl.trainer.utils._NO_SUCH_NAME": NAME,
        "no_such_package.module.thing": NAME,
    }
    found = mismatches(table, {"GRPOTrainer": GRPOTrainer})
    assert set(found) == {"GRPOTrainer._compute_loss", "GRPOTrainer._no_such_attribute",
                          "trl.trainer.utils._NO_SUCH_NAME", "no_such_package.module.thing"}
    assert found["GRPOTrainer._compute_loss"] == ("(self, model, inputs, extra)", "(self, model, inputs)")


def plain_head_log_probs(model, input_ids, attention_mask, W, temperature, settings):
    """`(S, W)` log-probs of the last W tokens from the model's logits, scaled and capped as `settings` say (what
    TRL's fused head reads from the config: logit_scale, output_multiplier, lm_head_multiplier, 1/logits_scaling,
    then final_logit_softcapping)."""
    scale = settings.get("logit_scale", settings.get("output_multiplier", settings.get("lm_head_multiplier")))
    if scale is None and "logits_scaling" in settings:
        scale = 1 / settings["logits_scaling"]
    z = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -W - 1 : -1].double()  # (S, W, V)
    z = z * (1.0 if scale is None else scale)
    if "final_logit_softcapping" in settings:
        z = settings["final_logit_softcapping"] * torch.tanh(z / settings["final_logit_softcapping"])
    log_p = torch.log_softmax(z / temperature, dim=-1)
    return log_p.gather(-1, input_ids[:, -W:, None]).squeeze(-1).float()


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"logit_scale": 0.5},
        {"output_multiplier": 1.7},
        {"lm_head_multiplier": 0.25},
        {"logits_scaling": 4.0},
        {"final_logit_softcapping": 3.0},
        {"final_logit_softcapping": 2.0, "logit_scale": 2.5},
    ],
    ids=lambda s: ",".join(s) or "plain",
)
def test_selective_head_scores_like_trls_fused_head(settings):
    """`head_scales` copies TRL's reading of the head's scale and softcap: both heads give the same log-probs.

    Before TRL 1.15 there is no fused head: the reference is then the model's own logits, scaled and capped
    as the settings say (the tiny Llama's forward applies none of them)."""
    from trl.trainer import utils as trl_utils

    torch.manual_seed(0)
    ours, theirs = tiny_model(seed=3), tiny_model(seed=3)
    for model in (ours, theirs):
        for key, value in settings.items():
            setattr(model.config, key, value)
    temperature = 0.7
    add_selective_lm_head(ours, temperature, cast_lm_head_to_fp32=False)
    fused = getattr(trl_utils, "add_fused_lm_head", None)
    if fused is not None:
        fused(theirs, temperature=temperature)
    input_ids = torch.randint(3, 60, (3, 9))
    attention_mask = torch.ones_like(input_ids)
    W = 5  # the last W tokens are the completion
    where = torch.ones(3, W, dtype=torch.bool)
    positions = {"labels": input_ids[:, -W:], "grad": where, "values": None, "entropy": False}
    logps, _, _ = ours(input_ids=input_ids, attention_mask=attention_mask, d3s_positions=positions)
    if fused is not None:
        labels = input_ids.clone()
        labels[:, : -W] = -100
        out = theirs(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
        reference = out.log_probs[:, -W:]
    else:
        reference = plain_head_log_probs(theirs, input_ids, attention_mask, W, temperature, settings)
    torch.testing.assert_close(logps, reference.float(), rtol=1e-5, atol=1e-6)
    softcap, scale = head_scales(ours.config)
    assert softcap == settings.get("final_logit_softcapping")
    assert scale != 1.0 or not ({"logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling"} & set(settings))
