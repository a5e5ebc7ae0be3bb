#!/usr/bin/env bash
# The race: D3S against GRPO at equal compute (`d3s compare --budget reference`, docs/compare.md), on one
# machine with nothing else running. Every finished run stays in its folder; run the same command again to
# continue after an interruption (finished runs are reused, an unfinished one resumes from its checkpoint).
#
#   bash benchmarks/race.sh default      # default task: grpo, d3s (default recipe), the paper's d3s, d1s-c; 8 seeds
#   bash benchmarks/race.sh ablations    # default task, 4 seeds: d3s with mask_truncated_completions, without clipping
#   bash benchmarks/race.sh arith2digit  # arith-2digit: grpo, d3s (its recipe's: the paper's cut), d3s with the
#                                        # default recipe's floor; 6 seeds
#   bash benchmarks/race.sh all          # the three, in this order
#
# D3S=... sets the command (default: d3s on PATH); RESULTS=... the folder of the campaigns
# (default: benchmarks/results). lscpu's output is saved beside each campaign's runs.
set -euo pipefail
cd "$(dirname "$0")/.."
D3S=${D3S:-d3s}
RESULTS=${RESULTS:-benchmarks/results}
COMMON=(--budget reference --keep_checkpoints none --plots false)

compare() {  # folder, then d3s compare options; lscpu's output is saved beside the runs afterwards
    local out=$RESULTS/$1 status=0
    shift
    $D3S compare "$@" "${COMMON[@]}" --output_dir "$out" || status=$?
    if [ -d "$out" ]; then lscpu > "$out/lscpu.txt"; fi
    return $status
}

default() {
    # held-out: 200 problems, the default recipe's; 1-digit 2-term arithmetic has 253 distinct problems up to
    # swapped operands, and the 53 the held-out set leaves are the training pool
    compare race-default --variants grpo,d3s,d3s+min_tokens_per_rollout=0,d1s-c --seeds 11,12,13,14,15,16,17,18
}

ablations() {
    # the grpo and d3s runs of seeds 11-14 are those of `default`, copied once finished (compare reuses them)
    mkdir -p "$RESULTS/race-ablations"
    for run in "$RESULTS"/race-default/{grpo,d3s}-seed{11,12,13,14}; do
        if [ -f "$run/summary.json" ] && [ ! -e "$RESULTS/race-ablations/$(basename "$run")" ]; then
            cp -r "$run" "$RESULTS/race-ablations/"
        fi
    done
    compare race-ablations --variants grpo,d3s,d3s+mask_truncated_completions,d3s+max_grad_norm=0 \
        --seeds 11,12,13,14
}

arith2digit() {
    compare race-arith2digit --config arith-2digit --heldout_size 500 \
        --variants grpo,d3s,d3s+min_tokens_per_rollout=4 \
        --seeds 11,12,13,14,15,16
}

case "${1:-}" in
    default | ablations | arith2digit) "$1" ;;
    all) default && ablations && arith2digit ;;
    *) echo "usage: bash benchmarks/race.sh default|ablations|arith2digit|all" >&2; exit 2 ;;
esac
