"""A run that makes the model worse says so, at the evaluation that shows it (docs/reliability.md).

An evaluation is **below the start** when its whole 95% interval lies under the run's own step-0 accuracy:
`ci_high < accuracy at step 0` (the same held-out problems, greedy). The event carries what the run saw up to
that step, the usual suspects of a collapse:

- `no_signal_share`: the share of optimizer steps whose gradient was exactly zero (`d3s/zero_gradient`; records
  made before it was logged: steps whose groups all had equal rewards);
- `moved_without_signal`: how many of those steps still moved the weights (Adam's momentum);
- `truncation_rate`: the share of completions that ran to the length cap (TRL's `completions/clipped_ratio`),
  over all steps so far and over the last `RECENT` steps;
- `completion_length`: the mean completion length in tokens (TRL's `completions/mean_length`), likewise.

`d3s train` prints it as one line on stderr, marks the progress bar, and `summary.json` lists every event under
`below_start`. It warns; it does not stop the run.
"""

from __future__ import annotations

RECENT = 10
"""The last this-many steps give the "recent" truncation rate and completion length."""


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _series(train: list[dict], key: str) -> list[float]:
    return [r[key] for r in train if isinstance(r.get(key), (int, float))]


def check(records: list[dict], step: int, result: dict) -> dict | None:
    """The below-start event of the evaluation `result` at `step` (records: the run's so far), or None."""
    start = next((r for r in records if r.get("type") == "eval" and r.get("step") == 0), None)
    if step <= 0 or start is None or result.get("ci_high") is None or not result["ci_high"] < start["accuracy"]:
        return None
    train = [r for r in records if r.get("type") == "train" and r.get("step", 0) <= step]
    zero = _series(train, "d3s/zero_gradient")
    if zero:
        no_signal = [z > 0.5 for z in zero]
        moved = sum(m > 0.5 for z, m in zip(zero, _series(train, "d3s/weights_moved")) if z > 0.5)
    else:
        no_signal = [s >= 1.0 - 1e-9 for s in _series(train, "frac_reward_zero_std")]
        moved = None
    clipped, length = _series(train, "completions/clipped_ratio"), _series(train, "completions/mean_length")
    return {
        "step": step, "accuracy": result["accuracy"], "ci_high": result["ci_high"], "start": start["accuracy"],
        "steps": len(train), "no_signal_share": _mean([float(x) for x in no_signal]),
        "moved_without_signal": moved,
        "truncation_rate": _mean(clipped), "truncation_rate_recent": _mean(clipped[-RECENT:]),
        "completion_length": _mean(length), "completion_length_recent": _mean(length[-RECENT:]),
    }


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


def message(event: dict) -> str:
    """One line saying what happened and what the run saw."""
    moved = event["moved_without_signal"]
    length = event["completion_length_recent"]
    return (f"held-out accuracy {event['accuracy']:.1%} at step {event['step']} is below the start's "
            f"{event['start']:.1%} by more than its interval (upper bound {event['ci_high']:.1%}): the model got worse. "
            f"So far {_pct(event['no_signal_share'])} of {event['steps']} steps had no reward signal"
            + (f" ({moved} of them still moved the weights; skip_steps_without_signal stops that)" if moved else "")
            + f"; completions at the length cap {_pct(event['truncation_rate_recent'])} over the last {RECENT} steps "
            f"({_pct(event['truncation_rate'])} overall)"
            + ("" if length is None else f", {length:.0f} tokens on average"))
