#!/usr/bin/env bash
# The TRL compatibility matrix, on demand: for each TRL version (with a transformers version, optionally), a
# virtual environment under FOLDER with torch FIRST (a later resolver pass must not pull a CUDA build), then TRL,
# then d3s itself (editable, without its pins); in it, the private-name check (`trl_signature_mismatches()`) and
# the exactness tests. Prints one table row per version, as docs/compatibility.md records them, and appends each
# row to FOLDER/rows.md as it is measured.
#
#   bash scripts/trl_matrix.sh                                   # docs/compatibility.md's rows, under .venv-trl-matrix
#   bash scripts/trl_matrix.sh FOLDER 1.14.2:5.25.0 1.16.0       # TRL[:transformers] pairs; no transformers: pip's pick
#
# A version outside the supported range is measured too: D3S_ALLOW_UNSUPPORTED_TRL=1 lets the glue import there, and
# the tests marked `supported_range` (they assume a supported version) are left out. Exit status: 0 when every
# version in the supported range passed.
# Environment: D3S_TORCH_VERSION (default 2.13.0), PYTHON (default python3), MATRIX_TESTS (the test files).
set -euo pipefail
cd "$(dirname "$0")/.."
folder=${1:-.venv-trl-matrix}
shift || true
pairs=("$@")
if [ ${#pairs[@]} -eq 0 ]; then
  pairs=(1.12.0:5.25.0 1.13.0:5.25.0 1.14.2:5.24.0 1.14.2:5.25.0 1.15.0:5.25.0 1.16.0:5.24.0 1.16.0:5.25.0)
fi
tests=${MATRIX_TESTS:-"tests/integrations/test_trl_trainer.py tests/integrations/test_trl_compute.py
  tests/integrations/test_trl_private_api.py tests/integrations/test_trl_config.py
  tests/integrations/test_shared_prefill.py tests/integrations/test_trl_compat.py"}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1
mkdir -p "$folder"
rows=()
status=0
for pair in "${pairs[@]}"; do
  trl=${pair%%:*}
  tf=$([ "$pair" != "$trl" ] && echo "${pair#*:}" || true)
  env="$folder/trl-$trl${tf:+-transformers-$tf}"
  start=$SECONDS
  if [ ! -x "$env/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$env"
  fi
  "$env/bin/python" -m pip install -q --upgrade pip
  "$env/bin/pip" install -q "torch==${D3S_TORCH_VERSION:-2.13.0}"
  # requests: TRL 1.12 imports it without declaring it
  "$env/bin/pip" install -q "trl==$trl" ${tf:+"transformers==$tf"} "accelerate>=1.15.0" "datasets>=4.7.0" \
    pytest hypothesis pyyaml scipy "peft>=0.21.2,<0.22" requests
  "$env/bin/pip" install -q --no-deps -e .
  installed=$("$env/bin/python" -c "import trl, transformers; print(trl.__version__, transformers.__version__)")
  read -r trl_v tf_v <<< "$installed"
  supported=$("$env/bin/python" - "$trl_v" "$tf_v" <<'EOF'
import ast, sys
from packaging.version import Version
tree = ast.parse(open("src/d3s/integrations/trl/compat.py").read())
ranges = {node.targets[0].id: [Version(c.args[0].value) for c in node.value.elts] for node in tree.body
          if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "").endswith("_VERSION_RANGE")}
ok = all(lo <= Version(v) < hi for v, (lo, hi) in zip(sys.argv[1:], (ranges["TRL_VERSION_RANGE"],
                                                                      ranges["TRANSFORMERS_VERSION_RANGE"])))
print("yes" if ok else "no")
EOF
)
  mismatched=$(D3S_ALLOW_UNSUPPORTED_TRL=1 "$env/bin/python" -W ignore -c "
from d3s.integrations.trl.compat import trl_signature_mismatches
found = trl_signature_mismatches()
print(len(found), ' '.join(found) or '-')" 2>&1 | tail -1) || mismatched="import failed"
  log="$folder/trl-$trl${tf:+-transformers-$tf}.log"
  code=0
  # shellcheck disable=SC2086
  # outside the ranges: the glue imports anyway, and the tests that assume a supported version are left out
  marks="not slow and not vllm and not launch$([ "$supported" = yes ] || echo " and not supported_range")"
  D3S_ALLOW_UNSUPPORTED_TRL=$([ "$supported" = yes ] && echo 0 || echo 1) \
    "$env/bin/python" -m pytest -q -p no:cacheprovider -m "$marks" $tests > "$log" 2>&1 || code=$?
  summary=$(tail -1 "$log")
  passed=$(grep -o '[0-9]* passed' <<< "$summary" | cut -d' ' -f1 || true)
  failed=$(( $(grep -o '[0-9]* failed' <<< "$summary" | cut -d' ' -f1 || echo 0) + \
             $(grep -o '[0-9]* error' <<< "$summary" | cut -d' ' -f1 || echo 0) ))
  rows+=("| $trl_v | $tf_v | $mismatched | ${passed:-0} | $failed | $supported | $((SECONDS - start)) s |")
  echo "${rows[-1]}" >> "$folder/rows.md"  # each row as it is measured: a stopped matrix keeps the rows it has
  if [ "$supported" = yes ] && [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then  # 5: no test collected
    status=1
  fi
done
echo "| TRL | transformers | private-name mismatches | tests passed | tests failed | supported | took |"
echo "|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo "logs: $folder/*.log"
exit $status
