"""benchmarks/credit.sh driven with a stand-in for `d3s` that records each command and makes finished run folders:
the compares each stage runs, the arms' names at the tuned rates, reruns, and the report stage."""

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "credit.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("lscpu") is None,
                                reason="needs bash and lscpu")

# A stand-in for `d3s compare`: appends its name and arguments to $LOG, then writes summary.json into every run
# folder of --variants x --seeds under --output_dir that has none (each naming the folder it was made in).
STAND_IN = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$LOG"
[ "$1" = compare ] || exit 0
shift
while [ $# -gt 0 ]; do
    case "$1" in
        --variants) variants=$2; shift ;;
        --seeds) seeds=$2; shift ;;
        --output_dir) out=$2; shift ;;
    esac
    shift
done
for s in ${seeds//,/ }; do
    for v in ${variants//,/ }; do
        if [ ! -f "$out/$v-seed$s/summary.json" ]; then
            mkdir -p "$out/$v-seed$s"
            echo "{\\"made_in\\": \\"$(basename "$out")\\"}" > "$out/$v-seed$s/summary.json"
        fi
    done
done
"""

GRPO = "grpo+learning_rate=6e-05"  # GRPO tuned at 2x the recipes' rate, D1S-C at 1x
SMALL_G = "grpo+num_generations=4+per_device_train_batch_size=8+learning_rate=6e-05"
RACE = f"{GRPO},d1s-c,d1s-c+sample_selection=random,{SMALL_G}"


@pytest.fixture
def campaign(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("d3s", "d3s-report", "python"):
        stub = bin_dir / name
        stub.write_text(STAND_IN)
        stub.chmod(0o755)
    results = tmp_path / "results"
    (results / "credit-tuning").mkdir(parents=True)
    (results / "credit-tuning" / "choice.json").write_text(json.dumps(
        {"grpo": {"learning_rate": 6e-05}, "d1s-c": {"learning_rate": 3e-05}}))
    log = tmp_path / "log"

    def run(stage: str, **env: str) -> subprocess.CompletedProcess:
        log.write_text("")
        full = {**os.environ, "LOG": str(log), "RESULTS": str(results), "COMMIT": "0", "D3S": str(bin_dir / "d3s"),
                "REPORT_D3S": str(bin_dir / "d3s-report"), "PYTHON": str(bin_dir / "python"), **env}
        return subprocess.run(["bash", str(SCRIPT), stage], env=full, capture_output=True, text=True, timeout=120)

    def commands() -> list[list[str]]:
        return [shlex.split(line) for line in log.read_text().splitlines()]

    return run, commands, results


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_race_runs_each_seed_then_all_of_them_at_the_tuned_rates(campaign):
    run, commands, results = campaign
    done = run("race")
    assert done.returncode == 0, done.stderr
    cmds = commands()
    assert [_option(c, "--seeds") for c in cmds] == [str(s) for s in range(21, 29)] + ["21,22,23,24,25,26,27,28"]
    for c in cmds:
        assert c[:2] == ["d3s", "compare"] and _option(c, "--variants") == RACE
        assert _option(c, "--reference") == GRPO and _option(c, "--budget") == "reference"
        assert _option(c, "--output_dir") == str(results / "credit-race-default")
    assert [_option(c, "--plots") for c in cmds] == ["false"] * 8 + ["true"]
    assert (results / "credit-race-default" / "lscpu.txt").is_file()


def test_d3s_with_the_floor_runs_only_when_asked(campaign):
    run, commands, _ = campaign
    assert run("race", WITH_FLOOR="1").returncode == 0
    assert {_option(c, "--variants") for c in commands()} == {RACE + ",d3s"}  # at D1S-C's rate, the recipes'


def test_a_rerun_compares_only_the_seeds_not_yet_finished(campaign):
    run, commands, results = campaign
    for v in RACE.split(","):
        (results / "credit-race-default" / f"{v}-seed21").mkdir(parents=True)
        (results / "credit-race-default" / f"{v}-seed21" / "summary.json").write_text("{}")
    (results / "credit-race-default" / f"{GRPO}-seed22").mkdir()
    (results / "credit-race-default" / f"{GRPO}-seed22" / "summary.json").write_text("{}")  # seed 22 half done
    assert run("race").returncode == 0
    assert [_option(c, "--seeds") for c in commands()][:-1] == [str(s) for s in range(22, 29)]


def test_equal_steps_reuse_the_races_grpo_runs(campaign):
    run, commands, results = campaign
    assert run("race").returncode == 0
    assert run("steps").returncode == 0
    steps = results / "credit-steps-default"
    for s in range(21, 29):  # copied from the race, not made again
        assert json.loads((steps / f"{GRPO}-seed{s}" / "summary.json").read_text()) == {"made_in": "credit-race-default"}
        assert json.loads((steps / f"d1s-c-seed{s}" / "summary.json").read_text()) == {"made_in": "credit-steps-default"}
    c = commands()[-1]
    assert _option(c, "--variants") == f"{GRPO},d1s-c,d1s-c+sample_selection=random"
    assert "--budget" not in c and _option(c, "--reference") == GRPO


def test_the_report_refuses_a_missing_run_then_compares_every_campaign_and_trains_nothing(campaign):
    run, commands, results = campaign
    for stage in ("tuning", "race", "steps", "arith2digit", "flat"):
        assert run(stage).returncode == 0, stage
    missing = results / "credit-flat" / "d1s-c+skip_steps_without_signal=false-seed22"
    shutil.rmtree(missing)
    refused = run("report")
    assert refused.returncode == 2
    assert str(missing) in refused.stderr and "1 run(s) not finished" in refused.stderr
    assert commands() == []  # neither trained nor compared, nor the figures rewritten

    missing.mkdir()
    (missing / "summary.json").write_text("{}")
    done = run("report")
    assert done.returncode == 0, done.stderr
    cmds = commands()
    assert {c[0] for c in cmds[:-1]} == {"d3s-report"}  # this checkout's compare; the campaigns' d3s never runs
    assert [Path(_option(c, "--output_dir")).name for c in cmds[:-1]] == [
        "credit-tuning", "credit-tuning-grpo", "credit-race-default", "credit-steps-default",
        "credit-race-arith2digit", "credit-flat"]
    assert all(_option(c, "--plots") == "true" and "," in _option(c, "--seeds") for c in cmds[:-1])
    assert cmds[-1] == ["python", "scripts/readme_figures.py"]


def test_an_unknown_stage_is_refused_with_the_stages(campaign):
    run, _, _ = campaign
    done = run("racee")
    assert done.returncode == 2 and "tuning|choose|race|steps|arith2digit|flat|all|report" in done.stderr
