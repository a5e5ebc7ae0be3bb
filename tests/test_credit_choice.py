"""`benchmarks/credit_choice.py`: each arm's tuned rate is the best mean over the tuning seeds, a tie the lower rate."""

import importlib.util
import json
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("credit_choice", Path(__file__).parents[1] / "benchmarks/credit_choice.py")
credit_choice = importlib.util.module_from_spec(spec)
spec.loader.exec_module(credit_choice)


def _write(results: Path, arm: str, multiple: int, accuracies: list[float]) -> None:
    rate = credit_choice.RECIPE_RATE * multiple
    for seed, accuracy in zip(credit_choice.SEEDS, accuracies):
        run = results / credit_choice.ARMS[arm] / f"{credit_choice.folder_name(arm, rate)}-seed{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"after": {"accuracy": accuracy}}))


def test_the_best_mean_wins_and_a_tie_goes_to_the_lower_rate(tmp_path):
    for multiple, accs in ((1, [0.5, 0.6, 0.7]), (2, [0.7, 0.6, 0.8]), (4, [0.9, 0.4, 0.5])):
        _write(tmp_path, "grpo", multiple, accs)
    for multiple, accs in ((1, [0.6, 0.6, 0.6]), (2, [0.5, 0.7, 0.6]), (4, [0.1, 0.2, 0.3])):
        _write(tmp_path, "d1s-c", multiple, accs)
    assert credit_choice.main(["--results", str(tmp_path)]) == 0
    choice = json.loads((tmp_path / "credit-tuning" / "choice.json").read_text())
    assert choice["grpo"]["multiple"] == 2 and choice["grpo"]["learning_rate"] == pytest.approx(6e-05)
    assert choice["d1s-c"]["multiple"] == 1  # 0.6 against 0.6: the lower rate
    assert "| grpo | 6e-05 (2x) | 70.0%, 60.0%, 80.0% | 70.0% | yes |" in (tmp_path / "credit-tuning" / "choice.md").read_text()


def test_a_missing_run_is_named(tmp_path):
    with pytest.raises(SystemExit, match="grpo-seed1/summary.json is missing"):
        credit_choice.main(["--results", str(tmp_path)])
