"""A run that makes the model worse says so (`d3s.app.below_start`): the rule, the line, the records, and a
`d3s train` run end to end."""

from __future__ import annotations

import json

import pytest

from d3s.app import below_start
from d3s.app.runfiles import RunLog


def _records(zero_gradient: list[float], moved: list[float], start: float = 0.18) -> list[dict]:
    train = [{"type": "train", "step": i + 1, "d3s/zero_gradient": z, "d3s/weights_moved": m,
              "completions/clipped_ratio": 0.5 if i < 2 else 0.0, "completions/mean_length": 40.0 - i}
             for i, (z, m) in enumerate(zip(zero_gradient, moved))]
    return [{"type": "eval", "step": 0, "accuracy": start}, *train]


def test_below_start_only_when_the_whole_interval_is_under_the_start():
    records = _records([0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0])
    assert below_start.check(records, 4, {"accuracy": 0.10, "ci_high": 0.181}) is None  # the interval reaches it
    assert below_start.check(records, 0, {"accuracy": 0.0, "ci_high": 0.0}) is None  # the start itself
    event = below_start.check(records, 4, {"accuracy": 0.06, "ci_high": 0.10})
    assert event["start"] == 0.18 and event["steps"] == 4
    assert event["no_signal_share"] == 0.75 and event["moved_without_signal"] == 2
    assert event["truncation_rate"] == 0.25 and event["completion_length"] == pytest.approx(38.5)
    line = below_start.message(event)
    assert "6.0% at step 4 is below the start's 18.0%" in line and "75% of 4 steps had no reward signal" in line
    assert "2 of them still moved the weights" in line


def test_records_before_the_zero_gradient_metric_count_flat_steps():
    records = [{"type": "eval", "step": 0, "accuracy": 0.5},
               *({"type": "train", "step": i, "frac_reward_zero_std": f} for i, f in ((1, 1.0), (2, 0.5)))]
    event = below_start.check(records, 2, {"accuracy": 0.1, "ci_high": 0.2})
    assert event["no_signal_share"] == 0.5 and event["moved_without_signal"] is None
    assert "?" in below_start.message(event)  # no truncation record: said, not invented


def test_the_callback_says_so_on_stderr_and_in_the_records(tmp_path, capsys):
    pytest.importorskip("trl")
    from d3s.app.run_trainer import RunCallback

    log = RunLog(tmp_path / "metrics.jsonl", None)
    start, *train = _records([1.0, 1.0], [1.0, 1.0], start=0.5)
    log.add(start)
    results = iter([{"accuracy": 0.45, "ci_high": 0.55, "n": 200}, {"accuracy": 0.2, "ci_high": 0.3, "n": 200}])
    callback = RunCallback(log, lambda: next(results), eval_every=1)
    for record in train:
        log.add(record)
    callback.run_eval(1)
    assert "warning" not in capsys.readouterr().err
    callback.run_eval(2)
    err = capsys.readouterr().err
    assert "d3s train: warning: held-out accuracy 20.0% at step 2 is below the start's 50.0%" in err
    saved = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "below_start" not in saved[-2] and saved[-1]["below_start"]["step"] == 2
    assert callback._bar_fields({})["heldout"] == "20.0% BELOW START"
