"""Opt-in tests of D3S on TRL's vLLM generation path (colocate mode, on a CPU).

They run in their own environment and their own pytest process:

    bash scripts/setup_vllm.sh && .venv-vllm/bin/python -m pytest -m vllm tests/with_vllm

Every test module here sets `pytestmark = pytest.mark.vllm`; the default suite deselects the marker
(pyproject.toml), so `pytest -q` never builds a vLLM engine. Where vLLM cannot run (not installed in
this interpreter, a CPU without AVX2), every test skips with the reason.
"""

from __future__ import annotations

import gc
import os

import pytest
import vllm_tiny


@pytest.fixture(scope="session", autouse=True)
def vllm_ready(tmp_path_factory):
    """Skips every test here where vLLM cannot run; else prepares the process for colocated engines."""
    reason = vllm_tiny.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    vllm_tiny.set_vllm_cpu_env(tmp_path_factory.mktemp("vllm_cache"))
    if os.environ.get("D3S_VLLM_CPU_WEIGHT_WORKAROUND", "1") != "0":
        vllm_tiny.keep_linear_weights_on_cpu()  # the weight-sync workaround: see its docstring
    yield


@pytest.fixture(autouse=True)
def _release_engine():
    """Drops the engines of the finished test (each holds VLLM_CPU_KVCACHE_SPACE GiB) and the rank
    variables TRL's colocate mode leaves in os.environ."""
    yield
    vllm_tiny.clear_leaked_env()
    gc.collect()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory, vllm_ready) -> str:
    return vllm_tiny.save_tiny_model(tmp_path_factory.mktemp("tiny_llama"))
