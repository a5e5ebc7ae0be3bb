#!/usr/bin/env bash
# The README's first command, timed from a fresh clone with empty caches (pip's and the converted model's), then
# the same recipe with transformers' `generate` (`--shared_prefill_generation false`) in the same clone, for where
# a step's time goes. Run it with nothing else running; it clones the committed HEAD.
#
#   bash benchmarks/first_command.sh [OUT]    # OUT: default benchmarks/results/first-command
#
# OUT receives wall-clock.txt (setup, `d3s train` and total seconds), lscpu.txt, the run's metrics.jsonl,
# summary.json, run_config.json and training.png, and the same four files of the `generate` run in
# generate-path/. scripts/readme_figures.py (block first-command) reads them.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$repo/benchmarks/results/first-command}
mkdir -p "$out" && out=$(cd "$out" && pwd)
work=$(mktemp -d /tmp/first-command-XXXX)
git clone -q "$repo" "$work/clone"
export D3S_CACHE=$work/cache PIP_CACHE_DIR=$work/pip-cache
cd "$work/clone"
now() { date +%s.%N; }

t0=$(now)
bash scripts/setup.sh
t1=$(now)
.venv/bin/d3s train
t2=$(now)
awk -v a="$t0" -v b="$t1" -v c="$t2" \
    'BEGIN {printf "setup %.3f s, d3s train %.3f s, total %.3f s\n", b - a, c - b, c - a}' > "$out/wall-clock.txt"
lscpu > "$out/lscpu.txt"
for f in metrics.jsonl summary.json run_config.json training.png; do cp "runs/default/$f" "$out/"; done

.venv/bin/d3s train --shared_prefill_generation false --output_dir runs/default-off
mkdir -p "$out/generate-path"
for f in metrics.jsonl summary.json run_config.json training.png; do cp "runs/default-off/$f" "$out/generate-path/"; done
cat "$out/wall-clock.txt"
rm -rf "$work"
