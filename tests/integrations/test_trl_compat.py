"""The supported TRL and transformers: one ImportError line outside them, the override, and the shims."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402

from d3s.integrations.private_api import ATTRIBUTE, NAME, expected_for, mismatches  # noqa: E402
from d3s.integrations.trl import compat  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def import_glue(prelude: str = "", **env) -> subprocess.CompletedProcess:
    """`import d3s.integrations.trl` in a fresh interpreter, after `prelude` (which fakes what is installed)."""
    environment = {k: v for k, v in os.environ.items() if k != compat.ALLOW_UNSUPPORTED}
    environment.update(PYTHONWARNINGS="default", **env)
    code = f"{prelude}\nimport d3s.integrations.trl\nprint('imported')"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=300)


FAKE_TRL_VERSION = """
import importlib.metadata as metadata
real_version = metadata.version
metadata.version = lambda name: "1.11.0" if name == "trl" else real_version(name)
"""

INJECTED_MISMATCH = """
import d3s.integrations.private_api as private_api
real_mismatches = private_api.mismatches
def injected(table, owners=None, version=None):
    out = real_mismatches(table, owners, version)
    out["GRPOTrainer._compute_loss"] = ("(self, model, inputs)", "(self, model, inputs, extra)")
    return out
private_api.mismatches = injected
"""


def error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0 and "imported" not in result.stdout, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: "), result.stderr
    return last


def test_a_trl_outside_the_range_stops_the_import_with_one_line():
    line = error_line(import_glue(FAKE_TRL_VERSION))
    low, high = compat.TRL_VERSION_RANGE
    assert f"trl>={low},<{high}" in line and "found trl==1.11.0" in line
    assert f"transformers=={transformers.__version__}" in line and compat.ALLOW_UNSUPPORTED in line
    assert "needs TRL" not in line


def test_a_mismatched_private_name_inside_the_range_stops_the_import():
    line = error_line(import_glue(INJECTED_MISMATCH))
    assert "GRPOTrainer._compute_loss" in line and f"found trl=={trl.__version__}" in line


@pytest.mark.supported_range
def test_the_override_imports_anyway_with_one_warning_per_mismatch():
    result = import_glue(FAKE_TRL_VERSION + INJECTED_MISMATCH, **{compat.ALLOW_UNSUPPORTED: "1"})
    assert result.returncode == 0 and "imported" in result.stdout, result.stderr
    warned = [line for line in result.stderr.splitlines() if f"{compat.ALLOW_UNSUPPORTED}=1" in line]
    # the version, the injected name, and each name TRL 1.11 has otherwise (the faked version picks what is expected)
    as_if_old = mismatches(compat.PRIVATE_TRL_API, {"GRPOTrainer": compat.GRPOTrainer}, Version("1.11.0"))
    assert len(warned) == 2 + len(as_if_old), result.stderr
    assert any("trl==1.11.0 is outside" in line for line in warned)
    assert any("GRPOTrainer._compute_loss: expected" in line for line in warned)
    assert all(any(f"{name}: expected" in line for line in warned) for name in as_if_old)


def test_an_import_that_fails_for_another_reason_names_that_reason():
    result = import_glue("import sys; sys.modules['trl.models.utils'] = None")
    line = error_line(result)
    assert "importing TRL failed" in line and "trl.models.utils" in line and "needs TRL" not in line


def test_the_innermost_cause_of_trls_lazy_import_error_is_named():
    try:
        try:
            raise ModuleNotFoundError("No module named 'triton'")
        except ModuleNotFoundError as inner:
            raise RuntimeError("Failed to import trl.kernels because of the following error\nNo module") from inner
    except RuntimeError as err:
        assert compat._first_line(err) == "ModuleNotFoundError: No module named 'triton'"


@pytest.mark.supported_range
def test_check_supported_names_the_first_mismatches(monkeypatch):
    monkeypatch.setitem(compat.PRIVATE_TRL_API, "GRPOTrainer._compute_loss", "(self, model, inputs, extra)")
    found = compat.trl_signature_mismatches()
    assert set(found) == {"GRPOTrainer._compute_loss"}
    with pytest.raises(ImportError, match=r"private TRL names that do not match: GRPOTrainer\._compute_loss\.") as err:
        compat.check_supported(trl.__version__, transformers.__version__, found, allow=False)
    assert "\n" not in str(err.value)
    with pytest.warns(UserWarning, match="GRPOTrainer._compute_loss: expected"):
        compat.check_supported(trl.__version__, transformers.__version__, found, allow=True)
    many = {f"GRPOTrainer._name{i}": ("a", "b") for i in range(5)}
    with pytest.raises(ImportError, match="_name0, GRPOTrainer._name1, GRPOTrainer._name2 and 2 more"):
        compat.check_supported(trl.__version__, transformers.__version__, many, allow=False)
    with pytest.raises(ImportError, match=r"found trl==\S+ and transformers==5\.1\.0\. Install"):
        compat.check_supported(trl.__version__, "5.1.0", {}, allow=False)
    compat.check_supported(trl.__version__, transformers.__version__, {}, allow=False)  # nothing to say


@pytest.mark.supported_range
def test_the_installed_versions_are_supported_and_match_every_pin():
    assert compat.unsupported(trl.__version__, transformers.__version__, compat.trl_signature_mismatches()) == []


def test_versioned_entries_pick_the_installed_versions_expectation():
    table = {"A.x": ATTRIBUTE, "A.f": {"<1.14": "(self)", ">=1.14": "(self, n)"}, "m.N": {">=1.15": NAME}}
    assert expected_for(table, Version("1.13.0")) == {"A.x": ATTRIBUTE, "A.f": "(self)"}
    assert expected_for(table, Version("1.15.0")) == {"A.x": ATTRIBUTE, "A.f": "(self, n)", "m.N": NAME}
    assert expected_for(table, None) == {"A.x": ATTRIBUTE}
    with pytest.raises(ValueError, match="more than one specifier"):
        expected_for({"A.f": {">=1.0": "(a)", ">=1.5": "(b)"}}, Version("1.6"))
    owners = {"A": type("A", (), {"f": lambda self, n: None})}
    assert mismatches({"A.f": {"<1.14": "(self)", ">=1.14": "(self, n)"}}, owners, Version("1.14.2")) == {}
    assert mismatches({"A.f": {"<1.14": "(self)"}}, owners, Version("1.13")) == {"A.f": ("(self)", "(self, n)")}


def test_every_versioned_entry_expects_one_thing_per_supported_version():
    low, high = compat.TRL_VERSION_RANGE
    probes = [Version(f"1.{minor}.{patch}") for minor in range(low.minor, high.minor) for patch in (0, 2)]
    probes = [v for v in probes if low <= v < high]
    for name, expected in compat.PRIVATE_TRL_API.items():
        if isinstance(expected, dict):
            for v in probes:
                matching = [spec for spec in expected if SpecifierSet(spec).contains(v)]
                assert len(matching) <= 1, f"{name}: {matching} all match {v}"


def test_pyproject_states_the_ranges_of_compat():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = {}
    for extra in ("trl", "eval"):
        for requirement in map(Requirement, extras[extra]):
            pins.setdefault(requirement.name, []).append(requirement.specifier)
    (trl_low, trl_high), (tf_low, tf_high) = compat.TRL_VERSION_RANGE, compat.TRANSFORMERS_VERSION_RANGE
    assert pins["trl"] == [SpecifierSet(f">={trl_low},<{trl_high}")]
    assert pins["transformers"] == [SpecifierSet(f">={tf_low},<{tf_high}")] * 2  # the trl and the eval extra alike


@pytest.mark.parametrize("softcap, scale, temperature", [(None, 1.0, 1.0), (None, 0.5, 0.7), (3.0, 2.5, 0.9)])
@pytest.mark.parametrize("bias", [False, True])
def test_the_plain_torch_kernel_gives_the_log_probs_of_the_full_logits(softcap, scale, temperature, bias):
    """Values and gradients equal the plain computation over the full logits; TRL's kernel too, where it imports."""
    torch.manual_seed(0)
    N, H, V = 11, 8, 37
    hidden = torch.randn(N, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    b = torch.randn(V, requires_grad=True) if bias else None
    targets = torch.randint(0, V, (N,))

    def reference():
        z = torch.nn.functional.linear(hidden.double(), weight.double(), None if b is None else b.double()) * scale
        if softcap is not None:
            z = softcap * torch.tanh(z / softcap)
        log_p = torch.log_softmax(z / temperature, dim=-1)
        p = log_p.exp()
        return log_p[torch.arange(N), targets], -(p * log_p).sum(-1)

    kernels = [compat.TorchLogProbFunction] + ([compat.ChunkedLogProbFunction] if compat.ChunkedLogProbFunction else [])
    want_lp, want_ent = reference()
    want_grads = torch.autograd.grad((want_lp.sum() + 0.3 * want_ent.sum()), [hidden, weight] + ([b] if bias else []))
    for kernel in kernels:
        outputs = ("log_probs", "entropy")
        lp, ent, *_ = kernel.apply(hidden, weight, b, targets, temperature, 16, softcap, scale, outputs)
        torch.testing.assert_close(lp.double(), want_lp, rtol=1e-5, atol=1e-6)  # fp32, as the exactness tests
        torch.testing.assert_close(ent.double(), want_ent, rtol=1e-5, atol=1e-6)
        grads = torch.autograd.grad((lp.sum() + 0.3 * ent.sum()), [hidden, weight] + ([b] if bias else []))
        for got, want in zip(grads, want_grads):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_plain_torch_kernel_refuses_outputs_it_does_not_compute():
    h, w = torch.randn(2, 4), torch.randn(5, 4)
    lp, ent, *rest = compat.TorchLogProbFunction.apply(h, w, None, torch.tensor([1, 2]), 1.0, None, None, 1.0,
                                                       ("log_probs",))
    assert lp.shape == (2,) and ent is None and rest == [None, None, None]
    none = torch.zeros(0, 4, requires_grad=True)  # no token: empty outputs, still part of the graph
    lp, ent, *_ = compat.TorchLogProbFunction.apply(none, w, None, torch.zeros(0, dtype=torch.long), 1.0, None, None,
                                                    1.0, ("log_probs", "entropy"))
    assert lp.shape == ent.shape == (0,) and lp.requires_grad
    (lp.sum() + ent.sum()).backward()
    assert none.grad.shape == (0, 4)
    with pytest.raises(NotImplementedError, match="is_top1"):
        compat.TorchLogProbFunction.apply(h, w, None, torch.tensor([1, 2]), 1.0, None, None, 1.0,
                                          ("log_probs", "is_top1"))


def test_eos_token_ids_fall_back_to_the_tokenizers():
    class Tokenizer:
        eos_token_id = 7

    class Old:  # TRL < 1.14: no `eos_token_ids`
        processing_class = Tokenizer()

    class New(Old):
        eos_token_ids = [7, 9]

    assert compat.eos_token_ids(Old()) == (7,)
    assert compat.eos_token_ids(New()) == (7, 9)
