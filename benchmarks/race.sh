#!/usr/bin/env bash
# The race: D3S against GRPO at equal compute (`d3s compare --budget reference`, docs/compare.md), on one
# machine with nothing else running. Every finished run stays in its folder; run the same command again to
# continue after an interruption (finished runs are reused, an unfinished one resumes from its checkpoint).
#
#   bash benchmarks/race.sh default      # default task: grpo, d3s (the recipe's floor of 4), the paper's d3s, d1s-c; 8 seeds
#   bash benchmarks/race.sh ablations    # default task, 4 seeds: d3s with mask_truncated_completions, without clipping
#   bash benchmarks/race.sh arith2digit  # arith-2digit: grpo, d3s (its recipe's: the paper's cut), d3s with the
#                                        # default recipe's floor, d1s-c (best on the default task); 6 seeds
#   bash benchmarks/race.sh all          # the three, in this order
#   bash benchmarks/race.sh snapshot     # compare.md/json/png of the seeds every arm has finished; trains nothing
#
# D3S=... sets the command (default: .venv/bin/d3s where scripts/setup.sh made it, else d3s on PATH); RESULTS=... the folder of the campaigns
# (default: benchmarks/results). lscpu's output is saved beside each campaign's runs, one file per CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/d3s ]; then D3S=${D3S:-.venv/bin/d3s}; else D3S=${D3S:-d3s}; fi
RESULTS=${RESULTS:-benchmarks/results}
COMMON=(--budget reference --keep_checkpoints none --plots false)

# each campaign: its folder, its arms, its seeds and the other d3s compare options
# held-out on the default task: 200 problems, the default recipe's; 1-digit 2-term arithmetic has 253 distinct
# problems up to swapped operands, and the 53 the held-out set leaves are the training pool
default_folder=race-default
default_variants=grpo,d3s,d3s+min_tokens_per_rollout=0,d1s-c
default_seeds=11,12,13,14,15,16,17,18
default_options=()
# the grpo and d3s runs of seeds 11-14 are those of `default`, copied once finished (compare reuses them)
ablations_folder=race-ablations
ablations_variants=grpo,d3s,d3s+mask_truncated_completions,d3s+max_grad_norm=0
ablations_seeds=11,12,13,14
ablations_options=()
arith2digit_folder=race-arith2digit
# d1s-c: the arm with the largest paired gain over GRPO at GRPO's compute on the default task (race-default,
# seeds 11-17), raced here on another task and fresh runs before it can become the default recipe's variant
arith2digit_variants=grpo,d3s,d3s+min_tokens_per_rollout=4,d1s-c
arith2digit_seeds=11,12,13,14,15,16
# 10 evaluation points (every 2 of GRPO's 20 steps), so that one falls near 0.4 of the compute, the target's share
arith2digit_options=(--config arith-2digit --heldout_size 500 --budget_points 10)

campaign() {  # name [seeds]: the d3s compare command of that campaign, on its seeds or those given
    local folder=${1}_folder variants=${1}_variants seeds=${1}_seeds options="${1}_options[@]"
    $D3S compare ${!options+"${!options}"} --variants "${!variants}" --seeds "${2:-${!seeds}}" "${COMMON[@]}" \
        --output_dir "$RESULTS/${!folder}"
}

lscpu_file() {  # folder: where this machine's lscpu output goes: lscpu.txt, or lscpu-<family>-<model>.txt
    # when lscpu.txt is another CPU's (each run's run_config.json names its machine)
    local key='/^(CPU family|Model):/ {gsub(/ /, "", $2); printf "%s%s", sep, $2; sep="-"}' here
    here=$(lscpu | awk -F: "$key")
    if [ ! -f "$1/lscpu.txt" ] || [ "$(awk -F: "$key" "$1/lscpu.txt")" = "$here" ]; then
        echo "$1/lscpu.txt"
    else
        echo "$1/lscpu-$here.txt"
    fi
}

run() {  # name: lscpu's output beside the campaign's runs, then the campaign
    local folder=${1}_folder status=0
    mkdir -p "$RESULTS/${!folder}"
    lscpu > "$(lscpu_file "$RESULTS/${!folder}")"
    campaign "$1" || status=$?
    return $status
}

finished_seeds() {  # name: the seeds for which every arm of the campaign has finished (comma-separated)
    local folder=${1}_folder variants=${1}_variants seeds=${1}_seeds s v ok found=()
    for s in ${!seeds//,/ }; do
        ok=1
        for v in ${!variants//,/ }; do [ -f "$RESULTS/${!folder}/$v-seed$s/summary.json" ] || ok=0; done
        if [ $ok = 1 ]; then found+=("$s"); fi
    done
    (IFS=,; echo "${found[*]}")
}

ablations() {
    mkdir -p "$RESULTS/$ablations_folder"
    for run in "$RESULTS/$default_folder"/{grpo,d3s}-seed{11,12,13,14}; do
        if [ -f "$run/summary.json" ] && [ ! -e "$RESULTS/$ablations_folder/$(basename "$run")" ]; then
            cp -r "$run" "$RESULTS/$ablations_folder/"
        fi
    done
    run ablations
}

snapshot() {
    local name seeds
    for name in default ablations arith2digit; do
        seeds=$(finished_seeds $name)
        if [ -n "$seeds" ]; then campaign $name "$seeds"; else echo "race.sh: $name: no seed finished yet"; fi
    done
}

case "${1:-}" in
    default | arith2digit) run "$1" ;;
    ablations | snapshot) "$1" ;;
    all) run default && ablations && run arith2digit ;;
    *) echo "usage: bash benchmarks/race.sh default|ablations|arith2digit|all|snapshot" >&2; exit 2 ;;
esac
