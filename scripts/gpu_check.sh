#!/usr/bin/env bash
# What a lent GPU machine should spend its minutes on, prepared as one script. From the repository root:
#   bash scripts/gpu_check.sh [OUT]        # OUT defaults to benchmarks/results/gpu-h200/<date>
# It needs a CUDA build of torch already installed (the machine's own); the project's pins are installed
# from the package index when missing (set PIP_FIND_LINKS or PIP_INDEX_URL for an offline wheel folder).
# Each step has its own time limit, writes its log to OUT and goes on if it fails; the last lines of
# OUT/summary.txt say what passed. Nothing here runs in CI, which has no GPU.
#   1. the trainer's exactness tests on CUDA (fp32): D3S off equals TRL bit for bit, the selective forward
#      equals the full masked computation at every micro-batch, LoRA, gradient checkpointing, MoE, the
#      token-cut and prompt options;
#   2. every paper recipe end to end at tiny scale under its own launcher (DeepSpeed ZeRO-3) on every GPU
#      of the machine, bf16, checkpointed and resumed exactly (D3S_LAUNCH_VLLM=true adds the recipes'
#      colocated vLLM generation where vLLM is installed);
#   3. the training-phase benchmark, GRPO vs D3S, on a Qwen2.5-0.5B-shaped model.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/gpu-h200/$(date +%Y-%m-%d)}
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 D3S_TEST_DEVICE=cuda
PY=${PYTHON:-python}

step() {  # step NAME SECONDS COMMAND...: runs it with a time limit, logs to OUT/NAME.log, records the outcome
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s; $(grep -E '(passed|failed|error)' "$out/$name.log" | tail -n 1)" \
    | tee -a "$summary"
}

nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || { echo "gpu_check: no nvidia-smi: not a GPU machine" | tee -a "$summary"; exit 1; }
lscpu > "$out/lscpu.txt" 2>&1
if ! $PY -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "gpu_check: torch cannot see a GPU ($($PY -c 'import torch; print(torch.__version__)' 2>&1))" | tee -a "$summary"
  exit 1
fi
if ! $PY -c "import trl, peft, deepspeed, d3s" 2>/dev/null; then  # torch stays the machine's own build
  $PY -m pip install -q -e ".[train,dev,deepspeed]" > "$out/install.log" 2>&1 \
    || echo "gpu_check: installing the pins failed, see install.log" | tee -a "$summary"
fi
$PY -m pip freeze > "$out/pip-freeze.txt" 2>&1

step trainer-tests 900 $PY -m pytest -q -p no:cacheprovider tests/integrations/test_trl_compute.py \
  tests/integrations/test_trl_trainer.py tests/integrations/test_trl_peft.py tests/integrations/test_trl_token_cut.py \
  tests/integrations/test_trl_prompts.py
step paper-recipes 900 $PY -m pytest -q -p no:cacheprovider -m launch tests/launch
step training-phase 600 $PY benchmarks/bench_trl_training_phase.py --device cuda --model qwen-0.5b \
  --num-generations 16 --prompts 4 --prompt-len 128 --min-len 256 --max-len 768 --rounds 2 --steps 3
echo "gpu_check: results in $out" | tee -a "$summary"
