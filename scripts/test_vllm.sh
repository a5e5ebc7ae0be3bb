#!/usr/bin/env bash
# Runs the vLLM tests (pytest marker `vllm`, tests/with_vllm) in their own process, in .venv-vllm/ made by
# scripts/setup_vllm.sh. Without .venv-vllm/ they run in .venv/ and skip, each with the reason.
# Extra arguments go to pytest, e.g. `bash scripts/test_vllm.sh -k weight_sync`; `-m vllm` adds the
# slow ones (two processes).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv-vllm/bin/python
[ -x "$PY" ] || PY=.venv/bin/python
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
"$PY" -m pytest -m "vllm and not slow" tests/with_vllm -q -rs -W ignore::FutureWarning -W ignore::DeprecationWarning "$@"
